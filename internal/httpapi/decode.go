package httpapi

import (
	"fmt"
	"strings"
	"sync"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/strictjson"
)

// Request bodies. Every decoder is a pure function of the bytes, so the
// fuzzers can drive them directly; none of them lets an invalid value
// through to the tracker.

type heartbeatReq struct {
	UserID   string `json:"user_id"`
	DeviceID string `json:"device_id"`
	Active   *bool  `json:"active"`
}

type statusReq struct {
	UserID string  `json:"user_id"`
	Status string  `json:"status"`
	Text   *string `json:"text"`
}

type byeReq struct {
	UserID   string `json:"user_id"`
	DeviceID string `json:"device_id"`
}

type batchReq struct {
	UserIDs  []string `json:"user_ids"`
	ViewerID string   `json:"viewer_id"`
}

type settingsReq struct {
	StatusVisibility   *string `json:"status_visibility"`
	LastSeenVisibility *string `json:"last_seen_visibility"`
}

type contactsReq struct {
	Contacts []string `json:"contacts"`
}

// decodeJSON decodes exactly one JSON object into v by the rule every
// edge shares (package strictjson): exact field names, each once, no
// unknown fields, values of their types, valid UTF-8, no trailing data.
func decodeJSON(body []byte, v any) error {
	if err := strictjson.Decode(body, v); err != nil {
		return badRequest("invalid_json", "request body %v", err)
	}
	return nil
}

func checkID(field, id string) error {
	if err := presence.ValidateID(id); err != nil {
		return badRequest("invalid_id", "%s: %v", field, err)
	}
	return nil
}

// optionalID validates id unless it is empty.
func optionalID(field, id string) error {
	if id == "" {
		return nil
	}
	return checkID(field, id)
}

func decodeHeartbeat(body []byte) (heartbeatReq, error) {
	var r heartbeatReq
	if err := decodeJSON(body, &r); err != nil {
		return r, err
	}
	if err := optionalID("user_id", r.UserID); err != nil {
		return r, err
	}
	return r, optionalID("device_id", r.DeviceID)
}

func decodeStatus(body []byte) (statusReq, presence.Manual, error) {
	var r statusReq
	if err := decodeJSON(body, &r); err != nil {
		return r, 0, err
	}
	if err := optionalID("user_id", r.UserID); err != nil {
		return r, 0, err
	}
	if r.Status == "" {
		return r, 0, badRequest("invalid_status", "status is required: one of online, away, busy, invisible")
	}
	m, err := presence.ParseManual(r.Status)
	if err != nil {
		return r, 0, badRequest("invalid_status", "status %q: %v", r.Status, err)
	}
	if r.Text != nil {
		if err := presence.ValidateText(*r.Text); err != nil {
			return r, 0, badRequest("invalid_text", "text: %v", err)
		}
	}
	return r, m, nil
}

func decodeBye(body []byte) (byeReq, error) {
	var r byeReq
	if err := decodeJSON(body, &r); err != nil {
		return r, err
	}
	if err := optionalID("user_id", r.UserID); err != nil {
		return r, err
	}
	return r, optionalID("device_id", r.DeviceID)
}

// decodeBatch decodes a POST batch request; its ids are de-duplicated
// with sc's set.
func decodeBatch(body []byte, sc *idScratch) (batchReq, error) {
	var r batchReq
	if err := decodeJSON(body, &r); err != nil {
		return r, err
	}
	if r.UserIDs == nil {
		return r, badRequest("invalid_ids", "user_ids is required: a list of 1 to %d ids", query.MaxBatch)
	}
	ids, err := checkIDList("user_ids", r.UserIDs, sc)
	if err != nil {
		return r, err
	}
	r.UserIDs = ids
	return r, optionalID("viewer_id", r.ViewerID)
}

func decodeSettings(body []byte) (presence.Settings, error) {
	var r settingsReq
	var s presence.Settings
	if err := decodeJSON(body, &r); err != nil {
		return s, err
	}
	if r.StatusVisibility == nil || r.LastSeenVisibility == nil {
		return s, badRequest("invalid_settings", "both status_visibility and last_seen_visibility are required (everyone, contacts or nobody)")
	}
	var err error
	if s.Status, err = presence.ParseVisibility(*r.StatusVisibility); err != nil {
		return s, badRequest("invalid_settings", "status_visibility: %v", err)
	}
	if s.LastSeen, err = presence.ParseVisibility(*r.LastSeenVisibility); err != nil {
		return s, badRequest("invalid_settings", "last_seen_visibility: %v", err)
	}
	return s, nil
}

func decodeContacts(body []byte) ([]string, error) {
	var r contactsReq
	if err := decodeJSON(body, &r); err != nil {
		return nil, err
	}
	if r.Contacts == nil {
		return nil, badRequest("invalid_contacts", "contacts is required: a list of user ids (may be empty)")
	}
	if len(r.Contacts) > presence.MaxContacts {
		return nil, badRequest("too_many_contacts", "%s (the request lists %d)", presence.ErrTooManyContacts, len(r.Contacts))
	}
	seen := make(map[string]struct{}, len(r.Contacts))
	out := r.Contacts[:0]
	for i, id := range r.Contacts {
		if err := checkID(fmt.Sprintf("contacts[%d]", i), id); err != nil {
			return nil, err
		}
		if _, dup := seen[id]; !dup {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out, nil
}

// idScratch is the memory parsing and de-duplicating one list of ids
// needs, reused across requests: a read of 1,000 ids otherwise allocates
// ~70 KB, and at hundreds of reads a second that garbage is what makes the
// collector run (and the tail latency of reads with it). The zero value
// is ready to use.
type idScratch struct {
	ids  []string
	seen map[string]struct{}
}

var idPool = sync.Pool{New: func() any { return new(idScratch) }}

func getIDScratch() *idScratch { return idPool.Get().(*idScratch) }

// putIDScratch returns sc to the pool.
func putIDScratch(sc *idScratch) {
	sc.reset()
	idPool.Put(sc)
}

// reset empties sc, so that it holds no request's strings.
func (sc *idScratch) reset() {
	clear(sc.ids[:cap(sc.ids)])
	sc.ids = sc.ids[:0]
	clear(sc.seen)
}

// parseIDList parses a comma-separated list of ids, the query parameter
// field (user_ids of the seed endpoint, ids of the rooms' counts). The ids
// it returns live in sc.
func parseIDList(field, s string, sc *idScratch) ([]string, error) {
	if s == "" {
		return nil, badRequest("invalid_ids", "%s is required: 1 to %d comma-separated ids", field, query.MaxBatch)
	}
	if n := strings.Count(s, ",") + 1; n > query.MaxBatch {
		return nil, badRequest("too_many_ids", "%d ids: at most %d per request", n, query.MaxBatch)
	}
	ids := sc.ids[:0]
	for {
		id, rest, more := strings.Cut(s, ",")
		ids = append(ids, id)
		if !more {
			break
		}
		s = rest
	}
	sc.ids = ids
	return checkIDList(field, ids, sc)
}

// checkIDList validates a list of ids (field names it in errors) and
// drops duplicates, keeping order, in place. It uses sc's set.
func checkIDList(field string, ids []string, sc *idScratch) ([]string, error) {
	if len(ids) == 0 {
		return nil, badRequest("invalid_ids", "%s is empty: give 1 to %d ids", field, query.MaxBatch)
	}
	if len(ids) > query.MaxBatch {
		return nil, badRequest("too_many_ids", "%d ids: at most %d per request", len(ids), query.MaxBatch)
	}
	for i, id := range ids {
		if err := presence.ValidateID(id); err != nil {
			return nil, badRequest("invalid_id", "%s[%d]: %v", field, i, err)
		}
	}
	if len(ids) <= 32 {
		// Small lists: quadratic is cheaper than a map.
		out := ids[:0]
	next:
		for _, id := range ids {
			for _, o := range out {
				if o == id {
					continue next
				}
			}
			out = append(out, id)
		}
		return out, nil
	}
	if sc.seen == nil {
		sc.seen = make(map[string]struct{}, query.MaxBatch)
	}
	seen := sc.seen
	out := ids[:0]
	for _, id := range ids {
		if _, dup := seen[id]; !dup {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out, nil
}

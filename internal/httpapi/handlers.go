package httpapi

import (
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
)

var viewPool = sync.Pool{New: func() any { return new(readBuf) }}

type readBuf struct {
	views []privacy.View
	out   []byte
}

func getReadBuf(n int) *readBuf {
	rb := viewPool.Get().(*readBuf)
	if cap(rb.views) < n {
		rb.views = make([]privacy.View, n)
	}
	rb.views = rb.views[:n]
	rb.out = rb.out[:0]
	return rb
}

func putReadBuf(rb *readBuf) {
	clear(rb.views)
	if cap(rb.out) > 1<<20 {
		rb.out = nil
	}
	viewPool.Put(rb)
}

// queryParam returns the single value of a query parameter, refusing
// repeats so that no value is silently ignored.
func queryParam(r *http.Request, name string) (string, error) {
	// The query is parsed once per request (a batch read's is ~10 KB of
	// ids, and the viewer is looked up in it too) and kept in r.Form,
	// which nothing else here fills.
	if r.Form == nil {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			return "", badRequest("invalid_query", "malformed query string: %v", err)
		}
		r.Form = q
	}
	vs := r.Form[name]
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	}
	return "", badRequest("invalid_query", "%s is given %d times; give it once", name, len(vs))
}

func (s *Server) readViewer(w http.ResponseWriter, r *http.Request, p auth.Principal) (string, error) {
	claimed, err := queryParam(r, "viewer_id")
	if err != nil {
		return "", err
	}
	if err := optionalID("viewer_id", claimed); err != nil {
		return "", err
	}
	return s.viewer(w, r, p, claimed)
}

// batchSeed serves GET /presence/batch?user_ids=1,2,3 as exactly
// {"1":"online","2":"away","3":"offline"}, hidden statuses as null.
func (s *Server) batchSeed(w http.ResponseWriter, r *http.Request) error {
	p, err := s.principal(r)
	if err != nil {
		return err
	}
	raw, err := queryParam(r, "user_ids")
	if err != nil {
		return err
	}
	sc := getIDScratch()
	defer putIDScratch(sc)
	ids, err := parseIDList("user_ids", raw, sc)
	if err != nil {
		return err
	}
	viewer, err := s.readViewer(w, r, p)
	if err != nil {
		return err
	}
	rb := getReadBuf(len(ids))
	defer putReadBuf(rb)
	read := s.reader.Read
	if sr, ok := s.reader.(StatusReader); ok {
		read = sr.ReadStatuses // only the statuses are shown
	}
	if err := read(r.Context(), viewer, ids, rb.views); err != nil {
		return err
	}
	b := append(rb.out, '{')
	for i := range rb.views {
		if i > 0 {
			b = append(b, ',')
		}
		b = wire.AppendString(b, ids[i])
		b = append(b, ':')
		b = wire.AppendStatus(b, &rb.views[i])
	}
	b = append(b, "}\n"...)
	rb.out = b
	writeJSON(w, http.StatusOK, b)
	return nil
}

// presenceGet serves GET /v1/presence/{user_id}.
func (s *Server) presenceGet(w http.ResponseWriter, r *http.Request) error {
	p, err := s.principal(r)
	if err != nil {
		return err
	}
	id := r.PathValue("user_id")
	if err := checkID("user_id", id); err != nil {
		return err
	}
	viewer, err := s.readViewer(w, r, p)
	if err != nil {
		return err
	}
	return s.writeOne(w, r, viewer, id)
}

func (s *Server) writeOne(w http.ResponseWriter, r *http.Request, viewer, id string) error {
	var views [1]privacy.View
	if err := s.readViews(r.Context(), viewer, []string{id}, views[:]); err != nil {
		return err
	}
	b := wire.AppendView(make([]byte, 0, 256), &views[0])
	writeJSON(w, http.StatusOK, append(b, '\n'))
	return nil
}

// presenceBatch serves POST /v1/presence/batch {"user_ids":[…],"viewer_id":"…"}
// as {"<id>":{view}, …}.
func (s *Server) presenceBatch(w http.ResponseWriter, r *http.Request) error {
	p, err := s.principal(r)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	sc := getIDScratch()
	defer putIDScratch(sc)
	req, err := decodeBatch(body, sc)
	if err != nil {
		return err
	}
	viewer, err := s.viewer(w, r, p, req.ViewerID)
	if err != nil {
		return err
	}
	rb := getReadBuf(len(req.UserIDs))
	defer putReadBuf(rb)
	if err := s.readViews(r.Context(), viewer, req.UserIDs, rb.views); err != nil {
		return err
	}
	b := append(rb.out, '{')
	for i := range rb.views {
		if i > 0 {
			b = append(b, ',')
		}
		b = wire.AppendString(b, req.UserIDs[i])
		b = append(b, ':')
		b = wire.AppendView(b, &rb.views[i])
	}
	b = append(b, "}\n"...)
	rb.out = b
	writeJSON(w, http.StatusOK, b)
	return nil
}

// publicGet serves the everyone-view of one user to anybody, cacheable by
// a CDN for profile pages.
func (s *Server) publicGet(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("user_id")
	if err := checkID("user_id", id); err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "public, max-age=30")
	return s.writeOne(w, r, "", id)
}

// heartbeat serves POST /v1/heartbeat {"user_id","device_id","active"}.
func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) error {
	active := true
	_, user, dev, err := s.deviceRequest(w, r, func(body []byte) (string, string, error) {
		req, err := decodeHeartbeat(body)
		active = req.Active == nil || *req.Active
		return req.UserID, req.DeviceID, err
	})
	if err != nil {
		return err
	}
	if hr, ok := s.tracker.(HeartbeatReader); ok {
		var snap presence.Snapshot
		_, read, err := hr.HeartbeatRead(r.Context(), user, dev, active, &snap)
		if err != nil {
			return err
		}
		if read {
			v := privacy.Filter(privacy.Relation{Self: true}, &snap)
			s.writeView(w, &v, dev)
			return nil
		}
	} else if _, err := s.tracker.Heartbeat(r.Context(), user, dev, active); err != nil {
		return err
	}
	return s.writeRecorded(w, r, user, dev)
}

// deviceRequest authenticates and decodes a request about one device of
// one user, and resolves who may act for which device. It returns who is
// calling too.
func (s *Server) deviceRequest(w http.ResponseWriter, r *http.Request, decode func([]byte) (user, dev string, err error)) (auth.Principal, string, string, error) {
	p, err := s.principal(r)
	if err != nil {
		return p, "", "", err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return p, "", "", err
	}
	claimedUser, claimedDev, err := decode(body)
	if err != nil {
		return p, "", "", err
	}
	user, err := s.actor(r, p, claimedUser)
	if err != nil {
		return p, "", "", err
	}
	dev, err := device(p, claimedDev)
	if err != nil {
		return p, "", "", err
	}
	return p, user, dev, nil
}

// writeRecorded answers a heartbeat or bye that the tracker took with
// writeSelf. If the user's own view cannot be read because a backend is
// unavailable (PostgreSQL down, the user's profile unknown: the tracker
// holds the beat until it can load it), the operation still stands: the
// answer is 200 with the view's fields null.
func (s *Server) writeRecorded(w http.ResponseWriter, r *http.Request, user, dev string) error {
	err := s.writeSelf(w, r, user, dev)
	if err != nil && tracker.Unavailable(err) {
		s.log.Warn("a heartbeat was recorded but the user's own view cannot be read now", "user_id", user, "err", err)
		s.writeView(w, &privacy.View{UserID: user}, dev)
		return nil
	}
	return err
}

// writeSelf answers a write with the user's own view and the timing the
// client should keep.
func (s *Server) writeSelf(w http.ResponseWriter, r *http.Request, user, dev string) error {
	var views [1]privacy.View
	if err := s.reader.Read(r.Context(), user, []string{user}, views[:]); err != nil {
		return err
	}
	s.writeView(w, &views[0], dev)
	return nil
}

func (s *Server) writeView(w http.ResponseWriter, v *privacy.View, dev string) {
	b := wire.AppendView(make([]byte, 0, 320), v)
	b = b[:len(b)-1] // reopen the object
	if dev != "" {
		b = append(b, `,"device_id":`...)
		b = wire.AppendString(b, dev)
	}
	b = append(b, `,"ttl_ms":`...)
	b = strconv.AppendInt(b, s.rules.TTL.Milliseconds(), 10)
	b = append(b, `,"heartbeat_interval_ms":`...)
	b = strconv.AppendInt(b, presence.HTTPBeatInterval(s.rules.TTL).Milliseconds(), 10)
	b = append(b, "}\n"...)
	writeJSON(w, http.StatusOK, b)
}

// status serves POST /v1/status {"user_id","status","text"}. "online"
// clears a manual status; an absent text clears the status text.
func (s *Server) status(w http.ResponseWriter, r *http.Request) error {
	p, err := s.principal(r)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	req, m, err := decodeStatus(body)
	if err != nil {
		return err
	}
	user, err := s.actor(r, p, req.UserID)
	if err != nil {
		return err
	}
	if err := s.limit(w, p, s.writes.Status, "status changes"); err != nil {
		return err
	}
	text := ""
	if req.Text != nil {
		text = *req.Text
	}
	if _, err := s.tracker.SetStatus(r.Context(), user, m, text); err != nil {
		return err
	}
	return s.writeSelf(w, r, user, "")
}

// bye serves POST /v1/bye {"user_id","device_id"}: the device ends at once.
func (s *Server) bye(w http.ResponseWriter, r *http.Request) error {
	_, user, dev, err := s.deviceRequest(w, r, func(body []byte) (string, string, error) {
		req, err := decodeBye(body)
		return req.UserID, req.DeviceID, err
	})
	if err != nil {
		return err
	}
	if _, err := s.tracker.Bye(r.Context(), user, dev); err != nil {
		return err
	}
	return s.writeRecorded(w, r, user, dev)
}

// account authenticates a call on /v1/users/{user_id}/… and returns the
// user and who is calling.
func (s *Server) account(r *http.Request) (string, auth.Principal, error) {
	user := r.PathValue("user_id")
	if err := checkID("user_id", user); err != nil {
		return "", auth.Principal{}, err
	}
	p, err := s.principal(r)
	if err != nil {
		return "", p, err
	}
	return user, p, s.self(r, p, user)
}

func writeSettings(w http.ResponseWriter, set presence.Settings) {
	b := []byte(`{"status_visibility":"` + set.Status.String() + `","last_seen_visibility":"` + set.LastSeen.String() + "\"}\n")
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) settingsGet(w http.ResponseWriter, r *http.Request) error {
	user, _, err := s.account(r)
	if err != nil {
		return err
	}
	set, err := s.tracker.Settings(r.Context(), user)
	if err != nil {
		return err
	}
	writeSettings(w, set)
	return nil
}

func (s *Server) settingsPut(w http.ResponseWriter, r *http.Request) error {
	user, p, err := s.account(r)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	set, err := decodeSettings(body)
	if err != nil {
		return err
	}
	if err := s.limit(w, p, s.writes.Settings, "changes of settings"); err != nil {
		return err
	}
	if err := s.tracker.SetSettings(r.Context(), user, set); err != nil {
		return err
	}
	writeSettings(w, set)
	return nil
}

func (s *Server) writeContacts(w http.ResponseWriter, r *http.Request, user string) error {
	list, err := s.contacts.Contacts(r.Context(), user)
	if err != nil {
		return err
	}
	b := append(make([]byte, 0, 32+len(list)*16), `{"contacts":[`...)
	for i, c := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = wire.AppendString(b, c)
	}
	b = append(b, "]}\n"...)
	writeJSON(w, http.StatusOK, b)
	return nil
}

func (s *Server) contactsGet(w http.ResponseWriter, r *http.Request) error {
	user, _, err := s.account(r)
	if err != nil {
		return err
	}
	return s.writeContacts(w, r, user)
}

func (s *Server) contactsPut(w http.ResponseWriter, r *http.Request) error {
	return s.contactsWrite(w, r, false)
}

func (s *Server) contactsAdd(w http.ResponseWriter, r *http.Request) error {
	return s.contactsWrite(w, r, true)
}

func (s *Server) contactsWrite(w http.ResponseWriter, r *http.Request, add bool) error {
	user, p, err := s.account(r)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	list, err := decodeContacts(body)
	if err != nil {
		return err
	}
	if err := s.limit(w, p, s.writes.Contacts, "changes of the contact list"); err != nil {
		return err
	}
	if add {
		err = s.contacts.AddContacts(r.Context(), user, list)
	} else {
		err = s.contacts.SetContacts(r.Context(), user, list)
	}
	if err != nil {
		return err
	}
	s.contactsChanged(user)
	return s.writeContacts(w, r, user)
}

func (s *Server) contactAdd(w http.ResponseWriter, r *http.Request) error {
	return s.contactOne(w, r, true)
}

func (s *Server) contactRemove(w http.ResponseWriter, r *http.Request) error {
	return s.contactOne(w, r, false)
}

func (s *Server) contactOne(w http.ResponseWriter, r *http.Request, add bool) error {
	user, p, err := s.account(r)
	if err != nil {
		return err
	}
	c := r.PathValue("contact_id")
	if err := checkID("contact_id", c); err != nil {
		return err
	}
	if err := s.limit(w, p, s.writes.Contacts, "changes of the contact list"); err != nil {
		return err
	}
	if add {
		err = s.contacts.AddContacts(r.Context(), user, []string{c})
	} else {
		err = s.contacts.RemoveContacts(r.Context(), user, []string{c})
	}
	if err != nil {
		return err
	}
	s.contactsChanged(user)
	return s.writeContacts(w, r, user)
}

// contactsChanged tells the hook that owner's contact list changed.
func (s *Server) contactsChanged(owner string) {
	if s.onContactsChanged != nil {
		s.onContactsChanged(owner)
	}
}

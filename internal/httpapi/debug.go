package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/wire"
)

type debugDevice struct {
	DeviceID   string  `json:"device_id"`
	LastBeat   string  `json:"last_beat"`
	LastActive *string `json:"last_active"` // null: never, or held active by its owner
	ExpiresAt  *string `json:"expires_at"`  // null: owned (its owner ends it)
	Alive      bool    `json:"alive"`
	Active     bool    `json:"active"`
	// Owner is the lease of the node that holds the device's socket and
	// keeps its deadline (scale-out), omitted if none.
	Owner uint64 `json:"owner,omitempty"`
}

type debugView struct {
	UserID         string        `json:"user_id"`
	Now            string        `json:"now"`
	InMemory       bool          `json:"in_memory"`
	Known          bool          `json:"known"`
	Status         string        `json:"status"`
	PublicStatus   string        `json:"public_status"`
	Reason         string        `json:"reason"`
	ManualStatus   *string       `json:"manual_status"`
	StatusText     string        `json:"status_text"`
	LastSeen       *string       `json:"last_seen"`
	PublicLastSeen *string       `json:"public_last_seen"`
	Version        uint64        `json:"version"`
	NextDeadline   *string       `json:"next_deadline"`
	Devices        []debugDevice `json:"devices"`
	Settings       struct {
		Status   string `json:"status_visibility"`
		LastSeen string `json:"last_seen_visibility"`
	} `json:"settings"`
	Rules struct {
		TTLms       int64 `json:"ttl_ms"`
		IdleAfterMs int64 `json:"idle_after_ms"`
	} `json:"rules"`
	// Viewer is what the viewer named by ?viewer_id= sees of the user and
	// why; omitted without one.
	Viewer *debugViewer `json:"viewer,omitempty"`
}

// debugViewer is one viewer's view of the user (GET
// /v1/debug/users/{user_id}?viewer_id=…): exactly what a read by that
// viewer answers, the relation it was filtered by, and why.
type debugViewer struct {
	ViewerID string `json:"viewer_id"`
	// Relation is "self", "contact" (the viewer is in the user's contact
	// list) or "other".
	Relation string          `json:"relation"`
	Sees     json.RawMessage `json:"sees"` // the view, as GET /v1/presence/{user_id} answers it
	Why      string          `json:"why"`
}

func optTime(ms int64) *string {
	if ms == 0 {
		return nil
	}
	s := wire.FormatTime(ms)
	return &s
}

// debugUser serves GET /v1/debug/users/{user_id}: why a user shows what it
// shows. API key only: it is the unfiltered truth.
func (s *Server) debugUser(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("user_id")
	if err := checkID("user_id", id); err != nil {
		return err
	}
	p, err := s.principal(r)
	if err != nil {
		return err
	}
	if err := s.backendOnly(r, p); err != nil {
		return err
	}
	viewer, err := queryParam(r, "viewer_id")
	if err != nil {
		return err
	}
	if err := optionalID("viewer_id", viewer); err != nil {
		return err
	}
	// The store's own schedule for the user (the second value) is when
	// its sweep looks at the user next, which may be earlier than any
	// change: a beat moves a deadline later without rescheduling.
	u, _, inMem, err := s.tracker.Debug(r.Context(), id)
	if err != nil {
		return err
	}
	known := inMem
	if !inMem {
		err := s.profiles.LoadProfiles(r.Context(), []string{id}, func(p *presence.Profile) {
			u = *presence.NewUser(*p)
			known = true
		})
		if err != nil {
			return err
		}
	}
	now := s.clock.Now().UnixMilli()
	rules := &s.rules
	st := u.Status(rules, now)
	v := debugView{
		UserID:         id,
		Now:            wire.FormatTime(now),
		InMemory:       inMem,
		Known:          known,
		Status:         st.String(),
		PublicStatus:   st.Public().String(),
		StatusText:     u.Text,
		LastSeen:       optTime(u.LastSeen),
		PublicLastSeen: optTime(u.PubLastSeen),
		Version:        u.Version,
		NextDeadline:   optTime(u.Deadline(rules, now)),
		Devices:        []debugDevice{},
	}
	if u.Manual != presence.ManualNone {
		m := u.Manual.String()
		v.ManualStatus = &m
	}
	v.Settings.Status = u.Settings.Status.String()
	v.Settings.LastSeen = u.Settings.LastSeen.String()
	v.Rules.TTLms = rules.TTL.Milliseconds()
	v.Rules.IdleAfterMs = rules.IdleAfter.Milliseconds()
	var newest int64
	alive := 0
	for _, d := range u.Devices {
		end := rules.End(&d)
		dd := debugDevice{
			DeviceID: d.ID,
			LastBeat: wire.FormatTime(d.LastBeat),
			Alive:    now < end,
			Owner:    d.Owner,
		}
		if d.LastActive < presence.Forever {
			dd.LastActive = optTime(d.LastActive)
		}
		if end < presence.Forever {
			dd.ExpiresAt = optTime(end)
		}
		dd.Active = dd.Alive && d.LastActive > 0 && now < d.LastActive+rules.IdleAfter.Milliseconds()
		if dd.Alive {
			alive++
			newest = max(newest, d.LastActive)
		}
		v.Devices = append(v.Devices, dd)
	}
	switch {
	case !known:
		v.Reason = "never seen: no device and no durable record"
	case alive == 0:
		v.Reason = "offline: no device has beaten within the ttl"
	case u.Manual == presence.ManualInvisible:
		v.Reason = fmt.Sprintf("invisible by choice: %d device(s) alive, everyone else sees offline with last_seen frozen", alive)
	case u.Manual != presence.ManualNone:
		v.Reason = fmt.Sprintf("manual status %s with %d device(s) alive", u.Manual, alive)
	case st == presence.Online:
		v.Reason = fmt.Sprintf("online: a device was active %s ago (idle after %s)", time.Duration(now-newest)*time.Millisecond, rules.IdleAfter)
	default:
		v.Reason = fmt.Sprintf("away: %d device(s) alive but no activity within %s", alive, rules.IdleAfter)
	}
	if viewer != "" {
		if v.Viewer, err = s.debugViewer(r, id, viewer, &u); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(b, '\n'))
	return nil
}

// debugViewer reads user as viewer would (the same read, so the same
// privacy filter and, on a scale-out node, the same replica) and says why it sees that, from the user's settings u
// and whether viewer is in the user's contact list.
func (s *Server) debugViewer(r *http.Request, user, viewer string, u *presence.User) (*debugViewer, error) {
	var views [1]privacy.View
	if err := s.readViews(r.Context(), viewer, []string{user}, views[:]); err != nil {
		return nil, err
	}
	dv := &debugViewer{ViewerID: viewer, Relation: "other", Sees: wire.AppendView(nil, &views[0])}
	if viewer == user {
		dv.Relation = "self"
		dv.Why = fmt.Sprintf("%s looks at themselves: everything is shown as it is (an invisible user sees invisible)", user)
		return dv, nil
	}
	contacts, err := s.contacts.Contacts(r.Context(), user)
	if err != nil {
		return nil, err
	}
	who := fmt.Sprintf("%s is not in %s's contact list", viewer, user)
	if slices.Contains(contacts, viewer) {
		dv.Relation = "contact"
		who = fmt.Sprintf("%s is in %s's contact list", viewer, user)
	}
	set := &u.Settings
	why := []string{fmt.Sprintf("%s shows their status to %s and their last seen to %s; %s",
		user, visibleTo(set.Status), visibleTo(set.LastSeen), who)}
	v := &views[0]
	switch {
	case !v.StatusVisible:
		why = append(why, fmt.Sprintf("so %s sees no status (null) and no last seen", viewer))
	case u.Manual == presence.ManualInvisible:
		why = append(why, fmt.Sprintf("%s may see the status, but %s is invisible: %s sees offline, last seen frozen where they vanished", viewer, user, viewer))
	default:
		why = append(why, fmt.Sprintf("so %s sees %s", viewer, v.Status))
		switch {
		case v.LastSeenVisible:
		case u.PubLastSeen == 0:
			why = append(why, "and no last seen: never seen")
		default:
			why = append(why, "and no last seen: it is not shown to "+viewer)
		}
	}
	dv.Why = strings.Join(why, ", ")
	return dv, nil
}

// visibleTo names whom a visibility shows something to.
func visibleTo(v presence.Visibility) string {
	switch v {
	case presence.Everyone:
		return "everyone"
	case presence.Contacts:
		return "their contacts"
	}
	return "nobody"
}

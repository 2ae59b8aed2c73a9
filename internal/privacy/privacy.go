// Package privacy is the one filter every exit of presence goes through:
// single and batch reads, subscription snapshots, live events and streams.
// Given who is looking at whom and the true state, it returns exactly what
// that viewer may see. It is pure and safe for concurrent use.
package privacy

import "github.com/presenced/presenced/internal/presence"

// Relation is how the viewer stands to the target.
type Relation struct {
	Self    bool // the viewer is the target
	Contact bool // the viewer is in the target's contact list
}

// View is what one viewer may see of one user. A field that is not Visible
// reads as null on the wire.
type View struct {
	UserID          string
	StatusVisible   bool
	Status          presence.Status // never Invisible unless Self
	Text            string          // only with the status
	Devices         int             // only with the status
	Version         uint64          // only with the status
	LastSeenVisible bool            // false also when the user was never seen
	LastSeen        int64           // Unix ms
}

// allows reports whether a viewer in relation rel passes visibility v.
func allows(v presence.Visibility, rel Relation) bool {
	switch v {
	case presence.Everyone:
		return true
	case presence.Contacts:
		return rel.Contact || rel.Self
	}
	return rel.Self
}

// Filter returns what a viewer in relation rel may see of the true state s.
// An invisible user reads exactly like one who really went offline: status
// offline, no devices, last_seen, status text and version frozen where
// they vanished (the public face: Snapshot.Public).
func Filter(rel Relation, s *presence.Snapshot) View {
	v := View{UserID: s.UserID}
	if rel.Self {
		v.StatusVisible = true
		v.Status = s.Status
		v.Text = s.Text
		v.Devices = s.Devices
		v.Version = s.Version
		v.LastSeen = s.LastSeen
		v.LastSeenVisible = s.LastSeen != 0
		return v
	}
	if allows(s.Settings.Status, rel) {
		v.StatusVisible = true
		v.Status = s.Status.Public()
		v.Text, v.Version = s.Public()
		if v.Status != presence.Offline {
			v.Devices = s.Devices
		}
	}
	// last_seen moves with every heartbeat while a user is online, so it
	// would give a hidden status away: it is shown only to viewers who may
	// see the status as well.
	if allows(s.Settings.LastSeen, rel) && allows(s.Settings.Status, rel) && s.PubLastSeen != 0 {
		v.LastSeenVisible = true
		v.LastSeen = s.PubLastSeen
	}
	return v
}

// NeedsContact reports whether Filter's answer for a non-self viewer
// depends on the contact relation, so readers look the relation up only
// when it matters.
func NeedsContact(s *presence.Settings) bool {
	return s.Status == presence.Contacts || s.LastSeen == presence.Contacts
}

// FilterEvent returns what a viewer in relation rel may see of a change
// event, and false if the viewer may see nothing of it (the status is
// hidden from them, or the change is one only the user sees:
// Event.SelfOnly). The settings are the target's. The user themselves see
// their own status and text as they are (Event.SelfView: invisible
// included) and the public last_seen.
func FilterEvent(rel Relation, set *presence.Settings, ev *presence.Event) (View, bool) {
	if ev.SelfOnly && !rel.Self {
		return View{UserID: ev.UserID}, false
	}
	s := presence.Snapshot{
		UserID:      ev.UserID,
		Known:       true,
		Status:      ev.Status,
		Text:        ev.Text,
		PubLastSeen: ev.LastSeen,
		LastSeen:    ev.LastSeen,
		Version:     ev.Version,
		Settings:    *set,
	}
	if rel.Self {
		s.Status, s.Text = ev.SelfView()
	}
	v := Filter(rel, &s)
	return v, v.StatusVisible
}

// Delivery is what one watcher in relation rel is sent of ev: the view,
// and whether anything at all is sent. A watcher who may see the status
// gets the new view — for an event that changed only the settings, only
// if its view under the settings before differs; one who could see the
// status before a change of settings and no longer can gets a view with
// the status hidden (its Version still set); anyone else gets
// nothing.
func Delivery(rel Relation, ev *presence.Event) (View, bool) {
	v, ok := FilterEvent(rel, &ev.Settings, ev)
	if !ev.SettingsChanged {
		return v, ok
	}
	if ok && !ev.SettingsOnly {
		return v, true // the state changed too
	}
	before := ev.Before()
	old, _ := FilterEvent(rel, &before, ev)
	return Reveal(old, v, ev.Version)
}

// Reveal is what a watcher is sent when only who may see the user changed
// (settings, a contact list), its view going from old to now: now if the
// status is visible and the view differs, the status hidden at version if
// it was visible and no longer is, nothing otherwise.
func Reveal(old, now View, version uint64) (View, bool) {
	switch {
	case now.StatusVisible:
		return now, old != now
	case old.StatusVisible:
		return View{UserID: now.UserID, Version: version}, true
	}
	return now, false
}

// Wider returns, field by field, the settings of a and b that let more
// viewers see: a viewer who may see under either may see under it.
func Wider(a, b presence.Settings) presence.Settings {
	return presence.Settings{Status: min(a.Status, b.Status), LastSeen: min(a.LastSeen, b.LastSeen)}
}

package privacy_test

import (
	"fmt"
	"testing"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
)

var visibilities = []presence.Visibility{presence.Everyone, presence.Contacts, presence.Nobody}

var relations = []struct {
	name string
	rel  privacy.Relation
}{
	{"stranger", privacy.Relation{}},
	{"contact", privacy.Relation{Contact: true}},
	{"self", privacy.Relation{Self: true}},
	{"self listed as own contact", privacy.Relation{Self: true, Contact: true}},
}

// states are true states of one user, each with what others should see.
var states = []struct {
	name      string
	snap      presence.Snapshot
	pubStatus presence.Status
	pubDevs   int
}{
	{"online", presence.Snapshot{UserID: "u", Known: true, Status: presence.Online, Text: "hi",
		LastSeen: 5000, PubLastSeen: 5000, Devices: 2, Version: 7}, presence.Online, 2},
	{"busy", presence.Snapshot{UserID: "u", Known: true, Status: presence.Busy, Manual: presence.ManualBusy,
		LastSeen: 5000, PubLastSeen: 5000, Devices: 1, Version: 8}, presence.Busy, 1},
	{"away", presence.Snapshot{UserID: "u", Known: true, Status: presence.Away,
		LastSeen: 5000, PubLastSeen: 5000, Devices: 1, Version: 9}, presence.Away, 1},
	{"invisible", presence.Snapshot{UserID: "u", Known: true, Status: presence.Invisible, Manual: presence.ManualInvisible,
		Text: "shh", LastSeen: 9000, PubLastSeen: 2000, Devices: 3, Version: 4}, presence.Offline, 0},
	{"offline", presence.Snapshot{UserID: "u", Known: true, Status: presence.Offline,
		LastSeen: 1000, PubLastSeen: 1000, Version: 3}, presence.Offline, 0},
	{"never seen", presence.Snapshot{UserID: "u"}, presence.Offline, 0},
}

// allowed is the contract: everyone sees, contacts see if listed, nobody
// sees nothing; the user always sees itself.
func allowed(v presence.Visibility, rel privacy.Relation) bool {
	return rel.Self || v == presence.Everyone || (v == presence.Contacts && rel.Contact)
}

// lastSeenAllowed: last_seen is shown only to a viewer who may see the
// status too, because a last_seen that moves with every heartbeat would
// give a hidden status away.
func lastSeenAllowed(s presence.Settings, rel privacy.Relation) bool {
	return allowed(s.LastSeen, rel) && allowed(s.Status, rel)
}

func TestFilterMatrix(t *testing.T) {
	for _, st := range states {
		for _, sv := range visibilities {
			for _, lv := range visibilities {
				for _, r := range relations {
					name := fmt.Sprintf("%s/status=%s,last_seen=%s/%s", st.name, sv, lv, r.name)
					t.Run(name, func(t *testing.T) {
						s := st.snap
						s.Settings = presence.Settings{Status: sv, LastSeen: lv}
						got := privacy.Filter(r.rel, &s)

						want := privacy.View{UserID: "u"}
						if allowed(sv, r.rel) {
							want.StatusVisible = true
							want.Text = s.Text
							want.Version = s.Version
							if r.rel.Self {
								want.Status, want.Devices = s.Status, s.Devices
							} else {
								want.Status, want.Devices = st.pubStatus, st.pubDevs
							}
						}
						last := s.PubLastSeen
						if r.rel.Self {
							last = s.LastSeen
						}
						if lastSeenAllowed(s.Settings, r.rel) && last != 0 {
							want.LastSeenVisible, want.LastSeen = true, last
						}
						if got != want {
							t.Errorf("got %+v, want %+v", got, want)
						}
						// Invariants that hold whatever the oracle says.
						if !r.rel.Self && got.Status == presence.Invisible {
							t.Errorf("invisible leaked to a non-self viewer")
						}
						if !got.StatusVisible && (got.Status != presence.Offline || got.Text != "" || got.Devices != 0 || got.Version != 0) {
							t.Errorf("hidden status leaks details: %+v", got)
						}
						if !got.LastSeenVisible && got.LastSeen != 0 {
							t.Errorf("hidden last_seen leaks its value: %+v", got)
						}
						if !got.StatusVisible && got.LastSeenVisible {
							t.Errorf("last_seen shown with the status hidden: %+v", got)
						}
					})
				}
			}
		}
	}
}

// TestFilterInvisibleIsOffline checks that to anybody but the user, an
// invisible user is indistinguishable from one who went offline at the
// moment they vanished.
func TestFilterInvisibleIsOffline(t *testing.T) {
	inv := presence.Snapshot{UserID: "u", Known: true, Status: presence.Invisible, Manual: presence.ManualInvisible,
		LastSeen: 9000, PubLastSeen: 2000, Devices: 2, Version: 4}
	off := presence.Snapshot{UserID: "u", Known: true, Status: presence.Offline, Manual: presence.ManualInvisible,
		LastSeen: 2000, PubLastSeen: 2000, Version: 4}
	for _, r := range relations {
		if r.rel.Self {
			continue
		}
		for _, sv := range visibilities {
			for _, lv := range visibilities {
				inv.Settings = presence.Settings{Status: sv, LastSeen: lv}
				off.Settings = inv.Settings
				if a, b := privacy.Filter(r.rel, &inv), privacy.Filter(r.rel, &off); a != b {
					t.Errorf("%s, %s/%s: invisible %+v, offline %+v", r.name, sv, lv, a, b)
				}
			}
		}
	}
}

// TestLastSeenNeedsStatus: a viewer kept from the status never gets the
// last_seen either, whatever last_seen_visibility says, since a last_seen
// that follows every heartbeat would tell them the hidden status. For a
// viewer who may not see the status, an online user, an invisible one and
// one offline for an hour all read the same: nothing at all.
func TestLastSeenNeedsStatus(t *testing.T) {
	for _, st := range states {
		for _, sv := range visibilities {
			for _, r := range relations {
				if allowed(sv, r.rel) {
					continue
				}
				for _, lv := range visibilities {
					s := st.snap
					s.Settings = presence.Settings{Status: sv, LastSeen: lv}
					got := privacy.Filter(r.rel, &s)
					if want := (privacy.View{UserID: "u"}); got != want {
						t.Errorf("%s, status=%s last_seen=%s, %s: got %+v, want only the id", st.name, sv, lv, r.name, got)
					}
				}
			}
		}
	}
	// Self always sees everything, whatever the settings.
	s := states[0].snap
	s.Settings = presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	if got := privacy.Filter(privacy.Relation{Self: true}, &s); !got.StatusVisible || !got.LastSeenVisible || got.LastSeen != s.LastSeen {
		t.Errorf("self with everything hidden: got %+v, want status and last_seen", got)
	}
	// Seeing the status does not by itself give the last_seen.
	s.Settings = presence.Settings{Status: presence.Everyone, LastSeen: presence.Nobody}
	if got := privacy.Filter(privacy.Relation{Contact: true}, &s); !got.StatusVisible || got.LastSeenVisible {
		t.Errorf("status everyone, last_seen nobody: got %+v, want the status only", got)
	}
}

func TestNeedsContact(t *testing.T) {
	for _, sv := range visibilities {
		for _, lv := range visibilities {
			s := presence.Settings{Status: sv, LastSeen: lv}
			want := sv == presence.Contacts || lv == presence.Contacts
			if got := privacy.NeedsContact(&s); got != want {
				t.Errorf("%s/%s: got %v, want %v", sv, lv, got, want)
			}
			// And it is right: where it says no, the contact relation
			// changes nothing.
			if !want {
				snap := states[0].snap
				snap.Settings = s
				a := privacy.Filter(privacy.Relation{}, &snap)
				b := privacy.Filter(privacy.Relation{Contact: true}, &snap)
				if a != b {
					t.Errorf("%s/%s: contact changes the view though NeedsContact is false", sv, lv)
				}
			}
		}
	}
}

func TestFilterEvent(t *testing.T) {
	events := []struct {
		name string
		ev   presence.Event
	}{
		{"came online", presence.Event{UserID: "u", Status: presence.Online, Prev: presence.Offline, LastSeen: 5000, Version: 10, At: 5000}},
		{"went offline", presence.Event{UserID: "u", Status: presence.Offline, Prev: presence.Busy, Text: "bye", LastSeen: 6000, Version: 11, At: 36000}},
		{"text change", presence.Event{UserID: "u", Status: presence.Busy, Prev: presence.Busy, Text: "new", LastSeen: 7000, Version: 12, At: 7000}},
	}
	for _, e := range events {
		for _, sv := range visibilities {
			for _, lv := range visibilities {
				for _, r := range relations {
					t.Run(fmt.Sprintf("%s/%s,%s/%s", e.name, sv, lv, r.name), func(t *testing.T) {
						set := presence.Settings{Status: sv, LastSeen: lv}
						got, ok := privacy.FilterEvent(r.rel, &set, &e.ev)
						if want := allowed(sv, r.rel); ok != want {
							t.Fatalf("visible: got %v, want %v", ok, want)
						}
						if !ok {
							return
						}
						want := privacy.View{UserID: "u", StatusVisible: true, Status: e.ev.Status, Text: e.ev.Text, Version: e.ev.Version}
						if lastSeenAllowed(set, r.rel) {
							want.LastSeenVisible, want.LastSeen = true, e.ev.LastSeen
						}
						if got != want {
							t.Errorf("got %+v, want %+v", got, want)
						}
					})
				}
			}
		}
	}
	// The user themselves see their true status (invisible), whatever
	// their settings; everyone else sees offline.
	ev := presence.Event{UserID: "u", Status: presence.Offline, Prev: presence.Online, LastSeen: 1, Version: 2, Self: presence.Invisible}
	set := presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	got, ok := privacy.FilterEvent(privacy.Relation{Self: true}, &set, &ev)
	if !ok || got.Status != presence.Invisible || !got.LastSeenVisible {
		t.Errorf("self event: got %+v, %v", got, ok)
	}
	set = presence.Settings{}
	if got, _ := privacy.FilterEvent(privacy.Relation{Contact: true}, &set, &ev); got.Status != presence.Offline {
		t.Errorf("a contact sees %v of an invisible user, want offline", got.Status)
	}
	// An event whose true status contradicts its public one (or does not
	// say: an older node's) shows the public status to the user too.
	ev = presence.Event{UserID: "u", Status: presence.Busy, Prev: presence.Online, LastSeen: 1, Version: 2}
	if got, _ := privacy.FilterEvent(privacy.Relation{Self: true}, &set, &ev); got.Status != presence.Busy {
		t.Errorf("self event without Self: got %v, want busy", got.Status)
	}
}

// TestDelivery: a change of settings sends each watcher its new view only
// where it changed — the status where sight was gained, a hidden view with
// the new version where it was lost — and nothing to anyone else, so
// nobody whose view stays learns that a setting changed.
func TestDelivery(t *testing.T) {
	state := presence.Event{UserID: "u", Status: presence.Busy, Prev: presence.Busy, Text: "t", LastSeen: 5000, Version: 20, Self: presence.Busy}
	for _, before := range settingsAll() {
		for _, after := range settingsAll() {
			for _, r := range relations {
				ev := state
				ev.Settings, ev.PrevSettings, ev.SettingsChanged, ev.SettingsOnly = after, before, true, true
				name := fmt.Sprintf("%+v→%+v/%s", before, after, r.name)
				got, send := privacy.Delivery(r.rel, &ev)
				old, oldOK := privacy.FilterEvent(r.rel, &before, &ev)
				now, nowOK := privacy.FilterEvent(r.rel, &after, &ev)
				switch {
				case nowOK && (!oldOK || old != now):
					if !send || got != now {
						t.Errorf("%s: got %+v, %v; want the new view %+v", name, got, send, now)
					}
				case !nowOK && oldOK:
					if !send || got.StatusVisible || got.LastSeenVisible || got.Version != 20 {
						t.Errorf("%s: got %+v, %v; want the status hidden at version 20", name, got, send)
					}
				default:
					if send {
						t.Errorf("%s: sent %+v to a watcher whose view did not change", name, got)
					}
				}
				// The same settings change merged with a change of state
				// (a queue that coalesced them): everyone who sees the
				// status gets it.
				ev.SettingsOnly = false
				got, send = privacy.Delivery(r.rel, &ev)
				if nowOK && (!send || got != now) {
					t.Errorf("%s with a state change: got %+v, %v; want %+v", name, got, send, now)
				}
				if !nowOK && send != oldOK {
					t.Errorf("%s with a state change: sent %v, want %v", name, send, oldOK)
				}
			}
		}
	}
	// An event that changed no setting is delivered as ever.
	ev := state
	ev.Settings = presence.Settings{Status: presence.Contacts}
	if _, send := privacy.Delivery(privacy.Relation{}, &ev); send {
		t.Error("a state change was sent to a stranger of a contacts-only user")
	}
	if v, send := privacy.Delivery(privacy.Relation{Contact: true}, &ev); !send || v.Status != presence.Busy {
		t.Errorf("a state change to a contact: got %+v, %v", v, send)
	}
}

func settingsAll() []presence.Settings {
	var out []presence.Settings
	for _, sv := range visibilities {
		for _, lv := range visibilities {
			out = append(out, presence.Settings{Status: sv, LastSeen: lv})
		}
	}
	return out
}

// TestInvisibleFaceFrozen: everyone but the user reads an invisible
// user's public face — the text and version of when they vanished —,
// the user their own; a change only the user sees reaches nobody else.
func TestInvisibleFaceFrozen(t *testing.T) {
	s := presence.Snapshot{UserID: "u", Known: true, Status: presence.Invisible, Manual: presence.ManualInvisible,
		Text: "gone fishing", LastSeen: 9000, PubLastSeen: 2000, Devices: 1, Version: 12, PubText: "lunch", PubVersion: 10}
	for _, r := range relations {
		v := privacy.Filter(r.rel, &s)
		want := privacy.View{UserID: "u", StatusVisible: true, Status: presence.Offline, Text: "lunch", Version: 10, LastSeenVisible: true, LastSeen: 2000}
		if r.rel.Self {
			want = privacy.View{UserID: "u", StatusVisible: true, Status: presence.Invisible, Text: "gone fishing", Devices: 1, Version: 12, LastSeenVisible: true, LastSeen: 9000}
		}
		if v != want {
			t.Errorf("%s reads %+v, want %+v", r.name, v, want)
		}
	}
	ev := presence.Event{UserID: "u", Status: presence.Offline, Prev: presence.Offline, Text: "lunch", LastSeen: 2000, Version: 12,
		Self: presence.Invisible, SelfText: "gone fishing", SelfOnly: true}
	for _, r := range relations {
		v, ok := privacy.Delivery(r.rel, &ev)
		switch {
		case r.rel.Self && (!ok || v.Text != "gone fishing" || v.Status != presence.Invisible || v.Version != 12):
			t.Errorf("%s is sent %+v (%v), want invisible %q at 12", r.name, v, ok, "gone fishing")
		case !r.rel.Self && ok:
			t.Errorf("%s is sent %+v of a change only the user sees", r.name, v)
		}
	}
	// An event everyone sees of an invisible user: the others the frozen
	// text, the user their own.
	ev.SelfOnly, ev.Version = false, 13
	if v, _ := privacy.Delivery(privacy.Relation{}, &ev); v.Text != "lunch" {
		t.Errorf("another viewer is sent text %q, want %q", v.Text, "lunch")
	}
	if v, _ := privacy.Delivery(privacy.Relation{Self: true}, &ev); v.Text != "gone fishing" {
		t.Errorf("the user is sent text %q, want %q", v.Text, "gone fishing")
	}
}

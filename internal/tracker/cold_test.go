package tracker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// errUnreachable is an error of a durable store that cannot serve for
// now, marked as the stores mark theirs.
type errUnreachable struct{}

func (errUnreachable) Error() string     { return "durable store unreachable" }
func (errUnreachable) Unavailable() bool { return true }

// TestColdLoadsFailFast: after one load found the durable store
// unavailable, the first beats of other users wait without asking it
// again (until Run's probe reaches it), and operations that need a
// profile fail at once as Unavailable.
func TestColdLoadsFailFast(t *testing.T) {
	d := newMemDurable(presence.Profile{UserID: "b", Manual: presence.ManualBusy, Version: 7})
	d.setFail("LoadProfiles", errUnreachable{})
	f := newOutageFixture(t, d, tracker.Config{ProbeInterval: time.Hour}).fixture
	for _, u := range []string{"a", "b", "c"} {
		f.beat(u, "d", true)
	}
	if n := d.calledTimes("LoadProfiles"); n != 1 {
		t.Errorf("LoadProfiles called %d times for three users while it fails, want 1 (then fail fast)", n)
	}
	// An operation that needs the profile now fails fast, as Unavailable.
	if _, err := f.tr.SetStatus(f.ctx, "a", presence.ManualAway, ""); !tracker.Unavailable(err) {
		t.Errorf("SetStatus while loads fail fast: %v, want Unavailable", err)
	}
	if n := d.calledTimes("LoadProfiles"); n != 1 {
		t.Errorf("LoadProfiles called %d times, want still 1", n)
	}
	f.wantEvents("while the durable store is down")
}

// TestColdRecovery plays the replay with a durable store that comes back:
// a bye ends a waiting device (never shown), a failed write of last_seen
// keeps that user waiting without holding up the others, and a
// non-transient load error still fails the heartbeat.
func TestColdRecovery(t *testing.T) {
	d := newMemDurable(presence.Profile{UserID: "b", Manual: presence.ManualBusy, Version: 7})
	d.setFail("LoadProfiles", errUnreachable{})
	f := newOutageFixture(t, d, tracker.Config{ProbeInterval: 5 * time.Millisecond}).fixture
	f.beat("a", "d", true)
	f.beat("b", "d", true)
	f.at(time.Second)
	f.beat("c", "d", true)
	f.bye("c", "d") // c came and went: never shown
	d.setFail("SaveLastSeen", errDown)
	d.setFail("LoadProfiles", nil)
	// c's last_seen cannot be written: c waits; a and b are loaded.
	testwait.For(t, "a and b loaded", func() bool { return f.tr.Stats().ProfilesLoaded == 2 })
	if n := f.tr.Stats().AwaitingProfile; n != 1 {
		t.Errorf("AwaitingProfile = %d, want 1 (c, whose last_seen waits)", n)
	}
	f.wantEvents("a and b loaded", "a offline→online seen=0s", "b offline→busy seen=0s")
	d.setFail("SaveLastSeen", nil)
	testwait.For(t, "c loaded", func() bool { return f.tr.Stats().AwaitingProfile == 0 })
	f.wantEvents("c's device ended while it waited")
	if p, _ := d.profile("c"); p.LastSeen != ms(time.Second) || p.PubLastSeen != ms(time.Second) {
		t.Errorf("c's durable last_seen %v, public %v; want 1s, 1s", offset(p.LastSeen), offset(p.PubLastSeen))
	}
	if s := f.read("b")[0]; s.Version <= 7 || s.Status != presence.Busy {
		t.Errorf("b after its load: %+v, want busy above version 7", s)
	}

	// A load that fails for another reason than an unavailable store is
	// an error, as before: nothing waits.
	d.setFail("LoadProfiles", errDown)
	if _, err := f.tr.Heartbeat(f.ctx, "e", "d", true); !errors.Is(err, errDown) || tracker.Unavailable(err) {
		t.Errorf("Heartbeat with a failing (not unavailable) load: %v, want %v", err, errDown)
	}
	if n := f.tr.Stats().AwaitingProfile; n != 0 {
		t.Errorf("AwaitingProfile = %d after a non-transient failure, want 0", n)
	}
}

// TestColdBound: at most MaxBuffered users wait for their profile; past
// that a first heartbeat is Unavailable, while the waiting users' beats
// and byes are still taken.
func TestColdBound(t *testing.T) {
	d := newMemDurable()
	d.setFail("LoadProfiles", errUnreachable{})
	f := newOutageFixture(t, d, tracker.Config{ProbeInterval: time.Hour, MaxBuffered: 2}).fixture
	f.beat("a", "d", true)
	f.beat("b", "d", true)
	if _, err := f.tr.Heartbeat(f.ctx, "c", "d", true); !tracker.Unavailable(err) {
		t.Errorf("a third waiting user: %v, want Unavailable", err)
	}
	f.beat("a", "d2", false)
	f.bye("b", "d")
	if n := f.tr.Stats().AwaitingProfile; n != 2 {
		t.Errorf("AwaitingProfile = %d, want 2", n)
	}
}

package tracker_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// run runs tr.Run until the test ends.
func run(t *testing.T, tr *tracker.Tracker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := tr.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// offlineOf returns the offline events of user among evs.
func offlineOf(evs []presence.Event, user string) []string {
	var out []string
	for _, e := range evs {
		if e.UserID == user && e.Status == presence.Offline {
			out = append(out, fmtEvents([]presence.Event{e})...)
		}
	}
	return out
}

// A socket closed without a bye ends its device when the close grace
// runs out by the tracker's clock, not at the next sweep tick (an hour
// away here): Run's timer wakes the sweep for it.
func TestCloseGraceEndsOnTimeEmbedded(t *testing.T) {
	r := rules
	r.CloseGrace = 150 * time.Millisecond
	f := newFixtureRules(t, newMemDurable(), clock.NewFake(start), tracker.Config{Rules: r, SweepInterval: time.Hour}, r)
	run(t, f.tr)
	f.beat("alice", "phone", true)
	f.pub.take()
	f.at(time.Second)
	if err := f.tr.Disconnect(f.ctx, "alice", "phone", ms(0)); err != nil {
		t.Fatal(err)
	}
	f.at(time.Second + 149*time.Millisecond)
	if s := f.get("alice"); s.Status != presence.Online {
		t.Fatalf("alice within her grace: %v", s.Status)
	}
	var got []presence.Event
	f.at(time.Second + 150*time.Millisecond)
	testwait.Forf(t, func() string { return "alice's offline event at the end of her grace" }, func() bool {
		got = append(got, f.pub.take()...)
		return len(offlineOf(got, "alice")) > 0
	})
	if evs := fmtEvents(got); strings.Join(evs, ";") != "alice online→offline seen=0s" {
		t.Errorf("events %v, want alice online→offline seen=0s", evs)
	}
}

// With the grace off a socket closed without a bye ends its device at the
// close, exactly as if a grace had run out then: a reconnect is a new
// arrival.
func TestNoCloseGraceEndsAtTheCloseEmbedded(t *testing.T) {
	r := rules
	r.CloseGrace = presence.NoCloseGrace
	f := newFixtureRules(t, newMemDurable(), clock.NewFake(start), tracker.Config{Rules: r, SweepInterval: time.Hour}, r)
	f.beat("alice", "phone", true)
	f.pub.take()
	f.at(time.Second)
	if err := f.tr.Disconnect(f.ctx, "alice", "phone", ms(0)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(fmtEvents(f.pub.take()), ";"); got != "alice online→offline seen=0s" {
		t.Errorf("at the close: %q, want alice online→offline seen=0s", got)
	}
	if s := f.get("alice"); s.Status != presence.Offline {
		t.Errorf("alice after the close: %v", s.Status)
	}
	f.at(time.Second + time.Millisecond)
	f.beat("alice", "phone", true)
	if got := strings.Join(fmtEvents(f.pub.take()), ";"); got != "alice offline→online seen=1.001s" {
		t.Errorf("the reconnect: %q, want alice offline→online seen=1.001s", got)
	}
}

// On a shared Redis the node that holds the socket ends the device: at
// the close with the grace off, when the grace runs out by its clock
// otherwise, without waiting for a sweep tick; the other node reads it
// offline.
func TestCloseGraceEndsOnTimeOwned(t *testing.T) {
	redis := testsvc.Redis(t)
	for _, tc := range []struct {
		name  string
		grace time.Duration
	}{{"off", presence.NoCloseGrace}, {"150ms", 150 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, redis)
			c.rules = leaseRules
			c.rules.CloseGrace = tc.grace
			c.tweak = func(cfg *tracker.Config) { cfg.SweepInterval = time.Hour }
			a, b := c.add(1), c.add(2)
			a.alive, b.alive = true, true
			a.socketConnect("bob", "pc")
			a.events()
			run(t, a.tr)
			c.at(500 * time.Millisecond)
			if err := a.tr.Disconnect(a.ctx, "bob", "pc", ms(0)); err != nil {
				t.Fatal(err)
			}
			if tc.grace > 0 {
				c.at(500*time.Millisecond + tc.grace - time.Millisecond)
				if s := b.read("bob")[0]; s.Status != presence.Online {
					t.Fatalf("node b reads bob within his grace: %+v", s)
				}
				c.at(500*time.Millisecond + tc.grace)
			}
			var got []presence.Event
			testwait.Forf(t, func() string { return "bob's offline event from node a" }, func() bool {
				got = append(got, a.pub.take()...)
				return len(offlineOf(got, "bob")) > 0
			})
			if evs := fmtEvents(got); strings.Join(evs, ";") != "bob online→offline seen=0s" {
				t.Errorf("node a published %v, want bob online→offline seen=0s", evs)
			}
			if s := b.read("bob")[0]; s.Status != presence.Offline || s.LastSeen != ms(0) {
				t.Errorf("node b reads bob %+v", s)
			}
		})
	}
}

// On a store in another process only the devices this node holds arm the
// close timer: a device it does not hold (one that beat over HTTP) ends
// by the store's deadline, which the sweep ticker applies, so a storm of
// such closes costs Redis no sweep of every shard each.
func TestCloseTimerOnlyForHeldDevicesOnRedis(t *testing.T) {
	c := newCluster(t, testsvc.Redis(t))
	c.rules = leaseRules
	c.rules.CloseGrace = 150 * time.Millisecond
	c.tweak = func(cfg *tracker.Config) { cfg.SweepInterval = time.Hour }
	a := c.add(1)
	a.alive = true
	if _, err := a.tr.Heartbeat(a.ctx, "ann", "web", true); err != nil {
		t.Fatal(err)
	}
	c.at(100 * time.Millisecond)
	if err := a.tr.Disconnect(a.ctx, "ann", "web", ms(0)); err != nil {
		t.Fatal(err)
	}
	if at := a.tr.CloseDeadline(); at != 0 {
		t.Fatalf("a device the node does not hold armed the close timer for %d", at)
	}
	a.socketConnect("bob", "pc")
	if err := a.tr.Disconnect(a.ctx, "bob", "pc", ms(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if at, want := a.tr.CloseDeadline(), ms(250*time.Millisecond); at != want {
		t.Fatalf("the close of a held device armed the timer for %d, want %d", at, want)
	}
}

package fanout_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/testwait"
)

// store is what a resync reads in these tests: the view of each user,
// the same for every viewer.
type store map[string]privacy.View

func (st store) read(_ context.Context, _ string, ids []string, out []privacy.View) error {
	for i, id := range ids {
		v, ok := st[id]
		if !ok {
			v = privacy.View{UserID: id}
		}
		out[i] = v
	}
	return nil
}

// viewOf is the view everyone is sent of ev (no privacy setting in the way).
func viewOf(ev *presence.Event) privacy.View {
	v, _ := privacy.FilterEvent(privacy.Relation{}, &ev.Settings, ev)
	return v
}

func resync(t *testing.T, h *fanout.Hub, st store) {
	t.Helper()
	if err := h.Resync(context.Background(), st.read); err != nil {
		t.Fatal(err)
	}
}

// versions lists the versions of s's frames of user in order.
func versions(s *sink, user string) []uint64 {
	var out []uint64
	for _, f := range s.frames() {
		if f.user == user {
			out = append(out, f.version)
		}
	}
	return out
}

// TestResyncSendsOnlyWhatChanged: a resync that reads what the watchers
// were sent sends nothing — not after live changes, not after another
// resync, not when only the version moved (a store that lost its data
// counts on from a new floor) —, and sends a watcher the users whose view
// differs, each at the version read.
func TestResyncSendsOnlyWhatChanged(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	a, b := newSink("a"), newSink("b")
	users := ids("u", 20)
	subscribe(t, h, a, users...)
	subscribe(t, h, b, users[:10]...)
	st := store{}
	for i, u := range users {
		ev := event(u, presence.Status(i%4), 3, presence.Settings{})
		h.Publish(ev)
		st[u] = viewOf(ev)
	}
	na, nb := a.count(), b.count()
	if na != 20 || nb != 10 {
		t.Fatalf("live changes: a got %d frames, b %d; want 20 and 10", na, nb)
	}
	for range 3 {
		resync(t, h, st)
	}
	if a.count() != na || b.count() != nb {
		t.Fatalf("resyncs of what the watchers hold sent %d and %d frames, want none", a.count()-na, b.count()-nb)
	}
	// A new epoch: every version higher, nothing else changed.
	for u, v := range st {
		v.Version += 1 << 32
		st[u] = v
	}
	resync(t, h, st)
	if a.count() != na || b.count() != nb {
		t.Fatalf("a resync that found only higher versions sent %d and %d frames, want none", a.count()-na, b.count()-nb)
	}
	// Two users changed while the node was cut off.
	for _, u := range []string{"u2", "u13"} {
		v := st[u]
		v.Status, v.Version = presence.Busy, v.Version+1
		st[u] = v
	}
	resync(t, h, st)
	resync(t, h, st)
	if got := a.frames()[na:]; len(got) != 2 || got[0].user == got[1].user {
		t.Fatalf("a got %d frames after two users changed, want one frame of each", len(got))
	}
	for _, f := range a.frames()[na:] {
		if f.version != st[f.user].Version {
			t.Errorf("a got %s at version %d, want %d", f.user, f.version, st[f.user].Version)
		}
		if d := decode(t, f.b); d.Status == nil || *d.Status != "busy" {
			t.Errorf("a got %s", f.b)
		}
	}
	if got := versions(b, "u2"); b.count() != nb+1 || len(got) != 2 {
		t.Fatalf("b got %d frames (u2 at %v), want one more, of u2 (it does not watch u13)", b.count()-nb, got)
	}
	if s := h.Stats(); s.Unchanged == 0 || s.Stale == 0 {
		t.Errorf("Stats: Unchanged %d, Stale %d; want both counted", s.Unchanged, s.Stale)
	}
}

// TestResyncPresentLastSeen: the last_seen of a present user moves with
// every heartbeat in reads, while a change carries the moment it was made:
// a resync that finds only a newer last_seen sends nothing (it could not
// send it at a newer version), nor anything at a version the watcher was
// sent already; a user who is offline is sent again when its last_seen
// moved at a newer version (it came and went meanwhile).
func TestResyncPresentLastSeen(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	s := newSink("w")
	subscribe(t, h, s, "on", "off")
	on, off := event("on", presence.Online, 5, presence.Settings{}), event("off", presence.Offline, 7, presence.Settings{})
	h.Publish(on)
	h.Publish(off)
	st := store{"on": viewOf(on), "off": viewOf(off)}
	later := st["on"]
	later.LastSeen += 10_000
	st["on"] = later
	resync(t, h, st)
	if n := s.count(); n != 2 {
		t.Fatalf("a newer last_seen of a present user at the same version: %d frames, want 2 (nothing sent)", n)
	}
	// The same version with another content: never sent again.
	same := st["on"]
	same.Status = presence.Away
	st["on"] = same
	resync(t, h, st)
	if n := s.count(); n != 2 {
		t.Fatalf("another view at a version the watcher holds: %d frames, want 2 (nothing sent)", n)
	}
	back := st["off"]
	back.LastSeen, back.Version = back.LastSeen+60_000, 9
	st["off"] = back
	resync(t, h, st)
	if got := versions(s, "off"); len(got) != 2 || got[1] != 9 {
		t.Fatalf("an offline user seen later at a newer version: versions %v, want [7 9]", got)
	}
}

// TestNoOlderVersionAfterNewer: a watcher is never sent a version of a
// user lower than (or equal to) one it was sent — a change that comes late
// after a resync read a newer state, or after a newer change.
func TestNoOlderVersionAfterNewer(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	s := newSink("w")
	subscribe(t, h, s, "x", "y")
	st := store{"x": viewOf(event("x", presence.Offline, 3, presence.Settings{}))}
	resync(t, h, st)
	h.Publish(event("x", presence.Busy, 2, presence.Settings{})) // queued on the bus before the outage
	h.Publish(event("x", presence.Offline, 3, presence.Settings{}))
	h.Publish(event("y", presence.Busy, 8, presence.Settings{}))
	h.Publish(event("y", presence.Online, 6, presence.Settings{}))
	h.Publish(event("y", presence.Online, 8, presence.Settings{}))
	if got := versions(s, "x"); len(got) != 1 || got[0] != 3 {
		t.Errorf("x: versions sent %v, want [3] (the resync's)", got)
	}
	if got := versions(s, "y"); len(got) != 1 || got[0] != 8 {
		t.Errorf("y: versions sent %v, want [8]", got)
	}
	// The same holds for the batched path of users with many watchers.
	h2 := newHub(t, newRels(), fanout.Config{AsyncThreshold: 2, AsyncBatch: 1})
	runHub(t, h2)
	fans := celebrity(t, h2, 3)
	h2.Publish(event("celeb", presence.Busy, 5, presence.Settings{}))
	testwait.For(t, "the batched delivery", func() bool { return fans[2].count() == 1 })
	h2.Publish(event("celeb", presence.Online, 4, presence.Settings{}))
	h2.Publish(event("celeb", presence.Away, 6, presence.Settings{}))
	testwait.For(t, "the newer change", func() bool { return fans[2].count() == 2 })
	for _, f := range fans {
		if got := versions(f, "celeb"); len(got) != 2 || got[0] != 5 || got[1] != 6 {
			t.Errorf("%s: versions sent %v, want [5 6]", f.viewer, got)
		}
	}
}

// TestConcurrentVersionsInOrder: changes of a few users published from
// many goroutines in any order, and resyncs meanwhile, reach each watcher
// in strictly increasing versions per user. Run under -race.
func TestConcurrentVersionsInOrder(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	users := ids("u", 4)
	var sinks []*sink
	for i := range 8 {
		s := newSink(fmt.Sprint("w", i))
		subscribe(t, h, s, users...)
		sinks = append(sinks, s)
	}
	const n = 300
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range n {
				v := uint64(1 + r.IntN(n))
				h.Publish(event(users[r.IntN(len(users))], presence.Status(v%4), v, presence.Settings{}))
			}
		})
	}
	wg.Go(func() {
		for i := range 20 {
			st := store{}
			for _, u := range users {
				st[u] = viewOf(event(u, presence.Status(i%4), uint64(i*15), presence.Settings{}))
			}
			_ = h.Resync(context.Background(), st.read)
		}
	})
	wg.Wait()
	for _, s := range sinks {
		for _, u := range users {
			vs := versions(s, u)
			for i := 1; i < len(vs); i++ {
				if vs[i] <= vs[i-1] {
					t.Fatalf("%s was sent %s at version %d after %d", s.viewer, u, vs[i], vs[i-1])
				}
			}
		}
	}
}

// TestSnapshotSent: what a subscribe's snapshot showed is not sent again
// by a resync that finds it unchanged — a user never seen included, whose
// snapshot has no version and whose read in Redis carries the version
// floor —, and a change older than it that comes later is not sent.
func TestSnapshotSent(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	s := newSink("w")
	subscribe(t, h, s, "x", "hidden", "never")
	x := viewOf(event("x", presence.Online, 5, presence.Settings{}))
	never := privacy.View{UserID: "never", StatusVisible: true}
	h.SnapshotSent(s, []privacy.View{x, {UserID: "hidden"}, never, viewOf(event("not-watched", presence.Online, 5, presence.Settings{}))})
	never.Version = 1 << 32
	resync(t, h, store{"x": x, "never": never})
	h.Publish(event("x", presence.Busy, 4, presence.Settings{}))
	if n := s.count(); n != 0 {
		t.Fatalf("after the snapshot: %d frames (versions %v), want none", n, versions(s, "x"))
	}
	h.Publish(event("x", presence.Busy, 6, presence.Settings{}))
	if got := versions(s, "x"); len(got) != 1 || got[0] != 6 {
		t.Fatalf("a newer change: versions %v, want [6]", got)
	}
}

// TestSelfOnly: a change only the user sees (the text of an invisible
// user) reaches the user's own sockets and nobody else, on both paths.
func TestSelfOnly(t *testing.T) {
	for _, threshold := range []int{0, 2} {
		t.Run(fmt.Sprint("threshold ", threshold), func(t *testing.T) {
			h := newHub(t, newRels(), fanout.Config{AsyncThreshold: threshold, AsyncBatch: 1})
			runHub(t, h)
			self, a, b := newSink("u"), newSink("a"), newSink("b")
			for _, s := range []*sink{self, a, b} {
				subscribe(t, h, s, "u")
			}
			gone := event("u", presence.Offline, 3, presence.Settings{})
			gone.Self, gone.SelfText, gone.Text = presence.Invisible, "lunch", "lunch"
			// Back to back: on the batched path the second comes while
			// the first waits for Run.
			h.Publish(gone)
			only := *gone
			only.Version, only.SelfText, only.SelfOnly = 4, "gone fishing", true
			h.Publish(&only)
			testwait.For(t, "the offline everyone sees", func() bool { return a.count() == 1 && b.count() == 1 })
			testwait.For(t, "the user's own change", func() bool { return slices.Contains(versions(self, "u"), 4) })
			last := self.frames()[self.count()-1]
			m := decode(t, last.b)
			if last.version != 4 || m.Status == nil || *m.Status != "invisible" || m.StatusText == nil || *m.StatusText != "gone fishing" {
				t.Errorf("the user got %s at version %d last", last.b, last.version)
			}
			if d := decode(t, a.frames()[0].b); d.StatusText == nil || *d.StatusText != "lunch" || a.frames()[0].version != 3 {
				t.Errorf("another watcher got %s at version %d", a.frames()[0].b, a.frames()[0].version)
			}
			// A change everyone sees, after: the others get it, the user too.
			n := self.count()
			back := event("u", presence.Online, 5, presence.Settings{})
			back.Self, back.SelfText, back.Text = presence.Online, "back", "back"
			h.Publish(back)
			testwait.For(t, "the change everyone sees", func() bool { return a.count() == 2 && b.count() == 2 && self.count() == n+1 })
			for _, s := range []*sink{a, b} {
				if got := versions(s, "u"); len(got) != 2 || got[0] != 3 || got[1] != 5 {
					t.Errorf("%s got versions %v, want [3 5]", s.viewer, got)
				}
			}
		})
	}
}

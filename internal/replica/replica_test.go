package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
)

// source is a store as a fill sees it: a fixed set of users, and a hook
// that runs in the middle of a scan (after the first user).
type source struct {
	mu    sync.Mutex
	users map[string]presence.Snapshot
	mid   func()
	fail  error
	scans atomic.Int32
	// during, if set, runs in ReadPublished after the users are read and
	// before they are returned.
	during func()
	reads  atomic.Int32 // users read by ReadPublished
	hang   atomic.Bool  // ReadPublished waits for its context to end
}

func (s *source) ReadPublished(ctx context.Context, ids []string, out []presence.Snapshot) error {
	if s.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	s.mu.Lock()
	fail, during := s.fail, s.during
	for i, id := range ids {
		u, ok := s.users[id]
		if !ok {
			u = presence.Snapshot{UserID: id, Version: 1}
		}
		out[i] = u
	}
	s.mu.Unlock()
	if fail != nil {
		return fail
	}
	s.reads.Add(int32(len(ids)))
	if during != nil {
		during()
	}
	return nil
}

func (s *source) ScanReads(_ context.Context, fn func(string, *presence.Snapshot)) error {
	s.scans.Add(1)
	s.mu.Lock()
	users, mid, fail := make(map[string]presence.Snapshot, len(s.users)), s.mid, s.fail
	for id, u := range s.users {
		users[id] = u
	}
	s.mu.Unlock()
	if fail != nil {
		return fail
	}
	first := true
	for id, u := range users {
		fn(id, &u)
		if first && mid != nil {
			mid()
		}
		first = false
	}
	return nil
}

func (s *source) set(id string, st presence.Status, v uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users == nil {
		s.users = make(map[string]presence.Snapshot)
	}
	s.users[id] = presence.Snapshot{UserID: id, Known: true, Status: st, Version: v}
}

func run(t *testing.T, cfg Config) *Replica {
	t.Helper()
	if cfg.Settle == 0 {
		cfg.Settle = time.Millisecond
	}
	cfg.Retry = 5 * time.Millisecond
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func awaitReady(t *testing.T, r *Replica) {
	t.Helper()
	testwait.For(t, "the replica to be ready", r.Ready)
}

// await waits until ch is closed.
func await(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	testwait.For(t, what, func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	})
}

func get(t *testing.T, r *Replica, ids ...string) []presence.Snapshot {
	t.Helper()
	out := make([]presence.Snapshot, len(ids))
	if err := r.Get(context.Background(), 0, ids, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func ev(id string, st presence.Status, v uint64) *presence.Event {
	return &presence.Event{UserID: id, Status: st, Version: v, Settings: presence.Settings{Status: presence.Contacts}}
}

func TestNotReadyUntilFilled(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	src.fail = errors.New("redis down")
	r := run(t, Config{Source: src})
	out := make([]presence.Snapshot, 1)
	testwait.For(t, "the failed fill retried", func() bool { return src.scans.Load() >= 2 })
	if err := r.Get(context.Background(), 0, []string{"a"}, out); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Get before any fill succeeded: %v, want ErrNotReady", err)
	}
	src.mu.Lock()
	src.fail = nil
	src.mu.Unlock()
	awaitReady(t, r)
	got := get(t, r, "a", "nobody")
	if !got[0].Known || got[0].Status != presence.Online || got[0].Version != 5 {
		t.Errorf("a = %+v, want known, online, v5", got[0])
	}
	if got[1].Known || got[1].UserID != "nobody" {
		t.Errorf("a user the store does not hold = %+v, want unknown", got[1])
	}
}

func TestNewestVersionWins(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := run(t, Config{Source: src})
	awaitReady(t, r)
	r.Publish(ev("a", presence.Busy, 7))
	r.Publish(ev("a", presence.Away, 6)) // late: an older change
	r.Publish(ev("a", presence.Away, 7)) // the same version again
	got := get(t, r, "a")[0]
	if got.Status != presence.Busy || got.Version != 7 || got.Settings.Status != presence.Contacts {
		t.Errorf("a = %+v, want busy at v7 with its settings", got)
	}
	// An invisible user's own status never reaches the replica: it holds
	// the public one.
	r.Publish(&presence.Event{UserID: "b", Status: presence.Invisible, Version: 1})
	if got := get(t, r, "b")[0]; got.Status != presence.Offline {
		t.Errorf("b = %v, want offline (the public status)", got.Status)
	}
	if st := r.Stats(); st.Applied != 2 || st.Stale != 2 || st.Users != 2 {
		t.Errorf("stats %+v, want 2 applied, 2 stale, 2 users", st)
	}
	// A fill that reads an older version than a change applied keeps the
	// change.
	r.Refill()
	awaitReady(t, r)
	if got := get(t, r, "a")[0]; got.Status != presence.Busy {
		t.Errorf("after a refill a = %v, want busy (v7 beats the store's v5)", got.Status)
	}
}

// A refill deletes the users the store no longer holds, keeps those a
// change named while it ran, and refuses until it is done.
func TestRefill(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	src.set("b", presence.Online, 5)
	r := run(t, Config{Source: src})
	awaitReady(t, r)
	r.Publish(ev("gone", presence.Online, 3)) // the store will not hold it

	src.mu.Lock()
	delete(src.users, "b") // lost with the store's data
	entered, release := make(chan struct{}), make(chan struct{})
	src.mid = func() { close(entered); <-release }
	src.mu.Unlock()
	r.Refill()
	if r.Ready() {
		t.Fatal("ready right after Refill")
	}
	<-entered
	// A user who comes online while the fill runs, in a shard the scan
	// may have passed already.
	r.Publish(ev("new", presence.Online, 1))
	out := make([]presence.Snapshot, 1)
	if err := r.Get(context.Background(), 0, []string{"a"}, out); !errors.Is(err, ErrNotReady) {
		t.Errorf("Get during a refill: %v, want ErrNotReady", err)
	}
	close(release)
	awaitReady(t, r)
	got := get(t, r, "a", "b", "gone", "new")
	if !got[0].Known || got[1].Known || got[2].Known || !got[3].Known {
		t.Errorf("after the refill known = %v %v %v %v, want a and new only", got[0].Known, got[1].Known, got[2].Known, got[3].Known)
	}
}

// A refill asked for while one runs is served by another after it.
func TestRefillDuringFill(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := run(t, Config{Source: src})
	awaitReady(t, r)
	// The fill after the first Refill, and the one after it, each stop
	// in the middle of their scan until released.
	entered, release := make(chan struct{}), make(chan struct{})
	next, releaseNext := make(chan struct{}), make(chan struct{})
	var mids atomic.Int32
	src.mu.Lock()
	src.mid = func() {
		switch mids.Add(1) {
		case 1:
			close(entered)
			<-release
		case 2:
			close(next)
			<-releaseNext
		}
	}
	src.mu.Unlock()
	r.Refill()
	await(t, "the fill after the first Refill", entered)
	r.Refill() // changes may have been missed after the running fill started
	close(release)
	await(t, "the fill after the second Refill", next)
	if r.Ready() {
		t.Error("ready after the fill that started before the second Refill")
	}
	close(releaseNext)
	awaitReady(t, r)
	if n := src.scans.Load(); n != 3 {
		t.Errorf("%d scans, want 3 (the first fill, and one after each Refill)", n)
	}
}

func TestRefillAfterWaits(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := run(t, Config{Source: src})
	awaitReady(t, r)
	start := time.Now()
	r.RefillAfter(100 * time.Millisecond)
	awaitReady(t, r)
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("ready again after %v, want the fill to wait 100ms", d)
	}
}

// A RefillAfter that comes while a fill asked for earlier waits to start
// is not served by that fill: Get refuses until its time has passed.
func TestRefillAfterWhileAFillWaits(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := run(t, Config{Source: src, Settle: 50 * time.Millisecond})
	awaitReady(t, r)
	start := time.Now()
	r.Refill()
	// Run took the request: its fill waits its 50 ms settle.
	testwait.For(t, "Run to take the Refill", func() bool { return len(r.wake) == 0 })
	r.RefillAfter(300 * time.Millisecond)
	awaitReady(t, r)
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("ready again %v after a RefillAfter(300ms) that came while a fill waited to start", d)
	}
}

// Background fills correct what changes did not bring (a change lost on
// the way, a user the store lost) without ever refusing a read.
func TestBackgroundFill(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	src.set("b", presence.Online, 5)
	r := run(t, Config{Source: src, Every: 20 * time.Millisecond})
	awaitReady(t, r)
	src.set("a", presence.Busy, 9) // a change that was never published
	src.mu.Lock()
	delete(src.users, "b")
	src.mu.Unlock()
	var got []presence.Snapshot
	testwait.Forf(t, func() string { return fmt.Sprintf("background fills to correct the replica: %+v", got) }, func() bool {
		got = get(t, r, "a", "b")
		return got[0].Status == presence.Busy && !got[1].Known
	})
	if st := r.Stats(); st.Refused != 0 || st.Fills < 2 {
		t.Errorf("stats %+v: want reads answered throughout and several fills", st)
	}
}

// Run asks Fresh on its own, so that a node going silent is noticed even
// while nobody reads.
func TestFreshCheckedWithoutReads(t *testing.T) {
	src := &source{}
	var calls atomic.Int32
	r := run(t, Config{Source: src, Check: 2 * time.Millisecond, Fresh: func() bool { calls.Add(1); return true }})
	awaitReady(t, r)
	n := calls.Load()
	testwait.For(t, "Fresh called again and again without reads", func() bool { return calls.Load()-n >= 5 })
}

func TestFresh(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	var fresh atomic.Bool
	r := run(t, Config{Source: src, Fresh: fresh.Load})
	testwait.For(t, "the first fill", func() bool { return r.fills.Load() >= 1 })
	out := make([]presence.Snapshot, 1)
	if err := r.Get(context.Background(), 0, []string{"a"}, out); !errors.Is(err, ErrNotReady) {
		t.Errorf("Get while a node is not heard: %v, want ErrNotReady", err)
	}
	fresh.Store(true)
	awaitReady(t, r)
	if st := r.Stats(); st.Refused != 1 || st.Served != 0 {
		t.Errorf("stats %+v, want 1 refused, 0 served", st)
	}
}

func TestConcurrentUse(t *testing.T) {
	src := &source{}
	for i := range 100 {
		src.set(string(rune('a'+i%26))+string(rune('0'+i/26)), presence.Online, 1)
	}
	r := run(t, Config{Source: src})
	awaitReady(t, r)
	ids := []string{"a0", "b1", "c2", "zz"}
	// Four writers and readers, each asking for a refill every 50
	// changes, until three of the fills they ask for ran among them.
	fills := r.fills.Load() + 3
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			out := make([]presence.Snapshot, len(ids))
			for v := uint64(2); r.fills.Load() < fills; v++ {
				r.Publish(ev(ids[g], presence.Away, v))
				_ = r.Get(context.Background(), 0, ids, out)
				if v%50 == 0 {
					r.Refill()
				}
			}
		})
	}
	wg.Wait()
	awaitReady(t, r)
	if got := get(t, r, "a0")[0]; got.Status != presence.Away {
		t.Errorf("a0 = %v, want away", got.Status)
	}
}

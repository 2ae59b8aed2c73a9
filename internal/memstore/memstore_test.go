package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/storetest"
	"github.com/presenced/presenced/internal/tracker"
)

const t0 int64 = 1_700_000_000_000

var rules = presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}

func TestConformance(t *testing.T) {
	for _, shards := range []int{1, 256} {
		t.Run(map[int]string{1: "one shard", 256: "256 shards"}[shards], func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, r presence.Rules) tracker.Store {
				// Keep users for the whole length of the suite's scenarios.
				return memstore.New(memstore.Config{Rules: r, Shards: shards, EvictAfter: 1000 * time.Hour})
			})
		})
	}
}

func TestRoomsConformance(t *testing.T) {
	for _, shards := range []int{1, 256} {
		t.Run(map[int]string{1: "one shard", 256: "256 shards"}[shards], func(t *testing.T) {
			storetest.RunRooms(t, func(t *testing.T, r presence.Rules, rr presence.RoomRules) tracker.Store {
				return memstore.New(memstore.Config{Rules: r, RoomRules: rr, Shards: shards, EvictAfter: 1000 * time.Hour})
			})
		})
	}
}

func TestDefaults(t *testing.T) {
	s := memstore.New(memstore.Config{})
	ctx := context.Background()
	if err := s.Load(ctx, t0, &presence.Profile{UserID: "u"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Beat(ctx, t0, "u", "d", true); err != nil {
		t.Fatal(err)
	}
	// Default ttl is 30s.
	if out, _ := s.Expire(ctx, t0+30_000-1, 10, nil); len(out) != 0 {
		t.Errorf("Expire at 30s-1ms with default rules: got %d changes, want 0", len(out))
	}
	if out, _ := s.Expire(ctx, t0+30_000, 10, nil); len(out) != 1 {
		t.Errorf("Expire at 30s with default rules: got %d changes, want 1", len(out))
	}
}

// store is a memstore with helpers that fail the test on errors.
type store struct {
	*memstore.Store
	t *testing.T
}

func newStore(t *testing.T, cfg memstore.Config) *store {
	if cfg.Rules == (presence.Rules{}) {
		cfg.Rules = rules
	}
	return &store{Store: memstore.New(cfg), t: t}
}

func (s *store) load(now int64, user string) {
	s.t.Helper()
	if err := s.Load(context.Background(), now, &presence.Profile{UserID: user}); err != nil {
		s.t.Fatalf("Load(%q): %v", user, err)
	}
}

func (s *store) beat(now int64, user, device string) presence.Change {
	s.t.Helper()
	ch, err := s.Beat(context.Background(), now, user, device, true)
	if err != nil {
		s.t.Fatalf("Beat(%d, %q, %q): %v", now, user, device, err)
	}
	return ch
}

func (s *store) expire(now int64) []presence.Change {
	s.t.Helper()
	out, err := s.Expire(context.Background(), now, 1<<20, nil)
	if err != nil {
		s.t.Fatalf("Expire(%d): %v", now, err)
	}
	return out
}

func (s *store) known(now int64, user string) bool {
	s.t.Helper()
	var out [1]presence.Snapshot
	if err := s.Get(context.Background(), now, []string{user}, out[:]); err != nil {
		s.t.Fatalf("Get(%q): %v", user, err)
	}
	return out[0].Known
}

func (s *store) drain() int {
	s.t.Helper()
	out, err := s.Dirty(context.Background(), nil)
	if err != nil {
		s.t.Fatalf("Dirty: %v", err)
	}
	return len(out)
}

func TestEviction(t *testing.T) {
	const evict = time.Minute
	ms := evict.Milliseconds()
	ttl := rules.TTL.Milliseconds()

	t.Run("after checkpoint", func(t *testing.T) {
		s := newStore(t, memstore.Config{EvictAfter: evict})
		s.load(t0, "u")
		s.beat(t0, "u", "d")
		if got := s.expire(t0 + ttl); len(got) != 1 {
			t.Fatalf("Expire at ttl: got %d changes, want the offline event", len(got))
		}
		off := t0 + ttl
		// Not drained: the last_seen is not durable yet, so the user stays.
		s.expire(off + ms - 1)
		if !s.known(off+ms-1, "u") {
			t.Fatal("user dropped before EvictAfter")
		}
		s.expire(off + ms)
		if !s.known(off+ms, "u") {
			t.Fatal("user dropped while its change was not checkpointed (Dirty not drained)")
		}
		if got := s.drain(); got != 1 {
			t.Errorf("Dirty: got %d profiles, want 1", got)
		}
		// Drained: dropped one EvictAfter after the failed attempt.
		s.expire(off + 2*ms - 1)
		if !s.known(off+2*ms-1, "u") {
			t.Fatal("user dropped before the rescheduled eviction")
		}
		s.expire(off + 2*ms)
		if s.known(off+2*ms, "u") {
			t.Error("user still held after EvictAfter with Dirty drained")
		}
		if n := s.Len(); n != 0 {
			t.Errorf("Len: got %d, want 0", n)
		}
		if _, err := s.Beat(context.Background(), off+2*ms, "u", "d", true); err != tracker.ErrNotLoaded {
			t.Errorf("Beat after eviction: got %v, want ErrNotLoaded", err)
		}
		// Loaded again (from the durable store), it works as before.
		s.load(off+2*ms, "u")
		if ch := s.beat(off+2*ms, "u", "d"); !ch.Changed || ch.Event.Status != presence.Online {
			t.Errorf("beat after reload: got %+v, want an online event", ch)
		}
	})

	t.Run("drained before", func(t *testing.T) {
		s := newStore(t, memstore.Config{EvictAfter: evict})
		s.load(t0, "u")
		s.beat(t0, "u", "d")
		s.expire(t0 + ttl)
		s.drain()
		s.expire(t0 + ttl + ms - 1)
		if !s.known(t0+ttl+ms-1, "u") {
			t.Fatal("user dropped before EvictAfter")
		}
		s.expire(t0 + ttl + ms)
		if s.known(t0+ttl+ms, "u") {
			t.Error("user still held EvictAfter after going offline")
		}
	})

	t.Run("loaded only", func(t *testing.T) {
		s := newStore(t, memstore.Config{EvictAfter: evict})
		s.load(t0, "u")
		s.expire(t0 + ms - 1)
		if !s.known(t0+ms-1, "u") {
			t.Fatal("user dropped before EvictAfter")
		}
		s.expire(t0 + ms)
		if s.known(t0+ms, "u") {
			t.Error("loaded user never seen still held after EvictAfter")
		}
	})

	t.Run("alive users stay", func(t *testing.T) {
		s := newStore(t, memstore.Config{EvictAfter: evict})
		s.load(t0, "u")
		var now int64
		for now = t0; now < t0+10*ms; now += 10_000 {
			s.beat(now, "u", "d")
			s.expire(now)
			s.drain()
		}
		if !s.known(now, "u") {
			t.Error("alive user dropped")
		}
	})

	t.Run("back before eviction", func(t *testing.T) {
		s := newStore(t, memstore.Config{EvictAfter: evict})
		s.load(t0, "u")
		s.beat(t0, "u", "d")
		s.expire(t0 + ttl)
		s.drain()
		back := t0 + ttl + ms/2
		s.beat(back, "u", "d")
		s.drain()
		s.expire(t0 + ttl + ms) // the old eviction deadline
		if !s.known(t0+ttl+ms, "u") {
			t.Fatal("user dropped at a stale eviction deadline although it came back")
		}
		s.expire(back + ttl)
		s.drain()
		s.expire(back + ttl + ms)
		if s.known(back+ttl+ms, "u") {
			t.Error("user still held EvictAfter after going offline again")
		}
	})
}

// TestHeapBounded checks that heartbeats that change nothing push nothing
// onto the deadline heap, swept or not.
func TestHeapBounded(t *testing.T) {
	s := newStore(t, memstore.Config{Shards: 1})
	const users = 10
	for i := range users {
		s.load(t0, string(rune('a'+i)))
	}
	for i := range users {
		s.beat(t0, string(rune('a'+i)), "d")
	}
	base := s.HeapLen()
	if base > 2*users {
		t.Fatalf("heap after first beats: got %d items, want at most %d", base, 2*users)
	}
	// Without sweeping: a beat only moves the deadline later.
	for now := t0 + 1; now < t0+20_000; now += 7 {
		for i := range users {
			s.beat(now, string(rune('a'+i)), "d")
		}
	}
	if got := s.HeapLen(); got != base {
		t.Errorf("heap after unswept beats: got %d items, want %d", got, base)
	}
	// Sweeping every 100ms for an hour with beats every 10s: each user has
	// at most its live deadline and its stale eviction item.
	// Once the stale eviction items from Load have passed, one per user.
	var most, settled int
	for now := t0 + 20_000; now < t0+time.Hour.Milliseconds(); now += 100 {
		if (now-t0)%10_000 == 0 {
			for i := range users {
				s.beat(now, string(rune('a'+i)), "d")
			}
		}
		if got := s.expire(now); len(got) != 0 {
			t.Fatalf("Expire at %d: got %d changes, want none", now, len(got))
		}
		most = max(most, s.HeapLen())
		if now > t0+11*time.Minute.Milliseconds() {
			settled = max(settled, s.HeapLen())
		}
	}
	if most > 2*users {
		t.Errorf("heap while beating and sweeping: got up to %d items, want at most %d", most, 2*users)
	}
	if settled > users {
		t.Errorf("heap while beating and sweeping after the eviction horizon: got up to %d items, want at most %d", settled, users)
	}
}

func TestBeatAllocs(t *testing.T) {
	s := newStore(t, memstore.Config{})
	ctx := context.Background()
	s.load(t0, "user-1")
	s.beat(t0, "user-1", "phone")
	s.beat(t0, "user-1", "laptop")
	now := t0
	allocs := testing.AllocsPerRun(1000, func() {
		now++
		ch, err := s.Beat(ctx, now, "user-1", "laptop", true)
		if err != nil || ch.Changed {
			t.Fatalf("Beat: got %+v, %v; want no change", ch, err)
		}
	})
	if allocs != 0 {
		t.Errorf("Beat without change: got %v allocations, want 0", allocs)
	}
}

func BenchmarkBeat(b *testing.B) {
	s := memstore.New(memstore.Config{Rules: rules})
	ctx := context.Background()
	const users = 1 << 14
	ids := make([]string, users)
	for i := range ids {
		ids[i] = "user-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676%26))
		_ = s.Load(ctx, t0, &presence.Profile{UserID: ids[i]})
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if _, err := s.Beat(ctx, t0+int64(i), ids[i%users], "d", true); err != nil {
				b.Fatal(err)
			}
		}
	})
}

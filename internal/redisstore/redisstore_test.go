package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/storetest"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// client returns a client of this test binary's private redis-server
// (testsvc), closed at the end of the test.
func client(t testing.TB) rueidis.Client {
	t.Helper()
	return dial(t, testsvc.SharedRedis(t).URL)
}

func dial(t testing.TB, url string) rueidis.Client {
	t.Helper()
	c, err := redisstore.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newStore(t testing.TB, c rueidis.Client, cfg redisstore.Config) *redisstore.Store {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = testsvc.Unique(t) + ":" // the tests share one server
	}
	s, err := redisstore.Open(context.Background(), c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	c := client(t)
	for _, shards := range []int{1, 256} {
		t.Run(map[int]string{1: "one shard", 256: "256 shards"}[shards], func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, r presence.Rules) tracker.Store {
				// Keep users for the whole length of the suite's scenarios.
				// One shard starts with one bucket, which the suite's
				// users split; 256 start with the default.
				return newStore(t, c, redisstore.Config{Rules: r, Shards: shards, Buckets: map[int]int{1: 1}[shards], EvictAfter: 1000 * time.Hour})
			})
		})
	}
}

func TestRoomsConformance(t *testing.T) {
	c := client(t)
	for _, shards := range []int{1, 256} {
		t.Run(map[int]string{1: "one shard", 256: "256 shards"}[shards], func(t *testing.T) {
			storetest.RunRooms(t, func(t *testing.T, r presence.Rules, rr presence.RoomRules) tracker.Store {
				return newStore(t, c, redisstore.Config{Rules: r, RoomRules: rr, Shards: shards, EvictAfter: 1000 * time.Hour})
			})
		})
	}
}

// TestConformanceCluster runs the same suite on a Redis Cluster of three
// masters: every script touches only keys of one {shard} slot, and a batch
// read is split by node.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	cl := testsvc.RedisCluster(t, 3)
	c := dial(t, cl.URL)
	storetest.Run(t, func(t *testing.T, r presence.Rules) tracker.Store {
		return newStore(t, c, redisstore.Config{Rules: r, EvictAfter: 1000 * time.Hour})
	})
}

// TestRestart: while Redis is down every operation fails with an error
// (never a wrong answer); when it is back — empty, as a Redis without
// persistence comes back — the scripts are loaded again, users read as not
// held, and the tracker's reload (Load) brings them back.
func TestRestart(t *testing.T) {
	srv := testsvc.Redis(t)
	c := dial(t, srv.URL)
	s := newStore(t, c, redisstore.Config{})
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	if err := s.Load(ctx, t0, &presence.Profile{UserID: "u"}); err != nil {
		t.Fatal(err)
	}
	if ch, err := s.Beat(ctx, t0, "u", "d", true); err != nil || !ch.Changed {
		t.Fatalf("Beat: got %+v %v, want a change", ch, err)
	}
	for _, stop := range []func() error{srv.Stop, srv.Kill} {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := s.Beat(short, t0+1, "u", "d", true); err == nil || errors.Is(err, tracker.ErrNotLoaded) {
			t.Errorf("Beat while Redis is down: got err %v, want a connection error", err)
		}
		if _, err := s.Expire(short, t0+time.Hour.Milliseconds(), 10, nil); err == nil {
			t.Errorf("Expire while Redis is down: got no error")
		}
		if err := s.Get(short, t0, []string{"u"}, make([]presence.Snapshot, 1)); err == nil {
			t.Errorf("Get while Redis is down: got no error")
		}
		cancel()
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		// Back, empty: the client reconnects (maybe after a failed call).
		var err error
		testwait.Forf(t, func() string { return fmt.Sprintf("Beat after restart to answer ErrNotLoaded; it answers %v", err) }, func() bool {
			_, err = s.Beat(ctx, t0+2, "u", "d", true)
			return errors.Is(err, tracker.ErrNotLoaded)
		})
		// It lost its floor with its data: Load says so until the floor
		// is raised (the tracker takes a new epoch for it), and the user
		// then counts on from the new floor.
		if ok, err := s.CheckFloor(ctx); err != nil || ok {
			t.Errorf("CheckFloor after a restart: got %v, %v; want false (lost)", ok, err)
		}
		if err := s.Load(ctx, t0+2, &presence.Profile{UserID: "u", Version: 7}); !errors.Is(err, tracker.ErrStoreReset) {
			t.Fatalf("Load after a restart: got %v, want ErrStoreReset", err)
		}
		const floor = 5 << 32
		if err := s.RaiseFloor(ctx, floor); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.CheckFloor(ctx); err != nil || !ok {
			t.Errorf("CheckFloor after RaiseFloor: got %v, %v; want true", ok, err)
		}
		if err := s.RaiseFloor(ctx, 3<<32); err != nil { // never lowered
			t.Fatal(err)
		}
		var cold [1]presence.Snapshot
		if err := s.Get(ctx, t0+2, []string{"u"}, cold[:]); err != nil || cold[0].Known || cold[0].Version != floor {
			t.Errorf("Get of a user not held: got %+v %v, want unknown at version %d (the floor)", cold[0], err, uint64(floor))
		}
		if err := s.Load(ctx, t0+2, &presence.Profile{UserID: "u", Version: 7}); err != nil {
			t.Fatal(err)
		}
		if ch, err := s.Beat(ctx, t0+2, "u", "d", true); err != nil || !ch.Changed || ch.Event.Status != presence.Online ||
			ch.Event.Version != floor+1 {
			t.Errorf("Beat after reload: got %+v %v, want online at version %d", ch, err, uint64(floor+1))
		}
		if out, err := s.Expire(ctx, t0+2+30_000, 10, nil); err != nil || len(out) != 1 {
			t.Errorf("Expire after restart: got %d changes, %v; want 1", len(out), err)
		}
	}
}

// TestScriptsSurviveAFlushedCache: a node that forgot the scripts (SCRIPT
// FLUSH, as after a restart or on a just-promoted replica) answers every
// operation — the pipelined sweeps and checkpoints included — with no
// error, and the pipelined calls never send SCRIPT LOAD.
func TestScriptsSurviveAFlushedCache(t *testing.T) {
	srv := testsvc.Redis(t)
	c := dial(t, srv.URL)
	s := newStore(t, c, redisstore.Config{Shards: 4})
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	if err := s.Load(ctx, t0, &presence.Profile{UserID: "u"}); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		now := t0 + int64(round)*60_000
		if _, err := s.Beat(ctx, now, "u", "d", true); err != nil {
			t.Fatalf("round %d: Beat after SCRIPT FLUSH: %v", round, err)
		}
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if out, err := s.Dirty(ctx, nil); err != nil || len(out) != 1 {
			t.Fatalf("round %d: Dirty after SCRIPT FLUSH: %d profiles, %v", round, len(out), err)
		}
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if out, err := s.Expire(ctx, now+30_000, 10, nil); err != nil || len(out) != 1 {
			t.Fatalf("round %d: Expire after SCRIPT FLUSH: %d changes, %v", round, len(out), err)
		}
	}
	stats, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stats, "cmdstat_script|load:") {
		t.Errorf("SCRIPT LOAD was sent:\n%s", stats)
	}
}

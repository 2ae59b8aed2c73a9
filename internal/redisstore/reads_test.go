package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
)

// readsPopulation makes users of every kind a read tells apart: beating
// over HTTP (active, background, two devices), with a manual status and
// text, invisible, owned by a node, gone offline, and one never seen.
func readsPopulation(t *testing.T, s *redisstore.Store, now int64) []string {
	t.Helper()
	ctx := context.Background()
	ids := []string{"active", "background", "two", "busy", "ghost", "owned", "gone", "never"}
	load(t, s, now, ids[:len(ids)-1]...)
	for _, b := range []struct {
		user, dev string
		active    bool
	}{{"active", "d", true}, {"background", "d", false}, {"two", "a", true}, {"two", "b", false}, {"busy", "d", true}, {"ghost", "d", true}, {"gone", "d", true}} {
		if _, err := s.Beat(ctx, now, b.user, b.dev, b.active); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SetStatus(ctx, now+1, "busy", presence.ManualBusy, "in a meeting: 3 p.m.:ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetStatus(ctx, now+1, "ghost", presence.ManualInvisible, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetSettings(ctx, now+1, "busy", &presence.Settings{Status: presence.Contacts, LastSeen: presence.Nobody}); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, now+2, 7, "owned", "phone", now+2, now+2)
	if _, err := s.Bye(ctx, now+3, "gone", "d"); err != nil {
		t.Fatal(err)
	}
	// Beats that take the fast path (they move last_seen only).
	for _, b := range [][2]string{{"active", "d"}, {"two", "a"}, {"busy", "d"}} {
		if _, err := s.Beat(ctx, now+500, b[0], b[1], true); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// readsFixture is a store of readsShards shards on the shared Redis,
// holding readsPopulation; reads look at it at at.
type readsFixture struct {
	c      rueidis.Client
	cfg    redisstore.Config
	prefix string
	s      *redisstore.Store
	ids    []string
	at     int64
}

const readsShards = 4

func newReadsFixture(t *testing.T) *readsFixture {
	t.Helper()
	f := &readsFixture{c: client(t), prefix: testsvc.Unique(t) + ":"}
	f.cfg = redisstore.Config{Rules: presence.Rules{TTL: time.Duration(lTTL) * time.Millisecond, IdleAfter: time.Duration(lIdle) * time.Millisecond},
		Prefix: f.prefix, Shards: readsShards}
	f.s = newStore(t, f.c, f.cfg)
	const now = 1_000_000
	f.ids = readsPopulation(t, f.s, now)
	f.at = now + 1000
	return f
}

func getAll(t *testing.T, s *redisstore.Store, now int64, ids []string) []presence.Snapshot {
	t.Helper()
	out := make([]presence.Snapshot, len(ids))
	if err := s.Get(context.Background(), now, ids, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// Data written before the read hash existed (here: the read hash and the
// layout key deleted) reads the same through the users' own hashes until
// RebuildReads has rebuilt it, and the same after; RebuildReads is done
// once.
func TestReadsOfDataBeforeTheReadHash(t *testing.T) {
	f := newReadsFixture(t)
	c, cfg, prefix, s, ids, at := f.c, f.cfg, f.prefix, f.s, f.ids, f.at
	const shards = readsShards
	ctx := context.Background()
	want := getAll(t, s, at, ids)
	if want[0].Status != presence.Online || want[3].Status != presence.Busy || want[4].Status != presence.Invisible || want[5].Status != presence.Online || want[6].Status != presence.Offline || want[7].Known {
		t.Fatalf("population: %+v", want)
	}

	// The data of a build before the read hash.
	for k := range shards {
		if err := c.Do(ctx, c.B().Del().Key(fmt.Sprintf("%s{%d}b", prefix, k)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	old, err := redisstore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := getAll(t, old, at, ids); !slices.Equal(got, want) {
		t.Fatalf("read before the rebuild:\n got %+v\nwant %+v", got, want)
	}
	n, err := old.RebuildReads(ctx)
	if err != nil || n != len(ids)-1 {
		t.Fatalf("rebuild: %d users, %v; want %d", n, err, len(ids)-1)
	}
	fields := 0
	for k := range shards {
		m, err := c.Do(ctx, c.B().Hlen().Key(fmt.Sprintf("%s{%d}b", prefix, k)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		fields += int(m)
	}
	if fields != len(ids)-1+shards {
		t.Fatalf("read hash: %d fields after the rebuild, want %d and a marker per shard", fields, len(ids)-1)
	}
	if got := getAll(t, old, at, ids); !slices.Equal(got, want) {
		t.Fatalf("read after the rebuild:\n got %+v\nwant %+v", got, want)
	}
	// Another node starting finds the layout done.
	again, err := redisstore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := again.RebuildReads(ctx); err != nil || n != 0 {
		t.Fatalf("second rebuild: %d users, %v; want none", n, err)
	}
	if got := getAll(t, again, at, ids); !slices.Equal(got, want) {
		t.Fatalf("read on another node:\n got %+v\nwant %+v", got, want)
	}
	// One shard's read hash lost on its own (a failover that lost its
	// last writes, an eviction): its marker went with it, and its users
	// are read from their hashes again — nobody reads offline.
	for k := range shards {
		if err := c.Do(ctx, c.B().Del().Key(fmt.Sprintf("%s{%d}b", prefix, k)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if got := getAll(t, again, at, ids); !slices.Equal(got, want) {
			t.Fatalf("read with shard %d's read hash lost:\n got %+v\nwant %+v", k, got, want)
		}
		if _, err := again.RebuildReads(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A Redis that lost its data lost the read hashes' markers with it; the
// version floors raised again (the tracker's answer) mark the shards
// complete, since everything they will hold is written by this build: a
// node starting afterwards rebuilds nothing.
func TestReadsCompleteAfterRedisLostItsData(t *testing.T) {
	srv := testsvc.Redis(t)
	c := dial(t, srv.URL)
	ctx := context.Background()
	cfg := redisstore.Config{Rules: presence.Rules{TTL: time.Duration(lTTL) * time.Millisecond}, Shards: 8, Prefix: "p:"}
	s := newStore(t, c, cfg)
	const now = 1_000_000
	ids := readsPopulation(t, s, now)
	if err := c.Do(ctx, c.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.RaiseFloor(ctx, 5<<32); err != nil {
		t.Fatal(err)
	}
	readsPopulation(t, s, now+10_000)
	fresh, err := redisstore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := fresh.RebuildReads(ctx); err != nil || n != 0 {
		t.Fatalf("a node starting after the loss rebuilt %d users (%v), want none", n, err)
	}
	if got := getAll(t, fresh, now+11_000, ids); got[0].Status != presence.Online || got[len(ids)-1].Known {
		t.Fatalf("read after the loss: %+v", got)
	}
}

// A user evicted from Redis leaves the read hash with its hash: nothing
// of a user gone stays behind, and a read finds it not held.
func TestEvictionEmptiesTheReadHash(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	prefix := testsvc.Unique(t) + ":"
	evict := 60 * time.Second
	s := newStore(t, c, redisstore.Config{Rules: presence.Rules{TTL: time.Duration(lTTL) * time.Millisecond}, Prefix: prefix, Shards: 1, EvictAfter: evict})
	const now = 1_000_000
	load(t, s, now, "a", "b")
	for _, u := range []string{"a", "b"} {
		if _, err := s.Beat(ctx, now, u, "d", true); err != nil {
			t.Fatal(err)
		}
	}
	hlen := func() int64 {
		t.Helper()
		n, err := c.Do(ctx, c.B().Hlen().Key(prefix+"{0}b").Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n - 1 // the marker
	}
	if n := hlen(); n != 2 {
		t.Fatalf("read hash of two users: %d fields", n)
	}
	if _, err := s.Bye(ctx, now+1, "a", "d"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Dirty(ctx, nil); err != nil { // checkpointed: may be evicted
		t.Fatal(err)
	}
	end := now + 1 + evict.Milliseconds() + 1
	expireAll(t, s, end)
	if n := hlen(); n != 1 {
		t.Fatalf("read hash after a's eviction: %d fields, want 1", n)
	}
	if g := get(t, s, end, "a"); g.Known {
		t.Fatalf("evicted user read as held: %+v", g)
	}
}

// ScanReads yields every user the store holds as Get reads it (while
// nothing is due), and nobody else — also when a shard's read hash was
// lost on its own (rebuilt first).
func TestScanReads(t *testing.T) {
	f := newReadsFixture(t)
	c, prefix, s, ids, at := f.c, f.prefix, f.s, f.ids, f.at
	ctx := context.Background()
	want := make(map[string]presence.Snapshot)
	for i, snap := range getAll(t, s, at, ids) {
		if snap.Known {
			want[ids[i]] = snap
		}
	}
	for round, lose := range []bool{false, true} {
		if lose {
			if err := c.Do(ctx, c.B().Del().Key(prefix+"{1}b").Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		got := make(map[string]presence.Snapshot)
		err := s.ScanReads(ctx, func(id string, snap *presence.Snapshot) {
			if _, dup := got[id]; dup {
				t.Errorf("round %d: %s yielded twice", round, id)
			}
			got[id] = *snap
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("round %d: %d users yielded, want %d: %v", round, len(got), len(want), got)
		}
		for id, w := range want {
			g, ok := got[id]
			if !ok {
				t.Errorf("round %d: %s not yielded", round, id)
				continue
			}
			if g.Status != w.Status || g.Version != w.Version || g.Settings != w.Settings || !g.Known {
				t.Errorf("round %d: %s = %v v%d %+v, Get reads %v v%d %+v", round, id, g.Status, g.Version, g.Settings, w.Status, w.Version, w.Settings)
			}
		}
	}
}

// A read hash lost while ScanReads walks it (here: deleted by the
// callback, as an eviction would) fails the scan rather than leave its
// users out; the next scan rebuilds it and yields everyone.
func TestScanReadsFailsWhenAReadHashIsLostMeanwhile(t *testing.T) {
	f := newReadsFixture(t)
	ctx := context.Background()
	lost := false
	err := f.s.ScanReads(ctx, func(id string, _ *presence.Snapshot) {
		if !lost {
			lost = true
			for k := range readsShards {
				if err := f.c.Do(ctx, f.c.B().Del().Key(fmt.Sprintf("%s{%d}b", f.prefix, k)).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
	if err == nil {
		t.Fatal("ScanReads succeeded though every read hash was lost during it")
	}
	n := 0
	if err := f.s.ScanReads(ctx, func(string, *presence.Snapshot) { n++ }); err != nil {
		t.Fatal(err)
	}
	if n != len(f.ids)-1 {
		t.Errorf("the scan after yielded %d users, want %d", n, len(f.ids)-1)
	}
}

// On a Redis Cluster the fill's HSCANs go to each shard's master: every
// user of every master is yielded once.
func TestScanReadsOnACluster(t *testing.T) {
	t.Parallel()
	cl := testsvc.RedisCluster(t, 3)
	c := dial(t, cl.URL)
	ctx := t.Context()
	s := newStore(t, c, redisstore.Config{Prefix: testsvc.Unique(t) + ":", Shards: 64})
	const now = 1_000_000
	want := map[string]bool{}
	for i := range 90 {
		u := fmt.Sprint("c", i)
		if err := s.Load(ctx, now, &presence.Profile{UserID: u}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Beat(ctx, now, u, "d", true); err != nil {
			t.Fatal(err)
		}
		want[u] = true
	}
	got := map[string]int{}
	err := s.ScanReads(ctx, func(id string, snap *presence.Snapshot) {
		got[id]++
		if snap.Status != presence.Online || !snap.Known {
			t.Errorf("%s = %+v, want online", id, snap)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for u := range want {
		if got[u] != 1 {
			t.Errorf("%s yielded %d times, want once", u, got[u])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d users yielded, want %d", len(got), len(want))
	}
}

package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

// A user evicted from Redis leaves its bucket: nothing of a user gone
// stays behind, and a read finds it not held.
func TestEvictionEmptiesTheBucket(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	prefix := testsvc.Unique(t) + ":"
	evict := 60 * time.Second
	s := newStore(t, c, redisstore.Config{Rules: presence.Rules{TTL: time.Duration(lTTL) * time.Millisecond}, Prefix: prefix, Shards: 1, Buckets: 1, EvictAfter: evict})
	const now = 1_000_000
	load(t, s, now, "a", "b")
	for _, u := range []string{"a", "b"} {
		if _, err := s.Beat(ctx, now, u, "d", true); err != nil {
			t.Fatal(err)
		}
	}
	hlen := func() int64 {
		t.Helper()
		n, err := c.Do(ctx, c.B().Hlen().Key(prefix+"{0}p:0").Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := hlen(); n != 2 {
		t.Fatalf("bucket of two users: %d fields", n)
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
		t.Fatalf("bucket after a's eviction: %d fields, want 1", n)
	}
	if g := get(t, s, end, "a"); g.Known {
		t.Fatalf("evicted user read as held: %+v", g)
	}
}

// ScanReads yields every user the store holds as Get reads it (while
// nothing is due), and nobody else.
func TestScanReads(t *testing.T) {
	f := newReadsFixture(t)
	s, ids, at := f.s, f.ids, f.at
	ctx := context.Background()
	want := make(map[string]presence.Snapshot)
	for i, snap := range getAll(t, s, at, ids) {
		if snap.Known {
			want[ids[i]] = snap
		}
	}
	got := make(map[string]presence.Snapshot)
	err := s.ScanReads(ctx, func(id string, snap *presence.Snapshot) {
		if _, dup := got[id]; dup {
			t.Errorf("%s yielded twice", id)
		}
		got[id] = *snap
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("%d users yielded, want %d: %v", len(got), len(want), got)
	}
	for id, w := range want {
		g, ok := got[id]
		if !ok {
			t.Errorf("%s not yielded", id)
			continue
		}
		if g.Status != w.Status || g.Version != w.Version || g.Settings != w.Settings || g.Text != w.Text || g.Devices != w.Devices || !g.Known {
			t.Errorf("%s = %+v, Get reads %+v", id, g, w)
		}
	}
}

// On a Redis Cluster the fill's reads go to each shard's master: every
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

// Nodes must pack users alike: the first Open records the shards and
// buckets in Redis, an Open with other numbers is refused with an error
// naming both, and the same numbers open again.
func TestLayoutIsChecked(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	prefix := testsvc.Unique(t) + ":"
	open := func(shards, buckets int) error {
		_, err := redisstore.Open(ctx, c, redisstore.Config{Prefix: prefix, Shards: shards, Buckets: buckets})
		return err
	}
	if err := open(16, 64); err != nil {
		t.Fatal(err)
	}
	for _, sb := range [][2]int{{16, 32}, {8, 64}} {
		err := open(sb[0], sb[1])
		if err == nil || !strings.Contains(err.Error(), `"packed+split shards=16 buckets=64"`) || !strings.Contains(err.Error(), "-redis-buckets") {
			t.Errorf("open with %d shards, %d buckets over 16 × 64: %v", sb[0], sb[1], err)
		}
	}
	if err := open(16, 64); err != nil {
		t.Errorf("open again with the same layout: %v", err)
	}
}

// A node of a former format of the packed layout (the first, which
// cannot read an invisible user's frozen face; the second, which keeps a
// due member per user and never splits a bucket) recorded the layout: a
// node of this one opens on it, takes its buckets when it is given none,
// and records its own, so that a node of a former format no longer opens
// (it refuses another layout).
func TestLayoutFormerFormatIsMovedOn(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	for _, format := range []string{"packed", "packed+face"} {
		for _, buckets := range []int{64, 0} {
			prefix := testsvc.Unique(t) + ":"
			key := prefix + "layout"
			if err := c.Do(ctx, c.B().Set().Key(key).Value(format+" shards=16 buckets=64").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if _, err := redisstore.Open(ctx, c, redisstore.Config{Prefix: prefix, Shards: 16, Buckets: buckets}); err != nil {
				t.Fatalf("open over %s with buckets %d: %v", format, buckets, err)
			}
			if got, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString(); err != nil || got != "packed+split shards=16 buckets=64" {
				t.Fatalf("layout recorded over %s: %q (%v), want this format's", format, got, err)
			}
			// A former format with other numbers is still another layout.
			if err := c.Do(ctx, c.B().Set().Key(key).Value(format+" shards=16 buckets=32").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if _, err := redisstore.Open(ctx, c, redisstore.Config{Prefix: prefix, Shards: 16, Buckets: 64}); err == nil {
				t.Fatalf("open over %s with other buckets: no error", format)
			}
		}
	}
}

// ReadPublished reads what ScanReads yields of the users asked for, and
// Get's answer for a user not held; a change that is due but not yet
// applied (a device past its deadline) is not in it.
func TestReadPublished(t *testing.T) {
	f := newReadsFixture(t)
	s, ids, at := f.s, f.ids, f.at
	ctx := context.Background()
	scanned := make(map[string]presence.Snapshot)
	if err := s.ScanReads(ctx, func(id string, snap *presence.Snapshot) { scanned[id] = *snap }); err != nil {
		t.Fatal(err)
	}
	asked := append(slices.Clone(ids), "never-seen")
	got := make([]presence.Snapshot, len(asked))
	if err := s.ReadPublished(ctx, asked, got); err != nil {
		t.Fatal(err)
	}
	gets := getAll(t, s, at, asked)
	for i, id := range asked {
		w, held := scanned[id]
		if !held {
			w = gets[i]
			if w.Known {
				t.Fatalf("%s read as held by Get, not by ScanReads", id)
			}
		}
		g := got[i]
		if g.Known != w.Known || g.Status != w.Status || g.Version != w.Version || g.Settings != w.Settings {
			t.Errorf("%s = %+v, want %+v", id, g, w)
		}
	}

	const now = 1_000_000
	if err := s.Load(ctx, now, &presence.Profile{UserID: "late"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Beat(ctx, now, "late", "d", true); err != nil {
		t.Fatal(err)
	}
	later := int64(now + time.Hour.Milliseconds())
	if g := get(t, s, later, "late"); g.Status != presence.Offline {
		t.Fatalf("Get an hour after the last beat: %v, want offline (due)", g.Status)
	}
	one := make([]presence.Snapshot, 1)
	if err := s.ReadPublished(ctx, []string{"late"}, one); err != nil {
		t.Fatal(err)
	}
	if one[0].Status != presence.Online {
		t.Errorf("ReadPublished: %v, want online: the offline is due, not published", one[0].Status)
	}
}

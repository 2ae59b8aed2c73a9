package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
)

// A shard that grows splits its buckets while nodes run: a node that
// opened before the splits (its counts of buckets stale) still reads,
// beats, leaves rooms and takes over every user where it moved, each
// bucket stays a listpack's size, and a lease's takeover finds the
// devices it held in the buckets they moved to.
func TestSplitsKeepEveryUser(t *testing.T) {
	t.Run("one Redis", func(t *testing.T) { testSplitsKeepEveryUser(t, client(t)) })
	t.Run("Cluster", func(t *testing.T) { testSplitsKeepEveryUser(t, dial(t, testsvc.RedisCluster(t, 3).URL)) })
}

func testSplitsKeepEveryUser(t *testing.T, c rueidis.Client) {
	ctx := context.Background()
	prefix := testsvc.Unique(t) + ":"
	cfg := redisstore.Config{Rules: leaseRules, Prefix: prefix, Shards: 1, Buckets: 1, EvictAfter: time.Hour}
	a := newStore(t, c, cfg)
	stale := newStore(t, c, cfg) // opened with one bucket; never told of a split but by its own reads
	const users = 600
	const t0 = int64(1_000_000)
	ids := make([]string, users)
	for i := range ids {
		ids[i] = fmt.Sprint("user-", i)
		load(t, a, t0, ids[i])
		switch i % 3 {
		case 0: // beats over HTTP
			if _, err := a.Beat(ctx, t0, ids[i], "web", true); err != nil {
				t.Fatal(err)
			}
		case 1: // a WebSocket of node 7
			mustClaim(t, a, t0, 7, ids[i], "ws", t0, presence.Forever)
		case 2: // over HTTP, in a room
			if _, err := a.Beat(ctx, t0, ids[i], "web", true); err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.Join(ctx, t0, ids[i], "web", "room-"+strconv.Itoa(i%5)); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err := c.Do(ctx, c.B().Get().Key(prefix+"{0}n").Build()).AsInt64()
	if err != nil || n < users/48 || n > users/48+1 {
		t.Fatalf("%d users in a shard of 1 bucket at first: %d buckets (%v), want ~%d", users, n, err, users/48)
	}
	for b := range n {
		held, err := c.Do(ctx, c.B().Hlen().Key(fmt.Sprintf("%s{0}p:%d", prefix, b)).Build()).AsInt64()
		if err != nil || held == 0 || held > 128 {
			t.Errorf("bucket %d of %d holds %d users (%v)", b, n, held, err)
		}
	}
	// Reads by the node that knew of one bucket: every user, where it is.
	for i, g := range getAll(t, stale, t0+1, ids) {
		if !g.Known || g.Status != presence.Online {
			t.Errorf("%s read by a node with a stale count: %+v, want online", ids[i], g)
		}
	}
	// Writes by a node whose count is stale again (a node's count is
	// read at its start, by its reads and by its checkpoints).
	stale2 := newStore(t, c, cfg)
	for i := range 50 {
		load(t, a, t0, fmt.Sprint("more-", i)) // more splits
	}
	for i, id := range ids {
		if i%3 == 1 {
			continue
		}
		if _, err := stale2.Beat(ctx, t0+2, id, "web", true); err != nil {
			t.Fatalf("beat of %s by a node with a stale count: %v", id, err)
		}
		if i%3 == 2 {
			if _, _, err := stale2.Leave(ctx, t0+2, id, "web", "room-"+strconv.Itoa(i%5)); err != nil {
				t.Fatalf("leave of %s: %v", id, err)
			}
		}
	}
	counts, err := a.RoomCounts(ctx, []string{"room-0", "room-1", "room-2", "room-3", "room-4"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for r, n := range counts {
		if n != 0 {
			t.Errorf("room-%d counts %d after every member left, want 0", r, n)
		}
	}
	// Node 7 dies: its devices are found where they moved, each once.
	out, err := a.TakeOver(ctx, t0+lTTL+10, 7, t0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	offline := map[string]int{}
	for _, ch := range out {
		if ch.Event.Status == presence.Offline {
			offline[ch.Event.UserID]++
		}
	}
	for i, id := range ids {
		if want := map[bool]int{true: 1}[i%3 == 1]; offline[id] != want {
			t.Errorf("%s announced offline %d times by the takeover, want %d", id, offline[id], want)
		}
	}
}

// Redis holds users of a former format (a member per user in the due
// sets, no count of buckets or users): a node of this one opens on them
// with their buckets, counts the users, and its sweep takes each user's
// member as it comes due and sends every user offline once.
func TestFormerFormatUsersAreSwept(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	prefix := testsvc.Unique(t) + ":"
	cfg := redisstore.Config{Rules: leaseRules, Prefix: prefix, Shards: 1, Buckets: 8, EvictAfter: time.Hour}
	s := newStore(t, c, cfg)
	const users = 100 // no split: 8 buckets hold 384
	const t0 = int64(1_000_000)
	due := prefix + "{0}due"
	for i := range users {
		id := fmt.Sprint("user-", i)
		load(t, s, t0, id)
		if _, err := s.Beat(ctx, t0, id, "web", true); err != nil {
			t.Fatal(err)
		}
	}
	// As the former format left it: a member per user, at its deadline.
	if err := c.Do(ctx, c.B().Del().Key(due, prefix+"{0}n", prefix+"{0}c").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i := range users {
		id := fmt.Sprint("user-", i)
		_, dl, _, err := s.Debug(ctx, id)
		if err != nil || dl != t0+lTTL {
			t.Fatalf("%s due at %d (%v), want %d", id, dl, err, t0+lTTL)
		}
		if err := c.Do(ctx, c.B().Zadd().Key(due).ScoreMember().ScoreMember(float64(dl), id).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Do(ctx, c.B().Set().Key(prefix+"layout").Value("packed+face shards=1 buckets=8").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t, c, redisstore.Config{Rules: leaseRules, Prefix: prefix, Shards: 1, EvictAfter: time.Hour})
	if n, err := c.Do(ctx, c.B().Get().Key(prefix+"{0}c").Build()).AsInt64(); err != nil || n != users {
		t.Errorf("users counted: %d (%v), want %d", n, err, users)
	}
	for i, g := range getAll(t, s2, t0+1, []string{"user-0", "user-99"}) {
		if g.Status != presence.Online {
			t.Errorf("user %d read by the new node: %+v, want online", i, g)
		}
	}
	got := map[string]int{}
	for now := t0 + lTTL - 100; now < t0+lTTL+1000; now += 50 {
		out, err := s2.Expire(ctx, now, 30, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range out {
			if ch.Event.Status == presence.Offline {
				if now < t0+lTTL {
					t.Errorf("%s offline at %d, before its ttl", ch.Event.UserID, now)
				}
				got[ch.Event.UserID]++
			}
		}
	}
	for i := range users {
		if id := fmt.Sprint("user-", i); got[id] != 1 {
			t.Errorf("%s announced offline %d times, want once", id, got[id])
		}
	}
	left, err := c.Do(ctx, c.B().Zrange().Key(due).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range left {
		if m == "" || m[0] != 2 {
			t.Errorf("due member %q left of the former format", m)
		}
	}
}

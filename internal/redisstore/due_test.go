package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
)

// A user beating over HTTP costs the due set nothing of its own (its
// bucket's member stands for it), and every one still goes offline
// exactly once, at its ttl, however many nodes sweep at once.
func TestHTTPUsersExpireOnceByBucket(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	prefix := testsvc.Unique(t) + ":"
	cfg := redisstore.Config{Rules: leaseRules, Prefix: prefix, Shards: 2, EvictAfter: time.Hour}
	s := newStore(t, c, cfg)
	const users = 400
	const t0 = int64(1_000_000)
	for i := range users {
		id := fmt.Sprint("user-", i)
		load(t, s, t0, id)
		// Beats spread over 10 s: the users of a bucket come due apart.
		if _, err := s.Beat(ctx, t0+int64(i)*25, id, "web", true); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 2 {
		members, err := c.Do(ctx, c.B().Zcard().Key(fmt.Sprintf("%s{%d}due", prefix, k)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.Do(ctx, c.B().Get().Key(fmt.Sprintf("%s{%d}n", prefix, k)).Build()).AsInt64()
		if err != nil {
			n = redisstore.DefaultBuckets // none split
		}
		if members > n {
			t.Errorf("shard %d: %d members in the due set for %d buckets", k, members, n)
		}
	}
	var mu sync.Mutex
	offline := map[string][]int64{}
	var wg sync.WaitGroup
	for w := range 3 {
		o := newStore(t, c, cfg)
		wg.Go(func() {
			for now := t0 + lTTL - 1000; now < t0+lTTL+12_000; now += 100 + int64(w) {
				out, err := o.Expire(ctx, now, 7, nil)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, ch := range out {
					if ch.Event.Status == presence.Offline {
						offline[ch.Event.UserID] = append(offline[ch.Event.UserID], now)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for i := range users {
		id := fmt.Sprint("user-", i)
		end := t0 + int64(i)*25 + lTTL
		if got := offline[id]; len(got) != 1 || got[0] < end {
			t.Errorf("%s (ttl out at %d) announced offline at %v, want once, after", id, end, got)
		}
	}
}

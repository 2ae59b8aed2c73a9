package redisstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// Buckets that grow with the population. A shard starts with Config.Buckets
// buckets and adds one each time it holds splitAt users a bucket
// (lua/load.lua's split, by linear hashing: lua/packed.lua), so a bucket
// holds about splitAt users whatever the population — few enough keys
// that their own cost is a few bytes a user, small enough for Redis to
// keep each a listpack. A shard's count of buckets is <prefix>{shard}n
// (missing: Config.Buckets) and only grows; its count of users is
// <prefix>{shard}c.
//
// The scripts read the count where they run, so every node places a user
// alike. Go keeps each shard's count as last read (Store.nb) to name a
// user's bucket in a call: a script that does not find the user where the
// call says looks where the shard says now (helpers.lua's load), and a
// read checks, after its HMGETs and in the same round trip, that the
// counts it used are still the shards' (Get): a split moves users
// atomically and counts only grow, so an unchanged count means no user
// it read had moved. A node learns the count of a shard from every load
// into it, its reads and its checkpoints (every second).

// splitAt is SPLIT_AT of lua/packed.lua: the users a bucket a shard holds
// before it splits one.
const splitAt = 48

// bucketIndex is bucket_index of lua/packed.lua: the bucket of g (a user's
// FNV-1a over the shards) among the n buckets of a shard that started
// with n0.
func bucketIndex(g uint32, n, n0 int64) int {
	base := n0
	for base*2 <= n {
		base *= 2
	}
	b := int64(g) % base
	if b < n-base {
		b = int64(g) % (2 * base)
	}
	return int(b)
}

// countKey is the key of shard sk's count of buckets.
func (sk *shardKeys) countKey() string { return sk.tag + "n" }

// learnBuckets records that shard k has n buckets, unless this node knew
// of more (a count only grows; a reply read later may carry an older one).
func (s *Store) learnBuckets(k int, n int64) {
	for {
		cur := s.nb[k].Load()
		if n <= cur || s.nb[k].CompareAndSwap(cur, n) {
			return
		}
	}
}

// parseBuckets parses v, err: the reply to a GET of a shard's count of
// buckets (nil: the shard has its first n0).
func parseBuckets(v string, err error, n0 int64) (int64, error) {
	if rueidis.IsRedisNil(err) {
		return n0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < n0 {
		return 0, fmt.Errorf("%q buckets in a shard that starts with %d", v, n0)
	}
	return n, nil
}

// refreshBuckets reads the count of buckets of the shards named (nil:
// all) into s.nb.
func (s *Store) refreshBuckets(ctx context.Context, shards []int) error {
	if shards == nil {
		shards = make([]int, len(s.shards))
		for i := range shards {
			shards[i] = i
		}
	}
	cmds := make(rueidis.Commands, len(shards))
	for j, k := range shards {
		cmds[j] = s.c.B().Get().Key(s.shards[k].countKey()).Build()
	}
	var firstErr error
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		v, err := r.ToString()
		n, err := parseBuckets(v, err, int64(s.buckets))
		if err != nil {
			firstErr = firstOf(firstErr, err)
			continue
		}
		s.nb[shards[j]].Store(n)
	}
	if firstErr != nil {
		return fmt.Errorf("redisstore: read bucket counts: %w", firstErr)
	}
	return nil
}

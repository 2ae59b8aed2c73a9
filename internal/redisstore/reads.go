package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
)

// ScanReads calls fn with every user the store holds as a read at no
// particular time shows it (the status last published — invisible for an
// invisible user with devices — the settings, the version; nothing due is
// applied): the fill of a node's read replica (package replica). It reads
// every bucket (HGETALL, a listpack of a few dozen users), up to
// scanBatch of them in one pipelined round trip, so Redis is never held
// for long by one call; then the buckets shards added meanwhile, whose
// users may have moved from a bucket read before they came (such a user
// may be yielded twice). fn is called from one goroutine; snap is valid
// during the call only.
func (s *Store) ScanReads(ctx context.Context, fn func(id string, snap *presence.Snapshot)) (err error) {
	defer callScanReads.Start(ctx).Done(&err)
	const scanBatch = 512
	type bucket struct{ shard, n int }
	var todo []bucket
	done := make([]int64, len(s.shards)) // per shard: the buckets read
	var snap presence.Snapshot
	var u packedUser
	cmds := make(rueidis.Commands, 0, scanBatch)
	for {
		if err := s.refreshBuckets(ctx, nil); err != nil {
			return fmt.Errorf("redisstore: scan reads: %w", err)
		}
		todo = todo[:0]
		for k := range s.shards {
			n := s.nb[k].Load()
			for b := done[k]; b < n; b++ {
				todo = append(todo, bucket{k, int(b)})
			}
			done[k] = n
		}
		if len(todo) == 0 {
			return nil
		}
		for lo := 0; lo < len(todo); lo += scanBatch {
			cmds = cmds[:0]
			for _, b := range todo[lo:min(len(todo), lo+scanBatch)] {
				cmds = append(cmds, s.c.B().Hgetall().Key(s.shards[b.shard].bucketKey(b.n)).Build())
			}
			for _, r := range s.c.DoMulti(ctx, cmds...) {
				kv, err := r.AsStrSlice()
				if err != nil {
					return fmt.Errorf("redisstore: scan reads: %w", err)
				}
				for i := 0; i+1 < len(kv); i += 2 {
					if err := decodePacked(kv[i], kv[i+1], &u); err != nil {
						return fmt.Errorf("redisstore: scan reads %q: %w", kv[i], err)
					}
					publishedSnapshot(&u, &snap)
					fn(kv[i], &snap)
				}
			}
		}
	}
}

// publishedSnapshot fills out with u as last published: ScanReads.
func publishedSnapshot(u *packedUser, out *presence.Snapshot) {
	st := u.Pub
	if st == presence.Offline && len(u.Devices) > 0 && u.Manual == presence.ManualInvisible {
		st = presence.Invisible
	}
	*out = presence.Snapshot{
		UserID:      u.UserID,
		Known:       true,
		Status:      st,
		Manual:      u.Manual,
		Text:        u.Text,
		LastSeen:    u.LastSeen,
		PubLastSeen: u.PubLastSeen,
		Devices:     len(u.Devices),
		Version:     u.Version,
		Settings:    u.Settings,
		PubText:     u.PubText,
		PubVersion:  u.PubVersion,
	}
}

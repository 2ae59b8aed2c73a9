package redisstore

import (
	"context"

	"github.com/presenced/presenced/internal/presence"
)

// BeatArgs is one heartbeat of a BeatBatch.
type BeatArgs struct {
	User, Device string
	Now          int64
	Active       bool
}

// BeatBatch sends beats in one script call, in order, as Beat does with
// the beats that queue while a call is in flight. On a Cluster all users
// must share a shard.
func (s *Store) BeatBatch(ctx context.Context, beats []BeatArgs) ([]presence.Change, []error) {
	batch := make([]*beatReq, len(beats))
	for i, b := range beats {
		batch[i] = &beatReq{user: b.User, device: b.Device, now: b.Now, active: b.Active, shard: s.shardOf(b.User)}
	}
	s.beatBatch(ctx, batch)
	chs, errs := make([]presence.Change, len(beats)), make([]error, len(beats))
	for i, r := range batch {
		chs[i], errs[i] = r.ch, r.err
	}
	return chs, errs
}

// BeatCalls returns the script calls that carried heartbeats so far.
func (s *Store) BeatCalls() uint64 { return s.beatCalls.Load() }

var CallContext = callContext

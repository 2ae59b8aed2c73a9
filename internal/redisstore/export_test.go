package redisstore

import (
	"context"
	"errors"
	"time"

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
		k, bk := s.place(b.User)
		batch[i] = &beatReq{user: b.User, device: b.Device, now: b.Now, active: b.Active, shard: &s.shards[k], bucket: bk}
	}
	s.beatBatch(ctx, batch)
	chs, errs := make([]presence.Change, len(beats)), make([]error, len(beats))
	for i, r := range batch {
		chs[i], errs[i] = r.ch, r.err
	}
	return chs, errs
}

// BeatQueue returns how many heartbeats wait for a call of their group,
// and in how many groups a call is in flight.
func (s *Store) BeatQueue() (queued, inFlight int) {
	for _, groups := range [][]beatGroup{s.mixedGroups, s.shardGroups} {
		for i := range groups {
			g := &groups[i]
			g.mu.Lock()
			queued += len(g.queue)
			if g.running {
				inFlight++
			}
			g.mu.Unlock()
		}
	}
	return queued, inFlight
}

// BeatCalls returns the script calls that carried heartbeats so far.
func (s *Store) BeatCalls() uint64 { return s.beatCalls.Load() }

// CallContext is the context of a call carrying beats whose callers have
// these deadlines (zero: none).
func CallContext(deadlines ...time.Time) (context.Context, context.CancelFunc) {
	batch := make([]*beatReq, len(deadlines))
	for i, d := range deadlines {
		batch[i] = &beatReq{deadline: d}
	}
	return callContext(batch)
}

// PanicInCall makes a group's next call panic (its first beat has no
// shard) while another caller's beat rides in it. It reports whether the
// panic reached the sender, the other caller's error, and whether the
// group was released for the next call.
func (s *Store) PanicInCall() (panicked bool, otherErr error, released bool) {
	g := &s.shardGroups[0]
	bad := &beatReq{user: "bad", done: make(chan bool, 1)}
	other := &beatReq{user: "other", device: "d", shard: &s.shards[0], done: make(chan bool, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, bad, other)
	g.running = true
	g.mu.Unlock()
	func() {
		defer func() { panicked = recover() != nil }()
		s.sendBeats(g, bad)
	}()
	if lead := <-other.done; lead {
		return panicked, errors.New("the other caller was asked to send a call"), false
	}
	g.mu.Lock()
	released = !g.running && len(g.queue) == 0
	g.mu.Unlock()
	return panicked, other.err, released
}

// RoomClaim is a user's room ops claimed by a node that may die before it
// applies or acknowledges them.
type RoomClaim struct{ c *roomClaim }

// TakeRoomOps claims user's room ops as a node that is about to apply
// them does (nil: none due).
func (s *Store) TakeRoomOps(ctx context.Context, now int64, user string) (*RoomClaim, error) {
	sk := &s.shards[s.shardIndex(user)]
	arr, err := s.roomTake.Exec(ctx, s.c, []string{sk.due}, []string{user, i64(now)}).ToArray()
	if err != nil {
		return nil, err
	}
	c, err := decodeRoomClaim(user, arr)
	if c == nil || err != nil {
		return nil, err
	}
	return &RoomClaim{c}, nil
}

// ApplyRoomOpsNoAck applies claimed ops at now and dies before the
// acknowledgement: it returns the events applied and how many ops the
// rooms refused (their claim had ended).
func (s *Store) ApplyRoomOpsNoAck(ctx context.Context, now int64, rc *RoomClaim) (evs []presence.RoomEvent, refused int, err error) {
	for _, op := range rc.c.ops {
		e := s.roomApplyExec(now, rc.c, op)
		arr, err := s.roomApply.Exec(ctx, s.c, e.Keys, e.Args).ToArray()
		if err != nil {
			return evs, refused, err
		}
		switch code, _ := arr[0].AsInt64(); code {
		case -1:
			refused++
		case 1:
			n, _ := arr[1].AsInt64()
			evs = append(evs, presence.RoomEvent{Room: op.room, UserID: rc.c.user, Count: int(n)})
		}
	}
	return evs, refused, nil
}

// AgeReplicaChecks makes what the store learnt of every master's
// replicas old enough to be asked again by the next claim.
func (s *Store) AgeReplicaChecks() {
	for i := range s.replicas {
		s.replicas[i].checked.Store(0)
	}
}

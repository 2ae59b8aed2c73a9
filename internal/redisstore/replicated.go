package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// Claims, replicated before they are acknowledged.
//
// A device a node claims lives in Redis only (its durable copy is the
// socket itself). Redis replicates asynchronously: a master that
// acknowledged a claim and then died, or a master cut off from its
// replicas while a node still reached it (split brain), loses the claim
// when a replica is promoted in its place, and the device reads offline
// while its socket is alive — the one thing presence must not show. So a
// claim runs on a connection of its own followed by WAIT for every
// replica the master has (ROLE, on the same connection, says how many):
// the call
// succeeds once they all hold the write, and fails with
// tracker.ErrNotReplicated when they do not within replicaWait (or WAIT
// or ROLE fail after the script ran) — the tracker then retries it, as
// any failed claim. The change such
// a write made (a user coming online) is kept until a later write of the
// same user is acknowledged — replication is in order, so the earlier
// write is then safe too — and returned by it: watchers are told of a
// change only once it cannot be lost. A master without replicas
// (a single Redis, or a Cluster without them) does not wait at all, and a
// master whose replicas are gone (crashed; after a promotion the new
// master has none until one rejoins) waits for those it has, and so does
// a master cut off from its replicas once it drops them (repl-timeout,
// 60 s by default): from then on its writes are acknowledged unreplicated
// — Redis's min-replicas-to-write closes that window (docs/operations.md).
// A Redis that refuses ROLE (an ACL) is not waited for at all.
//
// Releases and hand-offs are not waited for: a release lost in a failover
// leaves its device in Redis until the node's lease ends (a false online
// for as long), but waiting would tell the node's table a release it
// applied had not happened, and the device's socket, if it came back,
// would then never be claimed again.

// replicaWait is how long WAIT waits for the replicas: replication on a
// LAN takes well under a millisecond; a replica this late is cut off or
// stalled.
const replicaWait = 100 * time.Millisecond

// replicaCheck is how often a shard whose master had no replicas is asked
// again (ROLE) before a write: meanwhile its writes take the shared,
// auto-pipelined connections. One write asks; the writes that come while
// it does go on as the last answer said, so a reconnect storm's
// thousands of claims a second do not all queue for the pool of
// dedicated connections each time the answer grows old (a queue long
// enough to outlast StoreTimeout, which the tracker takes for an outage).
const replicaCheck = time.Second

// shardReplicas is what the store last learnt of the replicas of a
// shard's master.
type shardReplicas struct {
	n        atomic.Int32 // connected replicas; -1 before the first look
	checked  atomic.Int64 // Unix ms of that look
	checking atomic.Bool  // a write is asking again (replicaCheck)
}

// execReplicated runs sc on keys and args like Exec and, when the shard's
// master has replicas, acknowledges only once they all have the write.
// With tracker.ErrNotReplicated the reply is returned too: the write was
// applied.
func (s *Store) execReplicated(ctx context.Context, sc *script, shard int, keys, args []string) (rueidis.RedisMessage, error) {
	r := &s.replicas[shard]
	if r.n.Load() == 0 {
		fresh := time.Now().UnixMilli()-r.checked.Load() < replicaCheck.Milliseconds()
		if fresh || !r.checking.CompareAndSwap(false, true) {
			return sc.Exec(ctx, s.c, keys, args).ToMessage()
		}
		// This write asks again; the others meanwhile go on as above.
		defer r.checking.Store(false)
	}
	var msg rueidis.RedisMessage
	var notReplicated error
	err := s.c.Dedicated(func(dc rueidis.DedicatedClient) error {
		// ROLE and the script in one round trip, then WAIT for the
		// replicas ROLE named (WAIT counts the writes of this connection).
		res := dc.DoMulti(ctx, dc.B().Role().Build(),
			dc.B().Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
		var err error
		msg, err = res[1].ToMessage()
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			// This node has not seen the script yet (a new master).
			msg, err = dc.Do(ctx, dc.B().Eval().Script(sc.src.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).ToMessage()
		}
		if err != nil {
			return err // the script did not run: a plain failure
		}
		// The script ran: whatever goes wrong from here leaves its write
		// applied, not acknowledged.
		have, master, err := replicasOf(res[0])
		switch {
		case err != nil:
			// ROLE refused (an ACL, a proxy that does not pass it): the
			// replicas cannot be known, so none are waited for — as
			// before this check existed — and ROLE is asked again in a
			// second.
			r.n.Store(0)
			r.checked.Store(time.Now().UnixMilli())
			return nil
		case !master:
			notReplicated = fmt.Errorf("%w: answered by a replica", tracker.ErrNotReplicated)
			return nil
		}
		r.n.Store(int32(have))
		r.checked.Store(time.Now().UnixMilli())
		if have == 0 {
			return nil
		}
		acked, err := dc.Do(ctx, dc.B().Wait().Numreplicas(have).Timeout(replicaWait.Milliseconds()).Build()).AsInt64()
		switch {
		case err != nil:
			notReplicated = fmt.Errorf("%w: WAIT: %v", tracker.ErrNotReplicated, err)
		case acked < have:
			notReplicated = fmt.Errorf("%w: %d of %d replicas", tracker.ErrNotReplicated, acked, have)
		}
		return nil
	})
	return msg, firstOf(err, notReplicated)
}

// unacked keeps ch, the change of a write of user not replicated in time,
// for the next acknowledged write of user (acked).
func (s *Store) unacked(user string, ch presence.Change) {
	if !ch.Changed {
		return
	}
	s.pendingMu.Lock()
	defer s.pendingMu.Unlock()
	if s.pending == nil || len(s.pending) >= maxPending {
		// Users whose writes never came again (their node's work moved
		// on): forget them rather than grow.
		s.pending = make(map[string]presence.Change)
	}
	if p, ok := s.pending[user]; !ok || ch.Event.Version > p.Event.Version {
		s.pending[user] = ch
	}
}

// acked returns what an acknowledged write of user that made ch tells:
// ch, or the change of an earlier write not replicated in time, now safe,
// when ch changed nothing (a newer change supersedes it).
func (s *Store) acked(user string, ch presence.Change) presence.Change {
	s.pendingMu.Lock()
	defer s.pendingMu.Unlock()
	p, ok := s.pending[user]
	if !ok {
		return ch
	}
	delete(s.pending, user)
	if ch.Changed && ch.Event.Version > p.Event.Version {
		return ch
	}
	return p
}

// forget drops the change kept for user: the write that made it was lost
// (a failover took it).
func (s *Store) forget(user string) {
	s.pendingMu.Lock()
	delete(s.pending, user)
	s.pendingMu.Unlock()
}

// maxPending bounds the changes kept for writes not replicated in time.
const maxPending = 100_000

// replicasOf reads a ROLE reply: whether the node is a master and its
// connected replicas, ["master", offset, [[ip, port, offset], …]].
func replicasOf(r rueidis.RedisResult) (n int64, master bool, err error) {
	arr, err := r.ToArray()
	if err != nil {
		return 0, false, err
	}
	if len(arr) < 3 {
		return 0, false, nil
	}
	if role, _ := arr[0].ToString(); role != "master" {
		return 0, false, nil
	}
	reps, err := arr[2].ToArray()
	if err != nil {
		return 0, false, err
	}
	return int64(len(reps)), true, nil
}

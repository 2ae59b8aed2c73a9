package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
)

// Heartbeats are sent in batches: the beats that arrive while a call of
// their group is in flight wait for it and go together in the next one —
// one script call for dozens of beats under load, and no added wait when
// idle (a beat that finds its group idle is sent at once). Each call has
// a fixed cost in Redis (parsing the call, setting up the script); in
// BenchmarkBeat a beat costs Redis 14–15 µs of CPU sent alone and 9–10 µs
// in batches of ~125, and the beats per second rose by half.
//
// A group has at most one call in flight. The caller whose beat opens a
// call sends it; when the reply is back it hands the next call to the
// first beat that queued meanwhile (so no caller sends more than one call)
// and then wakes the callers of its batch. A user's beats always go to
// the same group, in arrival order.
//
// The keys of one script must share a Cluster slot, so on a Cluster a
// group is a shard; on one Redis any keys may go together and the shards
// are folded into standaloneGroups groups — unless Redis refuses a call
// with CROSSSLOT (a proxy in front of a sharded Redis), after which each
// shard is a group again. (During that one switch a user's beat queued in
// its old group and one in its new group may be applied in either order;
// a beat only ever moves times later, so both orders end the same.)
const (
	maxBeatBatch     = 128
	standaloneGroups = 4
)

type beatGroup struct {
	mu      sync.Mutex
	queue   []*beatReq
	running bool     // a call is in flight or about to be sent
	_       [64]byte // keep neighbouring groups' locks off one cache line
}

type beatReq struct {
	user, device string
	now          int64
	active       bool
	shard        *shardKeys
	bucket       int       // within shard
	deadline     time.Time // the caller's (zero: none)

	snap   *presence.Snapshot // BeatRead: filled with the user after the beat
	snapOK bool               // snap was filled

	ch   presence.Change
	err  error
	done chan bool // true: send the next call of the group; false: ch and err are set
}

var beatReqPool = sync.Pool{New: func() any { return &beatReq{done: make(chan bool, 1)} }}

func (s *Store) initBeats() {
	s.shardGroups = make([]beatGroup, len(s.shards))
	if s.c.Mode() != rueidis.ClientModeCluster {
		s.mixedGroups = make([]beatGroup, standaloneGroups)
	}
}

// group returns the batch group of a beat of shard k: a mixed group on one
// Redis, unless it refused a call across slots (a proxy in front of a
// sharded Redis does): from then on, the shard's own group.
func (s *Store) group(k int) *beatGroup {
	if s.mixedGroups != nil && !s.crossSlotRefused.Load() {
		return &s.mixedGroups[k%len(s.mixedGroups)]
	}
	return &s.shardGroups[k]
}

func (s *Store) shardIndex(user string) int {
	return int(fnv32a(user) % uint32(len(s.shards)))
}

// Beat implements tracker.Store.
func (s *Store) Beat(ctx context.Context, now int64, user, device string, active bool) (presence.Change, error) {
	ch, _, err := s.BeatRead(ctx, now, user, device, active, nil)
	return ch, err
}

// BeatRead implements tracker.BeatReader: Beat, and, if snap is not nil,
// the user as Get would read it at now after the beat, filled in by the
// same script call (the HTTP heartbeat's answer costs no second round
// trip). It reports whether snap was filled; when it was not (the reply
// did not carry the user: not loaded, too many devices), the caller reads
// the user.
func (s *Store) BeatRead(ctx context.Context, now int64, user, device string, active bool, snap *presence.Snapshot) (_ presence.Change, _ bool, err error) {
	defer callBeatRead.Start(ctx).Done(&err)
	k, b := s.place(user)
	g := s.group(k)
	r := beatReqPool.Get().(*beatReq)
	r.user, r.device, r.now, r.active, r.shard, r.bucket, r.snap = user, device, now, active, &s.shards[k], b, snap
	r.deadline, _ = ctx.Deadline()

	g.mu.Lock()
	g.queue = append(g.queue, r)
	lead := !g.running
	g.running = true
	g.mu.Unlock()
	if !lead {
		lead = <-r.done
	}
	if lead {
		s.sendBeats(g, r)
	}
	ch, ok, err := r.ch, r.snapOK, r.err
	*r = beatReq{done: r.done}
	beatReqPool.Put(r)
	return ch, ok, err
}

// sendBeats sends one call with the group's queued beats, the first of
// which is self's, then hands the group on and wakes the batch's callers.
// The call has until the latest deadline of its callers (none if one has
// none): every beat gets at least the time its caller allows, whoever
// sends it and however long it queued. A caller may thus wait up to twice
// its deadline: the call in flight when it queued, then its own.
func (s *Store) sendBeats(g *beatGroup, self *beatReq) {
	g.mu.Lock()
	n := min(len(g.queue), maxBeatBatch)
	batch := make([]*beatReq, n)
	copy(batch, g.queue)
	rest := copy(g.queue, g.queue[n:])
	clear(g.queue[rest:])
	g.queue = g.queue[:rest]
	g.mu.Unlock()

	defer func() {
		// Whatever happened to the call — even a panic — the group goes
		// on and every caller of the batch is answered.
		p := recover()
		if p != nil {
			for _, r := range batch {
				r.ch, r.err = presence.Change{}, fmt.Errorf("redisstore: beat: panic: %v", p)
			}
		}
		g.mu.Lock()
		var next *beatReq
		if len(g.queue) > 0 {
			next = g.queue[0]
		} else {
			g.running = false
		}
		g.mu.Unlock()
		if next != nil {
			next.done <- true
		}
		for _, r := range batch {
			if r != self {
				r.done <- false
			}
		}
		if p != nil {
			panic(p)
		}
	}()
	ctx, cancel := callContext(batch)
	defer cancel()
	s.beatBatch(ctx, batch)
}

// callContext returns the context of a call carrying batch: never
// cancelled (a caller going away must not fail the others' beats), with
// the latest deadline of the batch's callers, or none if one has none.
func callContext(batch []*beatReq) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, r := range batch {
		if r.deadline.IsZero() {
			return context.Background(), func() {}
		}
		if r.deadline.After(latest) {
			latest = r.deadline
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// beatBatch runs one script call for batch and sets every beat's outcome.
func (s *Store) beatBatch(ctx context.Context, batch []*beatReq) {
	defer callBeatBatch.Start(ctx).End(nil)
	keys := make([]string, 0, 3*len(batch))
	args := make([]string, 0, 4*len(batch))
	for _, r := range batch {
		a := "0" // mode: active 1/0, + 2 to read the user back
		switch {
		case r.active && r.snap != nil:
			a = "3"
		case r.snap != nil:
			a = "2"
		case r.active:
			a = "1"
		}
		keys = append(keys, r.shard.bucketKey(r.bucket), r.shard.due, r.shard.dirty)
		args = append(args, r.user, i64(r.now), r.device, a)
	}
	s.beatCalls.Add(1)
	replies, err := s.beat.Exec(ctx, s.c, keys, args).ToArray()
	if err != nil && s.mixedGroups != nil && strings.Contains(err.Error(), "CROSSSLOT") {
		// Not a plain Redis but a proxy for a sharded one: keep each
		// later call within one shard (these beats fail; the tracker
		// retries or buffers them like any failed call).
		s.crossSlotRefused.Store(true)
	}
	if err == nil && len(replies) != len(batch) {
		err = errReplyCount(len(replies), len(batch))
	}
	for i, r := range batch {
		if err != nil {
			r.err = wrapErr("beat", s.beat.err(err))
			continue
		}
		reply := replies[i]
		if r.snap != nil {
			// {the beat's reply, the packed user} (beat_fast.lua), or a
			// plain {-1} / {-2}.
			if arr, err := reply.ToArray(); err == nil && len(arr) == 2 && arr[0].IsArray() {
				reply = arr[0]
				if v, err := arr[1].ToString(); err == nil {
					var u packedUser
					if err := decodePacked(r.user, v, &u); err == nil {
						s.snapshot(&u, r.now, r.snap)
						r.snapOK = true
					}
				}
			}
		}
		r.ch, r.err = s.change(reply, r.user, r.now, "beat")
	}
}

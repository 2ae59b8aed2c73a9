package redisstore

import (
	"context"
	"hash/fnv"
	"sync"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
)

// Heartbeats are sent in batches. A script call costs Redis far more than
// the few commands of a common heartbeat (measured: ~25 µs an EVALSHA of
// one beat), so the beats that arrive while a call of their group is in
// flight wait for it and go together in the next one: one script call for
// dozens of beats under load, and no added wait when idle (a beat that
// finds its group idle is sent at once).
//
// A group has at most one call in flight. The caller whose beat opens a
// call sends it; when the reply is back it hands the next call to the
// first beat that queued meanwhile (so no caller sends more than one call)
// and then wakes the callers of its batch. A user's beats always go to
// the same group, in arrival order.
//
// The keys of one script must share a Cluster slot, so on a Cluster a
// group is a shard; on one Redis any keys may go together and the shards
// are folded into standaloneGroups groups.
const (
	maxBeatBatch     = 128
	standaloneGroups = 4
)

type beatGroup struct {
	mu      sync.Mutex
	queue   []*beatReq
	running bool // a call is in flight or about to be sent
	_       [40]byte
}

type beatReq struct {
	user, device string
	now          int64
	active       bool
	shard        *shardKeys

	ch   presence.Change
	err  error
	done chan bool // true: send the next call of the group; false: ch and err are set
}

var beatReqPool = sync.Pool{New: func() any { return &beatReq{done: make(chan bool, 1)} }}

func (s *Store) initBeats() {
	n := standaloneGroups
	if s.c.Mode() == rueidis.ClientModeCluster {
		n = len(s.shards)
	}
	s.beatGroups = make([]beatGroup, n)
}

func (s *Store) shardIndex(user string) int {
	h := fnv.New32a()
	h.Write([]byte(user))
	return int(h.Sum32() % uint32(len(s.shards)))
}

// Beat implements tracker.Store.
func (s *Store) Beat(ctx context.Context, now int64, user, device string, active bool) (presence.Change, error) {
	k := s.shardIndex(user)
	g := &s.beatGroups[k%len(s.beatGroups)]
	r := beatReqPool.Get().(*beatReq)
	r.user, r.device, r.now, r.active, r.shard = user, device, now, active, &s.shards[k]

	g.mu.Lock()
	g.queue = append(g.queue, r)
	lead := !g.running
	g.running = true
	g.mu.Unlock()
	if !lead {
		lead = <-r.done
	}
	if lead {
		s.sendBeats(ctx, g, r)
	}
	ch, err := r.ch, r.err
	*r = beatReq{done: r.done}
	beatReqPool.Put(r)
	return ch, err
}

// sendBeats sends one call with the group's queued beats, the first of
// which is self's, then hands the group on and wakes the batch's callers.
func (s *Store) sendBeats(ctx context.Context, g *beatGroup, self *beatReq) {
	g.mu.Lock()
	n := min(len(g.queue), maxBeatBatch)
	batch := make([]*beatReq, n)
	copy(batch, g.queue)
	rest := copy(g.queue, g.queue[n:])
	clear(g.queue[rest:])
	g.queue = g.queue[:rest]
	g.mu.Unlock()

	cctx, cancel := callContext(ctx)
	s.beatBatch(cctx, batch)
	cancel()

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
}

// callContext keeps ctx's deadline (the tracker's store timeout) but not
// its cancellation: the call carries other callers' beats, which must not
// fail because the caller who happens to send it went away.
func callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	ctx = context.WithoutCancel(ctx)
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, dl)
}

// beatBatch runs one script call for batch and sets every beat's outcome.
func (s *Store) beatBatch(ctx context.Context, batch []*beatReq) {
	keys := make([]string, 0, 3*len(batch))
	args := make([]string, 0, 4*len(batch))
	for _, r := range batch {
		a := "0"
		if r.active {
			a = "1"
		}
		keys = append(keys, r.shard.users+r.user, r.shard.due, r.shard.dirty)
		args = append(args, r.user, i64(r.now), r.device, a)
	}
	s.beatCalls.Add(1)
	replies, err := s.beat.Exec(ctx, s.c, keys, args).ToArray()
	if err == nil && len(replies) != len(batch) {
		err = errReplyCount(len(replies), len(batch))
	}
	for i, r := range batch {
		if err != nil {
			r.err = wrapErr("beat", err)
			continue
		}
		r.ch, r.err = s.change(replies[i], r.user, r.now, "beat")
	}
}

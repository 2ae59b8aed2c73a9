package tracker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/presenced/presenced/internal/presence"
)

// outage is the outage buffer of this node — per user, per device the
// latest operation, the latest manual status and the latest settings of
// the time the store (or the user's part of it) was down — with the probe
// that tells when the store is back and the replay that then applies
// the buffer (see docs/internals.md, "Outages of the state store").
type outage struct {
	buf    userBuffer
	link   *link
	events *emitter
	log    *slog.Logger
	// apply applies one operation by the ordinary path (the user loaded
	// first), at the operation's own time.
	apply func(ctx context.Context, user string, o op) (presence.Change, error)

	replayed     atomic.Uint64 // users whose buffered operations were replayed
	staleReplays atomic.Uint64 // of those, users whose last change was over before the replay
}

// keep records o for user unless the store is up for the user. It
// reports whether o was taken (recorded, or refused with the returned
// error). While the buffer is replayed only users still in it take
// operations, so that theirs stay behind the older ones; the others go
// to the store.
func (g *outage) keep(user string, o op) (bool, error) {
	sh := g.buf.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := g.link.stateFor(user) // under the lock: see replay
	if st == stateUp {
		return false, nil
	}
	return g.buf.addLocked(sh, user, o, st == stateDown, ErrUnavailable)
}

// probe asks the store whether it answers, with Ping if it has one.
func (g *outage) probe(ctx context.Context) error {
	b := g.link.bound(ctx)
	defer g.link.release(b)
	if p := g.link.can.pinger; p != nil {
		return p.Ping(b.ctx)
	}
	var s [1]presence.Snapshot
	return g.link.store.Get(b.ctx, g.link.now(), []string{"\x00probe"}, s[:])
}

// replayWorkers replay the buffer's shards in parallel (each a share of
// the shards, so one user is replayed by one goroutine).
const replayWorkers = 8

var errReplayAborted = errors.New("replay aborted: the store is down again")

// replay applies every buffered user's operations to the store through
// the ordinary paths (ErrNotLoaded → load included), with each
// operation's own time as now, and publishes the changes. A user stays in
// the buffer while it is replayed: operations arriving meanwhile are added
// there and replayed after the older ones. On a failure the user's
// operations go back in front of the newer ones and replay stops. part is
// the part of a Partitioned store being replayed (its users only), or -1
// for the whole store (the users of every part that is up).
func (g *outage) replay(ctx context.Context, part int) error {
	// The state is stateReplaying before any shard is read: keep checks
	// the state under the shard lock, so no new user can enter a shard
	// after replay has listed it.
	var wg sync.WaitGroup
	errs := make([]error, replayWorkers)
	for w := range replayWorkers {
		wg.Go(func() {
			for i := w; i < bufShards; i += replayWorkers {
				if err := g.replayShard(ctx, &g.buf.shards[i], part); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (g *outage) replayShard(ctx context.Context, sh *bufShard, part int) error {
	users := g.buf.usersIn(sh, func(u string) bool {
		if part >= 0 {
			return g.link.parts.of(u) == part
		}
		return g.link.partUp(u) // its part is down: replayed when it answers
	}, nil)
	replaying := func() bool {
		if part >= 0 {
			return g.link.parts.replaying(part) && g.link.up()
		}
		return g.link.replaying()
	}
	var ops []op
	for _, u := range users {
		if !replaying() || ctx.Err() != nil {
			return errReplayAborted
		}
		var err error
		if ops, err = g.replayUser(ctx, sh, u, ops[:0]); err != nil {
			if part < 0 && !g.link.partUp(u) {
				continue // its part went down: it stays buffered until that part answers
			}
			return err
		}
	}
	return nil
}

func (g *outage) replayUser(ctx context.Context, sh *bufShard, user string, ops []op) ([]op, error) {
	// The newest change the replay made that everyone sees, and the
	// newest one only the user sees (an invisible user's text) if it came
	// after: each goes to different watchers.
	var last, self presence.Change
	_, err := g.buf.drain(sh, user, func(batch *pending) error {
		ops = batch.ops(ops[:0])
		for _, o := range ops {
			ch, err := g.replayOp(ctx, user, o)
			if err != nil {
				return fmt.Errorf("replay of %q: %w", user, err)
			}
			switch {
			case ch.Changed && ch.Event.SelfOnly:
				self = ch
			case ch.Changed:
				last, self = ch, presence.Change{}
			}
		}
		return nil
	})
	if err == nil {
		g.replayed.Add(1)
	}
	g.publishIfTrue(ctx, last, self)
	return ops, err
}

// replayOp applies one buffered operation and returns its change. A
// refusal by the rules (too many devices) drops it, as it would have been
// dropped at the time.
func (g *outage) replayOp(ctx context.Context, user string, o op) (presence.Change, error) {
	ch, err := g.apply(ctx, user, o)
	if err != nil && domainError(err) {
		g.log.Warn("buffered operation refused on replay", "user", user, "err", err)
		return presence.Change{}, nil
	}
	return ch, err
}

// publishIfTrue publishes the last change a user's replay made, if it is
// still what the user shows now. The changes of a replay happened at the
// times of the outage: the ones before the last are history (each event
// carries the whole state, so the last says it all), and the last itself
// may be over — a user who came and went during the outage was online
// then, not now, and announcing it would show them online until the next
// sweep. Such a user's state is settled by the sweeps that resume after
// RecoverGrace (an offline that a watcher already shows is harmless).
// self, if a change, is the newest change only the user sees that came
// after ch (an invisible user's text): it is published after ch, if the
// user still has that text.
func (g *outage) publishIfTrue(ctx context.Context, ch, self presence.Change) {
	if !ch.Changed && !self.Changed {
		return
	}
	user := ch.Event.UserID
	if !ch.Changed {
		user = self.Event.UserID
	}
	var s [1]presence.Snapshot
	b := g.link.bound(ctx)
	err := g.link.store.Get(b.ctx, g.link.now(), []string{user}, s[:])
	g.link.release(b)
	if err != nil || !s[0].Known {
		g.staleReplays.Add(1)
		return
	}
	if pubText, _ := s[0].Public(); ch.Changed && (s[0].Status.Public() != ch.Event.Status || pubText != ch.Event.Text) {
		g.staleReplays.Add(1)
	} else {
		g.events.emit(&ch)
	}
	if self.Changed && s[0].Text != self.Event.SelfText {
		g.staleReplays.Add(1)
	} else {
		g.events.emit(&self)
	}
}

// heldOps returns a copy of the operations buffered for user, in the
// order of a replay; nil if none.
func (g *outage) heldOps(user string) []op { return g.buf.opsOf(user) }

// heldDevices appends the last beats and byes of the devices buffered for
// user to out (what a peer is told).
func (g *outage) heldDevices(user string, out []op) []op { return g.buf.devicesOf(user, out) }

// users is how many users have operations in the buffer.
func (g *outage) users() int64 { return g.buf.n.Load() }

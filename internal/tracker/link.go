package tracker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/clock"
)

// link is the store as this node reaches it: its calls, bounded when the
// store lives in another process, and whether it answers — as a whole
// and, for a Partitioned store, part by part. Every part of the tracker
// calls the store through it; the outage machinery (outage.go, Run)
// moves its states.
type link struct {
	store   Store
	can     abilities
	timeout time.Duration // StoreTimeout: bounds every call of a store in another process
	grace   int64         // RecoverGrace in ms: no sweep for so long after a recovery
	clock   clock.Clock
	log     *slog.Logger

	state       atomic.Uint32 // stateUp, stateDown or stateReplaying
	parts       *partStates   // nil unless the store is Partitioned
	downAt      atomic.Int64  // clock ms of the last outage's start
	recoveredAt atomic.Int64  // clock ms of the last recovery
	outages     atomic.Uint64
}

func (l *link) now() int64 { return l.clock.Now().UnixMilli() }

// bounded is a store call's context: the caller's, bounded by
// StoreTimeout for a remote store.
type bounded struct {
	ctx    context.Context
	cancel context.CancelFunc // nil if ctx is the caller's own
}

// bound returns ctx bounded by StoreTimeout, so that a hung store (a
// paused process, a silent network) is detected, unless the store is in
// this process (it implements no Pinger: memstore, whose hot path stays
// free of timers and allocations). A caller's deadline that comes first
// still applies, and its expiry is the caller's, not an outage. The result
// must be passed to release once the call returned.
func (l *link) bound(ctx context.Context) bounded {
	if l.can.pinger == nil {
		return bounded{ctx: ctx}
	}
	c, cancel := context.WithTimeout(ctx, l.timeout)
	return bounded{ctx: c, cancel: cancel}
}

func (l *link) release(b bounded) {
	if b.cancel != nil {
		b.cancel()
	}
}

// up reports whether operations go to the store (fast path: one atomic load).
func (l *link) up() bool { return l.state.Load() == stateUp }

// down reports whether the store as a whole is down (not being replayed).
func (l *link) down() bool { return l.state.Load() == stateDown }

// stateFor is the state of the store as user's operations see it: down if
// the whole store or the user's part is, replaying if either is being
// replayed, up otherwise.
func (l *link) stateFor(user string) uint32 {
	g := l.state.Load()
	if l.parts == nil || g == stateDown {
		return g
	}
	switch p := l.parts.stateOf(user); {
	case p == stateDown:
		return stateDown
	case g == stateReplaying || p == stateReplaying:
		return stateReplaying
	}
	return stateUp
}

// upFor reports whether user's operations go to the store.
func (l *link) upFor(user string) bool { return l.stateFor(user) == stateUp }

// partUp reports whether user's part is up (true without parts): the
// whole store's state aside.
func (l *link) partUp(user string) bool {
	return l.parts == nil || l.parts.stateOf(user) == stateUp
}

// partDown reports whether user's part is down (false without parts).
func (l *link) partDown(user string) bool {
	return l.parts != nil && l.parts.stateOf(user) == stateDown
}

// partsDown reports whether some part is down or being replayed.
func (l *link) partsDown() bool { return l.parts != nil && l.parts.down.Load() > 0 }

// check classifies the error of a store call made with the caller's
// ctx. Anything but ErrNotLoaded, a domain error of package presence, a
// PartialError (part of the store answered: a Cluster master is down, and
// only its users are affected) or the caller's own cancellation means the
// store is unreachable (refused, reset, or silent past StoreTimeout): the
// store is marked down and the error is returned wrapped so that
// errors.Is(err, errOutage).
func (l *link) check(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, ErrNotLoaded) || errors.Is(err, ErrStoreReset) || domainError(err) || ctx.Err() != nil ||
		partial(err) || errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrTakeOverLeft) {
		return err
	}
	l.markDown(err)
	return &outageError{err}
}

// checkUser is check for a call about one user: with a Partitioned
// store, an outage puts only the user's part down (a PartialError, which
// a call about one user should not return, counts as one too).
func (l *link) checkUser(ctx context.Context, user string, err error) error {
	if l.parts == nil || err == nil || errors.Is(err, ErrNotLoaded) || errors.Is(err, ErrStoreReset) ||
		domainError(err) || ctx.Err() != nil || errors.Is(err, ErrNotReplicated) {
		return l.check(ctx, err)
	}
	l.markPartDown(l.parts.of(user), err)
	return &outageError{err}
}

// checkKey is check for a call about one key of no user (the leases
// hash): with a Partitioned store its outage is that of the one master
// holding the key, not of the store: the error is returned (wrapped as an
// outage's) and nothing is marked down. The lease code retries at its
// next tick; no node can renew or take a lease meanwhile, so nobody is
// taken over for it.
func (l *link) checkKey(ctx context.Context, err error) error {
	if l.parts == nil || err == nil || errors.Is(err, ErrLeaseLost) || domainError(err) || ctx.Err() != nil {
		return l.check(ctx, err)
	}
	return &outageError{err}
}

// markDown records an outage. A failure during a replay sends the store
// back down without counting a new outage.
func (l *link) markDown(err error) {
	if l.state.CompareAndSwap(stateUp, stateDown) {
		l.downAt.Store(l.now())
		l.outages.Add(1)
		l.log.Warn("state store unavailable; buffering operations and answering reads from the durable store", "err", err)
		return
	}
	l.state.CompareAndSwap(stateReplaying, stateDown)
}

// beginReplay moves the store from down to being replayed, and reports
// whether it did.
func (l *link) beginReplay() bool { return l.state.CompareAndSwap(stateDown, stateReplaying) }

// replaying reports whether the store as a whole is being replayed.
func (l *link) replaying() bool { return l.state.Load() == stateReplaying }

// replayFailed sends the store back down after a replay that failed.
func (l *link) replayFailed() { l.state.CompareAndSwap(stateReplaying, stateDown) }

// recovered marks the store up after its replay and reports whether it
// did. Sweeps wait RecoverGrace from now (sweepable).
func (l *link) recovered() bool {
	l.recoveredAt.Store(l.now())
	return l.state.CompareAndSwap(stateReplaying, stateUp)
}

// sweepable reports whether sweeps may run: the store is up, and was for
// RecoverGrace since its last recovery (docs/internals.md, "Outages of
// the state store").
func (l *link) sweepable() bool {
	return l.up() && l.now() >= l.recoveredAt.Load()+l.grace
}

// markPartDown records an outage of part p.
func (l *link) markPartDown(p int, err error) {
	if l.parts.markDown(p, l.now()) {
		l.log.Warn("part of the state store unavailable; buffering its users' operations", "part", p, "err", err)
	}
}

// partsFailed marks down the parts a call on every part found silent
// (PartialError.Parts), so that this node's writes for their users are
// buffered and its sweeps leave them alone until they are back and
// replayed — a node that only sweeps a part learns of its outage so.
func (l *link) partsFailed(err error) {
	var pe *PartialError
	if l.parts == nil || !errors.As(err, &pe) {
		return
	}
	for _, p := range pe.Parts {
		if p >= 0 && p < len(l.parts.states) {
			l.markPartDown(p, pe.Err)
		}
	}
}

// partsFailedWhole takes in a call about ids (a batch read) that failed
// as a whole, with no answer for any of them. When they all live in one
// part, that part is down: a read of users whose master does not answer.
// When they live in several, the failure does not say which of them
// failed — a pipelined read cut by its deadline fails for every part it
// touched, those whose masters answer too (a Cluster failover: a node
// whose client waited for the new layout; a node that did not run for a
// moment) — so each of them is left to Run to probe (probeSuspects), and
// only those that do not answer are marked down.
func (l *link) partsFailedWhole(ids []string, err error) {
	if p, one := l.parts.onePart(ids); one {
		l.markPartDown(p, err)
		return
	}
	l.parts.suspectAll(ids)
}

// probeSuspects pings at once, within one StoreTimeout, the parts a
// failed call made suspect and marks down those that do not answer. Run
// calls it every ProbeInterval.
func (l *link) probeSuspects(ctx context.Context) {
	if l.parts == nil {
		return
	}
	ps := l.parts.takeSuspects()
	if len(ps) == 0 || !l.up() {
		return // nothing suspect, or the store is down as a whole: its recovery probes it
	}
	errs := l.pingParts(ctx, ps)
	if ctx.Err() != nil {
		return
	}
	for i, p := range ps {
		if errs[i] != nil {
			l.markPartDown(p, errs[i])
		}
	}
}

// pingParts pings parts ps at once, within one StoreTimeout: one after
// the other, the shards of a silent master (a third of them, each
// waiting StoreTimeout) would hold Run — and the lease renewals it makes
// — for minutes.
func (l *link) pingParts(ctx context.Context, ps []int) []error {
	errs := make([]error, len(ps))
	b := l.bound(ctx)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { errs[i] = l.can.partitioned.PingPart(b.ctx, p) })
	}
	wg.Wait()
	l.release(b)
	return errs
}

// sweepSkip returns which parts a sweep leaves alone now — those down or
// being replayed, and those back for less than RecoverGrace — or nil if
// it may sweep them all.
func (l *link) sweepSkip() func(part int) bool {
	if l.parts == nil {
		return nil
	}
	return l.parts.sweepSkip(l.now(), l.grace)
}

// downParts returns which parts are down or being replayed now, or nil if
// none is (takeovers and checkpoints leave them alone).
func (l *link) downParts() func(part int) bool {
	if l.parts == nil {
		return nil
	}
	return l.parts.downSkip()
}

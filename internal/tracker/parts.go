package tracker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// Partitioned is an optional ability of a Store whose parts fail apart: a
// Redis Cluster, where each master holds some shards. The users of one
// part live there only (every key of a user is in its part). A store
// that fails as a whole (one Redis) is not Partitioned, or says 1.
//
// With it an outage of one part is that part's users' alone: a write for
// a user whose part does not answer puts that part down — the user's
// operations, and those of every user of the part, are buffered as in an
// outage of the whole store, reads of them are degraded — while the users
// of the other parts go on as if nothing happened. Run probes each part
// that is down with PingPart and replays its users' buffer when it
// answers.
type Partitioned interface {
	Parts() int
	Part(user string) int
	PingPart(ctx context.Context, part int) error
}

// partStates are the states (stateUp, stateDown, stateReplaying) of a
// Partitioned store's parts.
type partStates struct {
	of      func(user string) int
	ping    func(ctx context.Context, part int) error
	states  []atomic.Uint32
	downAt  []atomic.Int64 // clock ms of each part's last outage's start
	upAt    []atomic.Int64 // clock ms of each part's last recovery
	down    atomic.Int64   // parts down or replaying now
	outages atomic.Uint64  // times a part was found down
	// suspect are the parts a call about several of them failed for as
	// a whole (partsFailedWhole): Run probes them (probeSuspects) and
	// marks down those that do not answer. nsuspect counts them.
	suspect  []atomic.Bool
	nsuspect atomic.Int64
}

func newPartStates(s Store) *partStates {
	p, ok := s.(Partitioned)
	if !ok || p.Parts() < 2 {
		return nil
	}
	n := p.Parts()
	return &partStates{of: p.Part, ping: p.PingPart, states: make([]atomic.Uint32, n),
		downAt: make([]atomic.Int64, n), upAt: make([]atomic.Int64, n), suspect: make([]atomic.Bool, n)}
}

// stateFor is the state of the store as user's operations see it: down if
// the whole store or the user's part is, replaying if either is being
// replayed, up otherwise.
func (t *Tracker) stateFor(user string) uint32 {
	g := t.state.Load()
	if t.parts == nil || g == stateDown {
		return g
	}
	p := t.parts.states[t.parts.of(user)].Load()
	switch {
	case p == stateDown:
		return stateDown
	case g == stateReplaying || p == stateReplaying:
		return stateReplaying
	}
	return stateUp
}

// upFor reports whether user's operations go to the store.
func (t *Tracker) upFor(user string) bool { return t.stateFor(user) == stateUp }

// partUp reports whether user's part is up (true without parts): the
// whole store's state aside.
func (t *Tracker) partUp(user string) bool {
	return t.parts == nil || t.parts.states[t.parts.of(user)].Load() == stateUp
}

// storeErrUser is storeErr for a call about one user: with a Partitioned
// store, an outage puts only the user's part down (a PartialError, which
// a call about one user should not return, counts as one too).
func (t *Tracker) storeErrUser(ctx context.Context, user string, err error) error {
	if t.parts == nil || err == nil || errors.Is(err, ErrNotLoaded) || errors.Is(err, ErrStoreReset) ||
		domainError(err) || ctx.Err() != nil || errors.Is(err, ErrNotReplicated) {
		return t.storeErr(ctx, err)
	}
	t.markPartDown(t.parts.of(user), err)
	return &outageError{err}
}

// storeErrKey is storeErr for a call about one key of no user (the leases
// hash): with a Partitioned store its outage is that of the one master
// holding the key, not of the store: the error is returned (wrapped as an
// outage's) and nothing is marked down. The lease code retries at its
// next tick; no node can renew or take a lease meanwhile, so nobody is
// taken over for it.
func (t *Tracker) storeErrKey(ctx context.Context, err error) error {
	if t.parts == nil || err == nil || errors.Is(err, ErrLeaseLost) || domainError(err) || ctx.Err() != nil {
		return t.storeErr(ctx, err)
	}
	return &outageError{err}
}

// markPartDown records an outage of part p. A failure during its replay
// sends it back down without counting a new outage.
func (t *Tracker) markPartDown(p int, err error) {
	s := &t.parts.states[p]
	if s.CompareAndSwap(stateUp, stateDown) {
		t.parts.downAt[p].Store(t.Now())
		t.parts.outages.Add(1)
		if t.parts.down.Add(1) == 1 { // said once per outage, not per part
			t.log.Warn("part of the state store unavailable; buffering its users' operations", "part", p, "err", err)
		}
		return
	}
	s.CompareAndSwap(stateReplaying, stateDown)
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
func (t *Tracker) partsFailedWhole(ids []string, err error) {
	first := t.parts.of(ids[0])
	one := true
	for _, id := range ids[1:] {
		if t.parts.of(id) != first {
			one = false
			break
		}
	}
	if one {
		t.markPartDown(first, err)
		return
	}
	for _, id := range ids {
		p := t.parts.of(id)
		if t.parts.states[p].Load() == stateUp && !t.parts.suspect[p].Swap(true) {
			t.parts.nsuspect.Add(1)
		}
	}
}

// probeSuspects pings at once, within one StoreTimeout, the parts a
// failed call made suspect and marks down those that do not answer. Run
// calls it every ProbeInterval.
func (t *Tracker) probeSuspects(ctx context.Context) {
	if t.parts == nil || t.parts.nsuspect.Load() == 0 {
		return
	}
	var ps []int
	for p := range t.parts.suspect {
		if t.parts.suspect[p].Swap(false) {
			t.parts.nsuspect.Add(-1)
			ps = append(ps, p)
		}
	}
	if !t.up() {
		return // the store is down as a whole; its recovery probes it
	}
	errs := make([]error, len(ps))
	b := t.bound(ctx)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { errs[i] = t.parts.ping(b.ctx, p) })
	}
	wg.Wait()
	t.release(b)
	if ctx.Err() != nil {
		return
	}
	for i, p := range ps {
		if errs[i] != nil {
			t.markPartDown(p, errs[i])
		}
	}
}

// recoverParts probes every part that is down and, for each that answers,
// replays its users' buffer and marks it up. Run calls it every
// ProbeInterval while the store as a whole is up.
func (t *Tracker) recoverParts(ctx context.Context) {
	if t.parts == nil || t.parts.down.Load() == 0 || !t.up() {
		return
	}
	// The parts down are pinged at once, within one StoreTimeout: one
	// after the other, the shards of a silent master (a third of them,
	// each waiting StoreTimeout) would hold Run — and the lease renewals
	// it makes — for minutes.
	var downs []int
	for p := range t.parts.states {
		if t.parts.states[p].Load() == stateDown {
			downs = append(downs, p)
		}
	}
	answered := make([]bool, len(downs))
	b := t.bound(ctx)
	var wg sync.WaitGroup
	for i, p := range downs {
		wg.Go(func() { answered[i] = t.parts.ping(b.ctx, p) == nil })
	}
	wg.Wait()
	t.release(b)
	recovered, since := false, int64(0)
	for i, p := range downs {
		s := &t.parts.states[p]
		if !answered[i] || !s.CompareAndSwap(stateDown, stateReplaying) {
			continue
		}
		if err := t.replay(ctx, p); err != nil {
			s.CompareAndSwap(stateReplaying, stateDown)
			if ctx.Err() == nil {
				t.log.Warn("replay of a part's outage buffer failed; will retry", "part", p, "err", err)
			}
			continue
		}
		// The part's sweeps wait RecoverGrace, as after an outage of the
		// whole store: other nodes may hold beats of its users in their
		// buffers (sweepSkip).
		t.parts.upAt[p].Store(t.Now())
		if s.CompareAndSwap(stateReplaying, stateUp) {
			if t.parts.down.Add(-1) == 0 {
				t.log.Info("every part of the state store is back; their users' buffer replayed", "outages", t.parts.outages.Load())
			}
			if at := t.parts.downAt[p].Load(); !recovered || at < since {
				since = at
			}
			recovered = true
		}
	}
	if recovered {
		// As after an outage of the whole store: what this node's devices
		// did meanwhile, and what a failover may have lost, goes to the
		// store again; watchers are resynced.
		t.redoOwned(ctx, since)
		t.syncOwned(ctx)
		if t.onRecover != nil {
			t.onRecover()
		}
	}
}

// sweepSkip returns which parts a sweep leaves alone now — those down or
// being replayed, and those back for less than RecoverGrace — or nil if
// it may sweep them all.
func (t *Tracker) sweepSkip() func(part int) bool {
	if t.parts == nil {
		return nil
	}
	now, grace := t.Now(), t.recoverGrace.Milliseconds()
	skip := func(p int) bool {
		return t.parts.states[p].Load() != stateUp || now < t.parts.upAt[p].Load()+grace
	}
	for p := range t.parts.states {
		if skip(p) {
			return skip
		}
	}
	return nil
}

// downParts returns which parts are down or being replayed now, or nil if
// none is (takeovers and checkpoints leave them alone).
func (t *Tracker) downParts() func(part int) bool {
	if t.parts == nil || t.parts.down.Load() == 0 {
		return nil
	}
	return func(p int) bool { return t.parts.states[p].Load() != stateUp }
}

// partSweeper is the store as a PartSweeper, nil if it is not one.
func (t *Tracker) partSweeper() PartSweeper {
	ps, _ := t.store.(PartSweeper)
	return ps
}

// partsFailed marks down the parts a call on every part found silent
// (PartialError.Parts), so that this node's writes for their users are
// buffered and its sweeps leave them alone until they are back and
// replayed — a node that only sweeps a part learns of its outage so.
func (t *Tracker) partsFailed(err error) {
	var pe *PartialError
	if t.parts == nil || !errors.As(err, &pe) {
		return
	}
	for _, p := range pe.Parts {
		if p >= 0 && p < len(t.parts.states) {
			t.markPartDown(p, pe.Err)
		}
	}
}

package tracker

import (
	"sync/atomic"
)

// States of the store (or of one of its parts) as the tracker sees it.
const (
	stateUp        uint32 = iota // operations go to the store
	stateDown                    // operations are buffered; Run probes
	stateReplaying               // the buffer is being replayed; users not in it go to the store
)

// partStates are the states (stateUp, stateDown, stateReplaying) of the
// parts of a Partitioned store, each apart from the others: an outage of
// one part is its users' alone (see Partitioned).
type partStates struct {
	of      func(user string) int
	states  []atomic.Uint32
	downAt  []atomic.Int64 // clock ms of each part's last outage's start
	upAt    []atomic.Int64 // clock ms of each part's last recovery
	down    atomic.Int64   // parts down or replaying now
	outages atomic.Uint64  // times a part was found down
	// suspect are the parts a call about several of them failed for as
	// a whole (suspectAll): Run probes them (link.probeSuspects) and
	// marks down those that do not answer. nsuspect counts them.
	suspect  []atomic.Bool
	nsuspect atomic.Int64
}

// newPartStates returns the states of p's parts, nil if p is nil or has
// fewer than two (it fails as a whole).
func newPartStates(p Partitioned) *partStates {
	if p == nil || p.Parts() < 2 {
		return nil
	}
	n := p.Parts()
	return &partStates{of: p.Part, states: make([]atomic.Uint32, n),
		downAt: make([]atomic.Int64, n), upAt: make([]atomic.Int64, n), suspect: make([]atomic.Bool, n)}
}

// stateOf is the state of user's part.
func (ps *partStates) stateOf(user string) uint32 { return ps.states[ps.of(user)].Load() }

// markDown records an outage of part p at now and reports whether it is
// the first part down (said once per outage, not per part). A failure
// during its replay sends it back down without counting a new outage.
func (ps *partStates) markDown(p int, now int64) (first bool) {
	s := &ps.states[p]
	if s.CompareAndSwap(stateUp, stateDown) {
		ps.downAt[p].Store(now)
		ps.outages.Add(1)
		return ps.down.Add(1) == 1
	}
	s.CompareAndSwap(stateReplaying, stateDown)
	return false
}

// onePart returns the part of ids if they all live in one.
func (ps *partStates) onePart(ids []string) (int, bool) {
	first := ps.of(ids[0])
	for _, id := range ids[1:] {
		if ps.of(id) != first {
			return 0, false
		}
	}
	return first, true
}

// suspectAll makes the parts of ids that are up suspect.
func (ps *partStates) suspectAll(ids []string) {
	for _, id := range ids {
		p := ps.of(id)
		if ps.states[p].Load() == stateUp && !ps.suspect[p].Swap(true) {
			ps.nsuspect.Add(1)
		}
	}
}

// takeSuspects returns the suspect parts and clears them.
func (ps *partStates) takeSuspects() []int {
	if ps.nsuspect.Load() == 0 {
		return nil
	}
	var out []int
	for p := range ps.suspect {
		if ps.suspect[p].Swap(false) {
			ps.nsuspect.Add(-1)
			out = append(out, p)
		}
	}
	return out
}

// downs returns the parts that are down (not those being replayed).
func (ps *partStates) downs() []int {
	var out []int
	for p := range ps.states {
		if ps.states[p].Load() == stateDown {
			out = append(out, p)
		}
	}
	return out
}

// beginReplay moves part p from down to being replayed, and reports
// whether it did.
func (ps *partStates) beginReplay(p int) bool {
	return ps.states[p].CompareAndSwap(stateDown, stateReplaying)
}

// replayFailed sends part p back down after a replay that failed.
func (ps *partStates) replayFailed(p int) { ps.states[p].CompareAndSwap(stateReplaying, stateDown) }

// replaying reports whether part p is being replayed.
func (ps *partStates) replaying(p int) bool { return ps.states[p].Load() == stateReplaying }

// recovered marks part p up after its replay, at now. It reports whether
// it did, when the part's outage began, and whether no part is down any
// more.
func (ps *partStates) recovered(p int, now int64) (ok bool, downAt int64, last bool) {
	// The part's sweeps wait RecoverGrace from now, as after an outage
	// of the whole store: other nodes may hold beats of its users in
	// their buffers (sweepSkip).
	ps.upAt[p].Store(now)
	if !ps.states[p].CompareAndSwap(stateReplaying, stateUp) {
		return false, 0, false
	}
	return true, ps.downAt[p].Load(), ps.down.Add(-1) == 0
}

// sweepSkip returns which parts a sweep leaves alone at now — those down
// or being replayed, and those back for less than grace ms — or nil if
// it may sweep them all.
func (ps *partStates) sweepSkip(now, grace int64) func(part int) bool {
	skip := func(p int) bool {
		return ps.states[p].Load() != stateUp || now < ps.upAt[p].Load()+grace
	}
	for p := range ps.states {
		if skip(p) {
			return skip
		}
	}
	return nil
}

// downSkip returns which parts are down or being replayed now, or nil if
// none is (takeovers and checkpoints leave them alone).
func (ps *partStates) downSkip() func(part int) bool {
	if ps.down.Load() == 0 {
		return nil
	}
	return func(p int) bool { return ps.states[p].Load() != stateUp }
}

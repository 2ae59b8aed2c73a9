package tracker

import "context"

// TickLease renews the lease and takes over the leases that ran out, as
// Run does every LeaseInterval.
func (t *Tracker) TickLease(ctx context.Context) {
	if t.lease != nil {
		t.lease.tick(ctx)
	}
}

// Recover replays the outage buffer once the store answers, as Run's
// probe does (review tests).
func (t *Tracker) Recover(ctx context.Context) { t.recover(ctx) }

// RecoverParts probes the parts that are down and replays those that
// answer, as Run's probe does (review tests).
func (t *Tracker) RecoverParts(ctx context.Context) { t.recoverParts(ctx) }

// CheckFloor asks the store for its floors, as Run does every
// FlushInterval.
func (t *Tracker) CheckFloor(ctx context.Context) { t.checkFloor(ctx) }

// ProbeSuspects probes the parts a call that failed as a whole made
// suspect, as Run's probe does.
func (t *Tracker) ProbeSuspects(ctx context.Context) { t.link.probeSuspects(ctx) }

// CloseDeadline is the earliest close deadline Run's timer waits for, 0
// if none.
func (t *Tracker) CloseDeadline() int64 { return t.closes.earliest() }

package tracker

import (
	"context"
	"time"

	"github.com/presenced/presenced/internal/clock"
)

// Sweep applies every deadline due now and publishes the changes; first
// it hands the store the due work of the devices this node holds. It
// returns how many changes it published. It does nothing while the store
// is down and for RecoverGrace after it came back (docs/internals.md,
// "Outages of the state store").
func (t *Tracker) Sweep(ctx context.Context) (int, error) {
	if t.owned != nil {
		t.owned.sendDue(ctx)
	}
	return t.sweeps.sweep(ctx)
}

// closeSweep applies the close deadlines that came (Run's timer): those
// of the devices this node holds, in the node, and an in-process store's
// by a sweep. A store in another process (Redis) is swept only by the
// ticker: its part of a close is a device this node does not hold, and a
// storm of closes must not cost it a sweep of every shard each.
func (t *Tracker) closeSweep(ctx context.Context) (int, error) {
	if t.owned != nil {
		t.owned.sendDue(ctx)
	}
	if t.link.can.pinger != nil {
		return 0, nil
	}
	return t.sweeps.sweep(ctx)
}

// Checkpoint writes every last_seen changed since the previous checkpoint
// to the durable store in one transaction. On failure the batch is kept
// and retried with the next checkpoint, so nothing is lost while the
// durable store is away. While the state store is down only a waiting
// batch is retried; what a failed Dirty drained is kept in it.
func (t *Tracker) Checkpoint(ctx context.Context) error { return t.cps.write(ctx) }

// Run sweeps deadlines, checkpoints last_seen and, while the store is
// down, probes it and replays the outage buffer when it is back, until ctx
// is done; then it checkpoints once more. It returns nil after a clean stop.
// Besides every SweepInterval it sweeps when a close deadline comes (one
// timer on the tracker's clock, armed for the earliest: wake.go).
func (t *Tracker) Run(ctx context.Context) error {
	sweep := time.NewTicker(t.every.sweep)
	defer sweep.Stop()
	closeT := clock.NewTimer(t.link.clock, time.Hour)
	closeT.Stop()
	defer closeT.Stop()
	armed := int64(0) // the close deadline closeT is armed for, 0: none
	arm := func(at int64) {
		if at != 0 && (armed == 0 || at < armed) {
			// At the deadline itself: a clock moved between reading it and
			// arming would otherwise push the timer past it.
			clock.ResetAt(t.link.clock, closeT, time.UnixMilli(at))
			armed = at
		}
	}
	arm(t.closes.earliest())
	flush := time.NewTicker(t.every.flush)
	defer flush.Stop()
	probe := time.NewTicker(t.every.probe)
	defer probe.Stop()
	var leaseTick <-chan time.Time
	if t.lease != nil {
		lt := time.NewTicker(t.lease.interval())
		defer lt.Stop()
		leaseTick = lt.C
		t.lease.tick(ctx)
	}
	var partialLogged time.Time // part of the store down: said at most every 10 s
	sweepNow := func(sweep func(context.Context) (int, error)) {
		if _, err := sweep(ctx); err != nil && ctx.Err() == nil {
			if !partial(err) || time.Since(partialLogged) >= 10*time.Second {
				t.log.Warn("sweep failed", "err", err)
				if partial(err) {
					partialLogged = time.Now()
				}
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return t.Close(context.WithoutCancel(ctx))
		case <-sweep.C:
			sweepNow(t.Sweep)
		case <-t.closes.kick:
			arm(t.closes.earliest())
		case <-closeT.C():
			armed = 0
			next := t.closes.next(t.Now())
			sweepNow(t.closeSweep)
			arm(next)
		case <-leaseTick:
			t.lease.tick(ctx)
		case <-probe.C:
			t.recover(ctx)
			t.link.probeSuspects(ctx)
			t.recoverParts(ctx)
			t.cold.retry(ctx)
		case <-flush.C:
			if err := t.Checkpoint(ctx); err != nil && ctx.Err() == nil {
				t.log.Warn("checkpoint failed; will retry", "err", err)
			}
			t.checkFloor(ctx)
		}
	}
}

// Close writes the last checkpoint. It is idempotent. Operations still
// in the outage buffer (the store never came back) are lost with the
// node; Close logs how many users they concern.
func (t *Tracker) Close(ctx context.Context) error {
	var err error
	t.closeOnce.Do(func() {
		if n := t.outage.users(); n > 0 {
			t.log.Warn("closing while the state store is down: buffered operations are lost", "users", n)
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if t.owned != nil {
			t.owned.handOff(ctx)
		}
		err = t.Checkpoint(ctx)
	})
	return err
}

// recover probes a store that is down and, if it answers, replays the
// outage buffer and marks it up. Run calls it every ProbeInterval.
func (t *Tracker) recover(ctx context.Context) {
	if !t.link.down() || t.outage.probe(ctx) != nil {
		return
	}
	if !t.link.beginReplay() {
		return
	}
	n := t.outage.users()
	// A store that came back empty lost its floor: raise it before any
	// replayed user is loaded or read (restore checks first).
	if err := t.floors.restore(ctx); err != nil {
		t.link.replayFailed()
		return
	}
	if err := t.outage.replay(ctx, -1); err != nil {
		t.link.replayFailed()
		if ctx.Err() == nil {
			t.log.Warn("replay of the outage buffer failed; will retry", "err", err)
		}
		return
	}
	if !t.link.recovered() { // sweeps wait RecoverGrace from now
		return
	}
	t.log.Info("state store is back; outage buffer replayed", "users", n)
	if t.lease != nil {
		// What the devices this node holds did meanwhile (claims,
		// releases) goes to the store now, before anyone resyncs; and
		// what it wrote just before the outage, which a failover may
		// have lost, again. A lease taken over meanwhile is found first,
		// before anything is claimed under it.
		t.lease.tick(ctx)
		t.owned.redo(ctx, t.link.downAt.Load())
		t.owned.sendDue(ctx)
	}
	if t.onRecover != nil {
		t.onRecover()
	}
}

// recoverParts probes every part that is down and, for each that answers,
// replays its users' buffer and marks it up. Run calls it every
// ProbeInterval while the store as a whole is up.
func (t *Tracker) recoverParts(ctx context.Context) {
	ps := t.link.parts
	if ps == nil || ps.down.Load() == 0 || !t.link.up() {
		return
	}
	downs := ps.downs()
	errs := t.link.pingParts(ctx, downs)
	recovered, since := false, int64(0)
	for i, p := range downs {
		if errs[i] != nil || !ps.beginReplay(p) {
			continue
		}
		if err := t.outage.replay(ctx, p); err != nil {
			ps.replayFailed(p)
			if ctx.Err() == nil {
				t.log.Warn("replay of a part's outage buffer failed; will retry", "part", p, "err", err)
			}
			continue
		}
		ok, at, last := ps.recovered(p, t.Now())
		if !ok {
			continue
		}
		if last {
			t.log.Info("every part of the state store is back; their users' buffer replayed", "outages", ps.outages.Load())
		}
		if !recovered || at < since {
			since = at
		}
		recovered = true
	}
	if !recovered {
		return
	}
	// As after an outage of the whole store: what this node's devices did
	// meanwhile, and what a failover may have lost, goes to the store
	// again; watchers are resynced.
	if t.owned != nil {
		t.owned.redo(ctx, since)
		t.owned.sendDue(ctx)
	}
	if t.onRecover != nil {
		t.onRecover()
	}
}

// checkFloor asks a store that may lose its data (Floorer) whether it
// still has its version floor; when it lost it (and it is raised again)
// the application is asked to resync its watchers (OnRecover). Run calls
// it every FlushInterval.
func (t *Tracker) checkFloor(ctx context.Context) {
	if t.floors.check(ctx) && t.onRecover != nil {
		t.onRecover()
	}
}

// StoreDown reports whether the state store is down (or its outage buffer
// being replayed): operations are buffered and reads degraded.
func (t *Tracker) StoreDown() bool { return !t.link.up() }

// Degraded reports whether some operations do not reach the store now:
// it is down or replaying, or a part of it is (their changes are not
// published until they do). Cheap; safe for concurrent use.
func (t *Tracker) Degraded() bool { return !t.link.up() || t.link.partsDown() }

// LeaseID returns this node's lease, 0 while it has none (no Leaser
// store, or not yet acquired).
func (t *Tracker) LeaseID() uint64 {
	if t.lease == nil {
		return 0
	}
	return t.lease.current()
}

// PeerLeases returns the other nodes' leases as of this node's last
// renewal, and when that renewal listed them (this node's clock; 0: never,
// e.g. a store without leases). It is safe for concurrent use.
func (t *Tracker) PeerLeases() ([]PeerLease, int64) {
	if t.lease == nil {
		return nil, 0
	}
	return t.lease.peerLeases()
}

// LeaseTimeout is how long another node's lease may go unrenewed before
// this node takes it over (0 without leases).
func (t *Tracker) LeaseTimeout() time.Duration {
	if t.lease == nil {
		return 0
	}
	return t.lease.timeout()
}

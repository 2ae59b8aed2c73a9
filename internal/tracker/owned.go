package tracker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/presenced/presenced/internal/owned"
	"github.com/presenced/presenced/internal/presence"
)

// # Devices this node holds (a Store that implements Leaser)
//
// A heartbeat through a socket this node holds (SocketBeat) is the
// node's business: the device's deadline lives in an owned.Table here,
// and the store hears of the device only when others must see something
// — its claim when it connects (the user's status may change), a touch
// about once per IdleAfter while it is active (so the store does not turn
// the user away), its release when its ttl or close grace runs out here
// or it says bye. A heartbeat that changes nothing takes one lock of the
// table and makes no call at all. The devices are held under this node's
// lease (lease.go).
//
// While the store is down nothing the node holds can be announced
// offline for want of a write: the devices stay alive in the table (and
// in degraded reads), and the work that failed (claims of new devices,
// releases of ended ones) stays in the table and is done once the store
// answers.
//
// On Close the node hands every device back to the rules with its real
// last beat (HandOff): its clients have their ttl to reconnect anywhere.

// ownedDevices are the devices whose sockets this node holds, and the
// work of telling the store about them. Nil without a Leaser store.
type ownedDevices struct {
	table  *owned.Table
	lease  *leaseKeeper // the lease they are held under
	leaser Leaser
	link   *link
	events *emitter
	// load loads a user into the store by the ordinary path: a claim of
	// a user the store does not hold.
	load func(ctx context.Context, user string) error
	// claims holds a token per claim in flight (Config.MaxClaims).
	claims chan struct{}

	workMu  sync.Mutex // guards workBuf
	workBuf []owned.Work
}

// newOwnedDevices returns the devices of a node held under lease; retry
// is how soon failed work is retried (Config.ProbeInterval), maxClaims
// how many claims are in flight at most (Config.MaxClaims).
func newOwnedDevices(lease *leaseKeeper, rules presence.Rules, retry time.Duration, maxClaims int) *ownedDevices {
	return &ownedDevices{table: owned.New(owned.Config{Rules: rules, Retry: retry}), lease: lease,
		leaser: lease.leaser, link: lease.link, events: lease.events, claims: make(chan struct{}, maxClaims)}
}

// beat records a heartbeat of a device through a socket this node holds
// (connect: its first, with the device claimed again whatever this node
// knew of it), and writes its change, if any, to ch. The common beat
// takes one lock of the table and makes no store call.
func (od *ownedDevices) beat(ctx context.Context, src owned.Source, user, device string, active, connect bool, ch *presence.Change) error {
	now := od.link.now()
	need := od.table.BeatFrom(now, src, user, device, active, connect)
	if need == owned.NeedNothing {
		return nil
	}
	devs := od.table.Pending(user, need, nil)
	w := owned.Work{User: user}
	if need == owned.NeedClaim {
		w.Claim = devs
	} else {
		w.Touch = devs
	}
	c, err := od.work(ctx, now, w)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	*ch = c
	return nil
}

// leaseWait is how long a join waits for the node's first lease
// (claimNow): a node takes it as it starts, in one call of the store.
const leaseWait = 2 * time.Second

// claimNow claims device now if this node holds its socket and the store
// has not heard of it yet (its claim waits for the node's first lease, or
// for its retry after a failure), waiting up to leaseWait for the lease.
// It reports whether the node holds the device so: a caller that the
// store told the device is not alive may then try again.
func (od *ownedDevices) claimNow(ctx context.Context, user, device string) bool {
	if !od.table.Hurry(od.link.now(), user, device) {
		return false
	}
	if od.lease.current() == 0 {
		t := time.NewTimer(leaseWait)
		defer t.Stop()
		select {
		case <-od.lease.held:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	var ch presence.Change
	_ = od.beat(ctx, owned.Sockets, user, device, false, false, &ch) // an error is the caller's retry's to tell
	return true
}

// sendDue hands the due work of the table to the store: releases of
// devices that ended, claims that failed before, touches. Sweep calls it.
func (od *ownedDevices) sendDue(ctx context.Context) {
	if od.lease.current() == 0 || !od.link.up() {
		return
	}
	now := od.link.now()
	od.workMu.Lock()
	work := od.table.Due(now, od.workBuf[:0])
	defer func() {
		clear(work)
		od.workBuf = work[:0]
		od.workMu.Unlock()
	}()
	if len(work) == 0 {
		return
	}
	// Touches alone (the common work: active users kept online) go in
	// batches; the rest user by user, many at once (the client
	// pipelines their calls), a bounded number in flight.
	var touches []Touch
	const parallel = 32
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, w := range work {
		if len(w.Claim) == 0 && len(w.Release) == 0 && len(w.Bye) == 0 && len(w.HandOff) == 0 {
			if !od.link.upFor(w.User) {
				// Its part is down: the touch waits, unsent, instead of
				// holding every other touch of the batch for a timeout.
				od.table.Done(now, w.User, owned.Result{Failed: true, Unsent: true})
				continue
			}
			touches = append(touches, Touch{User: w.User, Devices: toOwned(w.Touch)})
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, _ = od.work(ctx, now, w)
		})
	}
	if len(touches) > 0 {
		od.touchAll(ctx, now, touches)
	}
	wg.Wait()
}

// touchAll sends touches in batches and reports each answer to the table.
func (od *ownedDevices) touchAll(ctx context.Context, now int64, touches []Touch) {
	lease := od.lease.current()
	b := od.link.bound(ctx)
	od.leaser.Touch(b.ctx, od.link.now(), lease, touches)
	od.link.release(b)
	for i := range touches {
		tc := &touches[i]
		var r owned.Result
		r.Lost = tc.Lost
		switch err := od.link.checkUser(ctx, tc.User, tc.Err); {
		case err == nil:
			od.events.emit(&tc.Change)
		case errors.Is(err, ErrNotLoaded):
			r.Reclaim = true
		default:
			r.Failed = true
			if !errors.Is(err, errOutage) && ctx.Err() == nil {
				od.link.log.Warn("telling the state store about this node's devices failed; will retry", "user", tc.User, "err", err)
			}
		}
		od.table.Done(now, tc.User, r)
	}
}

// work tells the store what w says, publishes the changes and reports
// the answers to the table. It returns the last change and an error only
// for a claim the rules refused (too many devices) or an unexpected
// failure; a store or durable store that does not answer leaves the work
// to be retried.
func (od *ownedDevices) work(ctx context.Context, now int64, w owned.Work) (presence.Change, error) {
	lease := od.lease.current()
	var r owned.Result
	var last presence.Change
	var refused error
	note := func(ch presence.Change, lost []string, err error) {
		r.Lost = append(r.Lost, lost...)
		switch {
		case err == nil:
			if ch.Changed {
				last = ch
				od.events.emit(&ch)
			}
		case errors.Is(err, ErrNotLoaded):
			r.Reclaim = true
		case errors.Is(err, ErrClaimStale):
		case errors.Is(err, presence.ErrTooManyDevices):
			refused = err
		default:
			r.Failed = true
			// A write not replicated in time is retried without a word
			// (it would repeat every retry while a replica lags; the
			// backend call metrics count it).
			if !errors.Is(err, errOutage) && !profileUnavailable(err) && !errors.Is(err, ErrNotReplicated) && ctx.Err() == nil {
				od.link.log.Warn("telling the state store about this node's devices failed; will retry", "user", w.User, "err", err)
			}
		}
	}
	if lease == 0 || !od.link.upFor(w.User) {
		r.Failed, r.Unsent = true, true
		od.table.Done(now, w.User, r)
		return last, nil
	}
	if len(w.Release) > 0 {
		note(od.call(ctx, w.User, func(c context.Context) (presence.Change, []string, error) {
			return od.leaser.Release(c, od.link.now(), lease, w.User, toOwned(w.Release), false)
		}))
	}
	if len(w.Bye) > 0 {
		note(od.call(ctx, w.User, func(c context.Context) (presence.Change, []string, error) {
			return od.leaser.Release(c, od.link.now(), lease, w.User, toOwned(w.Bye), true)
		}))
	}
	if len(w.HandOff) > 0 {
		note(od.call(ctx, w.User, func(c context.Context) (presence.Change, []string, error) {
			return od.leaser.HandOff(c, od.link.now(), lease, w.User, toOwned(w.HandOff))
		}))
	}
	if len(w.Touch) > 0 && !r.Failed {
		ts := []Touch{{User: w.User, Devices: toOwned(w.Touch)}}
		b := od.link.bound(ctx)
		od.leaser.Touch(b.ctx, od.link.now(), lease, ts)
		od.link.release(b)
		note(ts[0].Change, ts[0].Lost, od.link.checkUser(ctx, w.User, ts[0].Err))
	}
	for _, d := range w.Claim {
		if r.Failed {
			break
		}
		ch, err := od.claim(ctx, lease, w.User, d)
		switch {
		case errors.Is(err, ErrClaimStale):
			r.Lost = append(r.Lost, d.ID)
		case errors.Is(err, presence.ErrTooManyDevices):
			r.Refused = append(r.Refused, d.ID)
		}
		note(ch, nil, err)
	}
	r.Reclaim = r.Reclaim && !r.Failed
	od.table.Done(now, w.User, r)
	return last, refused
}

// claim claims one device, loading the user first if the store does not
// hold it, once a claim in flight left it room (Config.MaxClaims). A
// caller whose ctx ends while it waits makes no call; the work stays
// in the table, as for a store that did not answer.
func (od *ownedDevices) claim(ctx context.Context, lease uint64, user string, d owned.Device) (presence.Change, error) {
	select {
	case od.claims <- struct{}{}:
	case <-ctx.Done():
		return presence.Change{}, ctx.Err()
	}
	defer func() { <-od.claims }()
	dev := toOwned([]owned.Device{d})[0]
	for try := 0; ; try++ {
		b := od.link.bound(ctx)
		ch, err := od.leaser.Claim(b.ctx, od.link.now(), lease, user, dev)
		od.link.release(b)
		err = od.link.checkUser(ctx, user, err)
		if !errors.Is(err, ErrNotLoaded) || try > 0 {
			return ch, err
		}
		if err = od.load(ctx, user); err != nil {
			return ch, err
		}
	}
}

// call makes one call about user's owned devices, bounded, and
// classifies its error.
func (od *ownedDevices) call(ctx context.Context, user string, fn func(context.Context) (presence.Change, []string, error)) (presence.Change, []string, error) {
	b := od.link.bound(ctx)
	ch, lost, err := fn(b.ctx)
	od.link.release(b)
	return ch, lost, od.link.checkUser(ctx, user, err)
}

// toOwned is what the store is told of ds: a device the table says is
// active is held active (presence.Forever) until the table says it
// turned idle.
func toOwned(ds []owned.Device) []OwnedDevice {
	out := make([]OwnedDevice, len(ds))
	for i, d := range ds {
		out[i] = OwnedDevice{ID: d.ID, LastBeat: d.LastBeat, LastActive: d.LastActive}
		if d.Active {
			out[i].LastActive = presence.Forever
		}
	}
	return out
}

// handOff gives every device this node holds back to the rules with its
// real last beat, then takes over whatever its lease still holds (work
// that was in flight) and ends the lease. Close calls it; while the store
// is down nothing is done: other nodes take the lease over once it runs
// out.
func (od *ownedDevices) handOff(ctx context.Context) {
	lease := od.lease.current()
	if lease == 0 || !od.link.up() {
		return
	}
	type held struct {
		user string
		devs []OwnedDevice
	}
	var all []held
	od.table.Each(func(user string, claimed []owned.Device) {
		all = append(all, held{user, toOwned(claimed)})
	})
	const parallel = 32
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, h := range all {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ch, _, err := od.call(ctx, h.user, func(c context.Context) (presence.Change, []string, error) {
				return od.leaser.HandOff(c, od.link.now(), lease, h.user, h.devs)
			})
			if err == nil {
				od.events.emit(&ch)
			}
		})
	}
	wg.Wait()
	if od.lease.retire(ctx) {
		od.link.log.Info("handed this node's devices off", "users", len(all))
	}
}

// handOffPoll is how often handOffSources looks again for devices whose
// hand-off is not done yet.
const handOffPoll = 50 * time.Millisecond

// handOffSources gives every device of srcs back to the store's rules
// with its real last beat (the node no longer receives their heartbeats:
// partitions of an ingest moved to another node) and forgets it. It
// returns once the store took them all, or with an error when ctx ends
// first: what is left is handed off when the store answers (the table
// retries it), and a device the new owner claimed meanwhile is left to
// it (the store ends only this node's hold). A device that beats here
// again meanwhile is claimed again and not waited for.
func (od *ownedDevices) handOffSources(ctx context.Context, srcs []owned.Source) error {
	now, marked := od.link.now(), 0
	for _, src := range srcs {
		marked += od.table.HandOff(now, src)
	}
	if marked == 0 {
		return nil
	}
	for {
		if ctx.Err() == nil {
			od.sendDue(ctx) // never with an ended ctx: the work of every other device would fail
		}
		n := od.table.HandingOff(srcs)
		if n == 0 {
			return nil
		}
		t := time.NewTimer(handOffPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%d devices not handed off yet (they are when the state store answers): %w", n, ctx.Err())
		case <-t.C:
		}
	}
}

// redoWindow is how far before an outage was noticed the writes about
// owned devices are made again after it (redo): longer than a Redis
// Cluster's failover takes to begin (cluster-node-timeout, 15 s by
// default), during which a master that is cut off from its replicas may
// still acknowledge writes that the failover then loses.
const redoWindow = 30 * time.Second

// redo makes again, after the store came back, the claims, touches
// and releases of owned devices that it acknowledged in the redoWindow
// before the outage: Redis replicates asynchronously, and a failover may
// have lost them (a lost claim would leave a device this node holds
// unknown to the store; a lost release, a device online for ever). Made
// again on a store that kept them, they change nothing.
func (od *ownedDevices) redo(ctx context.Context, downAt int64) {
	lease := od.lease.current()
	if lease == 0 {
		return
	}
	now := od.link.now()
	for _, r := range od.table.Redo(now, downAt-redoWindow.Milliseconds()) {
		ch, _, err := od.call(ctx, r.User, func(c context.Context) (presence.Change, []string, error) {
			if r.HandOff {
				return od.leaser.HandOff(c, od.link.now(), lease, r.User, toOwned([]owned.Device{r.Device}))
			}
			return od.leaser.Release(c, od.link.now(), lease, r.User, toOwned([]owned.Device{r.Device}), r.Bye)
		})
		if err != nil {
			return // down again: the claims wait in the table; these releases are given up
		}
		od.events.emit(&ch)
	}
}

// opsOf appends the devices of user this node holds, alive at now, as
// beats (for degraded reads).
func (od *ownedDevices) opsOf(now int64, user string, ops []op) []op {
	for _, d := range od.table.Devices(now, user, nil) {
		if d.LastActive > 0 {
			ops = append(ops, op{kind: opBeat, at: d.LastActive, device: d.ID, active: true})
		}
		if d.LastBeat > d.LastActive {
			ops = append(ops, op{kind: opBeat, at: d.LastBeat, device: d.ID})
		}
	}
	return ops
}

// bye ends a device this node holds at once, if it holds it: done says
// that it did (or that the bye waits for the work in flight); otherwise
// the bye goes the ordinary way. err is an error of the release that is
// no outage (with an outage the bye is buffered, and its replay removes
// the device whoever owns it).
func (od *ownedDevices) bye(ctx context.Context, now int64, user, device string) (done bool, _ presence.Change, err error) {
	d, how := od.table.Remove(now, user, device)
	switch how {
	case owned.Deferred:
		return true, presence.Change{}, nil // released after the work in flight
	case owned.Release:
		if lease := od.lease.current(); lease != 0 && od.link.upFor(user) {
			ch, _, err := od.call(ctx, user, func(c context.Context) (presence.Change, []string, error) {
				return od.leaser.Release(c, now, lease, user,
					[]OwnedDevice{{ID: d.ID, LastBeat: d.LastBeat, LastActive: d.LastActive}}, true)
			})
			if err == nil {
				od.table.Released(now, user, d, true)
				od.events.emit(&ch)
				return true, ch, nil
			}
			if !errors.Is(err, errOutage) {
				return true, ch, err
			}
		}
	}
	return false, presence.Change{}, nil
}

// closed records that the socket of a device closed without a bye at now,
// its last beat through it at since, and reports whether this node holds
// the device (its deadline is then kept here).
func (od *ownedDevices) closed(now int64, user, device string, since int64) bool {
	return od.table.Close(now, user, device, since)
}

// dirty appends the last beats of the devices this node holds, for the
// checkpoint: the store does not hear of them.
func (od *ownedDevices) dirty(out []presence.Profile) []presence.Profile { return od.table.Dirty(out) }

// unclaim has every device this node holds claimed again (the store lost
// what it knew of them).
func (od *ownedDevices) unclaim(now int64) { od.table.Unclaim(now) }

// held is how many devices this node holds.
func (od *ownedDevices) held() int { return od.table.Len() }

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
// table and makes no call at all.
//
// The store holds a claimed device alive for as long as the node's lease
// lives. The node renews its lease every LeaseInterval (Run); the renewal
// also lists every other node's lease, and a lease this node has seen
// unchanged for leaseTimeout (three intervals or half the ttl, by this
// node's clock,
// counted only while this node reaches the store, and never for a node
// that Config.NodeAlive still hears) is taken over: marked, so that its
// owner can renew it no more, then every device it held is given back to
// the rules with the lease's last renewal as its last beat, and the
// departures due are published — exactly once, whichever node does it.
// A node that finds its own lease taken over (it was cut off for longer
// than that) or lost with the store's data takes a new lease and claims
// its devices again.
//
// While the store is down nothing the node holds can be announced
// offline for want of a write: the devices stay alive in the table (and
// in degraded reads), the work that failed (claims of new devices,
// releases of ended ones) stays in the table and is done once the store
// answers, and no lease is taken over on what a node could not see.
//
// On Close the node hands every device back to the rules with its real
// last beat (HandOff): its clients have their ttl to reconnect anywhere.

// Lease bookkeeping of this node (Run's goroutine, or Close after it).
type leases struct {
	mu    sync.Mutex // guards the fields below
	gen   uint64     // the generation of this node's lease: id = Epoch<<16 | gen
	peers map[uint64]peerLease
	buf   []Lease // the leases of the last renewal (every node's)
	// listed is when buf was last read from the store (this node's
	// clock), 0 before.
	listed int64

	interval, timeout, linger int64 // ms
	nodeAlive                 func(lease uint64) bool
	took                      map[uint64]int64 // leases this node took over → when
}

// peerLease is what this node last saw of another node's lease.
type peerLease struct {
	renewed int64 // the renewal seen
	since   int64 // this node's clock when it was first seen
}

func (t *Tracker) initLeases(cfg *Config) {
	l := t.link.can.leaser // nil with NoLeases
	if l == nil {
		return
	}
	t.leaser = l
	t.owned = owned.New(owned.Config{Rules: cfg.Rules, Retry: cfg.ProbeInterval})
	iv := cfg.LeaseInterval
	if iv <= 0 {
		iv = DefaultLeaseInterval(cfg.Rules.TTL)
	}
	t.lz.interval = iv.Milliseconds()
	t.lz.timeout = leaseTimeout(iv, cfg.Rules.TTL).Milliseconds()
	t.lz.linger = 10 * t.lz.timeout
	t.lz.nodeAlive = cfg.NodeAlive
	t.lz.peers = make(map[uint64]peerLease)
	t.lz.took = make(map[uint64]int64)
}

// DefaultLeaseInterval is Config.LeaseInterval's default for a ttl: the
// smaller of 1s and ttl/9, so that a dead node's lease (three intervals)
// is taken over well within its devices' ttl.
func DefaultLeaseInterval(ttl time.Duration) time.Duration { return min(time.Second, ttl/9) }

// DefaultLeaseTimeout is how long a lease renewed every
// DefaultLeaseInterval(ttl) may go unrenewed before it is taken over.
func DefaultLeaseTimeout(ttl time.Duration) time.Duration {
	return leaseTimeout(DefaultLeaseInterval(ttl), ttl)
}

// leaseTimeout is three renewals, or half the ttl if that is longer: a
// takeover only needs to come before the dead node's devices' ttl ends
// (they die a ttl after its last renewal, whenever it is taken over), and
// a node starved of CPU for a second or two is not taken for dead.
func leaseTimeout(interval, ttl time.Duration) time.Duration { return max(3*interval, ttl/2) }

// LeaseID returns this node's lease, 0 while it has none (no Leaser
// store, or not yet acquired).
func (t *Tracker) LeaseID() uint64 { return t.lease.Load() }

// PeerLease is what this node knows of another node's lease in the
// store (PeerLeases).
type PeerLease struct {
	ID      uint64
	Renewed int64 // its last renewal, Unix ms by its owner's clock
	Taken   bool  // marked taken over (its owner is gone or was cut off)
	// Since is when this node first saw the renewal Renewed, by its own
	// clock (0: not watched, e.g. being taken over): a lease whose
	// renewal has not changed for the lease timeout is taken over.
	Since int64
}

// PeerLeases returns the other nodes' leases as of this node's last
// renewal, and when that renewal listed them (this node's clock; 0: never,
// e.g. a store without leases). It is safe for concurrent use.
func (t *Tracker) PeerLeases() ([]PeerLease, int64) {
	if t.leaser == nil {
		return nil, 0
	}
	own := t.lease.Load()
	t.lz.mu.Lock()
	defer t.lz.mu.Unlock()
	out := make([]PeerLease, 0, len(t.lz.buf))
	for _, l := range t.lz.buf {
		if l.ID == own {
			continue
		}
		out = append(out, PeerLease{ID: l.ID, Renewed: l.Renewed, Taken: l.Taken, Since: t.lz.peers[l.ID].since})
	}
	return out, t.lz.listed
}

// LeaseTimeout is how long another node's lease may go unrenewed before
// this node takes it over (0 without leases).
func (t *Tracker) LeaseTimeout() time.Duration {
	return time.Duration(t.lz.timeout) * time.Millisecond
}

// acquireLease takes a new lease: the epoch of this run, above every
// other node's and run's, and a generation counted in this run.
// A lease taken after this node lost its first one (taken over, or gone
// with the store's data) claims every device again: what the store holds
// of them names the old lease.
func (t *Tracker) acquireLease(ctx context.Context) error {
	t.lz.mu.Lock()
	defer t.lz.mu.Unlock()
	gen := t.lz.gen + 1
	if gen >= 1<<16 {
		// The next would be the id of this epoch + 1: another node's.
		return errors.New("tracker: this run took 65,535 leases; restart the node for a new epoch")
	}
	id := t.rules.Epoch<<16 | gen
	b := t.link.bound(ctx)
	err := t.leaser.AcquireLease(b.ctx, id, t.Now())
	t.link.release(b)
	if err = t.link.checkKey(ctx, err); err != nil {
		return err
	}
	t.lz.gen = gen
	t.lease.Store(id)
	if gen > 1 {
		t.owned.Unclaim(t.Now())
	}
	return nil
}

// tickLease renews this node's lease and takes over the leases that ran
// out. Run calls it every LeaseInterval.
func (t *Tracker) tickLease(ctx context.Context) {
	if t.leaser == nil {
		return
	}
	if !t.link.up() {
		// What this node cannot see it does not judge: every lease
		// gets a fresh leaseTimeout once the store answers again.
		t.lz.mu.Lock()
		clear(t.lz.peers)
		t.lz.mu.Unlock()
		return
	}
	if t.lease.Load() == 0 {
		if err := t.acquireLease(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, errOutage) {
			t.log.Warn("acquiring this node's lease failed; will retry", "err", err)
		}
		return
	}
	now := t.Now()
	t.lz.mu.Lock()
	b := t.link.bound(ctx)
	all, err := t.leaser.RenewLease(b.ctx, t.lease.Load(), now, t.lz.buf[:0])
	t.link.release(b)
	t.lz.buf = all
	t.lz.mu.Unlock()
	if errors.Is(err, ErrLeaseLost) {
		t.leaseLost(ctx)
		return
	}
	if err = t.link.checkKey(ctx, err); err != nil {
		// What this node cannot see it does not judge (the leases' own
		// master down, with a Partitioned store: the store is not marked
		// down, so this is the only place that forgets).
		t.lz.mu.Lock()
		clear(t.lz.peers)
		t.lz.mu.Unlock()
		return
	}
	t.observe(ctx, now, all)
}

// leaseLost answers a lease that another node took over, or that the
// store lost with its data: this node's devices are claimed again under a
// new lease, and the application is asked to resync its watchers
// (OnRecover). A store that lost its data may have taken changes with it,
// and this node may not have seen the loss itself: another node found
// the version floor gone first and raised it, and this node's calls never
// failed (a Redis restarted between two of them).
func (t *Tracker) leaseLost(ctx context.Context) {
	t.leaseLosses.Add(1)
	t.log.Warn("this node's lease was taken over or lost; claiming its devices again under a new one",
		"lease", t.lease.Load(), "devices", t.owned.Len())
	t.lease.Store(0)
	_ = t.acquireLease(ctx) // claims everything again; if it fails, the next tick retries
	if t.onRecover != nil {
		t.onRecover()
	}
}

// observe takes over the leases in all that ran out (see the section
// above).
func (t *Tracker) observe(ctx context.Context, now int64, all []Lease) {
	own := t.lease.Load()
	type todo struct {
		id      uint64
		renewed int64
		mark    bool // not yet marked taken
		end     bool // the takeover is over: forget the lease
	}
	var work []todo
	t.lz.mu.Lock()
	t.lz.listed = now
	live := make(map[uint64]bool, len(all))
	for _, l := range all {
		if l.ID == own {
			continue
		}
		live[l.ID] = true
		if l.Taken {
			// Being taken over (by this node or another): help finish
			// it for a while — a claim its owner sent just before the
			// mark may land after another node took the shard over —
			// then forget it.
			at, ok := t.lz.took[l.ID]
			if !ok {
				at = now
				t.lz.took[l.ID] = now
			}
			work = append(work, todo{id: l.ID, renewed: l.Renewed, end: now-at >= t.lz.linger})
			continue
		}
		p, ok := t.lz.peers[l.ID]
		if !ok || p.renewed != l.Renewed {
			t.lz.peers[l.ID] = peerLease{renewed: l.Renewed, since: now}
			continue
		}
		if now-p.since < t.lz.timeout || (t.lz.nodeAlive != nil && t.lz.nodeAlive(l.ID)) {
			continue
		}
		work = append(work, todo{id: l.ID, renewed: l.Renewed, mark: true})
	}
	for id := range t.lz.peers {
		if !live[id] {
			delete(t.lz.peers, id)
		}
	}
	for id := range t.lz.took {
		if !live[id] {
			delete(t.lz.took, id)
		}
	}
	t.lz.mu.Unlock()
	for _, w := range work {
		if w.mark {
			b := t.link.bound(ctx)
			ok, err := t.leaser.TakeLease(b.ctx, w.id, w.renewed, now)
			t.link.release(b)
			if err = t.link.checkKey(ctx, err); err != nil || !ok {
				continue
			}
			t.takeovers.Add(1)
			t.log.Warn("a node's lease ran out; taking over its devices", "lease", w.id,
				"silent_ms", now-w.renewed, "own", own)
		}
		if err := t.takeOver(ctx, now, w.id, w.renewed); err != nil {
			if ctx.Err() == nil && !errors.Is(err, errOutage) && !partial(err) && !errors.Is(err, errPartsLeft) && !errors.Is(err, ErrTakeOverLeft) {
				t.log.Warn("taking over a lease failed; will retry", "lease", w.id, "err", err)
			}
			continue
		}
		if w.end {
			b := t.link.bound(ctx)
			err := t.leaser.EndLease(b.ctx, w.id)
			t.link.release(b)
			_ = t.link.checkKey(ctx, err)
		}
	}
}

// takeOver gives the devices of lease back to the rules and publishes the
// departures that are due.
//
// With a Partitioned store the parts that are down are left for later
// (PartTakeOver), and a part that does not answer is marked down: one
// master's outage is not the whole store's. The takeover is over only
// once every part was taken over (errPartsLeft until then: the lease is
// not ended meanwhile, or the devices of those parts would stay held by
// a lease nobody renews).
func (t *Tracker) takeOver(ctx context.Context, now int64, lease uint64, renewed int64) error {
	skip := t.link.downParts()
	pt := t.link.can.partTakeOver
	b := t.link.bound(ctx)
	var out []presence.Change
	var err error
	if skip != nil && pt != nil {
		out, err = pt.TakeOverParts(b.ctx, now, lease, renewed, t.durableLastSeen, skip, nil)
	} else {
		out, err = t.leaser.TakeOver(b.ctx, now, lease, renewed, t.durableLastSeen, nil)
	}
	t.link.release(b)
	for i := range out {
		t.emit(&out[i])
	}
	t.link.partsFailed(err)
	if err = t.link.check(ctx, err); err != nil {
		return err
	}
	if skip != nil && pt != nil {
		return errPartsLeft
	}
	return nil
}

// errPartsLeft says that a takeover left the parts that are down for later.
var errPartsLeft = errors.New("tracker: takeover of the parts that are down left for when they are back")

// durableLastSeen returns the durable last_seen of users: what their
// owner checkpointed before it went silent.
func (t *Tracker) durableLastSeen(ctx context.Context, users []string) (map[string]int64, error) {
	m := make(map[string]int64, len(users))
	err := t.durable.LoadProfiles(ctx, users, func(p *presence.Profile) { m[p.UserID] = p.LastSeen })
	return m, err
}

// SocketBeat records a heartbeat of a device through a socket this node
// holds. With a store that implements Leaser the node owns the device (see
// the section above): the common beat makes no store call. Otherwise it is
// Heartbeat. A beat that needs the store while the store is down, or while
// the user cannot be loaded, succeeds with an empty Change: the device is
// alive here and reaches the store when it answers.
func (t *Tracker) SocketBeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	return t.socketBeat(ctx, user, device, active, false)
}

// SocketConnect is the first heartbeat of a new socket (active): with a
// Leaser store the device is claimed again whatever this node knew of it,
// since it may have been held by another node meanwhile.
func (t *Tracker) SocketConnect(ctx context.Context, user, device string) (presence.Change, error) {
	return t.socketBeat(ctx, user, device, true, true)
}

func (t *Tracker) socketBeat(ctx context.Context, user, device string, active, connect bool) (presence.Change, error) {
	if t.owned == nil {
		return t.Heartbeat(ctx, user, device, active)
	}
	t.beats.add()
	now := t.Now()
	need := t.owned.Beat(now, user, device, active, connect)
	if need == owned.NeedNothing {
		return presence.Change{}, nil
	}
	devs := t.owned.Pending(user, need, nil)
	w := owned.Work{User: user}
	if need == owned.NeedClaim {
		w.Claim = devs
	} else {
		w.Touch = devs
	}
	ch, err := t.doWork(ctx, now, w)
	if err != nil {
		return presence.Change{}, fmt.Errorf("heartbeat: %w", err)
	}
	return ch, nil
}

// syncOwned hands the due work of the table to the store: releases of
// devices that ended, claims that failed before, touches. Sweep calls it.
func (t *Tracker) syncOwned(ctx context.Context) {
	if t.owned == nil || t.lease.Load() == 0 || !t.link.up() {
		return
	}
	now := t.Now()
	t.workMu.Lock()
	work := t.owned.Due(now, t.workBuf[:0])
	defer func() {
		clear(work)
		t.workBuf = work[:0]
		t.workMu.Unlock()
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
		if len(w.Claim) == 0 && len(w.Release) == 0 && len(w.Bye) == 0 {
			if !t.link.upFor(w.User) {
				// Its part is down: the touch waits, unsent, instead of
				// holding every other touch of the batch for a timeout.
				t.owned.Done(now, w.User, owned.Result{Failed: true, Unsent: true})
				continue
			}
			touches = append(touches, Touch{User: w.User, Devices: devices(w.Touch)})
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, _ = t.doWork(ctx, now, w)
		})
	}
	if len(touches) > 0 {
		t.touchAll(ctx, now, touches)
	}
	wg.Wait()
}

// touchAll sends touches in batches and reports each answer to the table.
func (t *Tracker) touchAll(ctx context.Context, now int64, touches []Touch) {
	lease := t.lease.Load()
	b := t.link.bound(ctx)
	t.leaser.Touch(b.ctx, t.Now(), lease, touches)
	t.link.release(b)
	for i := range touches {
		tc := &touches[i]
		var r owned.Result
		r.Lost = tc.Lost
		switch err := t.link.checkUser(ctx, tc.User, tc.Err); {
		case err == nil:
			t.emit(&tc.Change)
		case errors.Is(err, ErrNotLoaded):
			r.Reclaim = true
		default:
			r.Failed = true
			if !errors.Is(err, errOutage) && ctx.Err() == nil {
				t.log.Warn("telling the state store about this node's devices failed; will retry", "user", tc.User, "err", err)
			}
		}
		t.owned.Done(now, tc.User, r)
	}
}

// doWork tells the store what w says, publishes the changes and reports
// the answers to the table. It returns the last change and an error only
// for a claim the rules refused (too many devices) or an unexpected
// failure; a store or durable store that does not answer leaves the work
// to be retried.
func (t *Tracker) doWork(ctx context.Context, now int64, w owned.Work) (presence.Change, error) {
	lease := t.lease.Load()
	var r owned.Result
	var last presence.Change
	var refused error
	note := func(ch presence.Change, lost []string, err error) {
		r.Lost = append(r.Lost, lost...)
		switch {
		case err == nil:
			if ch.Changed {
				last = ch
				t.emit(&ch)
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
				t.log.Warn("telling the state store about this node's devices failed; will retry", "user", w.User, "err", err)
			}
		}
	}
	if lease == 0 || !t.link.upFor(w.User) {
		r.Failed, r.Unsent = true, true
		t.owned.Done(now, w.User, r)
		return last, nil
	}
	if len(w.Release) > 0 {
		note(t.ownedCall(ctx, w.User, func(c context.Context) (presence.Change, []string, error) {
			return t.leaser.Release(c, t.Now(), lease, w.User, devices(w.Release), false)
		}))
	}
	if len(w.Bye) > 0 {
		note(t.ownedCall(ctx, w.User, func(c context.Context) (presence.Change, []string, error) {
			return t.leaser.Release(c, t.Now(), lease, w.User, devices(w.Bye), true)
		}))
	}
	if len(w.Touch) > 0 && !r.Failed {
		ts := []Touch{{User: w.User, Devices: devices(w.Touch)}}
		b := t.link.bound(ctx)
		t.leaser.Touch(b.ctx, t.Now(), lease, ts)
		t.link.release(b)
		note(ts[0].Change, ts[0].Lost, t.link.checkUser(ctx, w.User, ts[0].Err))
	}
	for _, d := range w.Claim {
		if r.Failed {
			break
		}
		ch, err := t.claim(ctx, lease, w.User, d)
		switch {
		case errors.Is(err, ErrClaimStale):
			r.Lost = append(r.Lost, d.ID)
		case errors.Is(err, presence.ErrTooManyDevices):
			r.Refused = append(r.Refused, d.ID)
		}
		note(ch, nil, err)
	}
	r.Reclaim = r.Reclaim && !r.Failed
	t.owned.Done(now, w.User, r)
	return last, refused
}

// claim claims one device, loading the user first if the store does not
// hold it.
func (t *Tracker) claim(ctx context.Context, lease uint64, user string, d owned.Device) (presence.Change, error) {
	od := devices([]owned.Device{d})[0]
	for try := 0; ; try++ {
		b := t.link.bound(ctx)
		ch, err := t.leaser.Claim(b.ctx, t.Now(), lease, user, od)
		t.link.release(b)
		err = t.link.checkUser(ctx, user, err)
		if !errors.Is(err, ErrNotLoaded) || try > 0 {
			return ch, err
		}
		if err = t.load(ctx, user); err != nil {
			return ch, err
		}
	}
}

func (t *Tracker) ownedCall(ctx context.Context, user string, call func(context.Context) (presence.Change, []string, error)) (presence.Change, []string, error) {
	b := t.link.bound(ctx)
	ch, lost, err := call(b.ctx)
	t.link.release(b)
	return ch, lost, t.link.checkUser(ctx, user, err)
}

// devices is what the store is told of ds: a device the table says is
// active is held active (presence.Forever) until the table says it
// turned idle.
func devices(ds []owned.Device) []OwnedDevice {
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
func (t *Tracker) handOff(ctx context.Context) {
	lease := t.lease.Load()
	if t.owned == nil || lease == 0 || !t.link.up() {
		return
	}
	type held struct {
		user string
		devs []OwnedDevice
	}
	var all []held
	t.owned.Each(func(user string, claimed []owned.Device) {
		all = append(all, held{user, devices(claimed)})
	})
	const parallel = 32
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, h := range all {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ch, _, err := t.ownedCall(ctx, h.user, func(c context.Context) (presence.Change, []string, error) {
				return t.leaser.HandOff(c, t.Now(), lease, h.user, h.devs)
			})
			if err == nil {
				t.emit(&ch)
			}
		})
	}
	wg.Wait()
	now := t.Now()
	err := t.takeOver(ctx, now, lease, now)
	for errors.Is(err, ErrTakeOverLeft) && ctx.Err() == nil {
		err = t.takeOver(ctx, now, lease, now) // a large store: in several calls
	}
	if err != nil {
		t.log.Warn("handing off this node's devices failed; other nodes take them over when its lease runs out", "err", err)
		return
	}
	b := t.link.bound(ctx)
	err = t.leaser.EndLease(b.ctx, lease)
	t.link.release(b)
	if t.link.check(ctx, err) == nil {
		t.lease.Store(0)
		t.log.Info("handed this node's devices off", "users", len(all))
	}
}

// redoWindow is how far before an outage was noticed the writes about
// owned devices are made again after it (redoOwned): longer than a Redis
// Cluster's failover takes to begin (cluster-node-timeout, 15 s by
// default), during which a master that is cut off from its replicas may
// still acknowledge writes that the failover then loses.
const redoWindow = 30 * time.Second

// redoOwned makes again, after the store came back, the claims, touches
// and releases of owned devices that it acknowledged in the redoWindow
// before the outage: Redis replicates asynchronously, and a failover may
// have lost them (a lost claim would leave a device this node holds
// unknown to the store; a lost release, a device online for ever). Made
// again on a store that kept them, they change nothing.
func (t *Tracker) redoOwned(ctx context.Context, downAt int64) {
	lease := t.lease.Load()
	if t.owned == nil || lease == 0 {
		return
	}
	now := t.Now()
	for _, r := range t.owned.Redo(now, downAt-redoWindow.Milliseconds()) {
		ch, _, err := t.ownedCall(ctx, r.User, func(c context.Context) (presence.Change, []string, error) {
			return t.leaser.Release(c, t.Now(), lease, r.User, devices([]owned.Device{r.Device}), r.Bye)
		})
		if err != nil {
			return // down again: the claims wait in the table; these releases are given up
		}
		t.emit(&ch)
	}
}

// ownedOps appends the devices of user this node holds, alive at now, as
// beats (for degraded reads).
func (t *Tracker) ownedOps(now int64, user string, ops []op) []op {
	if t.owned == nil {
		return ops
	}
	for _, d := range t.owned.Devices(now, user, nil) {
		if d.LastActive > 0 {
			ops = append(ops, op{kind: opBeat, at: d.LastActive, device: d.ID, active: true})
		}
		if d.LastBeat > d.LastActive {
			ops = append(ops, op{kind: opBeat, at: d.LastBeat, device: d.ID})
		}
	}
	return ops
}

package tracker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

// leases are the devices this node holds (owned.Table) and the lease
// they are held under, with the other nodes' leases it watches and takes
// over (see the section above). Nil without a Leaser store.
type leases struct {
	leaser    Leaser
	takeParts PartTakeOver // nil: a takeover takes every part at once
	table     *owned.Table
	link      *link
	events    *emitter
	durable   Durable // the last_seen a silent node checkpointed (takeovers)
	epoch     uint64  // this run's epoch: leases are epoch<<16 | generation
	// load loads a user into the store by the ordinary path: a claim of
	// a user the store does not hold.
	load func(ctx context.Context, user string) error
	// onRecover, if not nil, asks the application to resync its watchers
	// (Config.OnRecover).
	onRecover func()

	id        atomic.Uint64 // this node's lease, 0 while it has none
	losses    atomic.Uint64 // times this node found its lease taken over or lost
	takeovers atomic.Uint64 // leases of other nodes this node marked and took over
	workMu    sync.Mutex    // guards workBuf
	workBuf   []owned.Work
	book      leaseBook
}

// leaseBook is the lease bookkeeping of this node (Run's goroutine, or
// Close after it).
type leaseBook struct {
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

// newLeases returns the leases of a node on a Leaser store; interval is
// Config.LeaseInterval (0: the default) and retry how soon failed work
// is retried (Config.ProbeInterval).
func newLeases(l Leaser, takeParts PartTakeOver, lk *link, events *emitter, durable Durable, rules presence.Rules,
	interval, retry time.Duration, nodeAlive func(lease uint64) bool) *leases {
	if interval <= 0 {
		interval = DefaultLeaseInterval(rules.TTL)
	}
	ls := &leases{leaser: l, takeParts: takeParts, link: lk, events: events, durable: durable, epoch: rules.Epoch,
		table: owned.New(owned.Config{Rules: rules, Retry: retry})}
	ls.book.interval = interval.Milliseconds()
	ls.book.timeout = leaseTimeout(interval, rules.TTL).Milliseconds()
	ls.book.linger = 10 * ls.book.timeout
	ls.book.nodeAlive = nodeAlive
	ls.book.peers = make(map[uint64]peerLease)
	ls.book.took = make(map[uint64]int64)
	return ls
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

// peerLeases returns the other nodes' leases as of this node's last
// renewal, and when that renewal listed them (this node's clock).
func (ls *leases) peerLeases() ([]PeerLease, int64) {
	own := ls.id.Load()
	ls.book.mu.Lock()
	defer ls.book.mu.Unlock()
	out := make([]PeerLease, 0, len(ls.book.buf))
	for _, l := range ls.book.buf {
		if l.ID == own {
			continue
		}
		out = append(out, PeerLease{ID: l.ID, Renewed: l.Renewed, Taken: l.Taken, Since: ls.book.peers[l.ID].since})
	}
	return out, ls.book.listed
}

// acquire takes a new lease: the epoch of this run, above every
// other node's and run's, and a generation counted in this run.
// A lease taken after this node lost its first one (taken over, or gone
// with the store's data) claims every device again: what the store holds
// of them names the old lease.
func (ls *leases) acquire(ctx context.Context) error {
	ls.book.mu.Lock()
	defer ls.book.mu.Unlock()
	gen := ls.book.gen + 1
	if gen >= 1<<16 {
		// The next would be the id of this epoch + 1: another node's.
		return errors.New("tracker: this run took 65,535 leases; restart the node for a new epoch")
	}
	id := ls.epoch<<16 | gen
	b := ls.link.bound(ctx)
	err := ls.leaser.AcquireLease(b.ctx, id, ls.link.now())
	ls.link.release(b)
	if err = ls.link.checkKey(ctx, err); err != nil {
		return err
	}
	ls.book.gen = gen
	ls.id.Store(id)
	if gen > 1 {
		ls.table.Unclaim(ls.link.now())
	}
	return nil
}

// tick renews this node's lease and takes over the leases that ran
// out. Run calls it every LeaseInterval.
func (ls *leases) tick(ctx context.Context) {
	if !ls.link.up() {
		// What this node cannot see it does not judge: every lease
		// gets a fresh leaseTimeout once the store answers again.
		ls.book.mu.Lock()
		clear(ls.book.peers)
		ls.book.mu.Unlock()
		return
	}
	if ls.id.Load() == 0 {
		if err := ls.acquire(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, errOutage) {
			ls.link.log.Warn("acquiring this node's lease failed; will retry", "err", err)
		}
		return
	}
	now := ls.link.now()
	ls.book.mu.Lock()
	b := ls.link.bound(ctx)
	all, err := ls.leaser.RenewLease(b.ctx, ls.id.Load(), now, ls.book.buf[:0])
	ls.link.release(b)
	ls.book.buf = all
	ls.book.mu.Unlock()
	if errors.Is(err, ErrLeaseLost) {
		ls.lost(ctx)
		return
	}
	if err = ls.link.checkKey(ctx, err); err != nil {
		// What this node cannot see it does not judge (the leases' own
		// master down, with a Partitioned store: the store is not marked
		// down, so this is the only place that forgets).
		ls.book.mu.Lock()
		clear(ls.book.peers)
		ls.book.mu.Unlock()
		return
	}
	ls.observe(ctx, now, all)
}

// lost answers a lease that another node took over, or that the
// store lost with its data: this node's devices are claimed again under a
// new lease, and the application is asked to resync its watchers
// (OnRecover). A store that lost its data may have taken changes with it,
// and this node may not have seen the loss itself: another node found
// the version floor gone first and raised it, and this node's calls never
// failed (a Redis restarted between two of them).
func (ls *leases) lost(ctx context.Context) {
	ls.losses.Add(1)
	ls.link.log.Warn("this node's lease was taken over or lost; claiming its devices again under a new one",
		"lease", ls.id.Load(), "devices", ls.table.Len())
	ls.id.Store(0)
	_ = ls.acquire(ctx) // claims everything again; if it fails, the next tick retries
	if ls.onRecover != nil {
		ls.onRecover()
	}
}

// observe takes over the leases in all that ran out (see the section
// above).
func (ls *leases) observe(ctx context.Context, now int64, all []Lease) {
	own := ls.id.Load()
	type todo struct {
		id      uint64
		renewed int64
		mark    bool // not yet marked taken
		end     bool // the takeover is over: forget the lease
	}
	var work []todo
	ls.book.mu.Lock()
	ls.book.listed = now
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
			at, ok := ls.book.took[l.ID]
			if !ok {
				at = now
				ls.book.took[l.ID] = now
			}
			work = append(work, todo{id: l.ID, renewed: l.Renewed, end: now-at >= ls.book.linger})
			continue
		}
		p, ok := ls.book.peers[l.ID]
		if !ok || p.renewed != l.Renewed {
			ls.book.peers[l.ID] = peerLease{renewed: l.Renewed, since: now}
			continue
		}
		if now-p.since < ls.book.timeout || (ls.book.nodeAlive != nil && ls.book.nodeAlive(l.ID)) {
			continue
		}
		work = append(work, todo{id: l.ID, renewed: l.Renewed, mark: true})
	}
	for id := range ls.book.peers {
		if !live[id] {
			delete(ls.book.peers, id)
		}
	}
	for id := range ls.book.took {
		if !live[id] {
			delete(ls.book.took, id)
		}
	}
	ls.book.mu.Unlock()
	for _, w := range work {
		if w.mark {
			b := ls.link.bound(ctx)
			ok, err := ls.leaser.TakeLease(b.ctx, w.id, w.renewed, now)
			ls.link.release(b)
			if err = ls.link.checkKey(ctx, err); err != nil || !ok {
				continue
			}
			ls.takeovers.Add(1)
			ls.link.log.Warn("a node's lease ran out; taking over its devices", "lease", w.id,
				"silent_ms", now-w.renewed, "own", own)
		}
		if err := ls.takeOver(ctx, now, w.id, w.renewed); err != nil {
			if ctx.Err() == nil && !errors.Is(err, errOutage) && !partial(err) && !errors.Is(err, errPartsLeft) && !errors.Is(err, ErrTakeOverLeft) {
				ls.link.log.Warn("taking over a lease failed; will retry", "lease", w.id, "err", err)
			}
			continue
		}
		if w.end {
			b := ls.link.bound(ctx)
			err := ls.leaser.EndLease(b.ctx, w.id)
			ls.link.release(b)
			_ = ls.link.checkKey(ctx, err)
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
func (ls *leases) takeOver(ctx context.Context, now int64, lease uint64, renewed int64) error {
	skip := ls.link.downParts()
	pt := ls.takeParts
	b := ls.link.bound(ctx)
	var out []presence.Change
	var err error
	if skip != nil && pt != nil {
		out, err = pt.TakeOverParts(b.ctx, now, lease, renewed, ls.lastSeen, skip, nil)
	} else {
		out, err = ls.leaser.TakeOver(b.ctx, now, lease, renewed, ls.lastSeen, nil)
	}
	ls.link.release(b)
	for i := range out {
		ls.events.emit(&out[i])
	}
	ls.link.partsFailed(err)
	if err = ls.link.check(ctx, err); err != nil {
		return err
	}
	if skip != nil && pt != nil {
		return errPartsLeft
	}
	return nil
}

// errPartsLeft says that a takeover left the parts that are down for later.
var errPartsLeft = errors.New("tracker: takeover of the parts that are down left for when they are back")

// lastSeen returns the durable last_seen of users: what their
// owner checkpointed before it went silent.
func (ls *leases) lastSeen(ctx context.Context, users []string) (map[string]int64, error) {
	m := make(map[string]int64, len(users))
	err := ls.durable.LoadProfiles(ctx, users, func(p *presence.Profile) { m[p.UserID] = p.LastSeen })
	return m, err
}

// beat records a heartbeat of a device through a socket this node holds
// (connect: its first, with the device claimed again whatever this node
// knew of it). The common beat takes one lock of the table and makes no
// store call.
func (ls *leases) beat(ctx context.Context, user, device string, active, connect bool) (presence.Change, error) {
	now := ls.link.now()
	need := ls.table.Beat(now, user, device, active, connect)
	if need == owned.NeedNothing {
		return presence.Change{}, nil
	}
	devs := ls.table.Pending(user, need, nil)
	w := owned.Work{User: user}
	if need == owned.NeedClaim {
		w.Claim = devs
	} else {
		w.Touch = devs
	}
	ch, err := ls.work(ctx, now, w)
	if err != nil {
		return presence.Change{}, fmt.Errorf("heartbeat: %w", err)
	}
	return ch, nil
}

// sendDue hands the due work of the table to the store: releases of
// devices that ended, claims that failed before, touches. Sweep calls it.
func (ls *leases) sendDue(ctx context.Context) {
	if ls.id.Load() == 0 || !ls.link.up() {
		return
	}
	now := ls.link.now()
	ls.workMu.Lock()
	work := ls.table.Due(now, ls.workBuf[:0])
	defer func() {
		clear(work)
		ls.workBuf = work[:0]
		ls.workMu.Unlock()
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
			if !ls.link.upFor(w.User) {
				// Its part is down: the touch waits, unsent, instead of
				// holding every other touch of the batch for a timeout.
				ls.table.Done(now, w.User, owned.Result{Failed: true, Unsent: true})
				continue
			}
			touches = append(touches, Touch{User: w.User, Devices: toOwned(w.Touch)})
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, _ = ls.work(ctx, now, w)
		})
	}
	if len(touches) > 0 {
		ls.touchAll(ctx, now, touches)
	}
	wg.Wait()
}

// touchAll sends touches in batches and reports each answer to the table.
func (ls *leases) touchAll(ctx context.Context, now int64, touches []Touch) {
	lease := ls.id.Load()
	b := ls.link.bound(ctx)
	ls.leaser.Touch(b.ctx, ls.link.now(), lease, touches)
	ls.link.release(b)
	for i := range touches {
		tc := &touches[i]
		var r owned.Result
		r.Lost = tc.Lost
		switch err := ls.link.checkUser(ctx, tc.User, tc.Err); {
		case err == nil:
			ls.events.emit(&tc.Change)
		case errors.Is(err, ErrNotLoaded):
			r.Reclaim = true
		default:
			r.Failed = true
			if !errors.Is(err, errOutage) && ctx.Err() == nil {
				ls.link.log.Warn("telling the state store about this node's devices failed; will retry", "user", tc.User, "err", err)
			}
		}
		ls.table.Done(now, tc.User, r)
	}
}

// work tells the store what w says, publishes the changes and reports
// the answers to the table. It returns the last change and an error only
// for a claim the rules refused (too many devices) or an unexpected
// failure; a store or durable store that does not answer leaves the work
// to be retried.
func (ls *leases) work(ctx context.Context, now int64, w owned.Work) (presence.Change, error) {
	lease := ls.id.Load()
	var r owned.Result
	var last presence.Change
	var refused error
	note := func(ch presence.Change, lost []string, err error) {
		r.Lost = append(r.Lost, lost...)
		switch {
		case err == nil:
			if ch.Changed {
				last = ch
				ls.events.emit(&ch)
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
				ls.link.log.Warn("telling the state store about this node's devices failed; will retry", "user", w.User, "err", err)
			}
		}
	}
	if lease == 0 || !ls.link.upFor(w.User) {
		r.Failed, r.Unsent = true, true
		ls.table.Done(now, w.User, r)
		return last, nil
	}
	if len(w.Release) > 0 {
		note(ls.call(ctx, w.User, func(c context.Context) (presence.Change, []string, error) {
			return ls.leaser.Release(c, ls.link.now(), lease, w.User, toOwned(w.Release), false)
		}))
	}
	if len(w.Bye) > 0 {
		note(ls.call(ctx, w.User, func(c context.Context) (presence.Change, []string, error) {
			return ls.leaser.Release(c, ls.link.now(), lease, w.User, toOwned(w.Bye), true)
		}))
	}
	if len(w.Touch) > 0 && !r.Failed {
		ts := []Touch{{User: w.User, Devices: toOwned(w.Touch)}}
		b := ls.link.bound(ctx)
		ls.leaser.Touch(b.ctx, ls.link.now(), lease, ts)
		ls.link.release(b)
		note(ts[0].Change, ts[0].Lost, ls.link.checkUser(ctx, w.User, ts[0].Err))
	}
	for _, d := range w.Claim {
		if r.Failed {
			break
		}
		ch, err := ls.claim(ctx, lease, w.User, d)
		switch {
		case errors.Is(err, ErrClaimStale):
			r.Lost = append(r.Lost, d.ID)
		case errors.Is(err, presence.ErrTooManyDevices):
			r.Refused = append(r.Refused, d.ID)
		}
		note(ch, nil, err)
	}
	r.Reclaim = r.Reclaim && !r.Failed
	ls.table.Done(now, w.User, r)
	return last, refused
}

// claim claims one device, loading the user first if the store does not
// hold it.
func (ls *leases) claim(ctx context.Context, lease uint64, user string, d owned.Device) (presence.Change, error) {
	od := toOwned([]owned.Device{d})[0]
	for try := 0; ; try++ {
		b := ls.link.bound(ctx)
		ch, err := ls.leaser.Claim(b.ctx, ls.link.now(), lease, user, od)
		ls.link.release(b)
		err = ls.link.checkUser(ctx, user, err)
		if !errors.Is(err, ErrNotLoaded) || try > 0 {
			return ch, err
		}
		if err = ls.load(ctx, user); err != nil {
			return ch, err
		}
	}
}

// call makes one call about user's owned devices, bounded, and
// classifies its error.
func (ls *leases) call(ctx context.Context, user string, fn func(context.Context) (presence.Change, []string, error)) (presence.Change, []string, error) {
	b := ls.link.bound(ctx)
	ch, lost, err := fn(b.ctx)
	ls.link.release(b)
	return ch, lost, ls.link.checkUser(ctx, user, err)
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
func (ls *leases) handOff(ctx context.Context) {
	lease := ls.id.Load()
	if lease == 0 || !ls.link.up() {
		return
	}
	type held struct {
		user string
		devs []OwnedDevice
	}
	var all []held
	ls.table.Each(func(user string, claimed []owned.Device) {
		all = append(all, held{user, toOwned(claimed)})
	})
	const parallel = 32
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, h := range all {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ch, _, err := ls.call(ctx, h.user, func(c context.Context) (presence.Change, []string, error) {
				return ls.leaser.HandOff(c, ls.link.now(), lease, h.user, h.devs)
			})
			if err == nil {
				ls.events.emit(&ch)
			}
		})
	}
	wg.Wait()
	now := ls.link.now()
	err := ls.takeOver(ctx, now, lease, now)
	for errors.Is(err, ErrTakeOverLeft) && ctx.Err() == nil {
		err = ls.takeOver(ctx, now, lease, now) // a large store: in several calls
	}
	if err != nil {
		ls.link.log.Warn("handing off this node's devices failed; other nodes take them over when its lease runs out", "err", err)
		return
	}
	b := ls.link.bound(ctx)
	err = ls.leaser.EndLease(b.ctx, lease)
	ls.link.release(b)
	if ls.link.check(ctx, err) == nil {
		ls.id.Store(0)
		ls.link.log.Info("handed this node's devices off", "users", len(all))
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
func (ls *leases) redo(ctx context.Context, downAt int64) {
	lease := ls.id.Load()
	if lease == 0 {
		return
	}
	now := ls.link.now()
	for _, r := range ls.table.Redo(now, downAt-redoWindow.Milliseconds()) {
		ch, _, err := ls.call(ctx, r.User, func(c context.Context) (presence.Change, []string, error) {
			return ls.leaser.Release(c, ls.link.now(), lease, r.User, toOwned([]owned.Device{r.Device}), r.Bye)
		})
		if err != nil {
			return // down again: the claims wait in the table; these releases are given up
		}
		ls.events.emit(&ch)
	}
}

// opsOf appends the devices of user this node holds, alive at now, as
// beats (for degraded reads).
func (ls *leases) opsOf(now int64, user string, ops []op) []op {
	for _, d := range ls.table.Devices(now, user, nil) {
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
func (ls *leases) bye(ctx context.Context, now int64, user, device string) (done bool, _ presence.Change, err error) {
	d, how := ls.table.Remove(now, user, device)
	switch how {
	case owned.Deferred:
		return true, presence.Change{}, nil // released after the work in flight
	case owned.Release:
		if lease := ls.id.Load(); lease != 0 && ls.link.upFor(user) {
			ch, _, err := ls.call(ctx, user, func(c context.Context) (presence.Change, []string, error) {
				return ls.leaser.Release(c, now, lease, user,
					[]OwnedDevice{{ID: d.ID, LastBeat: d.LastBeat, LastActive: d.LastActive}}, true)
			})
			if err == nil {
				ls.table.Released(now, user, d, true)
				ls.events.emit(&ch)
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
func (ls *leases) closed(now int64, user, device string, since int64) bool {
	return ls.table.Close(now, user, device, since)
}

// dirty appends the last beats of the devices this node holds, for the
// checkpoint: the store does not hear of them.
func (ls *leases) dirty(out []presence.Profile) []presence.Profile { return ls.table.Dirty(out) }

// unclaim has every device this node holds claimed again (the store lost
// what it knew of them).
func (ls *leases) unclaim(now int64) { ls.table.Unclaim(now) }

// held is how many devices this node holds.
func (ls *leases) held() int { return ls.table.Len() }

// timeout is how long another node's lease may go unrenewed before this
// node takes it over.
func (ls *leases) timeout() time.Duration { return time.Duration(ls.book.timeout) * time.Millisecond }

// interval is how often Run renews the lease.
func (ls *leases) interval() time.Duration { return time.Duration(ls.book.interval) * time.Millisecond }

package tracker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// # The lease of this node (a Store that implements Leaser)
//
// The store holds a device that this node claimed (owned.go) alive for as
// long as the node's lease lives. The node renews its lease every
// LeaseInterval (Run); the renewal also lists every other node's lease,
// and a lease this node has seen unchanged for leaseTimeout (three
// intervals or half the ttl, by this node's clock, counted only while
// this node reaches the store, and never for a node that Config.NodeAlive
// still hears) is taken over: marked, so that its owner can renew it no
// more, then every device it held is given back to the rules with the
// lease's last renewal as its last beat, and the departures due are
// published — exactly once, whichever node does it. A node that finds
// its own lease taken over (it was cut off for longer than that) or lost
// with the store's data takes a new lease and claims its devices again.
// While the store is down no lease is taken over on what a node could
// not see.

// leaseKeeper keeps this node's lease and watches the other nodes'
// leases, taking over those that ran out. Nil without a Leaser store.
type leaseKeeper struct {
	leaser    Leaser
	takeParts PartTakeOver // nil: a takeover takes every part at once
	link      *link
	events    *emitter
	durable   Durable // the last_seen a silent node checkpointed (takeovers)
	epoch     uint64  // this run's epoch: leases are epoch<<16 | generation
	// claims are the devices this node holds: a new lease claims them
	// again.
	claims interface {
		Unclaim(now int64)
		Len() int
	}
	// onRecover, if not nil, asks the application to resync its watchers
	// (Config.OnRecover).
	onRecover func()

	id        atomic.Uint64 // this node's lease, 0 while it has none
	held      chan struct{} // closed once the node took its first lease
	losses    atomic.Uint64 // times this node found its lease taken over or lost
	takeovers atomic.Uint64 // leases of other nodes this node marked and took over
	book      leaseBook
}

// newLeaseKeeper returns the lease keeper of a node on a Leaser store;
// interval is Config.LeaseInterval (0: the default).
func newLeaseKeeper(l Leaser, takeParts PartTakeOver, lk *link, events *emitter, durable Durable, rules presence.Rules,
	interval time.Duration, nodeAlive func(lease uint64) bool) *leaseKeeper {
	if interval <= 0 {
		interval = DefaultLeaseInterval(rules.TTL)
	}
	k := &leaseKeeper{leaser: l, takeParts: takeParts, link: lk, events: events, durable: durable, epoch: rules.Epoch,
		held: make(chan struct{})}
	k.book.interval = interval.Milliseconds()
	k.book.timeout = leaseTimeout(interval, rules.TTL).Milliseconds()
	k.book.linger = 10 * k.book.timeout
	k.book.nodeAlive = nodeAlive
	k.book.peers = make(map[uint64]peerLease)
	k.book.took = make(map[uint64]int64)
	return k
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
func (k *leaseKeeper) peerLeases() ([]PeerLease, int64) {
	own := k.id.Load()
	k.book.mu.Lock()
	defer k.book.mu.Unlock()
	out := make([]PeerLease, 0, len(k.book.buf))
	for _, l := range k.book.buf {
		if l.ID == own {
			continue
		}
		out = append(out, PeerLease{ID: l.ID, Renewed: l.Renewed, Taken: l.Taken, Since: k.book.peers[l.ID].since})
	}
	return out, k.book.listed
}

// acquire takes a new lease: the epoch of this run, above every
// other node's and run's, and a generation counted in this run.
// A lease taken after this node lost its first one (taken over, or gone
// with the store's data) claims every device again: what the store holds
// of them names the old lease.
func (k *leaseKeeper) acquire(ctx context.Context) error {
	k.book.mu.Lock()
	defer k.book.mu.Unlock()
	gen := k.book.gen + 1
	if gen >= 1<<16 {
		// The next would be the id of this epoch + 1: another node's.
		return errors.New("tracker: this run took 65,535 leases; restart the node for a new epoch")
	}
	id := k.epoch<<16 | gen
	b := k.link.bound(ctx)
	err := k.leaser.AcquireLease(b.ctx, id, k.link.now())
	k.link.release(b)
	if err = k.link.checkKey(ctx, err); err != nil {
		return err
	}
	k.book.gen = gen
	k.id.Store(id)
	if gen == 1 {
		close(k.held) // the first lease of this run
	}
	if gen > 1 {
		k.claims.Unclaim(k.link.now())
	}
	return nil
}

// tick renews this node's lease and takes over the leases that ran
// out. Run calls it every LeaseInterval.
func (k *leaseKeeper) tick(ctx context.Context) {
	if !k.link.up() {
		// What this node cannot see it does not judge: every lease
		// gets a fresh leaseTimeout once the store answers again.
		k.book.mu.Lock()
		clear(k.book.peers)
		k.book.mu.Unlock()
		return
	}
	if k.id.Load() == 0 {
		if err := k.acquire(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, errOutage) {
			k.link.log.Warn("acquiring this node's lease failed; will retry", "err", err)
		}
		return
	}
	now := k.link.now()
	k.book.mu.Lock()
	b := k.link.bound(ctx)
	all, err := k.leaser.RenewLease(b.ctx, k.id.Load(), now, k.book.buf[:0])
	k.link.release(b)
	k.book.buf = all
	k.book.mu.Unlock()
	if errors.Is(err, ErrLeaseLost) {
		k.lost(ctx)
		return
	}
	if err = k.link.checkKey(ctx, err); err != nil {
		// What this node cannot see it does not judge (the leases' own
		// master down, with a Partitioned store: the store is not marked
		// down, so this is the only place that forgets).
		k.book.mu.Lock()
		clear(k.book.peers)
		k.book.mu.Unlock()
		return
	}
	k.observe(ctx, now, all)
}

// lost answers a lease that another node took over, or that the
// store lost with its data: this node's devices are claimed again under a
// new lease, and the application is asked to resync its watchers
// (OnRecover). A store that lost its data may have taken changes with it,
// and this node may not have seen the loss itself: another node found
// the version floor gone first and raised it, and this node's calls never
// failed (a Redis restarted between two of them).
func (k *leaseKeeper) lost(ctx context.Context) {
	k.losses.Add(1)
	k.link.log.Warn("this node's lease was taken over or lost; claiming its devices again under a new one",
		"lease", k.id.Load(), "devices", k.claims.Len())
	k.id.Store(0)
	_ = k.acquire(ctx) // claims everything again; if it fails, the next tick retries
	if k.onRecover != nil {
		k.onRecover()
	}
}

// observe takes over the leases in all that ran out (see the section
// above).
func (k *leaseKeeper) observe(ctx context.Context, now int64, all []Lease) {
	own := k.id.Load()
	type todo struct {
		id      uint64
		renewed int64
		mark    bool // not yet marked taken
		end     bool // the takeover is over: forget the lease
	}
	var work []todo
	k.book.mu.Lock()
	k.book.listed = now
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
			at, ok := k.book.took[l.ID]
			if !ok {
				at = now
				k.book.took[l.ID] = now
			}
			work = append(work, todo{id: l.ID, renewed: l.Renewed, end: now-at >= k.book.linger})
			continue
		}
		p, ok := k.book.peers[l.ID]
		if !ok || p.renewed != l.Renewed {
			k.book.peers[l.ID] = peerLease{renewed: l.Renewed, since: now}
			continue
		}
		if now-p.since < k.book.timeout || (k.book.nodeAlive != nil && k.book.nodeAlive(l.ID)) {
			continue
		}
		work = append(work, todo{id: l.ID, renewed: l.Renewed, mark: true})
	}
	for id := range k.book.peers {
		if !live[id] {
			delete(k.book.peers, id)
		}
	}
	for id := range k.book.took {
		if !live[id] {
			delete(k.book.took, id)
		}
	}
	k.book.mu.Unlock()
	for _, w := range work {
		if w.mark {
			b := k.link.bound(ctx)
			ok, err := k.leaser.TakeLease(b.ctx, w.id, w.renewed, now)
			k.link.release(b)
			if err = k.link.checkKey(ctx, err); err != nil || !ok {
				continue
			}
			k.takeovers.Add(1)
			k.link.log.Warn("a node's lease ran out; taking over its devices", "lease", w.id,
				"silent_ms", now-w.renewed, "own", own)
		}
		if err := k.takeOver(ctx, now, w.id, w.renewed); err != nil {
			if ctx.Err() == nil && !errors.Is(err, errOutage) && !partial(err) && !errors.Is(err, errPartsLeft) && !errors.Is(err, ErrTakeOverLeft) {
				k.link.log.Warn("taking over a lease failed; will retry", "lease", w.id, "err", err)
			}
			continue
		}
		if w.end {
			b := k.link.bound(ctx)
			err := k.leaser.EndLease(b.ctx, w.id)
			k.link.release(b)
			_ = k.link.checkKey(ctx, err)
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
func (k *leaseKeeper) takeOver(ctx context.Context, now int64, lease uint64, renewed int64) error {
	skip := k.link.downParts()
	pt := k.takeParts
	b := k.link.bound(ctx)
	var out []presence.Change
	var err error
	if skip != nil && pt != nil {
		out, err = pt.TakeOverParts(b.ctx, now, lease, renewed, k.lastSeen, skip, nil)
	} else {
		out, err = k.leaser.TakeOver(b.ctx, now, lease, renewed, k.lastSeen, nil)
	}
	k.link.release(b)
	for i := range out {
		k.events.emit(&out[i])
	}
	k.link.partsFailed(err)
	if err = k.link.check(ctx, err); err != nil {
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
func (k *leaseKeeper) lastSeen(ctx context.Context, users []string) (map[string]int64, error) {
	m := make(map[string]int64, len(users))
	err := k.durable.LoadProfiles(ctx, users, func(p *presence.Profile) { m[p.UserID] = p.LastSeen })
	return m, err
}

// current is this node's lease, 0 while it has none.
func (k *leaseKeeper) current() uint64 { return k.id.Load() }

// timeout is how long another node's lease may go unrenewed before this
// node takes it over.
func (k *leaseKeeper) timeout() time.Duration {
	return time.Duration(k.book.timeout) * time.Millisecond
}

// interval is how often Run renews the lease.
func (k *leaseKeeper) interval() time.Duration {
	return time.Duration(k.book.interval) * time.Millisecond
}

// retire takes over what this node's lease still holds (work that was
// in flight when its devices were handed off) and ends the lease: a node
// that stops. It reports whether it did.
func (k *leaseKeeper) retire(ctx context.Context) bool {
	lease := k.id.Load()
	now := k.link.now()
	err := k.takeOver(ctx, now, lease, now)
	for errors.Is(err, ErrTakeOverLeft) && ctx.Err() == nil {
		err = k.takeOver(ctx, now, lease, now) // a large store: in several calls
	}
	if err != nil {
		k.link.log.Warn("handing off this node's devices failed; other nodes take them over when its lease runs out", "err", err)
		return false
	}
	b := k.link.bound(ctx)
	err = k.leaser.EndLease(b.ctx, lease)
	k.link.release(b)
	if k.link.check(ctx, err) != nil {
		return false
	}
	k.id.Store(0)
	return true
}

// Package tracker is the only code that changes presence. It validates
// nothing (the edge does that) and decides nothing about privacy (the filter
// does that): it applies heartbeats, manual statuses, byes and expiry to a
// Store, publishes every visible change, and checkpoints last_seen to the
// durable store in batches. Time comes from an injectable clock, so tests
// play hours in milliseconds by calling Sweep and Checkpoint themselves.
//
// The Tracker is a core (tracker.go; its operations in write.go, read.go
// and run.go) over parts that each own their state and are called one
// way: link (the store as the node reaches it, and whether it answers),
// applier (operations, users loaded first), outage (the buffer of what
// happened while the store was down, its probe and replay), cold (users
// whose profile the durable store could not load), ownedDevices and
// leaseKeeper (the devices this node holds with Redis, and the lease
// they are held under), floors (the version floor
// of a store that may lose its data), checkpoints, the sweeper and the
// peers' answers for degraded reads. What a shared store (SharedStore)
// can do is found once, by New.
//
// How the tracker rides out outages of either store, and holds the
// devices of its sockets, is told in docs/internals.md ("Outages of the
// state store", "Users the durable store cannot load", "Devices a node
// owns"); docs/architecture.md has the paths of a heartbeat and a read.
package tracker

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
)

// Config configures a Tracker. Zero values take the documented defaults.
type Config struct {
	Store     Store     // required
	Durable   Durable   // required
	Publisher Publisher // nil: changes are counted and dropped
	Clock     clock.Clock
	Logger    *slog.Logger

	// SweepInterval is how often Run applies due deadlines. Default 100ms,
	// so offline is reported well within ttl + 1s.
	SweepInterval time.Duration
	// FlushInterval is how often Run checkpoints changed last_seen values
	// in one transaction. Default 1s: at most this much is lost on a crash.
	FlushInterval time.Duration
	// SweepBatch bounds the changes applied per store call. Default 4096.
	SweepBatch int

	// Rules are the rules the Store applies; the tracker uses them only to
	// answer degraded reads from its outage buffer and to cap a buffered
	// user's devices. Zero values: TTL 30s, IdleAfter 5m, MaxDevices
	// presence.DefaultMaxDevices.
	Rules presence.Rules
	// StoreTimeout bounds every call to a Store that implements Pinger (a
	// store in another process), so that a hung store counts as down.
	// Default DefaultStoreTimeout. A Store without Ping is taken to run in this process and
	// is called with the caller's context.
	StoreTimeout time.Duration
	// ProbeInterval is how often Run probes a store that is down. Default
	// 250ms.
	ProbeInterval time.Duration
	// RecoverGrace is how long sweeps stay off after the store came back
	// (docs/internals.md, "Outages of the state store"). Default 2s.
	RecoverGrace time.Duration
	// MaxBuffered bounds the users with buffered operations while the store
	// is down. Default 200,000.
	MaxBuffered int
	// ReloadMargin is added to the version of every user loaded from the
	// durable store. A store shared by nodes (Redis) may lose its data
	// while the nodes run; the durable copy is then up to FlushInterval
	// behind, and counting on from it would stamp versions again that
	// were already published (consumers would drop those changes). A
	// margin above the changes a user can make in that time keeps new
	// versions above every published one; the app sets 1<<16 with Redis.
	// Zero for a store that lives and dies with the node (the epoch of the
	// next run covers a crash).
	ReloadMargin uint64
	// LoadTimeout bounds the durable read that loads a user the store does
	// not hold, so that a durable store that hangs is noticed like one that
	// refuses (docs/internals.md, "Users the durable store cannot
	// load"). Default 2s.
	LoadTimeout time.Duration
	// LeaseInterval is how often the node renews its lease with a Store
	// that implements Leaser; a lease not renewed for three
	// intervals, or half the ttl if that is longer, is taken over.
	// Default the smaller of 1s and TTL/9.
	LeaseInterval time.Duration
	// NodeAlive, if set, reports whether the node of a lease is heard
	// from on another channel than the store (the NATS bus): such a node
	// is cut off from the store only, keeps its devices, and is not taken
	// over.
	NodeAlive func(lease uint64) bool
	// Peers, if set, are asked what they hold of users' devices when a
	// read is degraded.
	Peers Peers
	// NoLeases turns owned devices off even with a Store that implements
	// Leaser: SocketBeat is then Heartbeat.
	NoLeases bool
	// MaxClaims bounds the claims of owned devices in flight at once
	// (a socket's connect, a claim that failed before); the others wait
	// for their turn before their call, and the wait is not part of
	// StoreTimeout. A reconnect storm — a node's thousands of clients
	// back on the others within a second or two — then leaves the store
	// a short queue ahead of everyone else's calls, and none of its own
	// claims waits long enough in the store client to look like an
	// outage. Default DefaultMaxClaims.
	MaxClaims int
	// OnRecover, if set, is called by Run each time the store came back and
	// the buffer was replayed. A store that came back empty lost the devices
	// of users who beat on no node during the outage, and no event tells
	// their watchers that they went offline: this is where the application
	// may re-read the state of what its watchers see. It must not block
	// for long.
	OnRecover func()
}

// DefaultMaxClaims is Config.MaxClaims's default: enough in flight to
// keep a pipelined Redis busy (thousands of claims a second), few enough
// that a call queued behind them waits milliseconds.
const DefaultMaxClaims = 32

// DefaultStoreTimeout is Config.StoreTimeout's default: how long a call
// of a store in another process may take before the store counts as down.
const DefaultStoreTimeout = time.Second

// DefaultRecoverGrace is Config.RecoverGrace's default: how long, after
// the store came back, every node is given to notice it and to tell it
// what it did meanwhile (the outage buffer, the devices it holds).
const DefaultRecoverGrace = 2 * time.Second

// Tracker applies presence operations. It is safe for concurrent use.
type Tracker struct {
	link    *link // the store as this node reaches it, and whether it answers
	durable Durable
	events  *emitter // every change, counted and published
	log     *slog.Logger
	rules   presence.Rules
	every   intervals // of Run's work

	apply  *applier      // operations to the store, users loaded first
	outage *outage       // what happened while the store was down
	cold   *cold         // users whose profile could not be loaded
	floors *floors       // the version floor of a store that may lose its data
	cps    *checkpoints  // last_seen to the durable store
	sweeps *sweeper      // deadlines due
	closes *closeTimer   // close deadlines, for Run's timer (wake.go)
	lease  *leaseKeeper  // this node's lease; nil without a Leaser store
	owned  *ownedDevices // the devices this node holds, under lease; nil without
	peers  *peerReads    // nil without Config.Peers

	beats         stripedCounter // heartbeats, unless the store counts them (BeatCounter)
	degradedReads atomic.Uint64  // Get calls answered without the store
	writes        writeLocks
	onRecover     func()
	closeOnce     sync.Once
}

// intervals are how often Run does its work.
type intervals struct {
	sweep, flush, probe time.Duration
}

// writeLocks serialise the writes of status and settings of one user,
// each held until both its durable write and its change of the hot state
// are done, so the durable store and the hot state never disagree about
// which of two concurrent changes came last.
type writeLocks struct {
	locks [64]sync.Mutex
	seed  maphash.Seed
	// durableFailing is set by a durable status write that failed and
	// cleared by one that succeeded; while it is set, SetStatus writes
	// durably before it applies instead of at the same time.
	durableFailing atomic.Bool
}

func (w *writeLocks) of(user string) *sync.Mutex {
	return &w.locks[maphash.String(w.seed, user)%uint64(len(w.locks))]
}

// New returns a Tracker. It starts nothing; call Run.
func New(cfg Config) (*Tracker, error) {
	if cfg.Store == nil || cfg.Durable == nil {
		return nil, errors.New("tracker: Store and Durable are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 100 * time.Millisecond
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = time.Second
	}
	if cfg.SweepBatch <= 0 {
		cfg.SweepBatch = 4096
	}
	cfg.Rules = cfg.Rules.WithDefaults()
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = 250 * time.Millisecond
	}
	if cfg.MaxClaims <= 0 {
		cfg.MaxClaims = DefaultMaxClaims
	}
	if cfg.RecoverGrace <= 0 {
		cfg.RecoverGrace = DefaultRecoverGrace
	}
	if cfg.MaxBuffered <= 0 {
		cfg.MaxBuffered = 200_000
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = 2 * time.Second
	}

	// What the store can do is decided here, once.
	can := abilitiesOf(cfg.Store)
	if cfg.NoLeases {
		can.leaser, can.partTakeOver = nil, nil
	}
	lk := &link{store: cfg.Store, can: can, timeout: cfg.StoreTimeout, grace: cfg.RecoverGrace.Milliseconds(),
		clock: cfg.Clock, log: cfg.Logger, parts: newPartStates(can.partitioned)}
	events := newEmitter(cfg.Publisher)
	t := &Tracker{
		link:      lk,
		durable:   cfg.Durable,
		events:    events,
		log:       cfg.Logger,
		rules:     cfg.Rules,
		every:     intervals{sweep: cfg.SweepInterval, flush: cfg.FlushInterval, probe: cfg.ProbeInterval},
		cps:       &checkpoints{link: lk, durable: cfg.Durable},
		sweeps:    &sweeper{link: lk, events: events, batch: cfg.SweepBatch},
		closes:    newCloseTimer(max(cfg.Rules.CloseGrace, 0)),
		onRecover: cfg.OnRecover,
	}
	t.writes.seed = maphash.MakeSeed()
	t.floors = &floors{link: lk, floorer: can.floorer, epoch: cfg.Rules.Epoch}
	t.floors.epochs, _ = cfg.Durable.(EpochCounter)
	t.cold = &cold{link: lk, durable: cfg.Durable, events: events, rules: cfg.Rules, timeout: cfg.LoadTimeout}
	t.cold.buf.init(cfg.MaxBuffered, cfg.Rules.MaxDevices)
	if p, ok := cfg.Durable.(interface{ Ping(context.Context) error }); ok {
		t.cold.ping = p.Ping
	}
	t.apply = &applier{link: lk, cps: t.cps, cold: t.cold, floors: t.floors, margin: cfg.ReloadMargin, timeout: cfg.LoadTimeout}
	t.cold.beat = t.apply.beat
	t.outage = &outage{link: lk, events: events, log: cfg.Logger, apply: t.apply.replayed}
	t.outage.buf.init(cfg.MaxBuffered, cfg.Rules.MaxDevices)
	if can.leaser != nil {
		t.lease = newLeaseKeeper(can.leaser, can.partTakeOver, lk, events, cfg.Durable, cfg.Rules,
			cfg.LeaseInterval, cfg.NodeAlive)
		t.owned = newOwnedDevices(t.lease, cfg.Rules, cfg.ProbeInterval, cfg.MaxClaims)
		t.lease.claims, t.lease.onRecover = t.owned.table, cfg.OnRecover
		t.owned.load = t.apply.load
		t.cps.owned, t.floors.unclaim = t.owned.dirty, t.owned.unclaim
	}
	if cfg.Peers != nil {
		t.peers = &peerReads{peers: cfg.Peers}
	}
	return t, nil
}

// Now returns the tracker's clock reading in Unix milliseconds.
func (t *Tracker) Now() int64 { return t.link.now() }

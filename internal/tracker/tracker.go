// Package tracker is the only code that changes presence. It validates
// nothing (the edge does that) and decides nothing about privacy (the filter
// does that): it applies heartbeats, manual statuses, byes and expiry to a
// Store, publishes every visible change, and checkpoints last_seen to the
// durable store in batches. Time comes from an injectable clock, so tests
// play hours in milliseconds by calling Sweep and Checkpoint themselves.
//
// # Outages of the state store
//
// A Store may live in another process (Redis) and go away. Such a store
// implements Pinger, and every call to it is bounded by
// Config.StoreTimeout, so a hung store is noticed like a refused one. An
// error of a store call that is not ErrNotLoaded, not a refusal by the
// rules of package presence and not the caller's own cancellation marks
// the store down; from then on no operation touches it (the check is one
// atomic load):
//
//   - Heartbeat, Bye, SetStatus and SetSettings (the last two after their
//     durable write, as always) are recorded in a bounded buffer of this
//     node — per user the latest operation of each device, the latest
//     manual status and the latest settings — and succeed with an empty
//     Change; nothing is published. Beyond Config.MaxBuffered users they
//     fail with ErrUnavailable.
//   - Get answers from the durable profiles overlaid with the buffer
//     (degraded reads), never with settings it does not know.
//   - Sweep does nothing; Checkpoint only retries a batch that is waiting.
//
// Run probes the store every Config.ProbeInterval (Pinger, or a Get). When
// it answers, the buffer is replayed user by user through the ordinary
// paths — a user the store lost (Redis restarted empty) is loaded from the
// durable store — with each operation's own time as now, so last_seen is
// the last real beat, not the moment of the replay, and the store is marked
// up. The buffer keeps each device's first and last beat of the outage: a
// status or bye is replayed after a beat at its own time of every device
// that beat before and after it, so a device that kept beating through an
// outage longer than the ttl is never found dead at that moment (no false
// offline). Of each user's replayed changes only the last is published,
// and only if the user still shows it now: one who came and went during
// the outage is not announced online after it (Stats.StaleReplays). The rules take the later of two
// beats of a device, so a replayed beat never moves one back. Operations of
// a user still in the buffer during the replay join the buffer behind the
// older ones.
//
// Sweeps stay off for Config.RecoverGrace after the recovery: every node
// buffered during the outage, and the store still holds the deadlines of
// before it. A node that recovered first would otherwise expire devices
// whose beats are still in another node's buffer, a false offline. The
// grace gives every node time to notice (ProbeInterval) and replay.
//
// What a node cannot know it does not make up: a store that comes back
// empty (Redis keeps nothing on disk) has lost the devices of users who did
// not beat on any node during the outage — reads then show them offline,
// but no event says so (Config.OnRecover is the application's cue) — and
// the last_seen changes not yet checkpointed (at most FlushInterval of
// them).
//
// # Users the durable store cannot load
//
// A user the store does not hold is loaded from the durable store before
// its first operation (ErrNotLoaded, then Store.Load). When the durable
// store does not answer (Config.LoadTimeout bounds the read), the user's
// manual status, privacy settings and last version are unknown, and no
// state of the user may be made up: a placeholder would show an invisible
// user online or a status its settings hide, and would stamp versions below
// ones already published. So a Heartbeat or Bye of such a user is held in
// this node's cold buffer (per device its beats and bye, as in the outage
// buffer; at most Config.MaxBuffered users, beyond that Unavailable) and
// succeeds with an empty Change: nobody sees anything of it, and reads of
// the user fail as every read fails that needs the durable store. Loads
// then fail fast (Unavailable) until Run reaches the durable store again,
// every ProbeInterval; it then loads each held user like any user — its
// real settings and status, its version + ReloadMargin — and replays its
// devices that are still alive at the times of their beats, published as
// ordinary changes (an invisible user's as none). Devices that ended
// meanwhile were never shown and are not now: they only move last_seen
// forward, by the rules (an invisible user's public last_seen stays
// frozen). A node that stops meanwhile loses what it held: those devices
// beat again within the ttl, or have gone.
package tracker

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/owned"
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
	// Default 1s. A Store without Ping is taken to run in this process and
	// is called with the caller's context.
	StoreTimeout time.Duration
	// ProbeInterval is how often Run probes a store that is down. Default
	// 250ms.
	ProbeInterval time.Duration
	// RecoverGrace is how long sweeps stay off after the store came back
	// (see the package doc). Default 2s.
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
	// refuses (see the package doc on users whose profile cannot be
	// loaded). Default 2s.
	LoadTimeout time.Duration
	// LeaseInterval is how often the node renews its lease with a Store
	// that implements Leaser (lease.go); a lease not renewed for three
	// intervals, or half the ttl if that is longer, is taken over.
	// Default the smaller of 1s and TTL/9.
	LeaseInterval time.Duration
	// NodeAlive, if set, reports whether the node of a lease is heard
	// from on another channel than the store (the NATS bus): such a node
	// is cut off from the store only, keeps its devices, and is not taken
	// over.
	NodeAlive func(lease uint64) bool
	// Peers, if set, are asked what they hold of users' devices when a
	// read is degraded (peers.go).
	Peers Peers
	// NoLeases turns owned devices off even with a Store that implements
	// Leaser: SocketBeat is then Heartbeat.
	NoLeases bool
	// OnRecover, if set, is called by Run each time the store came back and
	// the buffer was replayed. A store that came back empty lost the devices
	// of users who beat on no node during the outage, and no event tells
	// their watchers that they went offline: this is where the application
	// may re-read the state of what its watchers see. It must not block
	// for long.
	OnRecover func()
}

// DefaultRecoverGrace is Config.RecoverGrace's default: how long, after
// the store came back, every node is given to notice it and to tell it
// what it did meanwhile (the outage buffer, the devices it holds).
const DefaultRecoverGrace = 2 * time.Second

// Tracker applies presence operations. It is safe for concurrent use.
type Tracker struct {
	link    *link // the store, as this node reaches it
	durable Durable
	pub     Publisher
	clock   clock.Clock
	log     *slog.Logger

	sweepInterval time.Duration
	flushInterval time.Duration
	sweepBatch    int

	beats       stripedCounter      // unless the store counts (link.can.beatCounter)
	transitions [5][5]atomic.Uint64 // [prev][next] public status
	textChanges atomic.Uint64
	online      atomic.Int64 // users whose public status is not offline
	flushErrors atomic.Uint64
	flushed     atomic.Uint64

	// writeLocks serialise the writes of status and settings of one user,
	// each held until both its durable write and its change of the hot
	// state are done, so the durable store and the hot state never
	// disagree about which of two concurrent changes came last.
	writeLocks [64]sync.Mutex
	lockSeed   maphash.Seed
	// durableFailing is set by a durable status write that failed and
	// cleared by one that succeeded; while it is set, SetStatus writes
	// durably before it applies instead of at the same time.
	durableFailing atomic.Bool

	// Outages of the store (outage.go).
	rules         presence.Rules
	probeInterval time.Duration
	maxBuffered   int
	reloadMargin  uint64
	onRecover     func()
	buffered      atomic.Int64 // users in buf
	replayed      atomic.Uint64
	staleReplays  atomic.Uint64 // replayed users whose last change was over before the replay
	resets        atomic.Uint64 // times the store was found to have lost its data (floor.go)
	floorMu       sync.Mutex    // serialises resetFloor
	degradedReads atomic.Uint64
	peers         Peers
	peerSigns     atomic.Uint64 // signs of devices the peers gave degraded reads
	peerSnapshots atomic.Uint64 // users the peers read in the store for degraded reads
	peerAskErrors atomic.Uint64 // degraded reads that could ask no peer
	buf           [bufShards]bufShard

	// Users whose profile could not be loaded (cold.go).
	loadTimeout time.Duration
	cold        coldBuffer

	// Devices this node holds, with a Leaser store (lease.go).
	leaser      Leaser
	owned       *owned.Table
	lease       atomic.Uint64 // this node's lease, 0 while it has none
	lz          leases
	leaseLosses atomic.Uint64
	takeovers   atomic.Uint64
	workMu      sync.Mutex // guards workBuf
	workBuf     []owned.Work

	flushMu   sync.RWMutex // held by Checkpoint, read by load; guards pending
	pending   []presence.Profile
	sweepMu   sync.Mutex // guards sweepBuf
	sweepBuf  []presence.Change
	closeOnce sync.Once
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
		cfg.StoreTimeout = time.Second
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = 250 * time.Millisecond
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
	can := abilitiesOf(cfg.Store)
	if cfg.NoLeases {
		can.leaser, can.partTakeOver = nil, nil
	}
	t := &Tracker{
		link:          newLink(cfg.Store, can, &cfg),
		durable:       cfg.Durable,
		pub:           cfg.Publisher,
		clock:         cfg.Clock,
		log:           cfg.Logger,
		sweepInterval: cfg.SweepInterval,
		flushInterval: cfg.FlushInterval,
		sweepBatch:    cfg.SweepBatch,
		lockSeed:      maphash.MakeSeed(),
		rules:         cfg.Rules,
		probeInterval: cfg.ProbeInterval,
		maxBuffered:   cfg.MaxBuffered,
		reloadMargin:  cfg.ReloadMargin,
		loadTimeout:   cfg.LoadTimeout,
		onRecover:     cfg.OnRecover,
		peers:         cfg.Peers,
	}
	t.initLeases(&cfg)
	return t, nil
}

// Now returns the tracker's clock reading in Unix milliseconds.
func (t *Tracker) Now() int64 { return t.clock.Now().UnixMilli() }

// Heartbeat records a heartbeat of a device. It counts as activity unless
// active is false. The common case — a beat that changes nothing visible —
// takes one shard lock and allocates nothing. While the store is down the
// beat is buffered and an empty Change returned (ErrUnavailable if the
// buffer is full).
func (t *Tracker) Heartbeat(ctx context.Context, user, device string, active bool) (ch presence.Change, err error) {
	_, err = t.heartbeatRead(ctx, user, device, active, nil, &ch)
	return ch, err
}

// HeartbeatRead is Heartbeat that, if snap is not nil, also fills it with
// the user's state after the beat — what Get would answer — when the
// store can tell it in the beat's own call (a BeatReader: Redis), and
// reports whether it did. Otherwise (an embedded store, a beat buffered
// or held, a user whose state needs the whole record) the caller reads
// the user.
func (t *Tracker) HeartbeatRead(ctx context.Context, user, device string, active bool, snap *presence.Snapshot) (ch presence.Change, read bool, err error) {
	read, err = t.heartbeatRead(ctx, user, device, active, snap, &ch)
	return ch, read, err
}

// heartbeatRead is HeartbeatRead with the change written to ch: on the
// path of every heartbeat a Change (an Event) is passed down by its
// address rather than copied out of every call.
func (t *Tracker) heartbeatRead(ctx context.Context, user, device string, active bool, snap *presence.Snapshot, ch *presence.Change) (bool, error) {
	if t.link.can.beatCounter == nil {
		t.beats.add()
	}
	if t.link.can.beatReader == nil {
		snap = nil
	}
	now := t.Now()
	o := op{kind: opBeat, at: now, device: device, active: active}
	var read bool
	kept, err := t.throughStore(user, keepHeld, func() op { return o }, ch, func() (err error) {
		read, err = t.applyBeatRead(ctx, now, user, device, active, snap, ch)
		return err
	})
	if err != nil && !kept && profileUnavailable(err) {
		// The durable store is down: wait for the profile (cold.go).
		*ch = presence.Change{}
		_, err = t.hold(user, o, false)
		return false, err
	}
	if err != nil && !kept {
		return false, fmt.Errorf("heartbeat: %w", err)
	}
	return read && !kept, err
}

// How throughStore keeps an operation the store cannot take now.
const (
	keepBuffered = false // in the outage buffer while the user's part is down
	keepHeld     = true  // also held while profiles are awaited (cold.go): beats and byes
)

// throughStore runs one operation of user: apply (the store's call) while
// the store — the user's part of it — is up, and publishes its change; or,
// while it is down, keeps the operation o() for the replay (held: also
// while users wait for their profiles, see held). A call that finds the
// store down on its first try (errOutage) is kept the same way. This is
// the one place where the hot path meets an outage; kept reports that the
// operation was kept (its Change, which apply writes to ch, is then empty,
// and err the buffer's refusal, if any); apply is given no argument, so
// that ch, which it captures, stays on its caller's stack. Other errors of apply are
// returned as they are.
func (t *Tracker) throughStore(user string, held bool, o func() op, ch *presence.Change, apply func() error) (kept bool, _ error) {
	for try := 0; ; try++ {
		if !t.link.upFor(user) || (held && t.cold.n.Load() > 0) {
			var ok bool
			var err error
			if held {
				ok, err = t.held(user, o())
			} else {
				ok, err = t.buffer(user, o())
			}
			if ok {
				*ch = presence.Change{}
				return true, err
			}
		}
		err := apply()
		if try == 0 && errors.Is(err, errOutage) {
			continue // the store is down now: keep the operation
		}
		if err != nil {
			return false, err
		}
		t.emit(ch)
		return false, nil
	}
}

// applyBeat applies a beat to the store, loading the user if needed.
func (t *Tracker) applyBeat(ctx context.Context, now int64, user, device string, active bool) (ch presence.Change, err error) {
	_, err = t.applyBeatRead(ctx, now, user, device, active, nil, &ch)
	return ch, err
}

// applyBeatRead is applyBeat that writes the change to ch and fills snap
// (if not nil: the store is a BeatReader) in the same call, and reports
// whether it did.
func (t *Tracker) applyBeatRead(ctx context.Context, now int64, user, device string, active bool, snap *presence.Snapshot, ch *presence.Change) (bool, error) {
	beat := func() (read bool, err error) {
		b := t.link.bound(ctx)
		defer t.link.release(b)
		if snap != nil {
			*ch, read, err = t.link.can.beatReader.BeatRead(b.ctx, now, user, device, active, snap)
			return read, err
		}
		*ch, err = t.link.store.Beat(b.ctx, now, user, device, active)
		return false, err
	}
	read, err := beat()
	if err = t.link.checkUser(ctx, user, err); errors.Is(err, ErrNotLoaded) {
		if err = t.load(ctx, user); err != nil {
			return false, err
		}
		read, err = beat()
		err = t.link.checkUser(ctx, user, err)
	}
	return read && err == nil, err
}

// SetStatus sets a manual status (ManualNone clears it) and a status text.
// It returns nil only once they are durable, so an invisible user stays
// invisible across restarts.
//
// The durable write and the change of the hot state (with its fan-out)
// run at the same time: a change reaches watchers without waiting for the
// durable store's commit (an fsync), and the caller still hears of success
// only after both. If the durable write fails, the hot state is set back
// to the status and text it had (watchers see the change and its undo) and
// the error returned, so a failed SetStatus leaves the user as it found
// them, as before. After such a failure, and while the store is down, the
// status is written durably first and applied after, one step at a time,
// until a durable write succeeds again: a durable store that keeps failing
// makes no flicker of its own. See docs/internals.md, "Durability".
func (t *Tracker) SetStatus(ctx context.Context, user string, m presence.Manual, text string) (presence.Change, error) {
	mu := t.writeLock(user)
	mu.Lock()
	defer mu.Unlock()
	if t.link.upFor(user) {
		prior, err := t.ensure(ctx, user)
		switch {
		case err == nil && !t.durableFailing.Load():
			return t.setStatusOverlapped(ctx, user, prior, m, text)
		case err != nil && !errors.Is(err, errOutage):
			return presence.Change{}, err
		}
	}
	if err := t.saveStatus(ctx, user, m, text); err != nil {
		return presence.Change{}, fmt.Errorf("set status: %w", err)
	}
	return t.applyStatusSaved(ctx, user, m, text)
}

// setStatusOverlapped writes the status durably while it applies and
// publishes it, and waits for both; see SetStatus. The goroutine of the
// durable write is this call's: it is always waited for.
func (t *Tracker) setStatusOverlapped(ctx context.Context, user string, prior manualStatus, m presence.Manual, text string) (presence.Change, error) {
	saved := make(chan error, 1)
	go func() { saved <- t.saveStatus(ctx, user, m, text) }()
	ch, err := t.applyStatus(ctx, t.Now(), user, m, text)
	if err == nil {
		t.emit(&ch)
	}
	if derr := <-saved; derr != nil {
		if err == nil {
			t.undoStatus(ctx, user, prior)
		}
		return presence.Change{}, fmt.Errorf("set status: %w", derr)
	}
	if errors.Is(err, errOutage) {
		// The store went down meanwhile: the status is durable, so it is
		// buffered as on the sequential path.
		return t.applyStatusSaved(ctx, user, m, text)
	}
	if err != nil {
		return ch, fmt.Errorf("set status: %w", err)
	}
	return ch, nil
}

// saveStatus is the durable write of a status. A failure that is not the
// caller's own cancellation makes the next status changes sequential
// (durable, then applied) until one succeeds.
func (t *Tracker) saveStatus(ctx context.Context, user string, m presence.Manual, text string) error {
	err := t.durable.SaveStatus(ctx, user, m, text)
	switch {
	case err == nil:
		t.durableFailing.Store(false)
	case ctx.Err() == nil:
		t.durableFailing.Store(true)
	}
	return err
}

// undoStatus sets the hot state of user back to prior after the durable
// write of a status that was applied failed. It publishes the change back.
// The status is not durable, so the undo is never skipped: with the store
// down it is buffered, and another failure is logged (the user's next
// status change, or a reload from the durable store, sets it right).
func (t *Tracker) undoStatus(ctx context.Context, user string, prior manualStatus) {
	ctx = context.WithoutCancel(ctx) // the caller's deadline may be what failed
	var ch presence.Change
	if _, err := t.throughStore(user, keepBuffered, func() op {
		return op{kind: opStatus, at: t.Now(), manual: prior.manual, text: prior.text}
	}, &ch, func() (err error) {
		ch, err = t.applyStatus(ctx, t.Now(), user, prior.manual, prior.text)
		return err
	}); err != nil {
		t.log.Error("could not undo a status that did not become durable", "user", user, "err", err)
	}
}

// applyStatusSaved applies a status that is durable already, or buffers
// it while the store is down.
func (t *Tracker) applyStatusSaved(ctx context.Context, user string, m presence.Manual, text string) (ch presence.Change, err error) {
	kept, err := t.throughStore(user, keepBuffered, func() op {
		return op{kind: opStatus, at: t.Now(), manual: m, text: text}
	}, &ch, func() (err error) {
		ch, err = t.applyStatus(ctx, t.Now(), user, m, text)
		return err
	})
	if err != nil && !kept {
		return ch, fmt.Errorf("set status: %w", err)
	}
	return ch, err
}

func (t *Tracker) applyStatus(ctx context.Context, now int64, user string, m presence.Manual, text string) (presence.Change, error) {
	for try := 0; ; try++ {
		b := t.link.bound(ctx)
		ch, err := t.link.store.SetStatus(b.ctx, now, user, m, text)
		t.link.release(b)
		err = t.link.checkUser(ctx, user, err)
		if errors.Is(err, ErrNotLoaded) && try < 3 {
			if err = t.load(ctx, user); err != nil {
				return ch, err
			}
			continue
		}
		return ch, err
	}
}

// Bye ends a device at once (logout, app closed). While the store is down
// the bye is buffered and an empty Change returned.
func (t *Tracker) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	now := t.Now()
	if t.owned != nil {
		d, how := t.owned.Remove(now, user, device)
		switch how {
		case owned.Deferred:
			return presence.Change{}, nil // released after the work in flight
		case owned.Release:
			if lease := t.lease.Load(); lease != 0 && t.link.upFor(user) {
				ch, _, err := t.ownedCall(ctx, user, func(c context.Context) (presence.Change, []string, error) {
					return t.leaser.Release(c, now, lease, user,
						[]OwnedDevice{{ID: d.ID, LastBeat: d.LastBeat, LastActive: d.LastActive}}, true)
				})
				if err == nil {
					t.owned.Released(now, user, d, true)
					t.emit(&ch)
					return ch, nil
				}
				if !errors.Is(err, errOutage) {
					return ch, fmt.Errorf("bye: %w", err)
				}
			}
			// The store is down: the bye below is buffered, and its
			// replay removes the device whoever owns it.
		}
	}
	var ch presence.Change
	kept, err := t.throughStore(user, keepHeld, func() op {
		return op{kind: opBye, at: now, device: device}
	}, &ch, func() (err error) {
		ch, err = t.applyBye(ctx, now, user, device)
		return err
	})
	if err != nil && !kept {
		return ch, fmt.Errorf("bye: %w", err)
	}
	return ch, err
}

func (t *Tracker) applyBye(ctx context.Context, now int64, user, device string) (presence.Change, error) {
	b := t.link.bound(ctx)
	ch, err := t.link.store.Bye(b.ctx, now, user, device)
	t.link.release(b)
	return ch, t.link.checkUser(ctx, user, err)
}

// Disconnect tells the tracker that the connection of a device closed
// without a bye at now; since is the last beat made through that
// connection (Unix ms, the tracker's clock). Unless the device beats again,
// it dies Rules.CloseGrace from now instead of at the end of its ttl, so a
// reconnect within the grace shows nothing and a real departure shows
// quickly. A device that beat after since (it reconnected, here or on
// another node) is left alone. While the store is down nothing is
// recorded: the device then lives its whole ttl, as after missed beats.
func (t *Tracker) Disconnect(ctx context.Context, user, device string, since int64) error {
	now := t.Now()
	if t.owned != nil && t.owned.Close(now, user, device, since) {
		return nil // this node holds the device: its deadline is kept here
	}
	if !t.link.upFor(user) {
		return nil
	}
	b := t.link.bound(ctx)
	ch, err := t.link.store.Disconnect(b.ctx, now, user, device, since)
	t.link.release(b)
	if err = t.link.checkUser(ctx, user, err); err != nil {
		if errors.Is(err, errOutage) {
			return nil // the device lives its whole ttl
		}
		return fmt.Errorf("disconnect: %w", err)
	}
	t.emit(&ch)
	return nil
}

// SetSettings durably replaces a user's privacy settings and applies them
// to the hot state (while the store is down: to the outage buffer).
func (t *Tracker) SetSettings(ctx context.Context, user string, s presence.Settings) error {
	mu := t.writeLock(user)
	mu.Lock()
	defer mu.Unlock()
	if t.link.upFor(user) {
		if _, err := t.ensure(ctx, user); err != nil && !errors.Is(err, errOutage) {
			return err
		}
	}
	if err := t.durable.SaveSettings(ctx, user, s); err != nil {
		return fmt.Errorf("set settings: %w", err)
	}
	// Each watcher whose view changed is sent the new one.
	var ch presence.Change
	kept, err := t.throughStore(user, keepBuffered, func() op {
		return op{kind: opSettings, settings: s}
	}, &ch, func() (err error) {
		ch, err = t.applySettings(ctx, t.Now(), user, &s)
		return err
	})
	if err != nil && !kept {
		return fmt.Errorf("set settings: %w", err)
	}
	return err
}

// ContactsChanged marks a change of user's contact list (durable before
// the call). When the user's settings show anything to contacts only, it
// stamps the user a new version and publishes it (a change of settings
// that keeps them: nobody is sent anything for it), so that watchers who
// gained or lost sight with the list — the hubs tell them, after it — are
// sent a view above everything they were sent before. While the store is
// down nothing is stamped (the resync after the outage reads every
// watcher's relations again).
func (t *Tracker) ContactsChanged(ctx context.Context, user string) error {
	mu := t.writeLock(user)
	mu.Lock()
	defer mu.Unlock()
	if !t.link.upFor(user) {
		return nil
	}
	var s [1]presence.Snapshot
	if err := t.get(ctx, t.Now(), []string{user}, s[:], false); err != nil {
		return fmt.Errorf("contacts changed: %w", err)
	}
	if set := s[0].Settings; set.Status != presence.Contacts && set.LastSeen != presence.Contacts {
		return nil // the list decides nothing anybody sees
	}
	if _, err := t.ensure(ctx, user); err != nil {
		return fmt.Errorf("contacts changed: %w", err)
	}
	ch, err := t.applySettings(ctx, t.Now(), user, nil)
	if err != nil {
		return fmt.Errorf("contacts changed: %w", err)
	}
	t.emit(&ch)
	return nil
}

func (t *Tracker) applySettings(ctx context.Context, now int64, user string, s *presence.Settings) (presence.Change, error) {
	for try := 0; ; try++ {
		b := t.link.bound(ctx)
		ch, err := t.link.store.SetSettings(b.ctx, now, user, s)
		t.link.release(b)
		err = t.link.checkUser(ctx, user, err)
		if errors.Is(err, ErrNotLoaded) && try < 3 {
			if err = t.load(ctx, user); err != nil {
				return ch, err
			}
			continue
		}
		return ch, err
	}
}

func (t *Tracker) writeLock(user string) *sync.Mutex {
	return &t.writeLocks[maphash.String(t.lockSeed, user)%uint64(len(t.writeLocks))]
}

// Settings returns a user's privacy settings (while the store is down:
// from the durable store and the outage buffer).
func (t *Tracker) Settings(ctx context.Context, user string) (presence.Settings, error) {
	if t.link.upFor(user) {
		if _, err := t.ensure(ctx, user); err != nil && !errors.Is(err, errOutage) {
			return presence.Settings{}, err
		}
	}
	var s [1]presence.Snapshot
	if err := t.get(ctx, t.Now(), []string{user}, s[:], false); err != nil {
		return presence.Settings{}, err
	}
	return s[0].Settings, nil
}

// Debug returns the hot state of a user and its next deadline.
func (t *Tracker) Debug(ctx context.Context, user string) (presence.User, int64, bool, error) {
	b := t.link.bound(ctx)
	defer t.link.release(b)
	u, deadline, ok, err := t.link.store.Debug(b.ctx, user)
	return u, deadline, ok, t.link.check(ctx, err)
}

// manualStatus is a user's manual status and status text.
type manualStatus struct {
	manual presence.Manual
	text   string
}

// ensure loads a user into the store so that every change is applied to
// state that is already there (Load never overwrites). It returns the
// user's manual status and text as the store holds them.
func (t *Tracker) ensure(ctx context.Context, user string) (manualStatus, error) {
	var s [1]presence.Snapshot
	b := t.link.bound(ctx)
	err := t.link.store.Get(b.ctx, t.Now(), []string{user}, s[:])
	t.link.release(b)
	if err = t.link.checkUser(ctx, user, err); err != nil {
		return manualStatus{}, err
	}
	if s[0].Known {
		return manualStatus{s[0].Manual, s[0].Text}, nil
	}
	p, err := t.loadProfile(ctx, user)
	return manualStatus{p.Manual, p.Text}, err
}

func (t *Tracker) load(ctx context.Context, user string) error {
	_, err := t.loadProfile(ctx, user)
	return err
}

// profiles calls fn with the profile of each of ids (each once) that the
// durable store knows or that this node checkpointed: the durable one
// with the checkpoints drained from the store but not yet durable (in
// flight, or pending after a failed write) merged in — the one rule for a
// user the store does not hold (a load, a degraded read). Versions count
// up from a loaded one, so loading without them would stamp versions that
// were already published. With wait, the durable read waits for a
// checkpoint in flight (a load must not miss it); without, a checkpoint
// in flight may be missed (a read, which must not queue behind a slow
// durable write: the last second of last_seen at worst).
func (t *Tracker) profiles(ctx context.Context, ids []string, fn func(*presence.Profile), wait bool) error {
	first := make(map[string]int, len(ids)) // id → its index among the distinct
	got := make([]presence.Profile, 0, len(ids))
	have := make([]bool, 0, len(ids))
	for _, id := range ids {
		if _, ok := first[id]; !ok {
			first[id] = len(got)
			got = append(got, presence.Profile{UserID: id})
			have = append(have, false)
		}
	}
	if wait {
		t.flushMu.RLock()
		defer t.flushMu.RUnlock()
	}
	err := t.durable.LoadProfiles(ctx, ids, func(p *presence.Profile) {
		if i, ok := first[p.UserID]; ok {
			got[i], have[i] = *p, true
		}
	})
	if err != nil {
		return err
	}
	if !wait {
		t.flushMu.RLock()
		defer t.flushMu.RUnlock()
	}
	for _, q := range t.pending {
		if i, ok := first[q.UserID]; ok {
			p := &got[i]
			if q.Version >= p.Version {
				p.PubText, p.PubVersion = q.PubText, q.PubVersion // the face goes with the newest version
			}
			p.LastSeen = max(p.LastSeen, q.LastSeen)
			p.PubLastSeen = max(p.PubLastSeen, q.PubLastSeen)
			p.Version = max(p.Version, q.Version)
			have[i] = true
		}
	}
	for i := range got {
		if have[i] {
			fn(&got[i])
		}
	}
	return nil
}

// loadProfile loads a user from the durable store into the store (unless
// it is held already) and returns the durable profile.
func (t *Tracker) loadProfile(ctx context.Context, user string) (presence.Profile, error) {
	if t.cold.down.Load() {
		return presence.Profile{UserID: user}, &profileError{user: user, err: errDurableDown}
	}
	p := presence.Profile{UserID: user}
	lctx, cancel := context.WithTimeout(ctx, t.loadTimeout)
	err := t.profiles(lctx, []string{user}, func(got *presence.Profile) { p = *got }, true)
	cancel()
	if err != nil {
		return p, t.loadFailed(ctx, user, err)
	}
	p.Raise(t.reloadMargin, 0) // the store raises it to its floor
	for try := 0; ; try++ {
		b := t.link.bound(ctx)
		err = t.link.store.Load(b.ctx, t.Now(), &p)
		t.link.release(b)
		if err = t.link.checkUser(ctx, user, err); !errors.Is(err, ErrStoreReset) || try > 0 {
			return p, err
		}
		if err = t.resetFloor(ctx); err != nil {
			return p, err
		}
	}
}

// emit counts and publishes a change. It takes the change by value so that
// the common no-change heartbeat keeps its Change on the stack.
func (t *Tracker) emit(ch *presence.Change) {
	if ch.Changed {
		t.publish(ch.Event)
	}
}

func (t *Tracker) publish(e presence.Event) {
	ev := &e
	if ev.Prev != ev.Status {
		t.transitions[ev.Prev][ev.Status].Add(1)
		switch {
		case ev.Prev == presence.Offline:
			t.online.Add(1)
		case ev.Status == presence.Offline:
			t.online.Add(-1)
		}
	} else {
		t.textChanges.Add(1)
	}
	if t.pub != nil {
		t.pub.Publish(ev)
	}
}

// Sweep applies every deadline due now and publishes the changes. It
// returns how many changes it published. It does nothing while the store
// is down and for RecoverGrace after it came back (see the package doc).
func (t *Tracker) Sweep(ctx context.Context) (int, error) {
	t.syncOwned(ctx)
	if !t.link.sweepable() {
		return 0, nil
	}
	t.sweepMu.Lock()
	defer t.sweepMu.Unlock()
	total := 0
	skip := t.link.sweepSkip()
	ps := t.link.can.partSweeper
	if skip != nil && ps == nil {
		return 0, nil // a part is down or just back: no sweep until it is settled
	}
	for {
		b := t.link.bound(ctx)
		var out []presence.Change
		var err error
		if skip != nil {
			out, err = ps.ExpireParts(b.ctx, t.Now(), t.sweepBatch, skip, t.sweepBuf[:0])
		} else {
			out, err = t.link.store.Expire(b.ctx, t.Now(), t.sweepBatch, t.sweepBuf[:0])
		}
		t.link.release(b)
		t.link.partsFailed(err)
		err = t.link.check(ctx, err)
		for i := range out {
			t.emit(&out[i])
		}
		total += len(out)
		clear(out)
		t.sweepBuf = out[:0]
		if err != nil {
			return total, fmt.Errorf("sweep: %w", err)
		}
		if len(out) < t.sweepBatch {
			return total, nil
		}
	}
}

// Checkpoint writes every last_seen changed since the previous checkpoint
// to the durable store in one transaction. On failure the batch is kept
// and retried with the next checkpoint, so nothing is lost while the
// durable store is away. While the state store is down only a waiting
// batch is retried; what a failed Dirty drained is kept in it.
func (t *Tracker) Checkpoint(ctx context.Context) error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	retry := len(t.pending) > 0 // a failed batch is still waiting
	batch := t.pending
	if t.link.up() {
		b := t.link.bound(ctx)
		var err error
		if skip, ps := t.link.downParts(), t.link.can.partSweeper; skip != nil && ps != nil {
			batch, err = ps.DirtyParts(b.ctx, skip, t.pending)
		} else {
			batch, err = t.link.store.Dirty(b.ctx, t.pending)
		}
		t.link.release(b)
		t.pending = batch
		if err = t.link.check(ctx, err); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	if t.owned != nil {
		// The last beats of the devices this node holds: the store
		// does not hear of them.
		n := len(batch)
		batch = t.owned.Dirty(batch)
		retry = retry || len(batch) > n
	}
	if len(batch) == 0 {
		return nil
	}
	if retry {
		// Dirty names each user once; a retried batch merged with newer
		// checkpoints, or the last beats of the devices this node
		// holds, can name one twice.
		batch = dedupeNewest(batch)
	}
	if err := t.durable.SaveLastSeen(ctx, batch); err != nil {
		t.pending = batch
		t.flushErrors.Add(1)
		return fmt.Errorf("checkpoint of %d users: %w", len(batch), err)
	}
	t.flushed.Add(uint64(len(batch)))
	clear(batch)
	t.pending = batch[:0]
	return nil
}

// dedupeNewest keeps one profile per user, the newest, when a failed batch
// is retried together with newer checkpoints.
func dedupeNewest(b []presence.Profile) []presence.Profile {
	if len(b) < 2 {
		return b
	}
	idx := make(map[string]int, len(b))
	out := b[:0]
	for _, p := range b {
		if i, ok := idx[p.UserID]; ok {
			// Every field written only grows: keep the newest of each
			// (a checkpoint of the devices this node holds carries only
			// last_seen).
			q := &out[i]
			if p.Version >= q.Version && p.PubVersion != 0 {
				// The face goes with the newest version (Manual and
				// Text say whether it is kept: Profile.Frozen).
				q.Manual, q.Text, q.PubText, q.PubVersion = p.Manual, p.Text, p.PubText, p.PubVersion
			}
			q.LastSeen = max(q.LastSeen, p.LastSeen)
			q.PubLastSeen = max(q.PubLastSeen, p.PubLastSeen)
			q.Version = max(q.Version, p.Version)
			continue
		}
		idx[p.UserID] = len(out)
		out = append(out, p)
	}
	return out
}

// Run sweeps deadlines, checkpoints last_seen and, while the store is
// down, probes it and replays the outage buffer when it is back, until ctx
// is done; then it checkpoints once more. It returns nil after a clean stop.
func (t *Tracker) Run(ctx context.Context) error {
	sweep := time.NewTicker(t.sweepInterval)
	defer sweep.Stop()
	flush := time.NewTicker(t.flushInterval)
	defer flush.Stop()
	probe := time.NewTicker(t.probeInterval)
	defer probe.Stop()
	var leaseTick <-chan time.Time
	if t.leaser != nil {
		lt := time.NewTicker(time.Duration(t.lz.interval) * time.Millisecond)
		defer lt.Stop()
		leaseTick = lt.C
		t.tickLease(ctx)
	}
	var partialLogged time.Time // part of the store down: said at most every 10 s
	for {
		select {
		case <-ctx.Done():
			return t.Close(context.WithoutCancel(ctx))
		case <-sweep.C:
			if _, err := t.Sweep(ctx); err != nil && ctx.Err() == nil {
				if !partial(err) || time.Since(partialLogged) >= 10*time.Second {
					t.log.Warn("sweep failed", "err", err)
					if partial(err) {
						partialLogged = time.Now()
					}
				}
			}
		case <-leaseTick:
			t.tickLease(ctx)
		case <-probe.C:
			t.recover(ctx)
			t.link.probeSuspects(ctx)
			t.recoverParts(ctx)
			t.retryCold(ctx)
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
		if n := t.buffered.Load(); n > 0 {
			t.log.Warn("closing while the state store is down: buffered operations are lost", "users", n)
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		t.handOff(ctx)
		err = t.Checkpoint(ctx)
	})
	return err
}

// StoreDown reports whether the state store is down (or its outage buffer
// being replayed): operations are buffered and reads degraded.
func (t *Tracker) StoreDown() bool { return !t.link.up() }

// Stats are the tracker's counters since start.
type Stats struct {
	Heartbeats  uint64
	Transitions map[[2]presence.Status]uint64 // [prev, next] → count
	TextChanges uint64
	// Online counts users whose public status is not offline, from the
	// transitions this tracker made: exact when it makes every transition
	// of its store (a store in this process), not when nodes share the
	// store (each sees only its own share of arrivals and departures).
	Online      int64
	Flushed     uint64 // last_seen checkpoints written
	FlushErrors uint64

	Down          bool   // the state store is down (or its outage buffer is being replayed)
	Outages       uint64 // times the state store went down
	Buffered      int64  // users with operations in the outage buffer
	Replayed      uint64 // users whose buffered operations were replayed
	StaleReplays  uint64 // of those, users whose last replayed change was over by the replay (not published)
	StoreResets   uint64 // times the state store was found to have lost its data (versions moved to a new epoch)
	DegradedReads uint64 // Get calls answered without the state store
	PartsDown     int    // parts of a Partitioned store (Cluster masters' shards) down now, their users' writes buffered
	PartOutages   uint64 // times a part was found down
	PeerSigns     uint64 // signs of devices other nodes gave degraded reads (Config.Peers)
	PeerSnapshots uint64 // users other nodes read in the store for degraded reads
	PeerAskErrors uint64 // degraded reads that could ask no other node

	AwaitingProfile int64  // users whose heartbeats wait in this node for the durable store (cold.go)
	ProfilesLoaded  uint64 // of those, users loaded once it answered

	OwnedDevices   int    // devices whose sockets this node holds and owns (lease.go); 0 without leases
	LeaseLosses    uint64 // times this node found its lease taken over or lost, and claimed its devices again
	LeaseTakeovers uint64 // leases of other nodes this node marked and took over
}

// Stats returns a copy of the counters.
func (t *Tracker) Stats() Stats {
	s := Stats{
		Heartbeats:  t.beats.load() + t.countedByStore(),
		Transitions: make(map[[2]presence.Status]uint64),
		TextChanges: t.textChanges.Load(),
		Online:      t.online.Load(),
		Flushed:     t.flushed.Load(),
		FlushErrors: t.flushErrors.Load(),

		Down:          !t.link.up(),
		Outages:       t.link.outages.Load(),
		Buffered:      t.buffered.Load(),
		Replayed:      t.replayed.Load(),
		StaleReplays:  t.staleReplays.Load(),
		StoreResets:   t.resets.Load(),
		DegradedReads: t.degradedReads.Load(),
		PeerSigns:     t.peerSigns.Load(),
		PeerSnapshots: t.peerSnapshots.Load(),
		PeerAskErrors: t.peerAskErrors.Load(),

		AwaitingProfile: t.cold.n.Load(),
		ProfilesLoaded:  t.cold.loaded.Load(),

		LeaseLosses:    t.leaseLosses.Load(),
		LeaseTakeovers: t.takeovers.Load(),
	}
	if t.owned != nil {
		s.OwnedDevices = t.owned.Len()
	}
	if t.link.parts != nil {
		s.PartsDown = int(t.link.parts.down.Load())
		s.PartOutages = t.link.parts.outages.Load()
	}
	for p := range t.transitions {
		for n := range t.transitions[p] {
			if c := t.transitions[p][n].Load(); c > 0 {
				s.Transitions[[2]presence.Status{presence.Status(p), presence.Status(n)}] = c
			}
		}
	}
	return s
}

func (t *Tracker) countedByStore() uint64 {
	if t.link.can.beatCounter == nil {
		return 0
	}
	return t.link.can.beatCounter.Beats()
}

// stripedCounter is a counter that many goroutines bump without fighting
// over one cache line.
type stripedCounter struct {
	stripes [32]struct {
		n atomic.Uint64
		_ [56]byte
	}
}

func (c *stripedCounter) add() { c.stripes[rand.Uint32()&31].n.Add(1) }

func (c *stripedCounter) load() uint64 {
	var n uint64
	for i := range c.stripes {
		n += c.stripes[i].n.Load()
	}
	return n
}

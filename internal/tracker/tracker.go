// Package tracker is the only code that changes presence. It validates
// nothing (the edge does that) and decides nothing about privacy (the filter
// does that): it applies heartbeats, manual statuses, byes and expiry to a
// Store, publishes every visible change, and checkpoints last_seen to the
// durable store in batches. Time comes from an injectable clock, so tests
// play hours in milliseconds by calling Sweep and Checkpoint themselves.
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
}

// Tracker applies presence operations. It is safe for concurrent use.
type Tracker struct {
	store   Store
	durable Durable
	pub     Publisher
	clock   clock.Clock
	log     *slog.Logger

	sweepInterval time.Duration
	flushInterval time.Duration
	sweepBatch    int

	beats       stripedCounter // unless the store counts (storeBeats)
	storeBeats  BeatCounter
	transitions [5][5]atomic.Uint64 // [prev][next] public status
	textChanges atomic.Uint64
	online      atomic.Int64 // users whose public status is not offline
	flushErrors atomic.Uint64
	flushed     atomic.Uint64

	// writeLocks serialise the durable-then-hot writes (status, settings)
	// of one user, so the durable store and the hot state never disagree
	// about which of two concurrent changes came last.
	writeLocks [64]sync.Mutex
	lockSeed   maphash.Seed

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
	return &Tracker{
		store:         cfg.Store,
		durable:       cfg.Durable,
		pub:           cfg.Publisher,
		clock:         cfg.Clock,
		log:           cfg.Logger,
		sweepInterval: cfg.SweepInterval,
		flushInterval: cfg.FlushInterval,
		sweepBatch:    cfg.SweepBatch,
		lockSeed:      maphash.MakeSeed(),
		storeBeats:    beatCounter(cfg.Store),
	}, nil
}

// Now returns the tracker's clock reading in Unix milliseconds.
func (t *Tracker) Now() int64 { return t.clock.Now().UnixMilli() }

// Heartbeat records a heartbeat of a device. It counts as activity unless
// active is false. The common case — a beat that changes nothing visible —
// takes one shard lock and allocates nothing.
func (t *Tracker) Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	if t.storeBeats == nil {
		t.beats.add()
	}
	now := t.Now()
	ch, err := t.store.Beat(ctx, now, user, device, active)
	if errors.Is(err, ErrNotLoaded) {
		if err = t.load(ctx, user); err != nil {
			return ch, err
		}
		ch, err = t.store.Beat(ctx, t.Now(), user, device, active)
	}
	if err != nil {
		return ch, fmt.Errorf("heartbeat: %w", err)
	}
	t.emit(ch)
	return ch, nil
}

// SetStatus sets a manual status (ManualNone clears it) and a status text.
// They are durable before they take effect, so an invisible user stays
// invisible across restarts.
func (t *Tracker) SetStatus(ctx context.Context, user string, m presence.Manual, text string) (presence.Change, error) {
	mu := t.writeLock(user)
	mu.Lock()
	defer mu.Unlock()
	if err := t.ensure(ctx, user); err != nil {
		return presence.Change{}, err
	}
	if err := t.durable.SaveStatus(ctx, user, m, text); err != nil {
		return presence.Change{}, fmt.Errorf("set status: %w", err)
	}
	for try := 0; ; try++ {
		ch, err := t.store.SetStatus(ctx, t.Now(), user, m, text)
		if errors.Is(err, ErrNotLoaded) && try < 3 {
			if err = t.load(ctx, user); err != nil {
				return ch, err
			}
			continue
		}
		if err != nil {
			return ch, fmt.Errorf("set status: %w", err)
		}
		t.emit(ch)
		return ch, nil
	}
}

// Bye ends a device at once (logout, app closed).
func (t *Tracker) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	ch, err := t.store.Bye(ctx, t.Now(), user, device)
	if err != nil {
		return ch, fmt.Errorf("bye: %w", err)
	}
	t.emit(ch)
	return ch, nil
}

// SetSettings durably replaces a user's privacy settings and applies them
// to the hot state.
func (t *Tracker) SetSettings(ctx context.Context, user string, s presence.Settings) error {
	mu := t.writeLock(user)
	mu.Lock()
	defer mu.Unlock()
	if err := t.ensure(ctx, user); err != nil {
		return err
	}
	if err := t.durable.SaveSettings(ctx, user, s); err != nil {
		return fmt.Errorf("set settings: %w", err)
	}
	for try := 0; ; try++ {
		err := t.store.SetSettings(ctx, user, s)
		if errors.Is(err, ErrNotLoaded) && try < 3 {
			if err = t.load(ctx, user); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("set settings: %w", err)
		}
		return nil
	}
}

func (t *Tracker) writeLock(user string) *sync.Mutex {
	return &t.writeLocks[maphash.String(t.lockSeed, user)%uint64(len(t.writeLocks))]
}

// Settings returns a user's privacy settings.
func (t *Tracker) Settings(ctx context.Context, user string) (presence.Settings, error) {
	if err := t.ensure(ctx, user); err != nil {
		return presence.Settings{}, err
	}
	var s [1]presence.Snapshot
	if err := t.store.Get(ctx, t.Now(), []string{user}, s[:]); err != nil {
		return presence.Settings{}, err
	}
	return s[0].Settings, nil
}

// Debug returns the hot state of a user and its next deadline.
func (t *Tracker) Debug(ctx context.Context, user string) (presence.User, int64, bool, error) {
	return t.store.Debug(ctx, user)
}

// ensure loads a user into the store so that every change is applied to
// state that is already there (Load never overwrites).
func (t *Tracker) ensure(ctx context.Context, user string) error {
	var s [1]presence.Snapshot
	if err := t.store.Get(ctx, t.Now(), []string{user}, s[:]); err != nil {
		return err
	}
	if s[0].Known {
		return nil
	}
	return t.load(ctx, user)
}

func (t *Tracker) load(ctx context.Context, user string) error {
	p := presence.Profile{UserID: user}
	// A user the store evicted may have a checkpoint that is drained from
	// the store but not yet durable (in flight, or pending after a failed
	// write). Versions count up from the loaded one, so loading without it
	// would stamp versions that were already published.
	t.flushMu.RLock()
	err := t.durable.LoadProfiles(ctx, []string{user}, func(got *presence.Profile) { p = *got })
	for i := range t.pending {
		if q := &t.pending[i]; q.UserID == user {
			p.LastSeen = max(p.LastSeen, q.LastSeen)
			p.PubLastSeen = max(p.PubLastSeen, q.PubLastSeen)
			p.Version = max(p.Version, q.Version)
		}
	}
	t.flushMu.RUnlock()
	if err != nil {
		return fmt.Errorf("load %q: %w", user, err)
	}
	return t.store.Load(ctx, t.Now(), &p)
}

// emit counts and publishes a change. It takes the change by value so that
// the common no-change heartbeat keeps its Change on the stack.
func (t *Tracker) emit(ch presence.Change) {
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
// returns how many changes it published.
func (t *Tracker) Sweep(ctx context.Context) (int, error) {
	t.sweepMu.Lock()
	defer t.sweepMu.Unlock()
	total := 0
	for {
		out, err := t.store.Expire(ctx, t.Now(), t.sweepBatch, t.sweepBuf[:0])
		for i := range out {
			t.emit(out[i])
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
// durable store is away.
func (t *Tracker) Checkpoint(ctx context.Context) error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	retry := len(t.pending) > 0 // a failed batch is still waiting
	batch, err := t.store.Dirty(ctx, t.pending)
	t.pending = batch
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if len(batch) == 0 {
		return nil
	}
	if retry {
		// Dirty names each user once; only a retried batch merged with
		// newer checkpoints can name one twice.
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
			out[i] = p // later in the batch is newer
			continue
		}
		idx[p.UserID] = len(out)
		out = append(out, p)
	}
	return out
}

// Run sweeps deadlines and checkpoints last_seen until ctx is done, then
// checkpoints once more. It returns nil after a clean stop.
func (t *Tracker) Run(ctx context.Context) error {
	sweep := time.NewTicker(t.sweepInterval)
	defer sweep.Stop()
	flush := time.NewTicker(t.flushInterval)
	defer flush.Stop()
	for {
		select {
		case <-ctx.Done():
			return t.Close(context.WithoutCancel(ctx))
		case <-sweep.C:
			if _, err := t.Sweep(ctx); err != nil && ctx.Err() == nil {
				t.log.Warn("sweep failed", "err", err)
			}
		case <-flush.C:
			if err := t.Checkpoint(ctx); err != nil && ctx.Err() == nil {
				t.log.Warn("checkpoint failed; will retry", "err", err)
			}
		}
	}
}

// Close writes the last checkpoint. It is idempotent.
func (t *Tracker) Close(ctx context.Context) error {
	var err error
	t.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err = t.Checkpoint(ctx)
	})
	return err
}

// Stats are the tracker's counters since start.
type Stats struct {
	Heartbeats  uint64
	Transitions map[[2]presence.Status]uint64 // [prev, next] → count
	TextChanges uint64
	Online      int64
	Flushed     uint64 // last_seen checkpoints written
	FlushErrors uint64
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

// BeatCounter is an optional ability of a Store: it counts the heartbeats
// it applies where that costs nothing (under a lock it holds anyway), so the
// tracker need not bump a counter shared between cores on every beat.
type BeatCounter interface {
	Beats() uint64
}

func beatCounter(s Store) BeatCounter {
	c, _ := s.(BeatCounter)
	return c
}

func (t *Tracker) countedByStore() uint64 {
	if t.storeBeats == nil {
		return 0
	}
	return t.storeBeats.Beats()
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

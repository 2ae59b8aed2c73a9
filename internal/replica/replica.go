// Package replica keeps, in each node of a scale-out deployment, what every
// user shows to others: the public status, the privacy settings and the
// version of the last change, for every user the shared state store holds.
// A status read of 1,000 ids is then answered in the node's memory, at the
// embedded node's speed, instead of by a round trip to Redis.
//
// It is filled from the store (Source.ScanReads: every user's read field)
// and kept current by the changes the nodes publish (Publish: the node's own
// from its tracker, the other nodes' from the bus). A change is applied only
// if its version is above the one held, so the two feeds, and changes that
// arrive out of order or twice, merge into the newest state of each user.
//
// A replica is only as good as its feed. Get refuses (ErrNotReady), and the
// caller reads the store, whenever it may have missed changes: before its
// first fill completes, from the moment it is told it may have missed some
// (Refill: the bus was cut off or dropped messages, the store came back or
// lost its data) until a fill that started after that moment is done, and
// while Config.Fresh says a node that may write changes is not heard on the
// bus. A fill deletes the users it did not find in the store and that no
// change named since it started (users the store lost or evicted).
//
// What it holds answers status reads only: the public status (an invisible
// user is offline in it), not the user's own status, last_seen, devices or
// text, which move with heartbeats that publish nothing. A user's own
// status and full views are read from the store (query.Reader).
package replica

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// ErrNotReady is returned by Get while the replica may have missed changes.
var ErrNotReady = errors.New("replica: not ready")

// Source is the shared state store as a fill reads it.
type Source interface {
	// ScanReads calls fn with the state of every user the store holds, as
	// a read of that user would show it before any due change (the public
	// status last published, the settings, the version), at least once
	// (a user that moves while the scan runs may come twice). fn is
	// called from one goroutine; snap is valid during the call only.
	ScanReads(ctx context.Context, fn func(id string, snap *presence.Snapshot)) error
}

// Config configures a Replica. Source is required.
type Config struct {
	Source Source
	// Fresh, if set, reports whether every node that may make changes is
	// heard on the bus now, so that the changes it makes reach this node
	// within moments. While it says false, Get refuses.
	Fresh func() bool
	// Settle is how long a fill asked for waits before it starts (more
	// requests meanwhile are one fill). Default 200 ms.
	Settle time.Duration
	// Retry is the wait before a failed fill is tried again. Default 1 s.
	Retry time.Duration
	// Check is how often Run calls Fresh while nobody reads (Fresh may
	// act on what it sees: the app fills again once a silent node is
	// heard). Default 250 ms.
	Check time.Duration
	// Every is the time between background fills. Default 5 minutes.
	Every  time.Duration
	Logger *slog.Logger
}

const numShards = 64

// Replica is the node's copy of every user's visible state. Safe for
// concurrent use.
type Replica struct {
	cfg    Config
	log    *slog.Logger
	seed   maphash.Seed
	shards [numShards]shard

	// gen counts fills; an entry carries the gen in which a fill found it
	// or a change named it. A fill deletes, at its end, the entries of
	// older gens.
	gen atomic.Uint32
	// asked counts the requests for a fill; filled is the value of asked
	// when the last fill that completed started. Get answers only while
	// they are equal.
	asked, filled atomic.Uint64
	wake          chan struct{} // capacity 1: a fill was asked for
	notBefore     atomic.Int64  // Unix ns before which the fill asked for does not start

	applied, stale, fills, refused, served atomic.Uint64
	lastFill                               atomic.Int64 // duration of the last completed fill, ns
}

type shard struct {
	mu sync.RWMutex // guards m
	m  map[string]entry
}

// entry is one user's visible state.
type entry struct {
	version  uint64
	gen      uint32
	status   presence.Status // public: never Invisible
	settings presence.Settings
}

// New returns an empty Replica; Run fills it and keeps it filled.
func New(cfg Config) (*Replica, error) {
	if cfg.Source == nil {
		return nil, errors.New("replica: Source is required")
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 200 * time.Millisecond
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.Check <= 0 {
		cfg.Check = 250 * time.Millisecond
	}
	if cfg.Every <= 0 {
		cfg.Every = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Replica{cfg: cfg, log: cfg.Logger, seed: maphash.MakeSeed(), wake: make(chan struct{}, 1)}
	for i := range r.shards {
		r.shards[i].m = make(map[string]entry)
	}
	r.asked.Store(1) // the first fill
	r.wake <- struct{}{}
	return r, nil
}

func (r *Replica) shardOf(id string) *shard {
	return &r.shards[maphash.String(r.seed, id)%numShards]
}

// Publish applies a change (a tracker.Publisher, and the bus's mirror of
// the other nodes' changes). It never blocks for long.
func (r *Replica) Publish(ev *presence.Event) {
	e := entry{version: ev.Version, status: ev.Status.Public(), settings: ev.Settings}
	if !r.apply(ev.UserID, e, 0) {
		r.stale.Add(1)
		return
	}
	r.applied.Add(1)
}

// apply stores e for id unless the entry held has a version at or above
// e's; either way the entry is marked with gen, or with the gen of the
// fill now (or last) running if gen is 0: a change applied after a fill
// started is kept by it (its write reached the store before it was
// published, so a fill that missed it started before). It reports whether
// e was stored.
func (r *Replica) apply(id string, e entry, gen uint32) bool {
	s := r.shardOf(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen == 0 {
		gen = r.gen.Load() // under the lock: a fill's sweep of this shard comes after
	}
	e.gen = gen
	if old, ok := s.m[id]; ok && old.version >= e.version {
		if old.gen != e.gen {
			old.gen = e.gen
			s.m[id] = old
		}
		return false
	}
	s.m[id] = e
	return true
}

// Refill tells the replica it may have missed changes: Get refuses until a
// fill that starts after this call is done. It never blocks.
func (r *Replica) Refill() { r.RefillAfter(0) }

// RefillAfter is Refill with a fill that starts no earlier than d from now
// (after the state store came back, the nodes first claim again the devices
// they hold; a fill before would miss them). Get refuses from now on.
func (r *Replica) RefillAfter(d time.Duration) {
	at := time.Now().Add(d).UnixNano()
	for {
		cur := r.notBefore.Load()
		if cur >= at || r.notBefore.CompareAndSwap(cur, at) {
			break
		}
	}
	r.asked.Add(1)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Ready reports whether Get answers now.
func (r *Replica) Ready() bool {
	return r.asked.Load() == r.filled.Load() && (r.cfg.Fresh == nil || r.cfg.Fresh())
}

// Get fills out[i] with what the replica holds of ids[i]: a known user
// with its public status, settings and version, or an unknown one (the
// store does not hold it). It returns ErrNotReady, and fills nothing, when
// the replica may have missed changes. now is not used: the replica holds
// what was published, not what is due.
func (r *Replica) Get(_ context.Context, _ int64, ids []string, out []presence.Snapshot) error {
	if !r.Ready() {
		r.refused.Add(1)
		return ErrNotReady
	}
	for i, id := range ids {
		s := r.shardOf(id)
		s.mu.RLock()
		e, ok := s.m[id]
		s.mu.RUnlock()
		if !ok {
			out[i] = presence.Snapshot{UserID: id}
			continue
		}
		out[i] = presence.Snapshot{UserID: id, Known: true, Status: e.status, Version: e.version, Settings: e.settings}
	}
	r.served.Add(1)
	return nil
}

// Run fills the replica, fills it again each time Refill asks, checks
// Config.Fresh every Config.Check (so that a node going silent is noticed
// even while nobody reads), and fills it in the background every
// Config.Every, until ctx is done. A background fill does not make Get
// refuse: it corrects, within Every, a change that never reached this node
// (a publisher that had to drop it) or a user the store lost without a
// Refill.
func (r *Replica) Run(ctx context.Context) error {
	check := time.NewTicker(r.cfg.Check)
	defer check.Stop()
	every := time.NewTimer(r.cfg.Every)
	defer every.Stop()
	for {
		asked := false
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-check.C:
			if r.cfg.Fresh != nil {
				r.cfg.Fresh()
			}
			continue
		case <-every.C:
		case <-r.wake:
			asked = true
		}
		if err := r.fillUntilDone(ctx, asked); err != nil {
			return err
		}
		every.Reset(r.cfg.Every)
	}
}

// fillUntilDone fills the replica, retrying until a fill succeeds. A fill
// asked for (Refill) waits Settle and then until the latest RefillAfter's
// time, and makes Get answer again only if no Refill came after it took
// its count of them.
func (r *Replica) fillUntilDone(ctx context.Context, asked bool) error {
	pause := time.Duration(0)
	if asked {
		pause = r.cfg.Settle
	}
	for {
		// Wait for the pause and for the latest RefillAfter, then take
		// the count of requests: a RefillAfter that comes after the count
		// (its time set before its count: see RefillAfter) is served by
		// the next fill, never by this one.
		for {
			wait := max(pause, time.Until(time.Unix(0, r.notBefore.Load())))
			if wait <= 0 {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
			pause = 0
		}
		count := r.asked.Load()
		err := r.fill(ctx)
		if err == nil {
			if asked {
				r.filled.Store(count)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if asked {
			r.log.Warn("filling the read replica failed; reads go to the store until it succeeds", "err", err)
		} else {
			r.log.Warn("the read replica's background fill failed; it is tried again", "err", err)
		}
		pause = r.cfg.Retry
	}
}

// fill reads every user the store holds and then deletes the entries that
// neither the store nor a change named since the fill started.
func (r *Replica) fill(ctx context.Context) error {
	gen := r.gen.Add(1)
	start := time.Now()
	n := 0
	err := r.cfg.Source.ScanReads(ctx, func(id string, snap *presence.Snapshot) {
		n++
		r.apply(id, entry{version: snap.Version, status: snap.Status.Public(), settings: snap.Settings}, gen)
	})
	if err != nil {
		return err
	}
	dropped := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for id, e := range s.m {
			if e.gen != gen {
				delete(s.m, id)
				dropped++
			}
		}
		s.mu.Unlock()
	}
	took := time.Since(start)
	r.lastFill.Store(int64(took))
	r.fills.Add(1)
	r.log.Info("read replica filled", "users", n, "dropped", dropped, "took", took.Round(time.Millisecond))
	return nil
}

// Stats are the replica's counters.
type Stats struct {
	Users    int           // users held
	Ready    bool          // Get answers now
	Applied  uint64        // changes applied
	Stale    uint64        // changes not applied: the replica held that version or a newer one
	Fills    uint64        // fills completed
	LastFill time.Duration // how long the last completed fill took
	Served   uint64        // reads answered
	Refused  uint64        // reads refused (not ready): the store answered them
}

// Stats returns the replica's counters. It takes every shard's lock
// briefly to count the users.
func (r *Replica) Stats() Stats {
	st := Stats{Ready: r.Ready(), Applied: r.applied.Load(), Stale: r.stale.Load(), Fills: r.fills.Load(),
		LastFill: time.Duration(r.lastFill.Load()), Served: r.served.Load(), Refused: r.refused.Load()}
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.RLock()
		st.Users += len(s.m)
		s.mu.RUnlock()
	}
	return st
}

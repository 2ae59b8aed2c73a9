// Package fanout is who, on this node, watches whom: the registry of live
// subscriptions of WebSocket connections, and the delivery of every change
// of presence to each connection that watches the user, after the privacy
// filter for that connection's user.
//
// A Hub receives the tracker's events (it is a tracker.Publisher). For each
// event it asks privacy what each kind of watcher may see — the user
// themselves, a contact, anyone else —, encodes each distinct view once
// (internal/wire) and hands the same bytes to every watcher of that view.
// Users watched by more than Config.AsyncThreshold connections are
// delivered by Hub.Run in coalescing batches, so one celebrity never delays
// anybody else (docs/internals.md, "What each watcher holds").
//
// Locks: the registry is sharded by target user; each shard's RWMutex
// guards its targets, their watcher slots, and each watch's class and
// position. Publish and Run hold a shard's read lock while they call
// Sink.Deliver; Subscribe, Unsubscribe, Remove and ContactsChanged take it
// for writing briefly. Per sink, subMu serializes Subscribe calls (held
// across the Relations look-up, so the cap is exact), and mu guards the
// sink's own subscriptions. Lock order: sinkState.subMu → sinkState.mu →
// shard.mu; sinkShard.mu is never held with another lock. No lock is held
// across a call to Relations.
package fanout

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
)

// Sink is one watching connection as the hub sees it (implemented by the
// gateway). It must be comparable (a pointer type): the hub keys its
// registry by it.
type Sink interface {
	// Viewer returns the user the connection belongs to. It must not
	// change over the life of the sink.
	Viewer() string
	// Deliver queues frame — the complete "presence" message of user at
	// version — for sending. It must not block and must not call back into
	// the Hub (the hub holds a shard's read lock during the call; a sink
	// that wants to close itself signals its own goroutine, which later
	// calls Remove). A frame of the same user still queued should be
	// replaced by this one (coalescing). The hub delivers a sink the frames
	// of one user in strictly increasing versions, one call at a time, and
	// none whose view is the same as the last one it delivered of that user.
	// A sink that stays behind closes itself.
	//
	// frame is immutable and shared by every sink of the same view of the
	// event: the sink may keep it as long as it wants but must never
	// modify it. The hub never modifies or reuses a frame once handed out.
	Deliver(user string, version uint64, frame []byte)
}

// Relations tells who lists whom as a contact (the durable store implements
// it).
type Relations interface {
	// ListedBy calls fn for each of owners whose contact list holds viewer.
	ListedBy(ctx context.Context, viewer string, owners []string, fn func(owner string)) error
}

// Defaults of Config.
const (
	DefaultMaxSubscriptions = presence.DefaultMaxSubscriptions
	DefaultAsyncThreshold   = 10000
	DefaultAsyncBatch       = 1024
)

// Config configures a Hub. Zero values mean the documented defaults.
type Config struct {
	// Relations answers whether a viewer is in a target's contact list.
	// Required.
	Relations Relations
	// MaxSubscriptions caps the users one sink watches (default 500).
	MaxSubscriptions int
	// AsyncThreshold: targets watched by more sinks than this are
	// delivered on the batched path by Run (default 10,000).
	AsyncThreshold int
	// AsyncBatch is how many watcher slots Run serves between two yields
	// (default 1,024).
	AsyncBatch int
	// Logger receives the rare warnings of the hub (default: discarded).
	Logger *slog.Logger
	// Interest, when set, is told which users this hub starts and stops
	// watching, so a cross-node bus subscribes only to those (nil: one
	// node, nothing to tell). A bus that is built after the hub (it
	// delivers into it) registers with SetInterest instead.
	Interest Interest
}

// Interest is told when the set of users watched on this node changes.
// Watch is called with users that got their first watcher, after they are
// registered and before Subscribe returns (so before the caller reads the
// snapshot); a Subscribe that adds a later watcher of a user whose first
// watcher's Watch is still running waits for that call before it returns,
// so that its snapshot too is read after the interest exists. Unwatch with users that lost their last one, after they are
// unregistered. Calls for one user may race (a last watcher leaves while a
// new first one comes): the implementation decides by Hub.Watched, which
// is always current.
type Interest interface {
	Watch(users []string)
	Unwatch(users []string)
}

// ErrTooManySubscriptions is returned by Subscribe when the request would
// take the sink past Config.MaxSubscriptions; nothing of the request is
// added.
var ErrTooManySubscriptions = errors.New("fanout: too many subscriptions for one connection")

// ErrRemoved is returned by a Subscribe that raced with Remove of the same
// sink; nothing is added.
var ErrRemoved = errors.New("fanout: the sink was removed")

// errRunning is returned by a second concurrent Run.
var errRunning = errors.New("fanout: Run is already running")

// maxRelationRounds bounds how often Subscribe reads the relations again
// when contact lists keep changing while it reads them; after that, the
// remaining subscriptions stay non-contacts (the side that shows less).
const maxRelationRounds = 4

const numShards = 64 // power of two

// class is how a watcher stands to the target; every watcher of one class
// gets the same frame.
type class uint8

const (
	classOther   class = iota // not in the target's contact list
	classContact              // in the target's contact list
	classSelf                 // the target themselves (another device)
	numClasses
)

var relations = [numClasses]privacy.Relation{
	classOther:   {},
	classContact: {Contact: true},
	classSelf:    {Self: true},
}

// watch is one subscription: sink watches target.
type watch struct {
	sink   Sink
	viewer string
	target string
	// held is the newest version of target whose view the watcher holds
	// (the last it was sent, or a later one with the same view, which was
	// not sent), shifted left by one; its low bit is a lock, set while a
	// delivery to this watcher is decided and made (watch.lock), so a
	// watcher is sent a user's changes in version order whatever order
	// they come in, and fp goes with the version.
	held atomic.Uint64
	// fp is the fingerprint of the view last sent (0: none, which no
	// view has); guarded by held's lock.
	fp uint64
	// Guarded by the target's shard mu.
	t     *target // nil once unregistered
	pos   int32   // index in t.slots
	class class
}

// lock takes w's delivery lock and returns the version w holds (0: none).
// Deliveries to one watcher are rare to meet, and short (Sink.Deliver
// never blocks): a taker that finds the lock held yields and tries again.
func (w *watch) lock() uint64 {
	for {
		s := w.held.Load()
		if s&1 == 0 && w.held.CompareAndSwap(s, s|1) {
			return s >> 1
		}
		runtime.Gosched()
	}
}

// unlock releases w's delivery lock, w holding version v.
func (w *watch) unlock(v uint64) { w.held.Store(v << 1) }

// Why offer sends nothing.
type refusal uint8

const (
	sent  refusal = iota
	stale         // w holds this version or a later one
	same          // w holds the same view: it now holds this version
)

// offer sends w frame, the view of w.target at version v whose
// fingerprint is fp, unless w holds v or a later version (an older change
// that comes late is never sent after a newer one) or holds the same view
// (nothing to show; w then holds v, so an older change coming later is not
// sent either).
func (w *watch) offer(v, fp uint64, frame []byte) refusal {
	held := w.lock()
	switch {
	case v <= held:
		w.unlock(held)
		return stale
	case w.fp == fp:
		w.unlock(v)
		return same
	}
	w.sink.Deliver(w.target, v, frame)
	w.fp = fp
	w.unlock(v)
	return sent
}

// target is the watchers of one user. Removed watchers leave a nil slot,
// so positions are stable while Run walks the slots in batches; the slots
// are compacted when at least half are holes and no batched delivery is
// walking them.
type target struct {
	slots      []*watch
	live       int             // non-nil slots
	n          [numClasses]int // live watchers per class
	delivering bool            // Run is walking slots: do not compact
	// ready is non-nil while the Interest.Watch of the first watcher is in
	// progress; it is closed when that call returned (the bus then has
	// the subscription). Later Subscribes of the same user wait for it
	// before they return, so their snapshot is read after the interest
	// exists too.
	ready chan struct{}
}

type shard struct {
	mu      sync.RWMutex       // guards targets and everything in them
	targets map[string]*target // by target user id
	// gen counts ContactsChanged calls of owners in this shard. It is
	// written under mu (for writing) and may be read without it.
	gen atomic.Uint64
	_   [40]byte // keep shards on their own cache lines
}

// sinkState is the subscriptions of one sink.
type sinkState struct {
	subMu  sync.Mutex // serializes Subscribe; held across Relations
	mu     sync.Mutex // guards the fields below
	subs   map[string]*watch
	closed bool // removed; a Subscribe in flight adds nothing
}

type sinkShard struct {
	mu    sync.Mutex // guards sinks
	sinks map[Sink]*sinkState
}

// Hub is the fan-out of one node. It is safe for concurrent use.
type Hub struct {
	rel       Relations
	interest  Interest
	maxSubs   int
	threshold int
	batch     int
	log       *slog.Logger
	seed      maphash.Seed

	shards     [numShards]shard
	sinkShards [numShards]sinkShard
	q          asyncQueue
	running    atomic.Bool

	// Counters and gauges, see Stats.
	sinks, subs, targets                                  atomic.Int64
	published, delivered, skipped, frames, refused        atomic.Uint64
	asyncQueued, asyncCoalesced, asyncBatches, relRetries atomic.Uint64
	asyncDelivered, failClosed, resynced, revealed        atomic.Uint64
	stale, unchanged                                      atomic.Uint64
}

var _ tracker.Publisher = (*Hub)(nil)

// New returns a hub. Run must be running for users above the async
// threshold to be delivered.
func New(cfg Config) (*Hub, error) {
	if cfg.Relations == nil {
		return nil, errors.New("fanout: Config.Relations is required")
	}
	if cfg.MaxSubscriptions < 0 || cfg.AsyncThreshold < 0 || cfg.AsyncBatch < 0 {
		return nil, fmt.Errorf("fanout: negative limit in %+v", cfg)
	}
	h := &Hub{
		rel:       cfg.Relations,
		interest:  cfg.Interest,
		maxSubs:   cfg.MaxSubscriptions,
		threshold: cfg.AsyncThreshold,
		batch:     cfg.AsyncBatch,
		log:       cfg.Logger,
		seed:      maphash.MakeSeed(),
	}
	if h.maxSubs == 0 {
		h.maxSubs = DefaultMaxSubscriptions
	}
	if h.threshold == 0 {
		h.threshold = DefaultAsyncThreshold
	}
	if h.batch == 0 {
		h.batch = DefaultAsyncBatch
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	for i := range h.shards {
		h.shards[i].targets = make(map[string]*target)
		h.sinkShards[i].sinks = make(map[Sink]*sinkState)
	}
	h.q.pending = make(map[string]presence.Event)
	h.q.wake = make(chan struct{}, 1)
	return h, nil
}

func (h *Hub) shardOf(user string) *shard {
	return &h.shards[maphash.String(h.seed, user)&(numShards-1)]
}

// state returns the state of s, creating it if create is set.
func (h *Hub) state(s Sink, viewer string, create bool) *sinkState {
	ss := &h.sinkShards[maphash.String(h.seed, viewer)&(numShards-1)]
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st := ss.sinks[s]
	if st == nil && create {
		st = &sinkState{subs: make(map[string]*watch)}
		ss.sinks[s] = st
		h.sinks.Add(1)
	}
	return st
}

// Subscribe makes s watch ids and returns the ones it did not watch before,
// in request order without duplicates; the caller then reads and sends
// their snapshot (an event published meanwhile may reach s before or after
// the snapshot: versions order them). If the request would take s past
// MaxSubscriptions, it returns ErrTooManySubscriptions and adds nothing;
// concurrent Subscribes of one sink are serialized, so the cap is exact.
// The ids are not validated here (the gateway does). On a Relations error
// nothing is added. Do not Subscribe a sink after Remove.
func (h *Hub) Subscribe(ctx context.Context, s Sink, ids []string) (added []string, err error) {
	if len(ids) == 0 {
		return nil, nil
	}
	viewer := s.Viewer()
	st := h.state(s, viewer, true)
	st.subMu.Lock()
	defer st.subMu.Unlock()

	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil, ErrRemoved
	}
	fresh := make([]string, 0, len(ids))
	var dup map[string]struct{}
	if len(ids) > 1 {
		dup = make(map[string]struct{}, len(ids))
	}
	for _, id := range ids {
		if _, ok := st.subs[id]; ok {
			continue
		}
		if dup != nil {
			if _, ok := dup[id]; ok {
				continue
			}
			dup[id] = struct{}{}
		}
		fresh = append(fresh, id)
	}
	if len(st.subs)+len(fresh) > h.maxSubs {
		st.mu.Unlock()
		h.refused.Add(1)
		return nil, ErrTooManySubscriptions
	}
	st.mu.Unlock()
	if len(fresh) == 0 {
		return nil, nil
	}

	// The relation of every new subscription, read with no lock held.
	// A ContactsChanged of an owner that runs meanwhile bumps its shard's
	// gen; such subscriptions are registered as non-contacts and read
	// again below.
	watches := make([]*watch, len(fresh))
	gens := make([]uint64, len(fresh))
	for i, id := range fresh {
		watches[i] = &watch{sink: s, viewer: viewer, target: id}
		gens[i] = h.shardOf(id).gen.Load()
		if id == viewer {
			watches[i].class = classSelf
		}
	}
	if err := h.readRelations(ctx, viewer, watches); err != nil {
		return nil, err
	}

	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil, ErrRemoved
	}
	var stale []*watch
	var first []string
	var mine []*target       // targets whose ready this call closes
	var wait []chan struct{} // Watch calls of other Subscribes in progress
	for i, w := range watches {
		sh := h.shardOf(w.target)
		sh.mu.Lock()
		if w.class != classSelf && sh.gen.Load() != gens[i] {
			w.class = classOther // shows less until read again
			stale = append(stale, w)
		}
		if h.insertLocked(sh, w) {
			first = append(first, w.target)
			if h.interest != nil {
				w.t.ready = make(chan struct{})
				mine = append(mine, w.t)
			}
		} else if w.t.ready != nil {
			wait = append(wait, w.t.ready)
		}
		sh.mu.Unlock()
		st.subs[w.target] = w
	}
	st.mu.Unlock()
	h.subs.Add(int64(len(watches)))
	if len(first) > 0 && h.interest != nil {
		h.interest.Watch(first)
		for i, t := range mine {
			sh := h.shardOf(first[i])
			sh.mu.Lock()
			close(t.ready)
			t.ready = nil
			sh.mu.Unlock()
		}
	}
	// Another sink's Subscribe registered the first watcher of some of
	// these users and has not finished telling the Interest: a snapshot
	// read now could miss a change that the bus would not deliver yet.
	// (Every Subscribe closes its own channels before it waits, so two
	// never wait for each other. If ctx ends first the subscriptions stay:
	// the caller's snapshot read fails on ctx anyway.)
wait:
	for _, c := range wait {
		select {
		case <-c:
		case <-ctx.Done():
			break wait
		}
	}

	if len(stale) > 0 {
		h.refreshRelations(ctx, viewer, stale, true)
	}
	return fresh, nil
}

// readRelations sets the class of each non-self watch from Relations.
func (h *Hub) readRelations(ctx context.Context, viewer string, ws []*watch) error {
	owners := make([]string, 0, len(ws))
	index := make(map[string]*watch, len(ws))
	for _, w := range ws {
		if w.class == classSelf {
			continue
		}
		w.class = classOther
		owners = append(owners, w.target)
		index[w.target] = w
	}
	if len(owners) == 0 {
		return nil
	}
	return h.rel.ListedBy(ctx, viewer, owners, func(owner string) {
		if w := index[owner]; w != nil {
			w.class = classContact
		}
	})
}

// refreshRelations reads the relations of registered watches again until
// no contact list changed during the read, and applies them. If that does
// not succeed the watches are made non-contacts (fail closed). retry says
// the watches are reads of Subscribe that raced with a contact change
// (counted in Stats.RelationRetries).
func (h *Hub) refreshRelations(ctx context.Context, viewer string, stale []*watch, retry bool) {
	failClosed := func() {
		h.failClosed.Add(uint64(len(stale)))
		for _, w := range stale {
			sh := h.shardOf(w.target)
			sh.mu.Lock()
			if w.t != nil {
				setClassLocked(w, classOther)
			}
			sh.mu.Unlock()
		}
	}
	for round := 0; len(stale) > 0; round++ {
		if round == maxRelationRounds {
			failClosed()
			h.log.Warn("fanout: contact lists kept changing; subscriptions left as non-contacts",
				"viewer", viewer, "count", len(stale))
			return
		}
		if retry || round > 0 {
			h.relRetries.Add(uint64(len(stale)))
		}
		// Read into copies: the registered watches are guarded by
		// their shard locks.
		probes := make([]*watch, len(stale))
		gens := make([]uint64, len(stale))
		for i, w := range stale {
			probes[i] = &watch{target: w.target}
			gens[i] = h.shardOf(w.target).gen.Load()
		}
		if err := h.readRelations(ctx, viewer, probes); err != nil {
			failClosed()
			h.log.Warn("fanout: reading contact relations again failed; subscriptions left as non-contacts",
				"viewer", viewer, "count", len(stale), "err", err)
			return
		}
		next := stale[:0]
		for i, w := range stale {
			sh := h.shardOf(w.target)
			sh.mu.Lock()
			switch {
			case w.t == nil: // unsubscribed meanwhile
			case sh.gen.Load() != gens[i]:
				next = append(next, w)
			default:
				setClassLocked(w, probes[i].class)
			}
			sh.mu.Unlock()
		}
		stale = next
	}
}

func setClassLocked(w *watch, c class) {
	if w.class == c {
		return
	}
	w.t.n[w.class]--
	w.class = c
	w.t.n[c]++
}

// insertLocked registers w; it reports whether w is its target's first
// watcher on this node.
func (h *Hub) insertLocked(sh *shard, w *watch) (first bool) {
	t := sh.targets[w.target]
	if t == nil {
		first = true
		t = &target{}
		sh.targets[w.target] = t
		h.targets.Add(1)
	}
	w.t = t
	w.pos = int32(len(t.slots))
	t.slots = append(t.slots, w)
	t.live++
	t.n[w.class]++
	return first
}

// removeLocked unregisters w; it reports whether w was its target's last
// watcher on this node.
func (h *Hub) removeLocked(sh *shard, w *watch) (last bool) {
	t := w.t
	if t == nil {
		return false
	}
	w.t = nil
	t.slots[w.pos] = nil
	t.live--
	t.n[w.class]--
	if t.live == 0 {
		// A batched delivery walking t notices that t left the map.
		if sh.targets[w.target] == t {
			delete(sh.targets, w.target)
			h.targets.Add(-1)
		}
		t.slots = nil
		return true
	}
	// Trailing holes go at once (no live watcher moves).
	for n := len(t.slots); n > 0 && t.slots[n-1] == nil; n-- {
		t.slots = t.slots[:n-1]
	}
	t.maybeCompact()
	return false
}

// maybeCompact closes the holes of t when they are at least half of its
// slots, unless a batched delivery is walking them.
func (t *target) maybeCompact() {
	holes := len(t.slots) - t.live
	if t.delivering || holes < 16 || holes < t.live {
		return
	}
	if cap(t.slots) > 4*t.live {
		slots := make([]*watch, 0, 2*t.live)
		for _, w := range t.slots {
			if w != nil {
				w.pos = int32(len(slots))
				slots = append(slots, w)
			}
		}
		t.slots = slots
		return
	}
	j := 0
	for _, w := range t.slots {
		if w != nil {
			w.pos = int32(j)
			t.slots[j] = w
			j++
		}
	}
	clear(t.slots[j:])
	t.slots = t.slots[:j]
}

// Unsubscribe stops s watching ids and returns how many it watched; ids it
// does not watch are ignored. When it returns, s gets no more frames of
// those users.
func (h *Hub) Unsubscribe(s Sink, ids []string) (removed int) {
	st := h.state(s, s.Viewer(), false)
	if st == nil {
		return 0
	}
	st.mu.Lock()
	n := 0
	var last []string
	for _, id := range ids {
		w := st.subs[id]
		if w == nil {
			continue
		}
		delete(st.subs, id)
		sh := h.shardOf(id)
		sh.mu.Lock()
		if h.removeLocked(sh, w) {
			last = append(last, id)
		}
		sh.mu.Unlock()
		n++
	}
	st.mu.Unlock()
	h.subs.Add(-int64(n))
	h.unwatch(last)
	return n
}

// unwatch tells the Interest about users that lost their last watcher.
func (h *Hub) unwatch(users []string) {
	if len(users) > 0 && h.interest != nil {
		h.interest.Unwatch(users)
	}
}

// Watched reports whether any sink of this hub watches user now.
func (h *Hub) Watched(user string) bool {
	sh := h.shardOf(user)
	sh.mu.RLock()
	_, ok := sh.targets[user]
	sh.mu.RUnlock()
	return ok
}

// Remove drops all of s's subscriptions and forgets s (its connection
// closed). When it returns, the hub never calls s.Deliver again.
func (h *Hub) Remove(s Sink) {
	ss := &h.sinkShards[maphash.String(h.seed, s.Viewer())&(numShards-1)]
	ss.mu.Lock()
	st := ss.sinks[s]
	delete(ss.sinks, s)
	ss.mu.Unlock()
	if st == nil {
		return
	}
	h.sinks.Add(-1)
	st.mu.Lock()
	st.closed = true
	var last []string
	for _, w := range st.subs {
		sh := h.shardOf(w.target)
		sh.mu.Lock()
		if h.removeLocked(sh, w) {
			last = append(last, w.target)
		}
		sh.mu.Unlock()
	}
	n := len(st.subs)
	st.subs = nil
	st.mu.Unlock()
	h.subs.Add(-int64(n))
	h.unwatch(last)
}

// StateFunc reads a user's state now (the tracker's Get of one user).
type StateFunc func(ctx context.Context, user string) (presence.Snapshot, error)

// ContactsChanged tells the hub that owner's contact list is now contacts:
// each watcher of owner becomes a contact or stops being one. Call it after
// the change is durable (a Subscribe running meanwhile reads the relations
// again from Relations). It costs O(watchers of owner + contacts).
//
// With state not nil, each watcher whose view of owner changed with its
// relation is sent its new view at once, read through state after the
// change: the status where sight was gained, the status hidden (with the
// version read) where it was lost; a watcher whose view is the same gets
// nothing (privacy.Reveal). The caller stamps owner a new version before
// (Tracker.ContactsChanged), so the view sent is above everything the
// watcher was sent before.
func (h *Hub) ContactsChanged(ctx context.Context, owner string, contacts []string, state StateFunc) {
	sh := h.shardOf(owner)
	sh.mu.RLock()
	t := sh.targets[owner]
	watched := t != nil && t.live > t.n[classSelf]
	sh.mu.RUnlock()
	var set map[string]struct{}
	if watched {
		set = make(map[string]struct{}, len(contacts))
		for _, c := range contacts {
			set[c] = struct{}{}
		}
	}
	type flip struct {
		w    *watch
		from class
	}
	var flips []flip
	sh.mu.Lock()
	sh.gen.Add(1)
	t = sh.targets[owner]
	if t == nil || t.live == t.n[classSelf] {
		sh.mu.Unlock()
		return
	}
	if set == nil { // the first watcher came while we looked
		set = make(map[string]struct{}, len(contacts))
		for _, c := range contacts {
			set[c] = struct{}{}
		}
	}
	for _, w := range t.slots {
		if w == nil || w.class == classSelf {
			continue
		}
		c := classOther
		if _, ok := set[w.viewer]; ok {
			c = classContact
		}
		if c != w.class && state != nil {
			flips = append(flips, flip{w, w.class})
		}
		setClassLocked(w, c)
	}
	sh.mu.Unlock()
	if len(flips) == 0 {
		return
	}
	snap, err := state(ctx, owner)
	if err != nil {
		h.log.Warn("fanout: reading a user whose contact list changed failed; watchers who gained or lost sight keep their view until the next change",
			"user_id", owner, "watchers", len(flips), "err", err)
		return
	}
	snap.UserID = owner
	// The watchers flipped are not the user: they are sent the public
	// version (an invisible user's frozen face), never the user's own.
	_, version := snap.Public()
	// One frame per direction (other → contact, contact → other).
	var fr frames
	var send [numClasses]bool
	for c := classOther; c <= classContact; c++ {
		v, ok := privacy.Reveal(privacy.Filter(relations[1-c], &snap), privacy.Filter(relations[c], &snap), version)
		if ok {
			fr.b[c], fr.fp[c], send[c] = wire.AppendPresence(nil, &v), h.fingerprint(&v), true
		}
	}
	var n counts
	sh.mu.RLock()
	for _, f := range flips {
		// Still watching, and not flipped back by a later change.
		if f.w.t != nil && f.w.class != f.from && send[f.w.class] {
			n.add(f.w.offer(version, fr.fp[f.w.class], fr.b[f.w.class]))
		}
	}
	sh.mu.RUnlock()
	h.count(&n)
	h.revealed.Add(uint64(n.sent))
}

// counts are the outcomes of offers, added to the hub's counters at once.
type counts struct{ sent, stale, same int }

func (n *counts) add(r refusal) {
	switch r {
	case sent:
		n.sent++
	case stale:
		n.stale++
	default:
		n.same++
	}
}

func (h *Hub) count(n *counts) {
	h.delivered.Add(uint64(n.sent))
	if n.stale > 0 {
		h.stale.Add(uint64(n.stale))
	}
	if n.same > 0 {
		h.unchanged.Add(uint64(n.same))
	}
}

// fingerprint is a hash of what a watcher is shown of v in a "presence"
// message, its version aside: whether the status is visible, the status,
// the status text, whether last_seen is visible and — only while the
// status is offline — last_seen. While a user is present its last_seen
// moves with every heartbeat in reads, and is the moment of the change in
// events: a view that differs in it alone shows nothing new, and a
// resync that read it would otherwise send every present user again.
// It is never 0.
func (h *Hub) fingerprint(v *privacy.View) uint64 {
	var m maphash.Hash
	m.SetSeed(h.seed)
	if !v.StatusVisible {
		m.WriteByte(0)
		return m.Sum64() | 1
	}
	k := byte(1 + v.Status<<2)
	var ls int64
	if v.LastSeenVisible {
		k |= 2
		if v.Status == presence.Offline {
			ls = v.LastSeen
		}
	}
	var b [9]byte
	b[0] = k
	binary.LittleEndian.PutUint64(b[1:], uint64(ls))
	m.Write(b[:])
	m.WriteString(v.Text)
	return m.Sum64() | 1
}

// frames are the encoded messages of one event, per class (b; nil: the
// class may not see the event), and the fingerprints of their views (fp).
// Frames of classes with the same view share bytes.
type frames struct {
	b  [numClasses][]byte
	fp [numClasses]uint64
}

// encode fills fr with the frames of ev for the classes in need, all in one
// allocation. It returns how many distinct frames it encoded.
func (h *Hub) encode(ev *presence.Event, need *[numClasses]bool, fr *frames) int {
	var (
		views   [numClasses]privacy.View
		visible [numClasses]bool
		same    [numClasses]int8 // class whose frame this class shares, or -1
		bounds  [numClasses][2]int
		scratch [1024]byte
	)
	buf := scratch[:0]
	distinct := 0
	for c := range numClasses {
		same[c] = -1
		if !need[c] {
			continue
		}
		views[c], visible[c] = privacy.Delivery(relations[c], ev)
		if !visible[c] {
			continue
		}
		for p := range c {
			if visible[p] && same[p] < 0 && views[p] == views[c] {
				same[c] = int8(p)
				break
			}
		}
		if same[c] < 0 {
			start := len(buf)
			buf = wire.AppendPresence(buf, &views[c])
			bounds[c] = [2]int{start, len(buf)}
			fr.fp[c] = h.fingerprint(&views[c])
			distinct++
		}
	}
	fps := fr.fp
	*fr = frames{}
	if distinct == 0 {
		return 0
	}
	out := make([]byte, len(buf))
	copy(out, buf)
	for c := range numClasses {
		if !visible[c] {
			continue
		}
		src := c
		if same[c] >= 0 {
			src = class(same[c])
		}
		b := bounds[src]
		fr.b[c] = out[b[0]:b[1]:b[1]]
		fr.fp[c] = fps[src]
	}
	return distinct
}

// Publish delivers ev to every sink watching its user, after the privacy
// filter for each. It implements tracker.Publisher: it keeps nothing of ev
// after it returns and never blocks on a sink. For a user with more than
// AsyncThreshold watchers it only records ev for Run, unless ev is a
// change only the user sees (Event.SelfOnly).
func (h *Hub) Publish(ev *presence.Event) {
	h.published.Add(1)
	sh := h.shardOf(ev.UserID)
	sh.mu.RLock()
	t := sh.targets[ev.UserID]
	if t == nil {
		sh.mu.RUnlock()
		return
	}
	// A change only the user sees goes to their own sockets at once: the
	// batched path coalesces changes everyone sees, which it must not be
	// folded into (it carries a version nobody else may be sent).
	if t.live > h.threshold && !ev.SelfOnly {
		sh.mu.RUnlock()
		h.enqueue(ev)
		return
	}
	var need [numClasses]bool
	for c := range numClasses {
		need[c] = t.n[c] > 0
	}
	var fr frames
	nf := h.encode(ev, &need, &fr)
	var n counts
	if nf > 0 {
		for _, w := range t.slots {
			if w == nil {
				continue
			}
			if f := fr.b[w.class]; f != nil {
				n.add(w.offer(ev.Version, fr.fp[w.class], f))
			}
		}
	}
	skipped := t.live - n.sent - n.stale - n.same
	sh.mu.RUnlock()
	h.frames.Add(uint64(nf))
	h.count(&n)
	h.skipped.Add(uint64(skipped))
}

// Stats are the counters of a hub.
type Stats struct {
	Sinks         int // sinks with state in the hub
	Subscriptions int // (sink, user) pairs
	Targets       int // users watched by at least one sink

	Published      uint64 // events given to Publish
	Delivered      uint64 // frames handed to sinks (both paths)
	SkippedPrivacy uint64 // (event, watcher) pairs withheld: status hidden from the watcher
	Frames         uint64 // distinct frames encoded
	Refused        uint64 // Subscribe calls refused by the cap
	// Stale counts (change, watcher) pairs not sent because the watcher
	// had been sent that version of the user or a later one (a change that
	// came late, a resync that read what a change had brought already).
	Stale uint64
	// Unchanged counts (change, watcher) pairs not sent because the
	// watcher's view was the same as the one it was sent last (a resync
	// that found nothing new; the watcher now holds the newer version).
	Unchanged uint64

	AsyncQueued    uint64 // events of users above the threshold recorded for Run
	AsyncCoalesced uint64 // of those, replaced by a newer one (or dropped as older) before delivery
	AsyncBatches   uint64 // batches Run delivered
	AsyncDelivered uint64 // frames Run handed to sinks (included in Delivered)
	AsyncPending   int    // users with an event waiting for Run

	RelationRetries uint64 // relations read again because a contact list changed during Subscribe
	FailClosed      uint64 // subscriptions left as non-contacts after failed re-reads
	Resynced        uint64 // sinks sent the current state by Resync
	// Revealed counts watchers sent their new view because a contact list
	// changed (ContactsChanged; included in Delivered).
	Revealed uint64
}

// Stats returns the current counters.
func (h *Hub) Stats() Stats {
	h.q.mu.Lock()
	pending := len(h.q.pending)
	h.q.mu.Unlock()
	return Stats{
		Sinks:           int(h.sinks.Load()),
		Subscriptions:   int(h.subs.Load()),
		Targets:         int(h.targets.Load()),
		Published:       h.published.Load(),
		Delivered:       h.delivered.Load(),
		SkippedPrivacy:  h.skipped.Load(),
		Frames:          h.frames.Load(),
		Refused:         h.refused.Load(),
		Stale:           h.stale.Load(),
		Unchanged:       h.unchanged.Load(),
		AsyncQueued:     h.asyncQueued.Load(),
		AsyncCoalesced:  h.asyncCoalesced.Load(),
		AsyncBatches:    h.asyncBatches.Load(),
		AsyncDelivered:  h.asyncDelivered.Load(),
		AsyncPending:    pending,
		RelationRetries: h.relRetries.Load(),
		FailClosed:      h.failClosed.Load(),
		Resynced:        h.resynced.Load(),
		Revealed:        h.revealed.Load(),
	}
}

// The batched path.

// asyncQueue holds the newest event of each user above the threshold that
// Run has not taken yet. Its size is bounded by the number of such users,
// at most (subscriptions on this node) / AsyncThreshold.
type asyncQueue struct {
	mu      sync.Mutex                // guards pending and order
	pending map[string]presence.Event // newest event per user
	order   []string                  // users in the order they were queued; may hold users taken since
	wake    chan struct{}             // signalled when pending grows
}

func (h *Hub) enqueue(ev *presence.Event) {
	h.asyncQueued.Add(1)
	q := &h.q
	q.mu.Lock()
	old, ok := q.pending[ev.UserID]
	switch {
	case !ok:
		q.pending[ev.UserID] = *ev
		q.order = append(q.order, ev.UserID)
	case ev.Version > old.Version:
		// Nobody was sent old: the merge keeps the settings before it,
		// so a watcher who lost sight in it still hears so.
		old.Merge(ev)
		q.pending[ev.UserID] = old
		h.asyncCoalesced.Add(1)
	default:
		if ev.SettingsChanged { // an older change of settings, late
			m := *ev
			m.Merge(&old)
			q.pending[ev.UserID] = m
		}
		h.asyncCoalesced.Add(1)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// job is the batched delivery of one user's newest event. It covers the
// slots [start, len) and then [0, start); a newer event taken mid-way
// restarts the cycle at the current position, so no watcher waits for a
// full pass.
type job struct {
	user    string
	sh      *shard
	t       *target
	ev      presence.Event
	fr      frames
	start   int
	pos     int
	wrapped bool
}

var allClasses = [numClasses]bool{true, true, true}

// SetInterest registers the Interest of a bus built after the hub (the
// bus delivers into the hub, so it cannot exist when the hub is made).
// It must be called before the hub takes its first subscription, and at
// most once; Config.Interest must then be nil.
func (h *Hub) SetInterest(i Interest) {
	if h.interest != nil {
		panic("fanout: SetInterest on a hub that has an Interest")
	}
	h.interest = i
}

// Run delivers the events of users above AsyncThreshold until ctx is done,
// in batches of AsyncBatch watcher slots, taking turns between users and
// yielding between rounds. It returns nil when ctx is done, and an error
// if another Run is running.
func (h *Hub) Run(ctx context.Context) error {
	if !h.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer h.running.Store(false)
	jobs := map[string]*job{}
	var order []*job
	defer func() {
		for _, j := range order {
			h.endJob(j)
		}
	}()
	for {
		if ctx.Err() != nil {
			return nil
		}
		order = h.takePending(jobs, order)
		if len(order) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-h.q.wake:
			}
			continue
		}
		next := order[:0]
		for _, j := range order {
			if h.step(j) {
				h.endJob(j)
				delete(jobs, j.user)
			} else {
				next = append(next, j)
			}
		}
		clear(order[len(next):])
		order = next
		runtime.Gosched()
	}
}

// takePending moves the queued events into jobs: a new job per user, or
// the newer event for a user whose job is running.
func (h *Hub) takePending(jobs map[string]*job, order []*job) []*job {
	q := &h.q
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, user := range q.order {
		ev, ok := q.pending[user]
		if !ok {
			continue
		}
		delete(q.pending, user)
		if j := jobs[user]; j != nil {
			if ev.Version <= j.ev.Version && !ev.SettingsChanged {
				h.asyncCoalesced.Add(1)
				continue
			}
			restart(&j.ev, &ev)
			h.frames.Add(uint64(h.encode(&j.ev, &allClasses, &j.fr)))
			j.start, j.wrapped = j.pos, false
			continue
		}
		j := &job{user: user, sh: h.shardOf(user), ev: ev}
		j.sh.mu.Lock()
		j.t = j.sh.targets[user]
		if j.t != nil {
			j.t.delivering = true
		}
		j.sh.mu.Unlock()
		if j.t == nil {
			continue // nobody watches any more
		}
		h.frames.Add(uint64(h.encode(&j.ev, &allClasses, &j.fr)))
		jobs[user] = j
		order = append(order, j)
	}
	clear(q.order)
	q.order = q.order[:0]
	return order
}

// restart makes cur, an event part of the watchers were sent, into one
// that tells every watcher what next tells (next may be older than cur: a
// late change of settings). Some watchers saw cur's settings, some those
// before: a watcher who could see under either and may not now is sent
// the status hidden; everyone who may see now is sent the newer state.
func restart(cur, next *presence.Event) {
	wide := privacy.Wider(cur.Before(), cur.Settings)
	changed := cur.SettingsChanged || next.SettingsChanged
	if next.Version > cur.Version {
		*cur = *next
	} else {
		wide = privacy.Wider(wide, next.Before()) // cur is the newer state
	}
	if changed {
		cur.SettingsChanged, cur.PrevSettings, cur.SettingsOnly = true, wide, false
	}
}

// step delivers one batch of j and reports whether j is done.
func (h *Hub) step(j *job) bool {
	sh := j.sh
	sh.mu.RLock()
	if sh.targets[j.user] != j.t {
		sh.mu.RUnlock()
		return true // every watcher left; new ones read a snapshot
	}
	limit := len(j.t.slots)
	if j.wrapped {
		limit = min(limit, j.start)
	}
	end := min(j.pos+h.batch, limit)
	var n counts
	skipped := 0
	for _, w := range j.t.slots[min(j.pos, end):end] {
		if w == nil {
			continue
		}
		if f := j.fr.b[w.class]; f != nil {
			n.add(w.offer(j.ev.Version, j.fr.fp[w.class], f))
		} else {
			skipped++
		}
	}
	sh.mu.RUnlock()
	h.asyncBatches.Add(1)
	h.asyncDelivered.Add(uint64(n.sent))
	h.count(&n)
	h.skipped.Add(uint64(skipped))
	j.pos = end
	if end < limit {
		return false
	}
	if j.wrapped || j.start == 0 {
		return true
	}
	j.wrapped, j.pos = true, 0
	return false
}

func (h *Hub) endJob(j *job) {
	j.sh.mu.Lock()
	j.t.delivering = false
	if j.sh.targets[j.user] == j.t {
		j.t.maybeCompact()
	}
	j.sh.mu.Unlock()
}

// SnapshotSent records that s is being sent views, the state of users it
// watches (the snapshot that answers a subscribe, read after Subscribe
// returned): a resync then sends none of them again unless it finds
// something new, and a change older than the view that comes later is
// not sent. Call it just before the snapshot is queued. Views of users s
// does not watch are ignored; a view older than a change s was sent
// meanwhile leaves that change recorded (the client orders the two by
// version). A view without a version (a user never seen, a hidden
// status) is recorded as the view at version 0.
func (h *Hub) SnapshotSent(s Sink, views []privacy.View) {
	st := h.state(s, s.Viewer(), false)
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for i := range views {
		v := &views[i]
		w := st.subs[v.UserID]
		if w == nil {
			continue
		}
		fp := h.fingerprint(v)
		held := w.lock()
		if v.Version < held || (v.Version == held && held != 0) {
			w.unlock(held)
			continue
		}
		w.fp = fp
		w.unlock(v.Version)
	}
}

// ReadFunc reads what viewer may see of ids now (query.Reader.Read).
type ReadFunc func(ctx context.Context, viewer string, ids []string, out []privacy.View) error

// Resync reads, through read as each sink's viewer, the current state of
// every user the sink watches, and sends the sink, as a "presence"
// message, each one whose status it may see and whose view differs from
// the last it was sent — at the version read, which must then be above
// the last version it was sent of that user (otherwise nothing is sent:
// a change newer than the read went out meanwhile). Call it when watchers
// may have missed changes: the node was cut off from the bus, or the state
// store came back from an outage. A resync that finds nothing new sends
// nothing; the watcher then holds the version read, so a change older than
// it that comes late is not sent either. Before that it reads again from
// Relations whether each sink is in the contact list of the users it
// watches: a contact-list change announced while the node was cut off was
// missed too, and a watcher removed from a list must not go on receiving
// what only contacts may see. It reads sink by sink and returns early
// when ctx is done, with ctx's error.
func (h *Hub) Resync(ctx context.Context, read ReadFunc) error {
	type entry struct {
		sink Sink
		st   *sinkState
	}
	var all []entry
	for i := range h.sinkShards {
		ss := &h.sinkShards[i]
		ss.mu.Lock()
		for s, st := range ss.sinks {
			all = append(all, entry{s, st})
		}
		ss.mu.Unlock()
	}
	var ids []string
	var ws []*watch
	var views []privacy.View
	var buf []byte
	for _, e := range all {
		if err := ctx.Err(); err != nil {
			return err
		}
		e.st.mu.Lock()
		ids = ids[:0]
		ws = ws[:0]
		for id, w := range e.st.subs {
			ids = append(ids, id)
			ws = append(ws, w)
		}
		e.st.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		// w.class is guarded by the shard locks: keep the non-self
		// watches by their target alone (self never changes).
		others := ws[:0]
		for _, w := range ws {
			if w.target != w.viewer {
				others = append(others, w)
			}
		}
		h.refreshRelations(ctx, e.sink.Viewer(), others, false)
		clear(ws)
		views = slices.Grow(views[:0], len(ids))[:len(ids)]
		if err := read(ctx, e.sink.Viewer(), ids, views); err != nil {
			h.log.Warn("resync: reading the state of watched users failed", "viewer", e.sink.Viewer(), "err", err)
			continue
		}
		var n counts
		e.st.mu.Lock()
		for i := range views {
			v := &views[i]
			w := e.st.subs[ids[i]]
			if !v.StatusVisible || e.st.closed || w == nil {
				continue
			}
			fp := h.fingerprint(v)
			held := w.lock()
			switch {
			case v.Version <= held:
				w.unlock(held)
				n.stale++
			case w.fp == fp:
				w.unlock(v.Version)
				n.same++
			default:
				buf = wire.AppendPresence(buf[:0], v)
				e.sink.Deliver(ids[i], v.Version, bytes.Clone(buf))
				w.fp = fp
				w.unlock(v.Version)
				n.sent++
			}
		}
		e.st.mu.Unlock()
		h.count(&n)
		h.resynced.Add(1)
	}
	return nil
}

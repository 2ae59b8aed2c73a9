// Package replica keeps, in each node of a scale-out deployment, what
// users show to others — the public status, the privacy settings and the
// version of the last change — so that a status read of 1,000 ids is
// answered in the node's memory instead of by a round trip to Redis.
//
// It holds every user the store holds, filled by scans
// (Source.ScanReads), or, bounded (Config.Max), the users its readers
// asked for, each read from the store on a miss (Source.ReadPublished)
// into a slot made before the read, and evicted by a clock when the
// replica is full. Either is kept current by the changes the nodes publish
// (Publish); a change applies only above the version held, so scans,
// reads and changes that arrive out of order or twice merge into the
// newest state of each user.
//
// Get refuses (ErrNotReady), and the caller reads the store, whenever
// the replica may have missed changes: until a fill (a bounded replica:
// emptying it) that started after it was told so (Refill) is done, and
// while Config.Fresh says a node that may write changes is not heard.
// GetFull answers full views (text, devices, last_seen) from what a read
// of the store brought, until a change or a device note of the user
// (NoteDevices). What everyone sees only: a user's own view is read from
// the store (query.Reader). docs/internals.md has the whole design.
package replica

import (
	"context"
	"errors"
	"fmt"
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
	// ReadPublished fills out[i] with ids[i] as ScanReads would yield it;
	// a user the store does not hold has Known false and the version a
	// read of it is ordered after. It fails if any user could not be read.
	ReadPublished(ctx context.Context, ids []string, out []presence.Snapshot) error
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
	// Every is the time between background fills; with Max, the age at
	// which a user held is read from the store again in the background
	// (Run). Default 5 minutes.
	Every time.Duration
	// ReadTimeout bounds a read through the store (with Max): a store
	// that hangs fails the Get, whose caller reads the store its own way
	// (query.Reader: the tracker, which answers from what the nodes know
	// while the store is down). Default 1 s.
	ReadTimeout time.Duration
	// Max, if above 0, bounds the replica to Max users, read through
	// from the store on a miss (see the package documentation); 0 holds
	// every user the store holds.
	Max    int
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

	// seq numbers the slots as they are made: a read through the store
	// applies what it read only to the slot it made or found before it
	// read (one a Refill or an eviction has not replaced since).
	seq       atomic.Uint64
	start     time.Time // the zero of slots' ages
	maxAge    uint32    // with Max: the age in seconds at which refresh reads a slot again
	nextShard int       // with Max: the shard Run refreshes next (Run's own)
	// held counts, with Max, the slots in use in all shards: a shard
	// makes a new one only while the sum is below Max, else it evicts.
	held atomic.Int64

	// notes counts the device notes (NoteDevices): a read that began
	// before a note of its user keeps no full view. epoch counts the
	// times the notes were heard again (NotesUp): a full view kept in an
	// older epoch is not answered. notesUp: GetFull answers.
	notes   atomic.Uint64
	epoch   atomic.Uint32
	notesUp atomic.Bool

	applied, stale, fills, refused, served atomic.Uint64
	notHeld, misses, evicted, refreshed    atomic.Uint64
	fullServed, fullRefused, fullMisses    atomic.Uint64
	lastFill                               atomic.Int64 // duration of the last completed fill, ns
}

// A shard and its slots hold no pointers, so that the collector never
// scans the replica (a million users held are 2 M pointers otherwise,
// and the marking they cost is a read's p99): ids are kept in their slots,
// and the map is keyed by their hash.
type shard struct {
	mu sync.RWMutex     // guards the fields below, not slots' ref
	m  map[uint64]int32 // an id's hash → its slot (hashes collide: see find)
	// texts holds the public status text of the users whose full view
	// is kept and has one, by the same key as m: the slots stay free of
	// pointers, and most users have no text.
	texts map[uint64]string
	slots []slot
	free  []int32 // slots of deleted users, made again first
	hand  int     // with Max: the clock hand of eviction
}

// slot holds one user.
type slot struct {
	id    [presence.MaxIDLen]byte // id[:idLen]; idLen 0: a free slot
	idLen uint8
	has   bool   // e holds a state (a slot made for a read in flight does not yet)
	ref   uint32 // atomic: read since the hand last passed (with Max)
	e     entry
	since uint64 // Replica.seq when the slot was made for id
	born  uint32 // seconds since Replica.start when e was read or changed
	noted uint64 // Replica.notes at the last device note of the user
}

// entry is one user's visible state.
type entry struct {
	version  uint64
	gen      uint32
	known    bool            // the store holds the user (with Max a user it does not hold is kept too)
	status   presence.Status // public: never Invisible
	settings presence.Settings
	// The rest of the full view everyone may see (GetFull), kept from a
	// read of the store (fullOK) in epoch. Only a read keeps it, with its
	// version: a change applied later replaces the entry (the changes
	// carry no device count), and so does a device note. The text is in
	// the shard's texts.
	fullOK      bool
	hasText     bool // the shard's texts holds the user's public text
	devices     uint16
	epoch       uint32
	pubLag      uint32 // version - the public version (an invisible user's frozen face)
	pubLastSeen int64
}

// entryOf is the entry of a snapshot read from the store, with its full
// view as of epoch (the public text is the caller's: snap.Public).
func entryOf(snap *presence.Snapshot, epoch uint32) entry {
	_, pv := snap.Public()
	lag := snap.Version - min(pv, snap.Version)
	return entry{version: snap.Version, known: snap.Known, status: snap.Status.Public(), settings: snap.Settings,
		epoch: epoch, fullOK: lag <= 1<<32-1, devices: uint16(min(snap.Devices, 1<<16-1)),
		pubLag: uint32(min(lag, 1<<32-1)), pubLastSeen: snap.PubLastSeen}
}

// statusOnly is e without its full view.
func (e entry) statusOnly() entry {
	e.epoch, e.fullOK, e.hasText, e.devices, e.pubLag, e.pubLastSeen = 0, false, false, 0, 0, 0
	return e
}

// hasFull reports whether e holds its full view in epoch.
func (e *entry) hasFull(epoch uint32) bool { return e.fullOK && e.epoch == epoch }

// fullSnapshot is what everyone may be shown of the user e holds, with
// its public text, read at now (Unix ms): the public status, text and
// version, the devices, and the public last_seen — now while the user is
// present, as the store reads a user present through a device a node
// owns (the replica hears of no heartbeat).
func (e *entry) fullSnapshot(id, text string, now int64) presence.Snapshot {
	s := presence.Snapshot{UserID: id, Known: e.known, Status: e.status, Text: text, Version: e.version,
		Settings: e.settings, PubText: text, PubVersion: e.version - uint64(e.pubLag), Devices: int(e.devices),
		LastSeen: e.pubLastSeen, PubLastSeen: e.pubLastSeen}
	if e.status != presence.Offline && now > s.PubLastSeen {
		s.LastSeen, s.PubLastSeen = now, now
	}
	return s
}

// drop forgets the user of hash h (its slot is the caller's to free).
func (s *shard) drop(h uint64) {
	delete(s.m, h)
	delete(s.texts, h)
}

// is reports whether sl holds id.
func (sl *slot) is(id string) bool { return string(sl.id[:sl.idLen]) == id }

// name returns the id sl holds.
func (sl *slot) name() string { return string(sl.id[:sl.idLen]) }

func (e *entry) snapshot(id string) presence.Snapshot {
	return presence.Snapshot{UserID: id, Known: e.known, Status: e.status, Version: e.version, Settings: e.settings}
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
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Max < 0 {
		return nil, errors.New("replica: Max must not be negative")
	}
	r := &Replica{cfg: cfg, log: cfg.Logger, seed: maphash.MakeSeed(), wake: make(chan struct{}, 1), start: time.Now()}
	if cfg.Max > 0 {
		r.maxAge = uint32(max(1, cfg.Every/time.Second))
	}
	for i := range r.shards {
		r.shards[i].m = make(map[uint64]int32)
		r.shards[i].texts = make(map[uint64]string)
	}
	r.asked.Store(1) // the first fill
	r.wake <- struct{}{}
	return r, nil
}

// locate returns id's shard and hash, the key of its slot there.
func (r *Replica) locate(id string) (*shard, uint64) {
	h := maphash.String(r.seed, id)
	return &r.shards[h%numShards], h
}

// hashOf returns the hash of the id sl holds.
func (r *Replica) hashOf(sl *slot) uint64 { return maphash.Bytes(r.seed, sl.id[:sl.idLen]) }

// find returns id's slot in s (h: id's hash), whose lock the caller
// holds; taken if another id of the same hash holds the key, which id
// then cannot have (it is read from the store each time instead).
func (s *shard) find(h uint64, id string) (i int32, ok, taken bool) {
	i, ok = s.m[h]
	if ok && !s.slots[i].is(id) {
		return 0, false, true
	}
	return i, ok, false
}

// age is now in seconds since the replica was made: a slot's born.
func (r *Replica) age() uint32 { return uint32(time.Since(r.start) / time.Second) }

// bounded reports whether Config.Max bounds the replica.
func (r *Replica) bounded() bool { return r.cfg.Max > 0 }

// What apply did with a change.
const (
	stored = iota // it holds the change now
	older         // it held that version or a newer one
	noRoom        // bounded and full: the user is not held
)

// Publish applies a change (a tracker.Publisher, and the bus's mirror of
// the other nodes' changes). It never blocks for long. A bounded replica
// keeps the change of a user it does not hold only while it has room: it
// makes none for changes.
func (r *Replica) Publish(ev *presence.Event) {
	e := entry{version: ev.Version, known: true, status: ev.Status.Public(), settings: ev.Settings}
	switch r.apply(ev.UserID, e, 0) {
	case stored:
		r.applied.Add(1)
	case older:
		r.stale.Add(1)
	default:
		r.notHeld.Add(1)
	}
}

// apply stores e for id unless the entry held has a version at or above
// e's; either way the entry is marked with gen, or with the gen of the
// fill now (or last) running if gen is 0: a change applied after a fill
// started is kept by it (its write reached the store before it was
// published, so a fill that missed it started before).
func (r *Replica) apply(id string, e entry, gen uint32) int {
	s, h := r.locate(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen == 0 {
		gen = r.gen.Load() // under the lock: a fill's sweep of this shard comes after
	}
	e.gen = gen
	i, ok, taken := s.find(h, id)
	if taken {
		return noRoom
	}
	if !ok {
		if i, ok = r.makeSlot(s, h, id, false); !ok {
			return noRoom
		}
	}
	sl := &s.slots[i]
	if sl.has && sl.e.version >= e.version {
		sl.e.gen = gen
		return older
	}
	sl.e, sl.has = e, true
	if r.bounded() {
		sl.born = r.age()
	}
	return stored
}

// makeSlot makes an empty slot for id (of hash h, a key s does not hold)
// in s, whose lock the caller holds:
// a free or new one while the replica has room (always, unbounded), or,
// if evict, the first one of s the clock hand finds unread since it last
// passed. It reports false if there is none.
func (r *Replica) makeSlot(s *shard, h uint64, id string, evict bool) (int32, bool) {
	if len(id) == 0 || len(id) > presence.MaxIDLen {
		return 0, false // not a valid id: never held
	}
	var i int32
	switch {
	case !r.bounded() || r.held.Add(1) <= int64(r.cfg.Max):
		if n := len(s.free); n > 0 {
			i, s.free = s.free[n-1], s.free[:n-1]
		} else {
			s.slots = append(s.slots, slot{})
			i = int32(len(s.slots) - 1)
		}
	case !evict:
		r.held.Add(-1)
		return 0, false
	default:
		r.held.Add(-1)
		var ok bool
		if i, ok = r.evict(s); !ok {
			return 0, false
		}
	}
	sl := &s.slots[i]
	*sl = slot{idLen: uint8(len(id)), since: r.seq.Add(1)} // unmarked: behind the hand, and a read marks it
	copy(sl.id[:], id)
	s.m[h] = i
	return i, true
}

// evict frees the slot of s that the clock hand finds first not read
// since it last passed (clearing, on its way, the marks of those that
// were), and returns it.
func (r *Replica) evict(s *shard) (int32, bool) {
	for range 2 * len(s.slots) {
		i := s.hand
		s.hand = (s.hand + 1) % len(s.slots)
		sl := &s.slots[i]
		if sl.idLen == 0 { // free
			continue
		}
		if atomic.LoadUint32(&sl.ref) != 0 {
			atomic.StoreUint32(&sl.ref, 0)
			continue
		}
		s.drop(r.hashOf(sl))
		r.evicted.Add(1)
		return int32(i), true
	}
	return 0, false
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
// store does not hold it). A bounded replica reads the users it does not
// hold, or holds for longer than Config.Every, from the store, and keeps
// them. It returns ErrNotReady, and fills nothing, when the replica may
// have missed changes, and the store's error if a read through it failed.
// now is not used: the replica holds what was published, not what is due.
func (r *Replica) Get(ctx context.Context, _ int64, ids []string, out []presence.Snapshot) error {
	if !r.Ready() {
		r.refused.Add(1)
		return ErrNotReady
	}
	asked := r.asked.Load()
	var miss []int
	for i, id := range ids {
		s, h := r.locate(id)
		s.mu.RLock()
		j, ok, _ := s.find(h, id)
		switch {
		case ok && s.slots[j].has:
			sl := &s.slots[j]
			out[i] = sl.e.snapshot(id)
			if r.bounded() && atomic.LoadUint32(&sl.ref) == 0 {
				atomic.StoreUint32(&sl.ref, 1)
			}
		case !r.bounded():
			out[i] = presence.Snapshot{UserID: id}
		default:
			miss = append(miss, i)
		}
		s.mu.RUnlock()
	}
	if len(miss) > 0 {
		if err := r.readThrough(ctx, ids, miss, out, asked); err != nil {
			return err
		}
	}
	r.served.Add(1)
	return nil
}

// GetFull fills out[i] with the full view everyone may see of ids[i] —
// the public status, text and version, the devices, the public last_seen
// (now, Unix ms, while the user is present) and the settings — as a read
// of the store at now shows it, but for what is due (Get). The replica
// keeps a user's full view from a read of the store until a change or a
// device note (NoteDevices) of the user comes; the others are read
// through and kept (a replica of every user keeps only the users it
// holds: one the store does not hold is read each time). Not the
// user's own view: the true status of an invisible user is not held. It returns ErrNotReady, and
// fills nothing, when Get would, and while the device notes are not
// heard (NotesUp).
func (r *Replica) GetFull(ctx context.Context, now int64, ids []string, out []presence.Snapshot) error {
	if !r.Ready() || !r.notesUp.Load() {
		r.fullRefused.Add(1)
		return ErrNotReady
	}
	asked, epoch := r.asked.Load(), r.epoch.Load()
	var miss []int
	for i, id := range ids {
		s, h := r.locate(id)
		s.mu.RLock()
		j, ok, _ := s.find(h, id)
		if ok && s.slots[j].has && s.slots[j].e.hasFull(epoch) {
			sl := &s.slots[j]
			text := ""
			if sl.e.hasText {
				text = s.texts[h]
			}
			out[i] = sl.e.fullSnapshot(id, text, now)
			if r.bounded() && atomic.LoadUint32(&sl.ref) == 0 {
				atomic.StoreUint32(&sl.ref, 1)
			}
		} else {
			miss = append(miss, i)
		}
		s.mu.RUnlock()
	}
	if len(miss) > 0 {
		r.fullMisses.Add(uint64(len(miss)))
		// Every user a replica of every user holds has a slot already:
		// it makes none for ids the store does not hold (reads of
		// made-up ids would fill memory until the next fill).
		slot := r.listen
		if !r.bounded() {
			slot = r.slotOf
		}
		// The answer is the read's own (a change that came meanwhile is
		// newer, and on its way to the reader's watchers).
		err := r.readMisses(ctx, ids, miss, asked, slot, func(i int, _ *entry, read *presence.Snapshot) {
			e := entryOf(read, epoch)
			text, _ := read.Public()
			out[i] = e.fullSnapshot(ids[i], text, now)
		})
		if err != nil {
			return err
		}
	}
	r.fullServed.Add(1)
	return nil
}

// NoteDevices tells the replica that the devices of user changed with
// no change of their public state (the store's device notes): the full
// view it keeps of user, and one a read in flight brings, is not
// answered.
func (r *Replica) NoteDevices(user string) {
	s, h := r.locate(user)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := r.notes.Add(1) // under the lock: a settle of user after it sees it
	i, ok, _ := s.find(h, user)
	if !ok {
		return
	}
	sl := &s.slots[i]
	sl.noted = n
	if sl.has {
		sl.e = sl.e.statusOnly()
	}
}

// NotesUp tells the replica whether it hears the device notes now. While
// it does not, GetFull refuses; when it does again, every full view kept
// before is forgotten (notes may have been missed meanwhile).
func (r *Replica) NotesUp(up bool) {
	if up {
		r.epoch.Add(1)
	}
	r.notesUp.Store(up)
}

// readThrough reads ids[i], for each i of miss, from the store into
// out[i], and keeps each in the slot found or made for it before the read:
// a change applied to the slot meanwhile is newer than the read and wins,
// and a slot replaced meanwhile (evicted, or emptied by a Refill — asked
// is the count of Refills when the read began) keeps nothing.
func (r *Replica) readThrough(ctx context.Context, ids []string, miss []int, out []presence.Snapshot, asked uint64) error {
	r.misses.Add(uint64(len(miss)))
	return r.readMisses(ctx, ids, miss, asked, r.listen, func(i int, e *entry, _ *presence.Snapshot) { out[i] = e.snapshot(ids[i]) })
}

// readMisses is readAndKeep of ids[i] for each i of miss, each kept in
// the slot slot gives it (listen, or slotOf), and fn given i.
func (r *Replica) readMisses(ctx context.Context, ids []string, miss []int, asked uint64, slot func(string) uint64, fn func(i int, e *entry, read *presence.Snapshot)) error {
	names := make([]string, len(miss))
	tokens := make([]uint64, len(miss))
	for j, i := range miss {
		names[j] = ids[i]
		tokens[j] = slot(ids[i])
	}
	return r.readAndKeep(ctx, names, tokens, asked, func(j int, e *entry, read *presence.Snapshot) { fn(miss[j], e, read) })
}

// readAndKeep reads ids from the store, within ReadTimeout, and keeps
// each in the slot of seq tokens[j] (settle; 0: none), unless a Refill
// came after asked was read; a failed read only frees the slots that hold
// nothing yet. After a read that did not fail, fn is given each id's
// newest entry — the read's, or its slot's if a change made it newer —
// and what the read found.
func (r *Replica) readAndKeep(ctx context.Context, ids []string, tokens []uint64, asked uint64, fn func(j int, e *entry, read *presence.Snapshot)) error {
	read := make([]presence.Snapshot, len(ids))
	// Taken before the read: a device note counted after this may
	// stand for a change the read did not see.
	notes, epoch := r.notes.Load(), r.epoch.Load()
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
	err := r.cfg.Source.ReadPublished(rctx, ids, read)
	cancel()
	keep := err == nil && r.asked.Load() == asked
	now := r.age()
	for j := range ids {
		e := entryOf(&read[j], epoch)
		if tokens[j] != 0 {
			text, _ := read[j].Public()
			r.settle(ids[j], tokens[j], &e, text, keep, now, notes)
		}
		if err == nil && fn != nil {
			fn(j, &e, &read[j])
		}
	}
	if err != nil {
		return fmt.Errorf("replica: read through the store: %w", err)
	}
	return nil
}

// slotOf returns the seq of id's slot, 0 if it has none.
func (r *Replica) slotOf(id string) uint64 {
	s, h := r.locate(id)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if i, ok, _ := s.find(h, id); ok {
		return s.slots[i].since
	}
	return 0
}

// listen returns the seq of id's slot, made (evicting another if need be)
// if there is none; 0 if none could be made.
func (r *Replica) listen(id string) uint64 {
	s, h := r.locate(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok, taken := s.find(h, id)
	if taken {
		return 0
	}
	if !ok {
		if i, ok = r.makeSlot(s, h, id, true); !ok {
			return 0
		}
	}
	return s.slots[i].since
}

// settle keeps *e, read from the store, in id's slot if it is still the
// one of seq since, and sets *e to what the slot holds if that is newer;
// its full view (and text) only if no device note of id was counted
// after notes. Without keep it only frees the slot if it holds nothing
// yet.
func (r *Replica) settle(id string, since uint64, e *entry, text string, keep bool, now uint32, notes uint64) {
	s, h := r.locate(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok, _ := s.find(h, id)
	if !ok || s.slots[i].since != since {
		return
	}
	sl := &s.slots[i]
	switch {
	case !keep:
		if !sl.has {
			s.drop(h)
			s.slots[i] = slot{}
			s.free = append(s.free, i)
			r.held.Add(-1)
		}
	case !sl.has || e.version >= sl.e.version:
		kept := *e
		if sl.noted > notes {
			kept = kept.statusOnly()
		} else if text != "" {
			s.texts[h] = text
			kept.hasText = true
		} else {
			delete(s.texts, h)
		}
		sl.e, sl.has, sl.born = kept, true, now
	default:
		*e = sl.e
	}
}

// Run fills the replica, fills it again each time Refill asks, checks
// Config.Fresh every Config.Check (so that a node going silent is noticed
// even while nobody reads), and fills it in the background every
// Config.Every, until ctx is done. A background fill does not make Get
// refuse: it corrects, within Every, a change that never reached this node
// (a publisher that had to drop it) or a user the store lost without a
// Refill. A bounded replica has no background fill: one shard at a time,
// each every Every/2, it reads again the users it holds for longer than
// Every (refresh), while reads go on answering them.
func (r *Replica) Run(ctx context.Context) error {
	check := time.NewTicker(r.cfg.Check)
	defer check.Stop()
	every := time.NewTimer(r.cfg.Every)
	defer every.Stop()
	var refresh <-chan time.Time
	if r.bounded() {
		every.Stop()
		t := time.NewTicker(max(time.Millisecond, r.cfg.Every/(2*numShards)))
		defer t.Stop()
		refresh = t.C
	}
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
		case <-refresh:
			if err := r.refresh(ctx, &r.shards[r.nextShard]); err != nil && ctx.Err() == nil {
				r.log.Warn("reading the read replica's old users again failed; tried at the shard's next turn", "err", err)
			}
			r.nextShard = (r.nextShard + 1) % numShards
			continue
		case <-every.C:
		case <-r.wake:
			asked = true
		}
		if err := r.fillUntilDone(ctx, asked); err != nil {
			return err
		}
		if !r.bounded() {
			every.Reset(r.cfg.Every)
		}
	}
}

// refresh reads again from the store the users of s that a bounded
// replica holds for longer than Every, a read of up to 1,000 at a time,
// each kept as a read through keeps it (settle). It corrects, within
// 1.5 × Every, a change that never reached this node.
func (r *Replica) refresh(ctx context.Context, s *shard) error {
	if !r.Ready() {
		return nil // emptied, or emptied soon
	}
	asked := r.asked.Load()
	now := r.age()
	var ids []string
	var tokens []uint64
	s.mu.RLock()
	for i := range s.slots {
		if sl := &s.slots[i]; sl.has && now-min(now, sl.born) >= r.maxAge {
			ids = append(ids, sl.name())
			tokens = append(tokens, sl.since)
		}
	}
	s.mu.RUnlock()
	for lo := 0; lo < len(ids); lo += 1000 {
		hi := min(len(ids), lo+1000)
		if err := r.readAndKeep(ctx, ids[lo:hi], tokens[lo:hi], asked, nil); err != nil {
			return err
		}
		r.refreshed.Add(uint64(hi - lo))
	}
	return nil
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
// neither the store nor a change named since the fill started. A bounded
// replica is emptied instead.
func (r *Replica) fill(ctx context.Context) error {
	if r.bounded() {
		r.empty()
		return nil
	}
	gen := r.gen.Add(1)
	start := time.Now()
	n := 0
	err := r.cfg.Source.ScanReads(ctx, func(id string, snap *presence.Snapshot) {
		n++
		// Status only: a scan reads a bucket at a moment it does not
		// tell, so a device note may not order after it (GetFull reads
		// the full view through).
		r.apply(id, entryOf(snap, 0).statusOnly(), gen)
	})
	if err != nil {
		return err
	}
	dropped := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for j := range s.slots {
			if sl := &s.slots[j]; sl.has && sl.e.gen != gen {
				s.drop(r.hashOf(sl))
				s.slots[j] = slot{}
				s.free = append(s.free, int32(j))
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

// empty forgets every user a bounded replica holds: they are read from
// the store again when asked for.
func (r *Replica) empty() {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		r.held.Add(-int64(len(s.m)))
		clear(s.m)
		clear(s.texts)
		clear(s.slots)
		s.slots, s.free, s.hand = s.slots[:0], s.free[:0], 0
		s.mu.Unlock()
	}
	r.fills.Add(1)
}

// Stats are the replica's counters.
type Stats struct {
	Users     int           // users held (with Max, also those being read)
	Max       int           // Config.Max: 0, every user the store holds
	Ready     bool          // Get answers now
	Applied   uint64        // changes applied
	Stale     uint64        // changes not applied: the replica held that version or a newer one
	NotHeld   uint64        // changes not applied: bounded and full, the user not held
	Fills     uint64        // fills completed (with Max: times it was emptied)
	LastFill  time.Duration // how long the last completed fill took
	Served    uint64        // reads answered
	Refused   uint64        // reads refused (not ready): the store answered them
	Misses    uint64        // with Max: users read through from the store
	Evicted   uint64        // with Max: users dropped to make room
	Refreshed uint64        // with Max: users read again for being held longer than Every
	// Full views (GetFull).
	FullServed  uint64 // reads answered
	FullRefused uint64 // reads refused (not ready, or the notes not heard): the store answered them
	FullMisses  uint64 // users read through from the store
	Noted       uint64 // device notes heard
	NotesUp     bool   // the device notes are heard: GetFull answers
}

// Stats returns the replica's counters. It takes every shard's lock
// briefly to count the users.
func (r *Replica) Stats() Stats {
	st := Stats{Max: r.cfg.Max, Ready: r.Ready(), Applied: r.applied.Load(), Stale: r.stale.Load(),
		NotHeld: r.notHeld.Load(), Fills: r.fills.Load(), LastFill: time.Duration(r.lastFill.Load()),
		Served: r.served.Load(), Refused: r.refused.Load(), Misses: r.misses.Load(), Evicted: r.evicted.Load(),
		Refreshed: r.refreshed.Load(), FullServed: r.fullServed.Load(), FullRefused: r.fullRefused.Load(), FullMisses: r.fullMisses.Load(),
		Noted: r.notes.Load(), NotesUp: r.notesUp.Load()}
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.RLock()
		st.Users += len(s.m)
		s.mu.RUnlock()
	}
	return st
}

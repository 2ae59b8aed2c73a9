// Package memstore is the in-memory state store of a single presenced node:
// users sharded over independently locked tables the collector need not
// scan (table.go), each shard with its own
// deadline heap, so a heartbeat touches one shard and the sweeper never
// scans users whose deadlines are not due.
package memstore

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"time"

	"github.com/presenced/presenced/internal/deadline"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/rooms"
	"github.com/presenced/presenced/internal/tracker"
)

var _ tracker.Store = (*Store)(nil)

// Config configures a Store. The zero value takes the documented defaults.
type Config struct {
	Rules presence.Rules
	// Shards is the number of independently locked shards, rounded up to a
	// power of two. Default 256.
	Shards int
	// EvictAfter is how long a user with no device is kept in memory after
	// its last change has been checkpointed; reads of evicted users are
	// served from the durable store. Default 10m.
	EvictAfter time.Duration
	// RoomRules are the limits of rooms (presence.RoomRules defaults).
	RoomRules presence.RoomRules
}

// Store is a sharded in-memory tracker.Store. It is safe for concurrent use.
type Store struct {
	rules      presence.Rules
	evictAfter int64
	seed       maphash.Seed
	mask       uint64
	shards     []shard
	scratch    sync.Pool // *getScratch
	rooms      *rooms.Table
}

type shard struct {
	mu    sync.Mutex // guards the fields below
	t     table
	heap  deadline.Heap[uint32] // record indices
	dirty []uint32              // records whose state changed since the last Dirty
	beats uint64                // heartbeats applied (counted under the lock: no shared counter line)
	rooms rooms.Users           // the rooms of its users' devices, by record index
	keys  []rooms.DeviceKey     // scratch of afterRooms
	_     [64]byte              // keep neighbouring shards' locks off one cache line
}

// New returns an empty Store.
func New(cfg Config) *Store {
	cfg.Rules = cfg.Rules.WithDefaults()
	if cfg.Shards <= 0 {
		cfg.Shards = 256
	}
	if cfg.EvictAfter <= 0 {
		cfg.EvictAfter = 10 * time.Minute
	}
	n := 1
	for n < cfg.Shards {
		n <<= 1
	}
	s := &Store{
		rules:      cfg.Rules,
		evictAfter: cfg.EvictAfter.Milliseconds(),
		seed:       maphash.MakeSeed(),
		mask:       uint64(n - 1),
		shards:     make([]shard, n),
		rooms:      rooms.New(rooms.Config{Rules: cfg.RoomRules, Epoch: cfg.Rules.Epoch}),
	}
	for i := range s.shards {
		s.shards[i].t.init(s.seed, uint(bits.TrailingZeros(uint(n))), cfg.Rules.MaxDevices)
	}
	return s
}

// locate returns the shard of user and the hash that finds it there.
func (s *Store) locate(user string) (*shard, uint64) {
	h := maphash.String(s.seed, user)
	return &s.shards[h&s.mask], h
}

// Beat implements tracker.Store.
func (s *Store) Beat(_ context.Context, now int64, user, device string, active bool) (presence.Change, error) {
	sh, h := s.locate(user)
	sh.mu.Lock()
	idx := sh.t.find(h, user)
	if idx < 0 {
		sh.mu.Unlock()
		return presence.Change{}, tracker.ErrNotLoaded
	}
	u, tx := sh.t.inflate(idx, user)
	member := u.RoomMember()
	ch, err := u.Beat(&s.rules, now, device, active)
	if err != nil {
		sh.mu.Unlock()
		return ch, err
	}
	sh.t.store(idx, &u, tx)
	s.afterRooms(sh, idx, &u, member, "", now, &ch)
	sh.beats++
	sh.touchLocked(idx)
	s.scheduleLocked(sh, idx, &u, now)
	sh.mu.Unlock()
	return ch, nil
}

// SetStatus implements tracker.Store.
func (s *Store) SetStatus(_ context.Context, now int64, user string, m presence.Manual, text string) (presence.Change, error) {
	sh, h := s.locate(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx := sh.t.find(h, user)
	if idx < 0 {
		return presence.Change{}, tracker.ErrNotLoaded
	}
	u, tx := sh.t.inflate(idx, user)
	member := u.RoomMember()
	ch := u.SetStatus(&s.rules, now, m, text)
	sh.t.store(idx, &u, tx)
	s.afterRooms(sh, idx, &u, member, "", now, &ch)
	if ch.Changed {
		sh.touchLocked(idx)
	}
	s.scheduleLocked(sh, idx, &u, now)
	return ch, nil
}

// Bye implements tracker.Store.
func (s *Store) Bye(_ context.Context, now int64, user, device string) (presence.Change, error) {
	sh, h := s.locate(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx := sh.t.find(h, user)
	if idx < 0 {
		return presence.Change{}, nil
	}
	u, tx := sh.t.inflate(idx, user)
	member := u.RoomMember()
	ch := u.Bye(&s.rules, now, device)
	sh.t.store(idx, &u, tx)
	s.afterRooms(sh, idx, &u, member, device, now, &ch)
	sh.touchLocked(idx)
	s.scheduleLocked(sh, idx, &u, now)
	return ch, nil
}

// Disconnect implements tracker.Store.
func (s *Store) Disconnect(_ context.Context, now int64, user, device string, since int64) (presence.Change, error) {
	sh, h := s.locate(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx := sh.t.find(h, user)
	if idx < 0 {
		return presence.Change{}, nil
	}
	u, tx := sh.t.inflate(idx, user)
	member := u.RoomMember()
	ch := u.Disconnect(&s.rules, now, device, since)
	sh.t.store(idx, &u, tx)
	s.afterRooms(sh, idx, &u, member, "", now, &ch)
	if ch.Changed {
		sh.touchLocked(idx)
	}
	s.scheduleLocked(sh, idx, &u, now)
	return ch, nil
}

// SetSettings implements tracker.Store.
func (s *Store) SetSettings(_ context.Context, now int64, user string, set *presence.Settings) (presence.Change, error) {
	sh, h := s.locate(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx := sh.t.find(h, user)
	if idx < 0 {
		return presence.Change{}, tracker.ErrNotLoaded
	}
	u, tx := sh.t.inflate(idx, user)
	next := u.Settings
	if set != nil {
		next = *set
	}
	ch := u.SetSettings(&s.rules, now, next)
	sh.t.store(idx, &u, tx)
	sh.touchLocked(idx)
	return ch, nil
}

// Load implements tracker.Store.
func (s *Store) Load(_ context.Context, now int64, p *presence.Profile) error {
	sh, h := s.locate(p.UserID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.t.find(h, p.UserID) >= 0 {
		return nil
	}
	idx := sh.t.add(h, p.UserID)
	u := presence.NewUser(*p)
	sh.t.store(idx, u, texts{})
	s.scheduleLocked(sh, idx, u, now)
	return nil
}

// Expire implements tracker.Store.
func (s *Store) Expire(_ context.Context, now int64, max int, out []presence.Change) ([]presence.Change, error) {
	for i := range s.shards {
		if len(out) >= max {
			break
		}
		sh := &s.shards[i]
		sh.mu.Lock()
		for sh.heap.Due(now) && len(out) < max {
			it := sh.heap.Pop()
			idx := int(it.V)
			r := &sh.t.recs[idx]
			if r.flags&flagLive == 0 || it.At != r.sched {
				continue // superseded by a later schedule, or dropped
			}
			r.sched = 0
			u, tx := sh.t.inflate(idx, "")
			member := u.RoomMember()
			ch := u.Expire(&s.rules, now)
			sh.t.store(idx, &u, tx)
			s.afterRooms(sh, idx, &u, member, "", now, &ch)
			if ch.Changed {
				ch.Event.UserID = sh.t.str(r.id())
				sh.touchLocked(idx)
			}
			if ch.Changed || len(ch.Rooms) > 0 {
				out = append(out, ch)
			}
			if len(u.Devices) == 0 && r.flags&flagRooms == 0 && r.evictAt != 0 && now >= r.evictAt {
				if r.flags&flagDirty == 0 {
					sh.t.remove(maphash.String(s.seed, sh.t.str(r.id())), idx)
					continue
				}
				r.evictAt = now + s.evictAfter // checkpoint first, then drop
			}
			s.scheduleLocked(sh, idx, &u, now)
		}
		sh.mu.Unlock()
	}
	return out, nil
}

// Get implements tracker.Store. Large reads are grouped by shard, so each
// shard is locked once per read and its lookups run back to back.
func (s *Store) Get(_ context.Context, now int64, ids []string, out []presence.Snapshot) error {
	if len(ids) < 16 || len(ids) > 1<<20 {
		for i, id := range ids {
			sh, h := s.locate(id)
			sh.mu.Lock()
			s.snapshotLocked(sh, sh.t.find(h, id), id, now, &out[i])
			sh.mu.Unlock()
		}
		return nil
	}
	sc, _ := s.scratch.Get().(*getScratch)
	if sc == nil {
		sc = &getScratch{counts: make([]int32, len(s.shards)+1)}
	}
	// Counting sort of the ids by shard.
	counts := sc.counts
	clear(counts)
	if cap(sc.hashes) < len(ids) {
		sc.hashes = make([]uint64, len(ids))
		sc.order = make([]int32, len(ids))
		sc.found = make([]int32, len(ids))
	}
	hashes, order := sc.hashes[:len(ids)], sc.order[:len(ids)]
	for i, id := range ids {
		h := maphash.String(s.seed, id)
		hashes[i] = h
		counts[h&s.mask+1]++
	}
	for k := 1; k < len(counts); k++ {
		counts[k] += counts[k-1]
	}
	for i, h := range hashes {
		k := h & s.mask
		order[counts[k]] = int32(i)
		counts[k]++
	}
	for j := 0; j < len(order); {
		k := hashes[order[j]] & s.mask
		sh := &s.shards[k]
		end := j
		for end < len(order) && hashes[order[end]]&s.mask == k {
			end++
		}
		sh.mu.Lock()
		// The slot, then the record of each id are loaded in passes of
		// their own, independent loads, so the cache misses of a thousand
		// users overlap instead of queueing one after the other; the
		// look-ups and snapshots that follow find them in the cache.
		found := sc.found[j:end]
		for n, i := range order[j:end] {
			found[n] = int32(sh.t.slots[sh.t.pos(hashes[i])])
		}
		var touch uint8
		for _, f := range found {
			if f > 0 {
				r := &sh.t.recs[f-1]
				touch += r.idLen + r.dev.lastBeatLow()
			}
		}
		sc.touch += touch
		for n, i := range order[j:end] {
			found[n] = int32(sh.t.find(hashes[i], ids[i]))
		}
		for n, i := range order[j:end] {
			s.snapshotLocked(sh, int(found[n]), ids[i], now, &out[i])
		}
		sh.mu.Unlock()
		j = end
	}
	s.scratch.Put(sc)
	return nil
}

type getScratch struct {
	touch  uint8 // what the touching pass read, so it is not optimised away
	counts []int32
	hashes []uint64
	order  []int32
	found  []int32
}

// snapshotLocked fills out with the state of record idx (-1: not held),
// the user id.
func (s *Store) snapshotLocked(sh *shard, idx int, id string, now int64, out *presence.Snapshot) {
	if idx < 0 {
		*out = presence.Snapshot{UserID: id}
		return
	}
	u, _ := sh.t.inflate(idx, id)
	u.Snapshot(&s.rules, now, out)
}

// Dirty implements tracker.Store.
func (s *Store) Dirty(_ context.Context, out []presence.Profile) ([]presence.Profile, error) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, idx := range sh.dirty {
			r := &sh.t.recs[idx]
			p := presence.Profile{
				UserID: sh.t.str(r.id()), Manual: r.manual,
				LastSeen: r.lastSeen, PubLastSeen: r.pubLastSeen,
				Version: r.version, Settings: r.settings,
			}
			p.PubVersion = r.version
			if r.flags&flagText != 0 {
				tx := sh.t.texts[idx]
				p.Text, p.PubText = tx.text, tx.pub
				if tx.pubVersion != 0 {
					p.PubVersion = tx.pubVersion
				}
			}
			out = append(out, p)
			r.flags &^= flagDirty
		}
		sh.dirty = sh.dirty[:0]
		sh.mu.Unlock()
	}
	return out, nil
}

// Debug implements tracker.Store.
func (s *Store) Debug(_ context.Context, user string) (presence.User, int64, bool, error) {
	sh, h := s.locate(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx := sh.t.find(h, user)
	if idx < 0 {
		return presence.User{}, 0, false, nil
	}
	u, _ := sh.t.inflate(idx, user)
	u.Devices = append([]presence.Device(nil), u.Devices...)
	return u, sh.t.recs[idx].sched, true, nil
}

// Beats returns the number of heartbeats applied.
func (s *Store) Beats() uint64 {
	var n uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.beats
		sh.mu.Unlock()
	}
	return n
}

// Len returns the number of users held in memory.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.n
		sh.mu.Unlock()
	}
	return n
}

// touchLocked puts record idx on the shard's dirty list once.
func (sh *shard) touchLocked(idx int) {
	if r := &sh.t.recs[idx]; r.flags&flagDirty == 0 {
		r.flags |= flagDirty
		sh.dirty = append(sh.dirty, uint32(idx))
	}
}

// scheduleLocked makes sure the heap holds an item no later than the next
// deadline of u, the user of record idx. A heartbeat only ever moves the
// deadline later, so the common heartbeat pushes nothing: the old item
// fires early and is rescheduled.
func (s *Store) scheduleLocked(sh *shard, idx int, u *presence.User, now int64) {
	r := &sh.t.recs[idx]
	d := u.Deadline(&s.rules, now)
	if d == 0 {
		if r.evictAt == 0 {
			r.evictAt = now + s.evictAfter
		}
		d = r.evictAt
	} else {
		r.evictAt = 0
	}
	if d <= now {
		// Never schedule into the past: a sweep that re-arms what it just
		// popped must not spin.
		d = now + 1
	}
	if r.sched == 0 || d < r.sched {
		r.sched = d
		sh.heap.Push(d, uint32(idx))
	}
}

// Package memstore is the in-memory state store of a single presenced node:
// users sharded over independently locked maps, each shard with its own
// deadline heap, so a heartbeat touches one shard and the sweeper never
// scans users whose deadlines are not due.
package memstore

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/presenced/presenced/internal/deadline"
	"github.com/presenced/presenced/internal/presence"
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
}

// Store is a sharded in-memory tracker.Store. It is safe for concurrent use.
type Store struct {
	rules      presence.Rules
	evictAfter int64
	seed       maphash.Seed
	mask       uint64
	shards     []shard
	scratch    sync.Pool // *getScratch
}

type entry struct {
	u presence.User
	// dev backs u.Devices for the common single-device user, so a
	// heartbeat finds its device in the same cache lines as the user.
	dev     [1]presence.Device
	sched   int64 // at of the heap item that is authoritative, 0 = none
	evictAt int64 // when a user with no device may be dropped, 0 = not set
	dirty   bool  // in the shard's dirty list
	deleted bool
}

type shard struct {
	mu    sync.Mutex // guards the fields below
	users map[string]*entry
	heap  deadline.Heap[*entry]
	dirty []*entry // users whose last_seen changed since the last Dirty
	beats uint64   // heartbeats applied (counted under the lock: no shared counter line)
	_     [64]byte // keep neighbouring shards' locks off one cache line
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
	}
	for i := range s.shards {
		s.shards[i].users = make(map[string]*entry)
	}
	return s
}

func (s *Store) shard(user string) *shard {
	return &s.shards[maphash.String(s.seed, user)&s.mask]
}

// Beat implements tracker.Store.
func (s *Store) Beat(_ context.Context, now int64, user, device string, active bool) (presence.Change, error) {
	sh := s.shard(user)
	sh.mu.Lock()
	e := sh.users[user]
	if e == nil {
		sh.mu.Unlock()
		return presence.Change{}, tracker.ErrNotLoaded
	}
	ch, err := e.u.Beat(&s.rules, now, device, active)
	if err != nil {
		sh.mu.Unlock()
		return ch, err
	}
	sh.beats++
	sh.touchLocked(e)
	s.scheduleLocked(sh, e, now)
	sh.mu.Unlock()
	return ch, nil
}

// SetStatus implements tracker.Store.
func (s *Store) SetStatus(_ context.Context, now int64, user string, m presence.Manual, text string) (presence.Change, error) {
	sh := s.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.users[user]
	if e == nil {
		return presence.Change{}, tracker.ErrNotLoaded
	}
	ch := e.u.SetStatus(&s.rules, now, m, text)
	if ch.Changed {
		sh.touchLocked(e)
	}
	s.scheduleLocked(sh, e, now)
	return ch, nil
}

// Bye implements tracker.Store.
func (s *Store) Bye(_ context.Context, now int64, user, device string) (presence.Change, error) {
	sh := s.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.users[user]
	if e == nil {
		return presence.Change{}, nil
	}
	ch := e.u.Bye(&s.rules, now, device)
	sh.touchLocked(e)
	s.scheduleLocked(sh, e, now)
	return ch, nil
}

// Disconnect implements tracker.Store.
func (s *Store) Disconnect(_ context.Context, now int64, user, device string, since int64) (presence.Change, error) {
	sh := s.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.users[user]
	if e == nil {
		return presence.Change{}, nil
	}
	ch := e.u.Disconnect(&s.rules, now, device, since)
	if ch.Changed {
		sh.touchLocked(e)
	}
	s.scheduleLocked(sh, e, now)
	return ch, nil
}

// SetSettings implements tracker.Store.
func (s *Store) SetSettings(_ context.Context, now int64, user string, set *presence.Settings) (presence.Change, error) {
	sh := s.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.users[user]
	if e == nil {
		return presence.Change{}, tracker.ErrNotLoaded
	}
	next := e.u.Settings
	if set != nil {
		next = *set
	}
	ch := e.u.SetSettings(&s.rules, now, next)
	sh.touchLocked(e)
	return ch, nil
}

// Load implements tracker.Store.
func (s *Store) Load(_ context.Context, now int64, p *presence.Profile) error {
	sh := s.shard(p.UserID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.users[p.UserID] != nil {
		return nil
	}
	e := newEntry(p)
	sh.users[e.u.UserID] = e
	s.scheduleLocked(sh, e, now)
	return nil
}

func newEntry(p *presence.Profile) *entry {
	e := &entry{u: *presence.NewUser(*p)}
	e.u.Devices = e.dev[:0]
	return e
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
			e := it.V
			if e.deleted || it.At != e.sched {
				continue // superseded by a later schedule
			}
			e.sched = 0
			ch := e.u.Expire(&s.rules, now)
			if ch.Changed {
				sh.touchLocked(e)
				out = append(out, ch)
			}
			if len(e.u.Devices) == 0 && e.evictAt != 0 && now >= e.evictAt {
				if !e.dirty {
					delete(sh.users, e.u.UserID)
					e.deleted = true
					continue
				}
				e.evictAt = now + s.evictAfter // checkpoint first, then drop
			}
			s.scheduleLocked(sh, e, now)
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
			sh := s.shard(id)
			sh.mu.Lock()
			s.snapshotLocked(sh, id, now, &out[i])
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
	if cap(sc.shardOf) < len(ids) {
		sc.shardOf = make([]uint32, len(ids))
		sc.order = make([]int32, len(ids))
	}
	shardOf, order := sc.shardOf[:len(ids)], sc.order[:len(ids)]
	for i, id := range ids {
		k := uint32(maphash.String(s.seed, id) & s.mask)
		shardOf[i] = k
		counts[k+1]++
	}
	for k := 1; k < len(counts); k++ {
		counts[k] += counts[k-1]
	}
	for i, k := range shardOf {
		order[counts[k]] = int32(i)
		counts[k]++
	}
	for j := 0; j < len(order); {
		k := shardOf[order[j]]
		sh := &s.shards[k]
		end := j
		for end < len(order) && shardOf[order[end]] == k {
			end++
		}
		sh.mu.Lock()
		// Two passes: all map lookups first, then all snapshots, so the
		// cache misses of independent users overlap instead of queueing.
		ents := sc.ents[:0]
		for _, i := range order[j:end] {
			ents = append(ents, sh.users[ids[i]])
		}
		for n, i := range order[j:end] {
			if e := ents[n]; e != nil {
				e.u.Snapshot(&s.rules, now, &out[i])
			} else {
				out[i] = presence.Snapshot{UserID: ids[i]}
			}
		}
		sh.mu.Unlock()
		clear(ents)
		sc.ents = ents[:0]
		j = end
	}
	s.scratch.Put(sc)
	return nil
}

type getScratch struct {
	ents    []*entry
	counts  []int32
	shardOf []uint32
	order   []int32
}

func (s *Store) snapshotLocked(sh *shard, id string, now int64, out *presence.Snapshot) {
	if e := sh.users[id]; e != nil {
		e.u.Snapshot(&s.rules, now, out)
	} else {
		*out = presence.Snapshot{UserID: id}
	}
}

// Dirty implements tracker.Store.
func (s *Store) Dirty(_ context.Context, out []presence.Profile) ([]presence.Profile, error) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j, e := range sh.dirty {
			out = append(out, e.u.Profile)
			e.dirty = false
			sh.dirty[j] = nil
		}
		sh.dirty = sh.dirty[:0]
		sh.mu.Unlock()
	}
	return out, nil
}

// Debug implements tracker.Store.
func (s *Store) Debug(_ context.Context, user string) (presence.User, int64, bool, error) {
	sh := s.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.users[user]
	if e == nil {
		return presence.User{}, 0, false, nil
	}
	u := e.u
	u.Devices = append([]presence.Device(nil), e.u.Devices...)
	return u, e.sched, true, nil
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
		n += len(sh.users)
		sh.mu.Unlock()
	}
	return n
}

// touchLocked puts e on the shard's dirty list once.
func (sh *shard) touchLocked(e *entry) {
	if !e.dirty {
		e.dirty = true
		sh.dirty = append(sh.dirty, e)
	}
}

// scheduleLocked makes sure the heap holds an item no later than e's next
// deadline. A heartbeat only ever moves the deadline later, so the common
// heartbeat pushes nothing: the old item fires early and is rescheduled.
func (s *Store) scheduleLocked(sh *shard, e *entry, now int64) {
	d := e.u.Deadline(&s.rules, now)
	if d == 0 {
		if e.evictAt == 0 {
			e.evictAt = now + s.evictAfter
		}
		d = e.evictAt
	} else {
		e.evictAt = 0
	}
	if d <= now {
		// Never schedule into the past: a sweep that re-arms what it just
		// popped must not spin.
		d = now + 1
	}
	if e.sched == 0 || d < e.sched {
		e.sched = d
		sh.heap.Push(d, e)
	}
}

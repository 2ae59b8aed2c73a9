// Package owned keeps the devices whose sockets this node holds, when
// several nodes share one state store (Redis). The node that holds a
// device's socket knows better than anyone whether it is alive, so it
// keeps the device's deadline itself and tells the shared store only what
// others must see: that the device is there (a claim, when it connects),
// that its activity turned idle_after old or that it is active again (a
// touch: the store holds an owned device "active, per its owner" and
// keeps no idle deadline of its own for it), and that it is gone (a
// release: its ttl or close grace ran out here, or it said bye). A
// heartbeat that changes nothing visible touches one shard lock of this
// table and nothing else — no network, no allocation — and an active user
// costs the store nothing at all between those moments.
//
// The table holds no connection to the store: it decides, and the tracker
// carries its decisions out and reports back (Beat says what a heartbeat
// needs at once; Due hands out the work whose time has come; Done records
// what the store answered). Work that fails — the store is down, the user
// cannot be loaded — stays in the table and comes due again after
// Config.Retry, so while the store does not answer the devices stay alive
// here, and what changed meanwhile reaches the store when it answers.
//
// Times are Unix milliseconds. A Table is safe for concurrent use.
package owned

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/deadline"
	"github.com/presenced/presenced/internal/presence"
)

// Config configures a Table. Zero values take the documented defaults.
type Config struct {
	// Rules are the rules of the state model (TTL, IdleAfter, CloseGrace).
	Rules presence.Rules
	// Retry is how long work that failed waits before it is due again.
	// Default 250ms.
	Retry time.Duration
	// Shards is the number of independently locked shards, rounded up to
	// a power of two. Default 64.
	Shards int
}

// Source is where the heartbeats of a device come from: Sockets, or a
// source of the caller's (one partition of an ingest stream). The
// devices of one source can be handed back to the store together
// (HandOff) when the node stops being their source's owner.
type Source uint32

// Sockets is the source of the devices whose sockets this node holds.
const Sockets Source = 0

// Need is what a heartbeat needs from the shared store at once.
type Need uint8

// Needs of a heartbeat.
const (
	// NeedNothing: the common case; the store knows all it must.
	NeedNothing Need = iota
	// NeedClaim: the device is new on this node: claim it now (the
	// caller then calls Done).
	NeedClaim
	// NeedTouch: an active beat of a device the store holds idle: touch
	// now so the user shows online (then Done).
	NeedTouch
)

// Device is what the table knows of one device.
type Device struct {
	ID         string
	LastBeat   int64
	LastActive int64 // 0: never active
	Closed     int64 // when its socket closed without a bye, 0 if open
	// Active, in work handed out: the store is to hold the device active
	// (its activity is less than IdleAfter old); otherwise it is to hold
	// LastActive, and settle the user by it.
	Active bool
}

// Work is what the store must be told about one user.
type Work struct {
	User    string
	Claim   []Device // devices to claim
	Touch   []Device // claimed devices whose activity the store must learn
	Release []Device // devices that ended here (their ttl or close grace ran out)
	Bye     []Device // devices that said bye while work of theirs was in flight
	// HandOff are devices this node no longer owns, alive or not: the
	// store is to hold them by the rules, from their real last beats.
	HandOff []Device
}

// Empty reports whether w asks for nothing.
func (w *Work) Empty() bool {
	return len(w.Claim) == 0 && len(w.Touch) == 0 && len(w.Release) == 0 && len(w.Bye) == 0 && len(w.HandOff) == 0
}

// Result is what the store answered to a Work (or to a NeedClaim or
// NeedTouch) for Done.
type Result struct {
	// Failed: the store did not answer, or could not load the user; the
	// work is due again after Config.Retry.
	Failed bool
	// Lost names devices another node holds now (a claim the store
	// refused as stale, a touch or release of a device this node no
	// longer holds): the table forgets them.
	Lost []string
	// Refused names devices whose claim the store refused by the rules
	// (too many devices): the table forgets them.
	Refused []string
	// Reclaim: the store does not hold the user at all (it lost its
	// data): every device of the user is to be claimed again.
	Reclaim bool
	// Unsent: with Failed, the work never reached the store (it was known
	// down): a claim of it was not sent.
	Unsent bool
}

type dev struct {
	Device
	claimed  bool // the store holds the device as this node's
	dead     bool // ended here; its release is not done yet
	bye      bool // dead by a bye (Remove while work of it was in flight)
	handOff  bool // dead here by HandOff: the store is to hold it by the rules
	source   Source
	handSrc  Source // the source it was handed off as (shard.handing)
	inFlight bool   // named in work handed out and not yet Done
	op       uint8  // the work in flight: opClaim, opTouch or opRelease
	activeR  bool   // the store holds the device active (claimed devices)
	// sentActive is what the work in flight tells the store: hold it
	// active.
	sentActive bool
	ackAt      int64 // when the store last acknowledged a claim or touch of it
	// sent: a claim of it was sent and it was not released since: the
	// store may hold it even when no claim was acknowledged (a reply
	// lost), so its end is a release, never a silent drop.
	sent    bool
	wasSent bool // sent before the work in flight (Result.Unsent restores it)
	// fresh: a new socket connected during the work in flight, which
	// must not count as its claim (the device may have moved meanwhile).
	fresh bool
	// revived: it beat again during the release in flight.
	revived bool
}

// Work in flight of a device.
const (
	opClaim uint8 = iota + 1
	opTouch
	opRelease
)

type user struct {
	id      string
	devs    []dev
	one     [1]dev // backs devs for the common single-device user
	sched   int64  // at of the heap item that is authoritative, 0 = none
	retryAt int64  // failed work waits until then
	busy    bool   // work of the user is in flight (handed out, not Done)
	gen     uint64 // Table.gen when the work in flight was handed out
	again   bool   // something came up while busy: look again at Done
	dirty   bool   // in the shard's dirty list
	ls      int64  // the latest beat of any of its devices
}

type shard struct {
	mu     sync.Mutex // guards the fields below and every *user in users
	users  map[string]*user
	heap   deadline.Heap[*user]
	dirty  []*user    // users whose last beat moved since the last Dirty
	recent []Released // the latest releases the store acknowledged, oldest first (Redo)
	// handing counts, by source, the devices whose hand-off is not done
	// (HandingOff); nil until the first HandOff.
	handing map[Source]int
	n       int // devices held
	_       [64]byte
}

// maxRecent bounds the releases a shard remembers for Redo.
const maxRecent = 1024

// Released is a release or hand-off the store acknowledged: its
// device, whether it was a bye or a hand-off, and when.
type Released struct {
	User    string
	Device  Device
	Bye     bool
	HandOff bool
	At      int64
}

// Table is the set of devices this node holds. It is safe for concurrent use.
type Table struct {
	gen    atomic.Uint64 // bumped by Unclaim: answers to older work claim nothing
	rules  presence.Rules
	idle   int64 // ms
	retry  int64
	seed   maphash.Seed
	mask   uint64
	shards []shard
}

// New returns an empty Table.
func New(cfg Config) *Table {
	cfg.Rules = cfg.Rules.WithDefaults()
	if cfg.Retry <= 0 {
		cfg.Retry = 250 * time.Millisecond
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 64
	}
	n := 1
	for n < cfg.Shards {
		n <<= 1
	}
	t := &Table{
		rules:  cfg.Rules,
		idle:   cfg.Rules.IdleAfter.Milliseconds(),
		retry:  cfg.Retry.Milliseconds(),
		seed:   maphash.MakeSeed(),
		mask:   uint64(n - 1),
		shards: make([]shard, n),
	}
	for i := range t.shards {
		t.shards[i].users = make(map[string]*user)
	}
	return t
}

func (t *Table) shard(id string) *shard { return &t.shards[maphash.String(t.seed, id)&t.mask] }

func (t *Table) end(d *dev) int64 {
	pd := presence.Device{LastBeat: d.LastBeat, Closed: d.Closed}
	return t.rules.End(&pd)
}

func (u *user) find(id string) int {
	for i := range u.devs {
		if u.devs[i].ID == id {
			return i
		}
	}
	return -1
}

// deviceLocked returns user userID of sh and the index of its device, or
// a nil user (or -1) when sh holds neither. Held: sh.mu.
func (sh *shard) deviceLocked(userID, device string) (*user, int) {
	u := sh.users[userID]
	if u == nil {
		return nil, -1
	}
	return u, u.find(device)
}

// Beat records a heartbeat of a device whose socket this node holds and
// says what the store needs at once. connect says the beat is a new
// socket's first: the device is claimed again (another node may have
// taken it since this node last claimed it). A beat of a device that
// ended here but was not released yet starts it afresh. For NeedClaim and
// NeedTouch the caller tells the store and then calls Done with the
// answer; until then the user's other work waits.
func (t *Table) Beat(now int64, userID, device string, active, connect bool) Need {
	return t.BeatFrom(now, Sockets, userID, device, active, connect)
}

// BeatFrom is Beat of a device whose heartbeats come from src: the device
// is src's from then on, whatever source it had.
func (t *Table) BeatFrom(now int64, src Source, userID, device string, active, connect bool) Need {
	sh := t.shard(userID)
	sh.mu.Lock()
	u := sh.users[userID]
	if u == nil {
		u = &user{id: userID}
		u.devs = u.one[:0]
		sh.users[userID] = u
	}
	i := u.find(device)
	if i < 0 {
		u.devs = append(u.devs, dev{Device: Device{ID: device}})
		i = len(u.devs) - 1
		sh.n++
	}
	d := &u.devs[i]
	switch {
	case d.dead && !d.inFlight:
		// Ended here but not yet released: it is back; the store still
		// holds it (or will learn of it with a claim). One handed
		// off is claimed again: the store may hold it by the rules.
		if d.handOff {
			d.claimed = false
			sh.unhandLocked(d)
		}
		d.dead, d.bye = false, false
	case d.dead:
		d.revived = true // Done of the release in flight brings it back
	}
	d.source = src
	if connect {
		d.claimed = false
		d.fresh = d.inFlight
	}
	if now > d.LastBeat {
		d.LastBeat = now
	}
	if d.Closed != 0 && now > d.Closed {
		d.Closed = 0
	}
	if active && now > d.LastActive {
		d.LastActive = now
	}
	u.ls = max(u.ls, now)
	if !u.dirty {
		u.dirty = true
		sh.dirty = append(sh.dirty, u)
	}
	need := NeedNothing
	switch {
	case u.busy:
		if !d.claimed || active {
			u.again = true
		}
	case !d.claimed && now >= u.retryAt:
		need = NeedClaim
	case !d.claimed:
		t.armLocked(sh, u, now)
	case active && !d.activeR:
		need = NeedTouch
	}
	// (An active device's idle time only moves later here: its heap item
	// fires early and is re-armed.)
	if need != NeedNothing {
		u.busy = true
		u.gen = t.gen.Load()
		d.inFlight, d.op, d.sentActive = true, opTouch, t.active(d, now)
		if need == NeedClaim {
			d.op, d.wasSent, d.sent = opClaim, d.sent, true
		}
	}
	sh.mu.Unlock()
	return need
}

// Hurry makes the claim of device of user due at now, when the table
// holds the device alive and not claimed (its claim waits for the node's
// lease, or for its retry after a failure): the next Beat of it asks for
// the claim. It reports whether it did.
func (t *Table) Hurry(now int64, userID, device string) bool {
	sh := t.shard(userID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	u, i := sh.deviceLocked(userID, device)
	if i < 0 {
		return false
	}
	if d := &u.devs[i]; d.dead || d.claimed || now >= t.end(d) {
		return false
	}
	u.retryAt = min(u.retryAt, now)
	return true
}

// active reports whether d's activity is less than IdleAfter old at now.
func (t *Table) active(d *dev, now int64) bool {
	return d.LastActive > 0 && now < d.LastActive+t.idle
}

// sent is d as work hands it out at now.
func (t *Table) sent(d *dev, now int64) Device {
	out := d.Device
	out.Active = t.active(d, now)
	return out
}

// Pending returns the devices of user that the caller must send with a
// NeedClaim (the beaten device, unclaimed) or NeedTouch (every claimed
// device), appending to out.
func (t *Table) Pending(userID string, need Need, out []Device) []Device {
	sh := t.shard(userID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	u := sh.users[userID]
	if u == nil {
		return out
	}
	for i := range u.devs {
		d := &u.devs[i]
		if d.inFlight && (need == NeedClaim && d.op == opClaim || need == NeedTouch && d.op == opTouch) {
			dv := d.Device
			dv.Active = d.sentActive
			out = append(out, dv)
		}
	}
	return out
}

// Close records that the socket of a device closed without a bye at
// now; since is the last beat through that socket. Unless it beats again
// the device ends CloseGrace after now (or at the end of its ttl). A
// device that beat after since (it has another socket here) is left
// alone. It reports whether the table holds the device.
func (t *Table) Close(now int64, userID, device string, since int64) bool {
	sh := t.shard(userID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	u, i := sh.deviceLocked(userID, device)
	if i < 0 {
		return false
	}
	d := &u.devs[i]
	if d.LastBeat <= since && d.Closed == 0 && !d.dead {
		d.Closed = now
		if e := t.end(d); u.sched == 0 || e < u.sched {
			t.pushLocked(sh, u, e)
		}
	}
	return true
}

// Removal is what Remove did with a device.
type Removal uint8

// Removals.
const (
	NotHeld   Removal = iota // the table does not hold the device
	Forgotten                // forgotten; the store never held it as this node's
	Release                  // forgotten; the caller releases it in the store (a bye)
	Deferred                 // work of the device is in flight: the table releases it (a bye) after it
)

// Remove forgets a device that said bye at now and returns it and what
// the caller must do.
func (t *Table) Remove(now int64, userID, device string) (Device, Removal) {
	sh := t.shard(userID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	u, i := sh.deviceLocked(userID, device)
	if i < 0 {
		return Device{}, NotHeld
	}
	d := &u.devs[i]
	if d.inFlight {
		// A claim of it may land after a release sent now: let the
		// work finish, then release it.
		d.dead, d.bye = true, true
		u.again = true
		return d.Device, Deferred
	}
	dv, claimed := d.Device, d.claimed
	t.dropLocked(sh, u, i)
	if claimed {
		return dv, Release
	}
	return dv, Forgotten
}

// dropLocked forgets device i of u, and u once it has no device and no
// work in flight.
func (t *Table) dropLocked(sh *shard, u *user, i int) {
	sh.unhandLocked(&u.devs[i])
	u.devs = append(u.devs[:i], u.devs[i+1:]...)
	u.devs[:len(u.devs)+1][len(u.devs)] = dev{}
	sh.n--
	if len(u.devs) == 0 && !u.busy {
		delete(sh.users, u.id)
		u.sched = 0
	}
}

// Due hands out the work of every user whose time has come by now,
// appending it to out: releases of devices that ended, claims that
// failed before, touches of devices whose activity turned idle. The
// users of the work handed out are busy until Done.
func (t *Table) Due(now int64, out []Work) []Work {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for sh.heap.Due(now) {
			it := sh.heap.Pop()
			u := it.V
			if it.At != u.sched {
				continue // superseded
			}
			u.sched = 0
			if u.busy {
				u.again = true
				continue
			}
			w := t.workLocked(sh, u, now)
			if !w.Empty() {
				u.busy = true
				u.gen = t.gen.Load()
				out = append(out, w)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// workLocked marks the devices that ended by now dead and collects what
// the store must be told about u; if there is nothing, it re-arms u.
func (t *Table) workLocked(sh *shard, u *user, now int64) Work {
	w := Work{User: u.id}
	for i := 0; i < len(u.devs); i++ {
		d := &u.devs[i]
		if !d.dead && t.end(d) <= now {
			d.dead = true
		}
		switch {
		case d.dead && !d.claimed && !d.sent:
			// Never shown to anyone: nothing to release.
			t.dropLocked(sh, u, i)
			i--
			continue
		case now < u.retryAt:
		case d.dead && d.bye:
			w.Bye = append(w.Bye, d.Device)
			d.inFlight, d.op = true, opRelease
		case d.dead && d.handOff:
			w.HandOff = append(w.HandOff, d.Device)
			d.inFlight, d.op = true, opRelease
		case d.dead:
			w.Release = append(w.Release, d.Device)
			d.inFlight, d.op = true, opRelease
		case !d.claimed:
			w.Claim = append(w.Claim, t.sent(d, now))
			d.inFlight, d.op, d.sentActive, d.wasSent, d.sent = true, opClaim, t.active(d, now), d.sent, true
		case d.activeR != t.active(d, now):
			// Its activity turned idle, or it is active again since the
			// store was told it was idle: the store settles the user.
			w.Touch = append(w.Touch, t.sent(d, now))
			d.inFlight, d.op, d.sentActive = true, opTouch, !d.activeR
		}
	}
	if len(u.devs) == 0 {
		delete(sh.users, u.id)
		return w
	}
	if w.Empty() {
		t.armLocked(sh, u, now)
	}
	return w
}

// Done records the store's answer to the work of user handed out by Beat
// (NeedClaim, NeedTouch) or Due, and re-arms the user.
func (t *Table) Done(now int64, userID string, r Result) {
	sh := t.shard(userID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	u := sh.users[userID]
	if u == nil {
		return
	}
	u.busy = false
	if u.gen != t.gen.Load() && !r.Failed {
		// Unclaim ran meanwhile: what this work claimed is not this
		// node's any more (or is under a lease taken over).
		r = Result{Reclaim: true, Lost: r.Lost, Refused: r.Refused}
	}
	if r.Failed {
		u.retryAt = now + t.retry
	} else {
		u.retryAt = 0
	}
	for i := 0; i < len(u.devs); i++ {
		d := &u.devs[i]
		if r.Reclaim {
			// The store does not hold the user's devices as this
			// node's: all of them are claimed again (the dead ones
			// are dropped by the next work: never shown again).
			d.claimed = false
		}
		if !d.inFlight {
			continue
		}
		op, sentActive, fresh, revived := d.op, d.sentActive, d.fresh, d.revived
		d.inFlight, d.op, d.fresh, d.revived = false, 0, false, false
		if op == opClaim && r.Unsent {
			d.sent = d.wasSent
		}
		if revived {
			// It beat again while its release was in flight: it lives;
			// claimed again if the release went through (or, for a
			// hand-off, may have: the store would hold it by the rules).
			handOff := d.handOff
			sh.unhandLocked(d)
			d.dead, d.bye = false, false
			if op == opRelease && !r.Failed && !r.Reclaim {
				d.claimed, d.sent = false, false
				continue
			}
			if op == opRelease && handOff {
				d.claimed = false
			}
		}
		switch {
		case r.Reclaim:
			if d.dead {
				t.dropLocked(sh, u, i)
				i--
			}
		case contains(r.Lost, d.ID) || contains(r.Refused, d.ID):
			t.dropLocked(sh, u, i)
			i--
		case r.Failed:
		case op == opRelease:
			sh.rememberLocked(Released{User: u.id, Device: d.Device, Bye: d.bye, HandOff: d.handOff, At: now})
			t.dropLocked(sh, u, i)
			i--
		default:
			// A claim or a touch: the store has the device as this
			// node's, active or not as sent. (A device that said bye
			// meanwhile is released by the next work; one whose new
			// socket connected meanwhile is claimed again.)
			d.claimed = !fresh
			d.activeR = sentActive
			d.ackAt = now
		}
	}
	if len(u.devs) == 0 {
		delete(sh.users, u.id)
		u.sched = 0
		return
	}
	if u.again {
		u.again = false
		t.pushLocked(sh, u, max(now, u.retryAt))
		return
	}
	t.armLocked(sh, u, now)
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// armLocked puts u's next deadline on the heap unless an item at or
// before it is there already.
func (t *Table) armLocked(sh *shard, u *user, now int64) {
	next := int64(0)
	for i := range u.devs {
		d := &u.devs[i]
		var at int64
		switch {
		case d.dead || !d.claimed || d.activeR != t.active(d, now):
			at = now
		default:
			at = t.end(d)
			if d.activeR {
				at = min(at, d.LastActive+t.idle)
			}
		}
		if next == 0 || at < next {
			next = at
		}
	}
	// Failed work waits for its retry; nothing is due before (Due would
	// otherwise find the user due again at once, and again).
	next = max(next, u.retryAt)
	if next != 0 && (u.sched == 0 || next < u.sched) {
		t.pushLocked(sh, u, next)
	}
}

func (t *Table) pushLocked(sh *shard, u *user, at int64) {
	u.sched = at
	sh.heap.Push(at, u)
}

// Unclaim marks every device of the table unclaimed: the store lost them
// (it lost its data, or this node's lease was taken over), and each is
// claimed again by the work Due hands out. Work in flight is answered
// as it is; its devices are claimed again after it.
func (t *Table) Unclaim(now int64) {
	t.gen.Add(1)
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, u := range sh.users {
			for j := range u.devs {
				u.devs[j].claimed = false
				u.devs[j].activeR = false
			}
			u.retryAt = 0
			if u.busy {
				u.again = true
			} else {
				t.pushLocked(sh, u, now)
			}
		}
		sh.mu.Unlock()
	}
}

func (sh *shard) rememberLocked(r Released) {
	if len(sh.recent) == maxRecent {
		n := copy(sh.recent, sh.recent[maxRecent/4:])
		clear(sh.recent[n:])
		sh.recent = sh.recent[:n]
	}
	sh.recent = append(sh.recent, r)
}

// Released records a release the caller made itself (a bye) and the store
// acknowledged at now, for Redo.
func (t *Table) Released(now int64, userID string, d Device, bye bool) {
	sh := t.shard(userID)
	sh.mu.Lock()
	sh.rememberLocked(Released{User: userID, Device: d, Bye: bye, At: now})
	sh.mu.Unlock()
}

// Redo answers a store that may have lost its last writes (Redis
// replicates asynchronously: a failover loses what the old master had
// acknowledged and not yet sent to its replica): every device whose claim
// or touch the store acknowledged at or after since is claimed again (a
// claim of a device the store still holds as this node's changes
// nothing), and the releases acknowledged at or after since are returned
// to be made again (a release of a device the store no longer holds as
// this node's changes nothing), but those of devices back in the table.
// The table forgets every release it remembered.
func (t *Table) Redo(now, since int64) []Released {
	var out []Released
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, u := range sh.users {
			again := false
			for j := range u.devs {
				if d := &u.devs[j]; d.claimed && d.ackAt >= since {
					d.claimed, d.activeR = false, false
					again = true
				}
			}
			if !again {
				continue
			}
			if u.busy {
				u.again = true
			} else {
				t.pushLocked(sh, u, now)
			}
		}
		k := 0
		for k < len(sh.recent) && sh.recent[k].At < since {
			k++
		}
		for _, r := range sh.recent[k:] {
			// A device that is back here since is this node's again: its
			// claim is made again above, never its old release.
			if u := sh.users[r.User]; u == nil || u.find(r.Device.ID) < 0 {
				out = append(out, r)
			}
		}
		clear(sh.recent)
		sh.recent = sh.recent[:0]
		sh.mu.Unlock()
	}
	return out
}

// HandOff ends here every device of src (its source moved to another
// node): the work Due hands out next gives each back to the store's rules
// with its real last beat (Work.HandOff), or forgets it if the store never
// held it; the device is forgotten once the store answered. A device
// that beats again meanwhile is claimed again. It returns the devices of
// src the table holds, handed off or not.
func (t *Table) HandOff(now int64, src Source) int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, u := range sh.users {
			mark := false
			for j := range u.devs {
				d := &u.devs[j]
				if d.source != src {
					continue
				}
				n++
				if !d.dead {
					d.dead, d.handOff, d.handSrc, mark = true, true, src, true
					if sh.handing == nil {
						sh.handing = make(map[Source]int)
					}
					sh.handing[src]++
				}
			}
			switch {
			case !mark:
			case u.busy:
				u.again = true
			default:
				t.pushLocked(sh, u, now)
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// unhandLocked clears d's hand-off, if any, from its shard's count.
// Held: sh.mu.
func (sh *shard) unhandLocked(d *dev) {
	if d.handOff {
		d.handOff = false
		if sh.handing[d.handSrc]--; sh.handing[d.handSrc] == 0 {
			delete(sh.handing, d.handSrc)
		}
	}
}

// HandingOff returns the number of devices of the sources in srcs whose
// hand-off the store has not taken yet (counted as HandOff marks them,
// so without a look at every device). A device that beat again since
// its HandOff is not one: it is claimed again.
func (t *Table) HandingOff(srcs []Source) int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, src := range srcs {
			n += sh.handing[src]
		}
		sh.mu.Unlock()
	}
	return n
}

// Devices appends the devices of user alive at now to out (those handed
// off and not yet forgotten included: they live by the rules).
func (t *Table) Devices(now int64, userID string, out []Device) []Device {
	sh := t.shard(userID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if u := sh.users[userID]; u != nil {
		for i := range u.devs {
			if d := &u.devs[i]; (!d.dead || d.handOff) && now < t.end(d) {
				out = append(out, d.Device)
			}
		}
	}
	return out
}

// Each calls fn with every user and its claimed devices (alive or not
// released), under the user's shard lock: fn must not call the table.
func (t *Table) Each(fn func(user string, claimed []Device)) {
	var buf []Device
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, u := range sh.users {
			buf = buf[:0]
			for j := range u.devs {
				if u.devs[j].claimed {
					buf = append(buf, u.devs[j].Device)
				}
			}
			if len(buf) > 0 {
				fn(u.id, buf)
			}
		}
		sh.mu.Unlock()
	}
}

// Dirty appends to out, and forgets, each user whose devices beat since
// the previous call, with the latest of their beats as LastSeen (a
// checkpoint of last_seen only: the other fields are zero).
func (t *Table) Dirty(out []presence.Profile) []presence.Profile {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, u := range sh.dirty {
			u.dirty = false
			out = append(out, presence.Profile{UserID: u.id, LastSeen: u.ls})
		}
		clear(sh.dirty)
		sh.dirty = sh.dirty[:0]
		sh.mu.Unlock()
	}
	return out
}

// Len returns the number of devices held.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

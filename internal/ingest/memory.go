package ingest

import (
	"container/list"
	"time"
)

// devKey names one device of one user.
type devKey struct{ user, device string }

// byeEntry is what the memory knows of one device that disconnected.
type byeEntry struct {
	key     devKey
	bye     time.Time // latest session_disconnected `at` seen
	beat    time.Time // latest beat `at` applied after bye (zero: none)
	expires time.Time // node clock time after which the entry is useless
}

// Memory remembers, per device, the latest session_disconnected `at`
// this node applied, for a bounded time and a bounded number of devices,
// so that an older connect or heartbeat redelivered after it does not bring
// the device back. Entries are kept in a list ordered by expiry (every
// insert and update sets expiry to now+life and moves the entry to the
// back); the oldest is dropped when the memory is full.
//
// These are the rules that make applying session events idempotent: a
// connect or heartbeat redelivered after its device's disconnect does not
// bring the device back, and an older disconnect redelivered after a
// reconnect does not end the new session.
//
// A Memory is not safe for concurrent use: its user keeps the events of one
// device in one goroutine (a Consumer's worker, a Kafka consumer's loop).
type Memory struct {
	life  time.Duration
	max   int
	m     map[devKey]*list.Element // of *byeEntry
	order list.List                // front: expires first
}

// NewMemory returns a Memory whose entries live for life after their last
// update and that holds at most max devices (the oldest dropped first).
func NewMemory(life time.Duration, size int) *Memory {
	return &Memory{life: life, max: max(size, 1), m: make(map[devKey]*list.Element)}
}

// expire drops the entries that expired by now.
func (b *Memory) expire(now time.Time) {
	for e := b.order.Front(); e != nil; e = b.order.Front() {
		be := e.Value.(*byeEntry)
		if be.expires.After(now) {
			return
		}
		b.order.Remove(e)
		delete(b.m, be.key)
	}
}

// BeatAllowed reports whether a beat (or connect) of the device at `at`
// may be applied, that is whether no disconnect of it at or after `at` is
// remembered. When it is allowed and the device disconnected before, the
// beat is remembered too, so that the older disconnect, if redelivered,
// does not end the reconnected device.
func (b *Memory) BeatAllowed(user, device string, at, now time.Time) bool {
	return b.beatAllowed(devKey{user, device}, at, now)
}

func (b *Memory) beatAllowed(k devKey, at, now time.Time) bool {
	b.expire(now)
	e, ok := b.m[k]
	if !ok {
		return true
	}
	be := e.Value.(*byeEntry)
	if !at.After(be.bye) {
		return false
	}
	if at.After(be.beat) {
		be.beat = at
		be.expires = now.Add(b.life)
		b.order.MoveToBack(e)
	}
	return true
}

// ByeAllowed reports whether a disconnect of the device at `at` may be
// applied: not when a beat after it (a reconnect) is remembered.
func (b *Memory) ByeAllowed(user, device string, at, now time.Time) bool {
	return b.byeAllowed(devKey{user, device}, at, now)
}

func (b *Memory) byeAllowed(k devKey, at, now time.Time) bool {
	b.expire(now)
	e, ok := b.m[k]
	if !ok {
		return true
	}
	return !e.Value.(*byeEntry).beat.After(at)
}

// RecordBye remembers a disconnect of the device at `at` that was (or is
// being) applied.
func (b *Memory) RecordBye(user, device string, at, now time.Time) {
	b.recordBye(devKey{user, device}, at, now)
}

func (b *Memory) recordBye(k devKey, at, now time.Time) {
	b.expire(now)
	if e, ok := b.m[k]; ok {
		be := e.Value.(*byeEntry)
		if at.After(be.bye) {
			be.bye = at
		}
		be.expires = now.Add(b.life)
		b.order.MoveToBack(e)
		return
	}
	for len(b.m) >= b.max {
		front := b.order.Front()
		b.order.Remove(front)
		delete(b.m, front.Value.(*byeEntry).key)
	}
	b.m[k] = b.order.PushBack(&byeEntry{key: k, bye: at, expires: now.Add(b.life)})
}

// Len returns the number of devices remembered.
func (b *Memory) Len() int { return len(b.m) }

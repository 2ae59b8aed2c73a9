// Package ratelimit says how often a client may do what, once for every
// entry point, and enforces it with token buckets.
//
// Status, Settings and Contacts are the limits of a client's durable
// writes, each per user: one Writes holds their buckets for a whole node,
// shared by the HTTP API (each user of a client token; backends with the
// API key are not limited) and the WebSocket gateway (set_status of every
// socket of the user), so a user's writes count once whichever way and
// over however many connections they come. A Bucket belongs to one owner
// (a connection's read side); Keyed holds a bucket per key (a user) for
// callers that share it, sharded, its memory bounded by the keys that
// took a token within the last burst's worth of time. Rooms is the limit
// of one device's joins and leaves of rooms.
//
// Times are Unix milliseconds, as the gateway and the HTTP API read their
// clocks.
package ratelimit

import (
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// Limit allows one operation every Every on average, and Burst at once
// after a quiet spell. A Limit whose Every or Burst is not positive allows
// everything.
type Limit struct {
	Every time.Duration
	Burst int
}

// The limits of a client's durable writes. People change their status,
// privacy settings and contacts at human speed; each change is a durable
// write (and a fan-out), so a client gets a few at once and then one a
// second. The same numbers hold over HTTP and WebSocket.
var (
	// Status limits status changes: POST /v1/status, set_status.
	Status = Limit{Every: time.Second, Burst: 5}
	// Settings limits changes of privacy settings: PUT /v1/users/{id}/settings.
	Settings = Limit{Every: time.Second, Burst: 5}
	// Contacts limits changes of a contact list (replace, add, remove).
	Contacts = Limit{Every: time.Second, Burst: 5}
)

// Rooms limits the joins and leaves of rooms of one device, counted per
// room: ten a second once the burst is spent. A device rejoins all its
// rooms after a reconnect (presence.DefaultMaxRooms, 100), so the burst
// of 200 lets it do so twice in a row (a network change, then a node
// restarting behind the load balancer) without a refusal, while a client
// that joins and leaves in a loop churns its rooms' watchers ten times a
// second at most.
var Rooms = Limit{Every: 100 * time.Millisecond, Burst: 200}

// RoomPages limits a client's reads of a room's further pages over HTTP
// (GET /v1/rooms/{room}?after=…), per user: the first page is a read of
// presence, under the poll interval; the pages after it, of up to 1,000
// members each, come ten a second once a burst of 100 is spent — a room
// of 100,000 read whole at once, while a client that pages in a loop
// costs what ten small reads a second cost.
var RoomPages = Limit{Every: 100 * time.Millisecond, Burst: 100}

// Writes are the per-user buckets of a client's durable writes, one for
// each kind, and the per-device buckets of its joins and leaves of rooms
// (keyed by RoomKey), for every edge of a node to share.
type Writes struct {
	Status, Settings, Contacts *Keyed
	Rooms                      *Keyed
}

// NewWrites returns empty buckets under Status, Settings, Contacts and
// Rooms.
func NewWrites() *Writes {
	return &Writes{Status: NewKeyed(Status), Settings: NewKeyed(Settings), Contacts: NewKeyed(Contacts), Rooms: NewKeyed(Rooms)}
}

// RoomKey is the key of a device's bucket in Writes.Rooms.
func RoomKey(user, device string) string { return user + "\x00" + device }

// SnapshotsPerSecond is how many ids a second a user's sockets may have
// read for subscribe's snapshots once the burst is spent (Snapshots): a
// device may re-subscribe a list of 500 every 5 s, for ever. (An HTTP
// client reads 1,000 ids per 30 s.)
const SnapshotsPerSecond = 100

// Snapshots limits the ids a user's subscriptions read, across all their
// sockets to a node: each newly watched id is one read through the
// privacy filter. maxWatched is the most the user may watch at once on
// the node; the burst is twice that, so that all their devices may
// subscribe their whole lists at connect and all again after a reconnect
// (a network change, a node restarting behind the load balancer) without
// a refusal. A client that subscribes and unsubscribes in a loop reads
// SnapshotsPerSecond ids a second.
func Snapshots(maxWatched int) Limit {
	return Limit{Every: time.Second / SnapshotsPerSecond, Burst: 2 * maxWatched}
}

// PerSecond returns the Limit of n operations a second, bursts of burst.
func PerSecond(n, burst int) Limit {
	if n <= 0 {
		return Limit{}
	}
	return Limit{Every: time.Second / time.Duration(n), Burst: burst}
}

// String says the limit the way error messages put it: "at most 1 per
// second, bursts of 5", "at most 1 per 30s".
func (l Limit) String() string {
	if l.off() {
		return "unlimited"
	}
	var s string
	if l.Every <= time.Second {
		s = fmt.Sprintf("at most %.3g per second", float64(time.Second)/float64(l.Every))
	} else {
		s = "at most 1 per " + l.Every.String()
	}
	if l.Burst > 1 {
		s += fmt.Sprintf(", bursts of %d", l.Burst)
	}
	return s
}

func (l Limit) off() bool { return l.Every <= 0 || l.Burst <= 0 }

// every is l.Every in whole milliseconds, at least 1.
func (l Limit) every() int64 { return max(1, l.Every.Milliseconds()) }

// take admits n operations (1 ≤ n ≤ Burst) at now (Unix ms) against
// full, the time at which the bucket is full again (a full bucket has
// full <= now). It returns the new full time and 0, or full unchanged and
// how many ms to wait for n tokens.
func (l Limit) take(full, now, n int64) (int64, int64) {
	if l.off() {
		return full, 0
	}
	every := l.every()
	next := max(full, now) + n*every
	if over := next - now - int64(l.Burst)*every; over > 0 {
		return full, over
	}
	return next, 0
}

// RetryAfter is a wait in ms as the whole seconds of a Retry-After header:
// rounded up, at least 1.
func RetryAfter(waitMS int64) int64 { return max(1, (waitMS+999)/1000) }

// Bucket is one owner's token bucket. Its zero value is full. It is not
// safe for concurrent use.
type Bucket struct {
	full int64 // Unix ms at which the bucket is full again
}

// Take takes a token at now (Unix ms) under l. It reports whether one was
// there and, if not, how many ms until one is.
func (b *Bucket) Take(now int64, l Limit) (ok bool, waitMS int64) {
	var wait int64
	b.full, wait = l.take(b.full, now, 1)
	return wait == 0, wait
}

// Keyed is a token bucket per key under one Limit. It is safe for
// concurrent use. Its memory is bounded by the keys that took a token
// within the last Burst × Every: a bucket that has filled up again is the
// same as none, and such buckets are dropped as their shard grows.
type Keyed struct {
	limit  Limit
	seed   maphash.Seed
	shards [64]keyedShard
}

type keyedShard struct {
	mu    sync.Mutex       // guards the fields below
	full  map[string]int64 // key → Unix ms at which its bucket is full again
	prune int              // drop full buckets when full grows to this
}

// NewKeyed returns empty buckets under l.
func NewKeyed(l Limit) *Keyed {
	k := &Keyed{limit: l, seed: maphash.MakeSeed()}
	for i := range k.shards {
		k.shards[i].full = make(map[string]int64)
		k.shards[i].prune = 1024
	}
	return k
}

// Limit returns the limit k enforces.
func (k *Keyed) Limit() Limit { return k.limit }

// Take takes a token from key's bucket at now (Unix ms). It reports
// whether one was there and, if not, how many ms until one is.
func (k *Keyed) Take(key string, now int64) (ok bool, waitMS int64) {
	return k.TakeN(key, 1, now)
}

// TakeN takes n tokens at once from key's bucket at now (Unix ms), or
// none. It reports whether they were there and, if not, how many ms until
// they are. More than the limit's Burst are never there (waitMS -1).
func (k *Keyed) TakeN(key string, n int, now int64) (ok bool, waitMS int64) {
	if k.limit.off() || n <= 0 {
		return true, 0
	}
	if n > k.limit.Burst {
		return false, -1
	}
	sh := k.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	full, wait := k.limit.take(sh.full[key], now, int64(n))
	if wait > 0 {
		return false, wait
	}
	if len(sh.full) >= sh.prune {
		for key, f := range sh.full {
			if f <= now {
				delete(sh.full, key)
			}
		}
		sh.prune = max(1024, 2*len(sh.full))
	}
	sh.full[key] = full
	return true, 0
}

// Give puts n tokens taken from key's bucket back (an operation that
// turned out to cost less than was taken), at most filling it.
func (k *Keyed) Give(key string, n int, now int64) {
	if k.limit.off() || n <= 0 {
		return
	}
	sh := k.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	full, ok := sh.full[key]
	if !ok {
		return
	}
	if full -= int64(n) * k.limit.every(); full <= now {
		delete(sh.full, key)
		return
	}
	sh.full[key] = full
}

func (k *Keyed) shard(key string) *keyedShard {
	return &k.shards[maphash.String(k.seed, key)%uint64(len(k.shards))]
}

// Len returns the number of buckets held (for tests of the memory bound).
func (k *Keyed) Len() int {
	n := 0
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		n += len(sh.full)
		sh.mu.Unlock()
	}
	return n
}

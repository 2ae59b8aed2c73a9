package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/presenced/presenced/internal/presence"
)

// Users are held packed, each a field of a small hash of its shard (a
// bucket): see lua/packed.lua for the layout and why. This file is the Go
// side: which bucket a user is in, and the packed user decoded.

// forever is FOREVER of the scripts: the last activity of an owned device
// its owner holds active, and the due time of a user with nothing due.
const forever = 1 << 52

// fnv32a is FNV-1a of s, as the scripts' fnv32a computes it.
func fnv32a(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

// place returns the shard of user and its bucket within it, as this
// node last knew the shard's buckets (buckets.go).
func (s *Store) place(user string) (shard, bucket int) {
	h := fnv32a(user)
	n := uint32(len(s.shards))
	k := int(h % n)
	return k, bucketIndex(h/n, s.nb[k].Load(), int64(s.buckets))
}

// bucketKey is the key of bucket b of shard sk: <prefix>{<shard>}p:<b>.
func (sk *shardKeys) bucketKey(b int) string {
	return sk.tag + "p:" + strconv.Itoa(b)
}

// bucketOf returns the key of user's bucket and the user's shard.
func (s *Store) bucketOf(user string) (string, *shardKeys) {
	k, b := s.place(user)
	sk := &s.shards[k]
	return sk.bucketKey(b), sk
}

// packedUser is a user decoded from its packed value: the user, and what
// the store keeps of it besides.
type packedUser struct {
	presence.User
	due    int64    // s: the user's entry in the due set (0 none, forever: nothing due)
	evict  int64    // ev: when the user is evicted (0: not planned)
	others []uint64 // the holders of its devices after each one's first (Device.Owner)
}

// holds reports whether lease holds one of u's devices.
func (u *packedUser) holds(lease uint64) bool {
	for _, d := range u.Devices {
		if d.Owner == lease {
			return true
		}
	}
	return slices.Contains(u.others, lease)
}

var errShortPacked = errors.New("packed user cut short")

// decodePacked decodes the packed user v (lua/packed.lua) of id into u,
// appending its devices to u.Devices (whose backing array it reuses).
func decodePacked(id, v string, u *packedUser) error {
	devs, others := u.Devices[:0], u.others[:0]
	*u = packedUser{User: presence.User{Profile: presence.Profile{UserID: id}}}
	p := 0
	short := false
	byte1 := func() int64 {
		if p >= len(v) {
			short = true
			return 0
		}
		p++
		return int64(v[p-1])
	}
	num := func(n int) int64 {
		if p+n > len(v) {
			short = true
			return 0
		}
		var b [8]byte
		copy(b[:], v[p:p+n])
		p += n
		return int64(binary.LittleEndian.Uint64(b[:]))
	}
	text := func() string {
		n := int(num(2))
		if short || p+n > len(v) {
			short = true
			return ""
		}
		p += n
		return v[p-n : p]
	}
	// A time whose kind is 0 (zero), 1 (forever), 2 (six bytes follow)
	// or 3 (rel: the time is rel, or three bytes follow that hold the
	// time - ls + 2^23, when rel < 0).
	timeOf := func(kind, rel int64) int64 {
		switch kind {
		case 1:
			return forever
		case 2:
			return num(6)
		case 3:
			if rel >= 0 {
				return rel
			}
			return u.LastSeen + num(3) - 1<<23
		}
		return 0
	}
	f1, f2 := byte1(), byte1()
	u.Manual = presence.Manual(f1 & 3)
	u.Pub = presence.Status(f1 >> 2 & 7)
	u.Settings = presence.Settings{Status: presence.Visibility(f2 & 3), LastSeen: presence.Visibility(f2 >> 2 & 3)}
	u.LastSeen = num(6)
	u.Version = uint64(num(7))
	u.PubLastSeen = u.LastSeen
	if f2&16 != 0 {
		u.PubLastSeen = num(6)
	}
	u.due = timeOf(f1>>5&3, -1)
	if f1&128 != 0 {
		u.evict = num(6)
	}
	if f2&32 != 0 {
		u.Text = text()
	}
	u.PubText = u.Text
	if f2&64 != 0 {
		u.PubText = text()
	}
	u.PubVersion = u.Version
	if f2&128 != 0 {
		u.PubVersion -= uint64(num(7))
	}
	for !short && p < len(v) {
		df := byte1()
		n := int(byte1())
		if short || p+n > len(v) {
			short = true
			break
		}
		d := presence.Device{ID: v[p : p+n], LastBeat: u.LastSeen}
		p += n
		if df&128 != 0 {
			df &^= 128 // its last beat is the user's last_seen
		} else {
			d.LastBeat = num(6)
		}
		d.LastActive = timeOf(df&3, d.LastBeat)
		if df&4 != 0 {
			d.Closed = num(6)
		}
		if df&8 != 0 {
			d.Owner = uint64(num(6))
		}
		for range df >> 4 {
			others = append(others, uint64(num(6)))
		}
		devs = append(devs, d)
	}
	u.Devices, u.others = devs, others
	if short || p != len(v) {
		return fmt.Errorf("%w (%d bytes)", errShortPacked, len(v))
	}
	return nil
}

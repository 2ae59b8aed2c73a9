package rooms

import (
	"sync"

	"github.com/presenced/presenced/internal/presence"
)

// UserRef names a user of a harness: its shard is the ref modulo the
// shards, its index there the ref divided by them.
type UserRef uint32

// harness is a Table with the user side a caller keeps beside it: one
// Users per shard of its users, each under its own mutex, as memstore
// keeps them. Its methods take the arguments the tests speak in.
type harness struct {
	*Table
	shards []hshard

	mu    sync.Mutex // guards names
	names map[DeviceKey]string
}

type hshard struct {
	mu  sync.Mutex // guards the fields below
	us  Users
	ids map[uint32]string // user ids by index
}

// fullStats is what both sides of a harness hold.
type fullStats struct {
	Rooms, Members, Memberships, DeviceRooms int
	Bytes                                    int64
}

func newHarness(cfg Config) *harness {
	h := &harness{Table: New(cfg), shards: make([]hshard, 4), names: map[DeviceKey]string{}}
	for i := range h.shards {
		h.shards[i].ids = map[uint32]string{}
	}
	return h
}

// lock locks u's shard and returns it and u's index there.
func (h *harness) lock(u UserRef) (*hshard, uint32) {
	s := &h.shards[int(u)%len(h.shards)]
	s.mu.Lock()
	return s, uint32(u) / uint32(len(h.shards))
}

func (h *harness) key(device string) DeviceKey {
	k := h.DeviceKey(device)
	h.mu.Lock()
	h.names[k] = device
	h.mu.Unlock()
	return k
}

func (h *harness) Join(u UserRef, user, device, room string, counted bool, now int64) (presence.RoomEvent, bool, error) {
	s, i := h.lock(u)
	defer s.mu.Unlock()
	h.key(device)
	ev, ok, err := h.Table.Join(&s.us, i, user, device, room, counted, now)
	if s.us.InRooms(i) {
		s.ids[i] = user
	}
	return ev, ok, err
}

func (h *harness) Leave(u UserRef, device, room string, reason presence.RoomReason, now int64) (presence.RoomEvent, bool) {
	s, i := h.lock(u)
	defer s.mu.Unlock()
	return h.Table.Leave(&s.us, i, s.ids[i], device, room, reason, now)
}

func (h *harness) LeaveAll(u UserRef, device string, reason presence.RoomReason, now int64, out []presence.RoomEvent) []presence.RoomEvent {
	s, i := h.lock(u)
	defer s.mu.Unlock()
	return h.Table.LeaveAll(&s.us, i, s.ids[i], h.key(device), reason, now, out)
}

func (h *harness) SetCounted(u UserRef, counted bool, now int64, out []presence.RoomEvent) []presence.RoomEvent {
	s, i := h.lock(u)
	defer s.mu.Unlock()
	return h.Table.SetCounted(&s.us, i, s.ids[i], counted, now, out)
}

func (h *harness) InRooms(u UserRef) bool {
	s, i := h.lock(u)
	defer s.mu.Unlock()
	return s.us.InRooms(i)
}

func (h *harness) Devices(u UserRef, out []string) []string {
	s, i := h.lock(u)
	defer s.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range s.us.Devices(i, nil) {
		out = append(out, h.names[k])
	}
	return out
}

func (h *harness) DeviceRooms(u UserRef, device string, out []string) []string {
	s, i := h.lock(u)
	defer s.mu.Unlock()
	return h.Table.DeviceRooms(&s.us, i, device, out)
}

func (h *harness) Stats() fullStats {
	st := h.Table.Stats()
	out := fullStats{Rooms: st.Rooms, Memberships: st.Memberships, Bytes: st.Bytes}
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		us := s.us.Stats()
		s.mu.Unlock()
		out.Members += us.Members
		out.DeviceRooms += us.DeviceRooms
		out.Bytes += us.Bytes
	}
	return out
}

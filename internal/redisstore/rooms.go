package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// Rooms (tracker.RoomStore) on Redis.
//
// A membership has two sides in two slots. The user's side — which rooms
// each device of the user is in, and whether the user is invisible — is
// one field of <bucket>r beside the packed user, in the user's slot, so a
// device's end (the sweep's ttl and close grace, a bye, its owner's
// release) takes it out of its rooms in the same script (helpers.lua,
// "Rooms"). Each change of whether the user counts in a room is an op,
// appended in that script to the user's outbox (<tag>ro) with a marker in
// the shard's due set. The room's side is in the room's slot
// (<prefix>{r<n>}, n = FNV-1a of the room over the shards): a sorted set
// of its members (all of score 0: pages in the order of user ids, a count
// is ZCARD) and its version.
//
// Whoever made ops applies them: the node of the join, leave, bye or
// release at once (the script's reply carries a mark, Store.change), the
// sweep for ends it found (expire.lua) and for ops whose applier died
// (their marker comes due when its claim lapses). Ops are claimed per
// user (room_take.lua: the marker's score is the claim's end plus a margin
// for the clocks of two Redis masters), applied in order (room_apply.lua
// refuses once the claim ended: a node that stalled past it writes
// nothing), then acknowledged (room_ack.lua, which hands over any ops made
// meanwhile). Ops are absolute — the user counts in the room or not — so
// one applied twice (its applier died before the ack) changes nothing:
// every join and leave moves a room's count once, and never below zero.
// A join or leave is published by the node that applied it.

// roomClaim is one user's room ops claimed for this node.
type roomClaim struct {
	user  string
	claim int64
	ops   []roomOp
}

// roomOp is one op of a user's outbox.
type roomOp struct {
	seq      int64
	room     string
	counted  bool
	reason   presence.RoomReason
	status   presence.Status
	settings presence.Settings
	at       int64
}

// parseRoomOps parses an outbox value: the last sequence number, then
// per op "\x02" and its fields separated by "\x03".
func parseRoomOps(v string) ([]roomOp, error) {
	i := strings.IndexByte(v, '\x02')
	if i < 0 {
		return nil, nil
	}
	var ops []roomOp
	for _, rec := range strings.Split(v[i+1:], "\x02") {
		f := strings.Split(rec, "\x03")
		if len(f) != 8 {
			return nil, fmt.Errorf("room op %q: %d fields", rec, len(f))
		}
		var n [8]int64
		for j, k := range []int{0, 2, 3, 4, 5, 6, 7} {
			x, err := strconv.ParseInt(f[k], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("room op %q: %w", rec, err)
			}
			n[j] = x
		}
		ops = append(ops, roomOp{seq: n[0], room: f[1], counted: n[1] == 1, reason: presence.RoomReason(n[2]),
			status:   presence.Status(n[3]),
			settings: presence.Settings{Status: presence.Visibility(n[4]), LastSeen: presence.Visibility(n[5])}, at: n[6]})
	}
	return ops, nil
}

// decodeRoomClaim decodes {1, claim, ops} (room_take.lua, room_ack.lua; nil for
// {0}).
func decodeRoomClaim(user string, arr []rueidis.RedisMessage) (*roomClaim, error) {
	if code, _ := arr[0].AsInt64(); code != 1 {
		return nil, nil
	}
	if len(arr) != 3 {
		return nil, fmt.Errorf("room claim of %d elements", len(arr))
	}
	return decodeRoomOps(user, arr[1], arr[2])
}

func decodeRoomOps(user string, claim, ops rueidis.RedisMessage) (*roomClaim, error) {
	cs, err := claim.ToString()
	if err != nil {
		return nil, err
	}
	c, err := strconv.ParseInt(cs, 10, 64)
	if err != nil {
		return nil, err
	}
	v, err := ops.ToString()
	if err != nil {
		return nil, err
	}
	o, err := parseRoomOps(v)
	if err != nil {
		return nil, err
	}
	return &roomClaim{user: user, claim: c, ops: o}, nil
}

// roomClaimSkew is what a claim adds to its end (helpers.lua's rooms(),
// SKEW): the scores in the due set are the claim's end plus it.
const roomClaimSkew = 1000

func (s *Store) roomTag(room string) string {
	return s.roomShardTag(int(fnv32a(room) % uint32(len(s.shards))))
}

func (s *Store) roomShardTag(i int) string { return s.prefix + "{r" + strconv.Itoa(i) + "}" }

// roomFloor is the key of room shard i's floor.
func (s *Store) roomFloor(i int) string { return s.roomShardTag(i) + "floor" }

// roomKeys returns the keys of room's scripts: members, versions, floor.
func (s *Store) roomKeys(room string) []string {
	tag := s.roomTag(room)
	return []string{tag + "z:" + room, tag + "v", tag + "floor"}
}

// applyRooms applies the claimed ops, acknowledges them and applies what
// the acknowledgements hand over, until none is left, and returns the
// joins and leaves they made, with the first error (a claim whose ops
// failed is not acknowledged: a sweep applies them once it lapses). One
// round trip applies every claim's ops, one acknowledges them.
func (s *Store) applyRooms(ctx context.Context, now int64, claims []*roomClaim) ([]presence.RoomEvent, error) {
	var evs []presence.RoomEvent
	var firstErr error
	for len(claims) > 0 {
		type applied struct {
			c  *roomClaim
			op roomOp
		}
		var execs []rueidis.LuaExec
		var what []applied
		for _, c := range claims {
			// The last op of each room decides it (ops are absolute): one
			// call a room, each of one slot.
			last := map[string]int{}
			for i, op := range c.ops {
				last[op.room] = i
			}
			for i, op := range c.ops {
				if last[op.room] != i {
					continue
				}
				execs = append(execs, s.roomApplyExec(now, c, op))
				what = append(what, applied{c: c, op: op})
			}
		}
		ok := make(map[*roomClaim]bool, len(claims))
		for _, c := range claims {
			ok[c] = true
		}
		for i, r := range s.roomApply.execMulti(ctx, s.c, execs...) {
			w := what[i]
			arr, err := r.ToArray()
			if err == nil && len(arr) == 0 {
				err = errors.New("empty reply")
			}
			if err != nil {
				firstErr = firstOf(firstErr, wrapErr("apply room ops", s.roomApply.err(err)))
				ok[w.c] = false
				continue
			}
			switch code, _ := arr[0].AsInt64(); code {
			case -1:
				ok[w.c] = false // the claim ended: another node applies them
			case 1:
				if len(arr) != 3 {
					firstErr = firstOf(firstErr, wrapErr("apply room ops", fmt.Errorf("reply of %d elements", len(arr))))
					continue
				}
				n, _ := arr[1].AsInt64()
				vs, _ := arr[2].ToString()
				v, _ := strconv.ParseUint(vs, 10, 64)
				ev := presence.RoomEvent{Room: w.op.room, UserID: w.c.user, Kind: presence.RoomLeave, Reason: w.op.reason,
					Count: int(n), Version: v, At: w.op.at}
				if w.op.counted {
					ev.Kind, ev.Status, ev.Settings = presence.RoomJoin, w.op.status, w.op.settings
				}
				evs = append(evs, ev)
			}
		}
		var acks []rueidis.LuaExec
		var acked []*roomClaim
		for _, c := range claims {
			if !ok[c] || len(c.ops) == 0 {
				continue
			}
			sk := &s.shards[s.shardIndex(c.user)]
			acks = append(acks, rueidis.LuaExec{Keys: []string{sk.due},
				Args: []string{c.user, i64(c.claim), i64(c.ops[len(c.ops)-1].seq), i64(now)}})
			acked = append(acked, c)
		}
		claims = claims[:0:0]
		for i, r := range s.roomAck.execMulti(ctx, s.c, acks...) {
			arr, err := r.ToArray()
			if err == nil && len(arr) == 0 {
				err = errors.New("empty reply")
			}
			if err != nil {
				firstErr = firstOf(firstErr, wrapErr("acknowledge room ops", s.roomAck.err(err)))
				continue
			}
			c, err := decodeRoomClaim(acked[i].user, arr)
			if err != nil {
				firstErr = firstOf(firstErr, wrapErr("acknowledge room ops", err))
				continue
			}
			if c != nil {
				claims = append(claims, c)
			}
		}
	}
	return evs, firstErr
}

// roomApplyExec is the call of room_apply.lua for op of claim c at now.
func (s *Store) roomApplyExec(now int64, c *roomClaim, op roomOp) rueidis.LuaExec {
	counted := "0"
	if op.counted {
		counted = "1"
	}
	return rueidis.LuaExec{Keys: s.roomKeys(op.room),
		Args: []string{i64(now), i64(c.claim - roomClaimSkew), op.room, c.user, counted}}
}

// drainRooms applies user's ops after a script marked that it made some
// (Store.change), and adds the joins and leaves to ch. An error leaves
// the ops to the sweep (their marker is due): the change itself stands.
func (s *Store) drainRooms(ctx context.Context, now int64, user string, ch *presence.Change) {
	sk := &s.shards[s.shardIndex(user)]
	arr, err := s.roomTake.Exec(ctx, s.c, []string{sk.due}, []string{user, i64(now)}).ToArray()
	if err != nil || len(arr) == 0 {
		return
	}
	c, err := decodeRoomClaim(user, arr)
	if err != nil || c == nil {
		return
	}
	evs, _ := s.applyRooms(ctx, now, []*roomClaim{c})
	ch.Rooms = append(ch.Rooms, evs...)
}

// Join implements tracker.RoomStore.
func (s *Store) Join(ctx context.Context, now int64, user, device, room string) (_ presence.RoomEvent, _ bool, err error) {
	defer callJoin.Start(ctx).Done(&err)
	return s.joinLeave(ctx, now, user, device, room, true)
}

// Leave implements tracker.RoomStore.
func (s *Store) Leave(ctx context.Context, now int64, user, device, room string) (_ presence.RoomEvent, _ bool, err error) {
	defer callLeave.Start(ctx).Done(&err)
	return s.joinLeave(ctx, now, user, device, room, false)
}

func (s *Store) joinLeave(ctx context.Context, now int64, user, device, room string, join bool) (presence.RoomEvent, bool, error) {
	op, j := "leave", "0"
	if join {
		op, j = "join", "1"
	}
	arr, err := s.roomJoin.Exec(ctx, s.c, s.userKeys(user),
		[]string{user, i64(now), device, room, j, strconv.Itoa(s.roomRules.MaxRooms)}).ToArray()
	if err == nil && len(arr) == 0 {
		err = errors.New("empty reply")
	}
	if err != nil {
		return presence.RoomEvent{}, false, wrapErr(op, s.roomJoin.err(err))
	}
	switch code, _ := arr[0].AsInt64(); code {
	case -3:
		return presence.RoomEvent{}, false, presence.ErrDeviceNotAlive
	case -4:
		return presence.RoomEvent{}, false, presence.ErrTooManyRooms
	}
	c, err := decodeRoomClaim(user, arr)
	if err != nil {
		return presence.RoomEvent{}, false, wrapErr(op, err)
	}
	var evs []presence.RoomEvent
	if c != nil {
		if evs, err = s.applyRooms(ctx, now, []*roomClaim{c}); err != nil && len(evs) == 0 {
			// The user's side is written; the ops stay in the outbox and
			// a sweep applies them once the claim lapses. Only the room's
			// master failed: not an outage of the user's part.
			return presence.RoomEvent{}, false, &tracker.PartialError{Err: err}
		}
	}
	// The event of this room is the caller's; others (ops of the user an
	// earlier call left to the sweep, taken with these) go out with the
	// next sweep.
	var mine *presence.RoomEvent
	for i := range evs {
		if evs[i].Room == room && mine == nil {
			mine = &evs[i]
		} else {
			s.spillRooms(evs[i])
		}
	}
	if mine != nil {
		return *mine, true, nil
	}
	p, err := s.RoomPage(ctx, room, "", 0, nil)
	if err != nil {
		return presence.RoomEvent{}, false, err
	}
	return presence.RoomEvent{Room: room, UserID: user, Count: p.Count, Version: p.Version, At: now}, false, nil
}

// RoomPage implements tracker.RoomStore: members in the order of user ids.
func (s *Store) RoomPage(ctx context.Context, room, after string, limit int, out []string) (_ tracker.RoomPage, err error) {
	defer callRoomPage.Start(ctx).Done(&err)
	arr, err := s.roomRead.Exec(ctx, s.c, s.roomKeys(room), []string{room, after, strconv.Itoa(max(limit, 0))}).ToArray()
	if err == nil && len(arr) < 3 {
		err = fmt.Errorf("reply of %d elements", len(arr))
	}
	if err != nil {
		return tracker.RoomPage{}, wrapErr("read room", s.roomRead.err(err))
	}
	n, _ := arr[0].AsInt64()
	vs, _ := arr[1].ToString()
	v, _ := strconv.ParseUint(vs, 10, 64)
	more, _ := arr[2].AsInt64()
	p := tracker.RoomPage{Members: out[:0], Count: int(n), Version: v, More: more == 1}
	for _, m := range arr[3:] {
		id, err := m.ToString()
		if err != nil {
			return tracker.RoomPage{}, wrapErr("read room", err)
		}
		p.Members = append(p.Members, id)
	}
	return p, nil
}

// RoomCounts implements tracker.RoomStore: one ZCARD a room, in one
// pipelined round trip.
func (s *Store) RoomCounts(ctx context.Context, rooms []string, out []int) (_ []int, err error) {
	defer callRoomCounts.Start(ctx).Done(&err)
	if len(rooms) == 0 {
		return out, nil
	}
	cmds := make(rueidis.Commands, len(rooms))
	for i, room := range rooms {
		cmds[i] = s.c.B().Zcard().Key(s.roomKeys(room)[0]).Build()
	}
	for _, r := range s.c.DoMulti(ctx, cmds...) {
		n, err := r.AsInt64()
		if err != nil {
			return out, wrapErr("count rooms", err)
		}
		out = append(out, int(n))
	}
	return out, nil
}

// spillRooms keeps joins and leaves applied by a call that cannot return
// them, for the next Expire to return.
func (s *Store) spillRooms(evs ...presence.RoomEvent) {
	s.spillMu.Lock()
	s.spill = append(s.spill, evs...)
	s.spillMu.Unlock()
}

// takeSpilled appends the kept joins and leaves to out as one Change.
func (s *Store) takeSpilled(out []presence.Change) []presence.Change {
	s.spillMu.Lock()
	defer s.spillMu.Unlock()
	if len(s.spill) == 0 {
		return out
	}
	out = append(out, presence.Change{Rooms: s.spill})
	s.spill = nil
	return out
}

// appendRoomClaim decodes an entry of expire.lua's reply that is a
// user's claimed room ops ({marker, claim, ops}); ok is false for a
// change of a user.
func appendRoomClaim(claims []*roomClaim, m rueidis.RedisMessage) (_ []*roomClaim, ok bool, err error) {
	arr, err := m.ToArray()
	if err != nil || len(arr) != 3 {
		return claims, false, nil
	}
	id, err := arr[0].ToString()
	if err != nil || !strings.HasPrefix(id, "\x01") {
		return claims, false, nil
	}
	c, err := decodeRoomOps(id[1:], arr[1], arr[2])
	if err != nil {
		return claims, true, err
	}
	return append(claims, c), true, nil
}

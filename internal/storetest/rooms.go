package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// RoomFactory returns a new empty store with rooms that applies rules and
// roomRules.
type RoomFactory func(t *testing.T, rules presence.Rules, roomRules presence.RoomRules) tracker.Store

// RunRooms runs the conformance suite of rooms (tracker.RoomStore)
// against the stores newStore returns: who is a member when, the events
// of every way a device leaves, invisibility, limits, pages, versions.
func RunRooms(t *testing.T, newStore RoomFactory) {
	tests := []struct {
		name  string
		fn    func(t *testing.T, r *rh)
		grace time.Duration // 0: 5 s
	}{
		{name: "JoinNeedsAliveDevice", fn: testRoomJoinNeedsAliveDevice},
		{name: "JoinAndLeave", fn: testRoomJoinAndLeave},
		{name: "TwoDevicesOneMember", fn: testRoomTwoDevicesOneMember},
		{name: "ByeLeaves", fn: testRoomByeLeaves},
		{name: "CloseGraceLeaves", fn: testRoomCloseGraceLeaves},
		{name: "NoCloseGraceLeavesAtTheClose", fn: testRoomNoCloseGraceLeaves, grace: presence.NoCloseGrace},
		{name: "ReconnectInGraceShowsNothing", fn: testRoomReconnectInGrace},
		{name: "TTLLeaves", fn: testRoomTTLLeaves},
		{name: "InvisibleLeavesAndComesBack", fn: testRoomInvisible},
		{name: "JoinWhileInvisible", fn: testRoomJoinWhileInvisible},
		{name: "MaxRooms", fn: testRoomMaxRooms},
		{name: "Pages", fn: testRoomPages},
		{name: "VersionsNeverRepeat", fn: testRoomVersionsNeverRepeat},
		{name: "Counts", fn: testRoomCounts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rules := DefaultRules
			rules.CloseGrace = 5 * time.Second
			if tc.grace != 0 {
				rules.CloseGrace = tc.grace
			}
			rules.Epoch = 7
			s := newStore(t, rules, presence.RoomRules{MaxRooms: 3})
			rs, ok := s.(tracker.RoomStore)
			if !ok {
				t.Fatalf("%T has no rooms (tracker.RoomStore)", s)
			}
			h := newH(t, func(*testing.T, presence.Rules) tracker.Store { return s }, rules)
			tc.fn(t, &rh{h: h, rs: rs})
		})
	}
}

// rh is a store with rooms under test.
type rh struct {
	*h
	rs tracker.RoomStore
}

func (r *rh) join(now int64, user, device, room string) (presence.RoomEvent, bool) {
	r.t.Helper()
	ev, changed, err := r.rs.Join(r.ctx, now, user, device, room)
	if err != nil {
		r.t.Fatalf("Join(%s/%s, %s): %v", user, device, room, err)
	}
	return ev, changed
}

func (r *rh) leave(now int64, user, device, room string) (presence.RoomEvent, bool) {
	r.t.Helper()
	ev, changed, err := r.rs.Leave(r.ctx, now, user, device, room)
	if err != nil {
		r.t.Fatalf("Leave(%s/%s, %s): %v", user, device, room, err)
	}
	return ev, changed
}

// members reads every page of room (pages of size per) and its count.
func (r *rh) members(room string, per int) ([]string, int) {
	r.t.Helper()
	var all []string
	after := ""
	n := -1
	for range 10000 {
		p, err := r.rs.RoomPage(r.ctx, room, after, per, nil)
		if err != nil {
			r.t.Fatalf("RoomPage(%s): %v", room, err)
		}
		if len(p.Members) > per {
			r.t.Fatalf("RoomPage(%s, limit %d) gave %d", room, per, len(p.Members))
		}
		all = append(all, p.Members...)
		n = p.Count
		if !p.More {
			return all, n
		}
		if len(p.Members) == 0 {
			r.t.Fatalf("RoomPage(%s) said more but gave none", room)
		}
		after = p.Members[len(p.Members)-1]
	}
	r.t.Fatalf("RoomPage(%s) never ended", room)
	return nil, 0
}

// is checks the members and count of room.
func (r *rh) is(room string, want ...string) {
	r.t.Helper()
	got, n := r.members(room, 2)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || n != len(want) {
		r.t.Fatalf("room %s: members %v count %d, want %v", room, got, n, want)
	}
}

// fmtRooms formats room events as "kind room user reason count".
func fmtRooms(evs []presence.RoomEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%s %s %s %s %d", e.Kind, e.Room, e.UserID, e.Reason, e.Count))
	}
	slices.Sort(out)
	return out
}

// roomsOf gathers the room events of changes.
func roomsOf(chs ...presence.Change) []string {
	var evs []presence.RoomEvent
	for _, ch := range chs {
		evs = append(evs, ch.Rooms...)
	}
	return fmtRooms(evs)
}

func wantRooms(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: room events\n got %q\nwant %q", what, got, want)
	}
}

func testRoomJoinNeedsAliveDevice(t *testing.T, r *rh) {
	if _, _, err := r.rs.Join(r.ctx, t0, "alice", "phone", "doc"); !errors.Is(err, presence.ErrDeviceNotAlive) {
		t.Fatalf("join of an unknown user: %v, want ErrDeviceNotAlive", err)
	}
	r.h.join(t0, "alice", "phone")
	if _, _, err := r.rs.Join(r.ctx, t0, "alice", "laptop", "doc"); !errors.Is(err, presence.ErrDeviceNotAlive) {
		t.Fatalf("join of a device that never beat: %v, want ErrDeviceNotAlive", err)
	}
	if _, _, err := r.rs.Join(r.ctx, t0+r.ttl(), "alice", "phone", "doc"); !errors.Is(err, presence.ErrDeviceNotAlive) {
		t.Fatalf("join of a device whose ttl ran out: %v, want ErrDeviceNotAlive", err)
	}
	r.is("doc")
}

func testRoomJoinAndLeave(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.h.join(t0, "bob", "phone")
	ev, ok := r.join(t0+1, "alice", "phone", "doc")
	if !ok || ev.Kind != presence.RoomJoin || ev.Reason != presence.ReasonJoined || ev.Count != 1 ||
		ev.UserID != "alice" || ev.Room != "doc" || ev.At != t0+1 || ev.Version <= 7<<32 {
		t.Fatalf("alice's join: %+v %v", ev, ok)
	}
	if _, ok := r.join(t0+2, "alice", "phone", "doc"); ok {
		t.Fatalf("a second join of the same device was an event")
	}
	ev2, ok := r.join(t0+3, "bob", "phone", "doc")
	if !ok || ev2.Count != 2 || ev2.Version != ev.Version+1 {
		t.Fatalf("bob's join: %+v after %+v", ev2, ev)
	}
	r.is("doc", "alice", "bob")
	ev3, ok := r.leave(t0+4, "alice", "phone", "doc")
	if !ok || ev3.Kind != presence.RoomLeave || ev3.Reason != presence.ReasonLeft || ev3.Count != 1 || ev3.Version != ev2.Version+1 {
		t.Fatalf("alice's leave: %+v", ev3)
	}
	if _, ok := r.leave(t0+5, "alice", "phone", "doc"); ok {
		t.Fatalf("leaving a room the device is not in was an event")
	}
	if _, ok := r.leave(t0+5, "nobody", "phone", "doc"); ok {
		t.Fatalf("an unknown user's leave was an event")
	}
	r.is("doc", "bob")
}

func testRoomTwoDevicesOneMember(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.beat(t0, "alice", "laptop", true)
	if _, ok := r.join(t0, "alice", "phone", "doc"); !ok {
		t.Fatal("first device's join was no event")
	}
	if _, ok := r.join(t0, "alice", "laptop", "doc"); ok {
		t.Fatal("the second device of a member joining was an event")
	}
	r.is("doc", "alice")
	if _, ok := r.leave(t0, "alice", "phone", "doc"); ok {
		t.Fatal("a member leaving with another device in the room was an event")
	}
	r.is("doc", "alice")
	// The other device's bye is the leave.
	wantRooms(t, "laptop's bye", roomsOf(r.bye(t0+sec, "alice", "laptop")), "leave doc alice bye 0")
	r.is("doc")
}

func testRoomByeLeaves(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.beat(t0, "alice", "laptop", true)
	r.join(t0, "alice", "phone", "a")
	r.join(t0, "alice", "phone", "b")
	r.join(t0, "alice", "laptop", "b")
	r.join(t0, "alice", "laptop", "c")
	wantRooms(t, "phone's bye", roomsOf(r.bye(t0+sec, "alice", "phone")), "leave a alice bye 0")
	r.is("a")
	r.is("b", "alice")
	ch := r.bye(t0+2*sec, "alice", "laptop")
	if !ch.Changed || ch.Event.Status != presence.Offline {
		t.Fatalf("the last device's bye: %+v", ch.Event)
	}
	wantRooms(t, "laptop's bye", roomsOf(ch), "leave b alice bye 0", "leave c alice bye 0")
	r.is("b")
	r.is("c")
	wantRooms(t, "a sweep after", roomsOf(r.expire(t0+time1h)...))
}

const time1h = 60 * minute

func testRoomCloseGraceLeaves(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.h.join(t0, "bob", "phone")
	r.join(t0, "alice", "phone", "doc")
	r.join(t0, "bob", "phone", "doc")
	disconnect(t, r, t0+sec, "alice", "phone", t0)
	r.is("doc", "alice", "bob") // within the grace: still there
	wantRooms(t, "a sweep within the grace", roomsOf(r.expire(t0+5*sec)...))
	wantRooms(t, "the sweep after the grace", roomsOf(r.expire(t0+6*sec)...), "leave doc alice ended 1")
	r.is("doc", "bob")
}

// With the grace off a socket closed without a bye leaves its rooms at
// the close.
func testRoomNoCloseGraceLeaves(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.h.join(t0, "bob", "phone")
	r.join(t0, "alice", "phone", "doc")
	r.join(t0, "bob", "phone", "doc")
	wantRooms(t, "the close", roomsOf(disconnect(t, r, t0+sec, "alice", "phone", t0)), "leave doc alice ended 1")
	r.is("doc", "bob")
	wantRooms(t, "a sweep after", roomsOf(r.expire(t0+2*sec)...))
}

func disconnect(t *testing.T, r *rh, now int64, user, device string, since int64) presence.Change {
	t.Helper()
	ch, err := r.s.Disconnect(r.ctx, now, user, device, since)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func testRoomReconnectInGrace(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.join(t0, "alice", "phone", "doc")
	disconnect(t, r, t0+sec, "alice", "phone", t0)
	if ch := r.beat(t0+3*sec, "alice", "phone", true); len(ch.Rooms) > 0 {
		t.Fatalf("a reconnect within the grace: %v", roomsOf(ch))
	}
	wantRooms(t, "sweeps after the reconnect", roomsOf(r.expire(t0+10*sec)...))
	r.is("doc", "alice")
}

func testRoomTTLLeaves(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.beat(t0, "alice", "laptop", true)
	r.join(t0, "alice", "phone", "doc")
	r.join(t0, "alice", "laptop", "doc")
	r.join(t0, "alice", "laptop", "other")
	// The phone stops beating; the laptop goes on.
	r.beat(t0+20*sec, "alice", "laptop", true)
	wantRooms(t, "the phone's ttl", roomsOf(r.expire(t0+r.ttl())...))
	r.is("doc", "alice")
	// A beat of the laptop after the phone's ttl ends the phone too.
	r.beat(t0+40*sec, "alice", "laptop", true)
	r.is("doc", "alice")
	evs := roomsOf(r.expire(t0 + 40*sec + r.ttl())...)
	wantRooms(t, "the laptop's ttl", evs, "leave doc alice ended 0", "leave other alice ended 0")
	r.is("doc")
	r.is("other")
}

func testRoomInvisible(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.h.join(t0, "bob", "phone")
	r.join(t0, "alice", "phone", "a")
	r.join(t0, "alice", "phone", "b")
	r.join(t0, "bob", "phone", "a")
	ch := r.status(t0+sec, "alice", presence.ManualInvisible, "")
	wantRooms(t, "going invisible", roomsOf(ch), "leave a alice invisible 1", "leave b alice invisible 0")
	r.is("a", "bob")
	r.is("b")
	ch = r.status(t0+2*sec, "alice", presence.ManualBusy, "")
	wantRooms(t, "coming back", roomsOf(ch), "join a alice visible 2", "join b alice visible 1")
	r.is("a", "alice", "bob")
	// Busy to away: no membership change.
	wantRooms(t, "busy to away", roomsOf(r.status(t0+3*sec, "alice", presence.ManualAway, "")))
	// Invisible, then the device ends: no second leave.
	r.status(t0+4*sec, "alice", presence.ManualInvisible, "")
	wantRooms(t, "an invisible user's bye", roomsOf(r.bye(t0+5*sec, "alice", "phone")))
	r.status(t0+6*sec, "alice", presence.ManualNone, "")
	r.is("a", "bob")
	r.is("b")
}

func testRoomJoinWhileInvisible(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.status(t0, "alice", presence.ManualInvisible, "")
	if _, ok := r.join(t0+sec, "alice", "phone", "doc"); ok {
		t.Fatal("an invisible user's join was an event")
	}
	r.is("doc")
	if n, _ := r.rs.RoomCounts(r.ctx, []string{"doc"}, nil); n[0] != 0 {
		t.Fatalf("an invisible user counted: %v", n)
	}
	wantRooms(t, "coming back", roomsOf(r.status(t0+2*sec, "alice", presence.ManualNone, "")), "join doc alice visible 1")
	r.is("doc", "alice")
}

func testRoomMaxRooms(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.beat(t0, "alice", "laptop", true)
	for _, room := range []string{"a", "b", "c"} {
		r.join(t0, "alice", "phone", room)
	}
	if _, _, err := r.rs.Join(r.ctx, t0, "alice", "phone", "d"); !errors.Is(err, presence.ErrTooManyRooms) {
		t.Fatalf("a fourth room with a cap of 3: %v", err)
	}
	r.is("d")
	r.join(t0, "alice", "phone", "a")  // a room it is in already is no new one
	r.join(t0, "alice", "laptop", "d") // the cap is per device
	r.leave(t0, "alice", "phone", "a")
	r.join(t0, "alice", "phone", "e")
	r.is("e", "alice")
}

func testRoomPages(t *testing.T, r *rh) {
	var want []string
	for i := range 25 {
		u := fmt.Sprintf("user-%02d", i)
		r.h.join(t0, u, "d")
		r.join(t0, u, "d", "big")
		want = append(want, u)
	}
	for _, per := range []int{1, 3, 7, 25, 100} {
		got, n := r.members("big", per)
		if len(got) != 25 || n != 25 {
			t.Fatalf("pages of %d: %d members (count %d)", per, len(got), n)
		}
		seen := map[string]bool{}
		for _, u := range got {
			if seen[u] {
				t.Fatalf("pages of %d list %s twice: %v", per, u, got)
			}
			seen[u] = true
		}
	}
	// Members present throughout a paging are listed exactly once
	// whatever joins and leaves between pages.
	var got []string
	after := ""
	for step := 0; ; step++ {
		p, err := r.rs.RoomPage(r.ctx, "big", after, 4, nil)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.Members...)
		u := fmt.Sprintf("late-%02d", step)
		r.h.join(t0, u, "d")
		r.join(t0, u, "d", "big")
		if step < 5 {
			r.leave(t0, fmt.Sprintf("user-%02d", 20+step), "d", "big")
		}
		if !p.More {
			break
		}
		after = p.Members[len(p.Members)-1]
	}
	count := map[string]int{}
	for _, u := range got {
		count[u]++
	}
	for _, u := range want[:20] {
		if count[u] != 1 {
			t.Fatalf("%s, a member throughout, listed %d times: %v", u, count[u], got)
		}
	}
	for u, n := range count {
		if n > 1 {
			t.Fatalf("%s listed %d times", u, n)
		}
	}
	if strings.Join(got, ",") == "" {
		t.Fatal("no members read")
	}
}

func testRoomVersionsNeverRepeat(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	ev1, _ := r.join(t0, "alice", "phone", "doc")
	ev2, _ := r.leave(t0, "alice", "phone", "doc")
	r.is("doc")
	if p, err := r.rs.RoomPage(r.ctx, "doc", "", 10, nil); err != nil || p.Version != 0 || p.Count != 0 {
		t.Fatalf("an emptied room reads %+v, %v; want no room: version 0", p, err)
	}
	ev3, _ := r.join(t0, "alice", "phone", "doc") // the room anew
	if !(ev1.Version < ev2.Version && ev2.Version < ev3.Version) {
		t.Fatalf("versions of a room emptied and made again: %d %d %d", ev1.Version, ev2.Version, ev3.Version)
	}
	if ev1.Version <= 7<<32 {
		t.Fatalf("version %d not above the epoch's floor", ev1.Version)
	}
}

func testRoomCounts(t *testing.T, r *rh) {
	r.h.join(t0, "alice", "phone")
	r.h.join(t0, "bob", "phone")
	r.join(t0, "alice", "phone", "a")
	r.join(t0, "bob", "phone", "a")
	r.join(t0, "bob", "phone", "b")
	n, err := r.rs.RoomCounts(r.ctx, []string{"a", "b", "none"}, nil)
	if err != nil || !slices.Equal(n, []int{2, 1, 0}) {
		t.Fatalf("counts: %v %v", n, err)
	}
}

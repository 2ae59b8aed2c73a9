package client

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

func TestDiffRoom(t *testing.T) {
	for _, tc := range []struct {
		name       string
		old, fresh map[string]Status
		want       []string
	}{
		{"same", map[string]Status{"a": Online, "b": Hidden}, map[string]Status{"a": Online, "b": Hidden}, nil},
		{"empty to empty", nil, map[string]Status{}, nil},
		{"left, joined, changed", map[string]Status{"a": Online, "b": Busy, "c": Online}, map[string]Status{"c": Away, "d": Hidden, "a": Online},
			[]string{"leave b  2", "join d  3", "status c away 3"}},
		{"all gone", map[string]Status{"b": Online, "a": Online}, map[string]Status{}, []string{"leave a  1", "leave b  0"}},
	} {
		var got []string
		for _, ch := range diffRoom("r", tc.old, len(tc.old), tc.fresh, 9) {
			if ch.Room != "r" || ch.Version != 9 || !ch.Snapshot {
				t.Errorf("%s: change %+v, want room r, version 9, Snapshot", tc.name, ch)
			}
			got = append(got, fmt.Sprintf("%s %s %s %d", ch.Kind, ch.UserID, ch.Status, ch.Count))
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: diff = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A room's changes are never coalesced nor dropped, until the application
// lets too many wait: then one snapshot of the room stands for them, at
// the end, and other updates keep their place.
func TestQueueRoomBacklogGivesWayToSnapshot(t *testing.T) {
	q := newQueue()
	snaps := 0
	snap := func() RoomSnapshot { snaps++; return RoomSnapshot{Room: "r", Count: 7} }
	q.pushRoom("other", RoomChange{Room: "other", UserID: "x"}, nil)
	for i := range maxRoomBacklog {
		q.pushRoom("r", RoomChange{Room: "r", UserID: fmt.Sprint(i)}, snap)
	}
	q.push(Event{UserID: "u", Version: 1})
	if snaps != 0 {
		t.Fatalf("a snapshot at %d changes waiting, want none until more than %d", maxRoomBacklog, maxRoomBacklog)
	}
	q.pushRoom("r", RoomChange{Room: "r", UserID: "last"}, snap)
	want := []string{"RoomChange other x", "Event u", "RoomSnapshot r 7"}
	var got []string
	for {
		u, ok := q.pop()
		if !ok {
			break
		}
		switch u := u.(type) {
		case RoomChange:
			got = append(got, "RoomChange "+u.Room+" "+u.UserID)
		case RoomSnapshot:
			got = append(got, fmt.Sprintf("RoomSnapshot %s %d", u.Room, u.Count))
		case Event:
			got = append(got, "Event "+u.UserID)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || snaps != 1 {
		t.Fatalf("popped %q (%d snapshots taken), want %q", got, snaps, want)
	}
	if len(q.rooms) != 0 {
		t.Fatalf("room counts left after draining: %v", q.rooms)
	}
	// Unwatching drops what waits of the room.
	q.pushRoom("r", RoomChange{Room: "r", UserID: "a"}, snap)
	q.pushRoom("s", RoomChange{Room: "s", UserID: "b"}, snap)
	q.dropRoom("r")
	if u, _ := q.pop(); u.(RoomChange).Room != "s" {
		t.Fatalf("after dropRoom(r): %+v", u)
	}
}

// After a reconnect the client sends again, in order, the leaves recorded
// while away, its joins and its watches, and nothing that went out on the
// connection already; the fresh room message that matches its view
// delivers nothing.
func TestRoomsSentAgainOnReconnect(t *testing.T) {
	f := newFake(t)
	// The reconnect comes a second or more after the close, so the leave
	// and join made while away are recorded before it even on a loaded
	// machine.
	c := f.dial(t, Config{MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second})
	ctx := context.Background()
	wantState(t, c, Connected)
	c0 := f.conn(0)
	for _, step := range []struct {
		op   func(context.Context, string) error
		room string
		want string
	}{
		{c.Join, "a", "join"},
		{c.Join, "b", "join"},
		{c.Join, "a", ""}, // joined already
		{c.WatchRoom, "w", "watch_room"},
		{c.WatchRoom, "w", ""},
		{c.Leave, "b", "leave"},
		{c.Leave, "b", ""}, // not joined
		{c.WatchRoom, "x", "watch_room"},
		{c.UnwatchRoom, "x", "unwatch_room"},
	} {
		if err := step.op(ctx, step.room); err != nil {
			t.Fatal(err)
		}
		if step.want != "" {
			if m := c0.next(t, step.want); m["room"] != step.room || len(m) != 2 {
				t.Fatalf("sent %v, want a %s of %s", m, step.want, step.room)
			}
		}
	}
	c0.send(map[string]any{"type": "room", "room": "w", "mode": "events", "count": 2,
		"members": map[string]any{"p": "online", "q": nil}, "next": nil, "version": 4})
	if u := nextUpdate(t, c); fmt.Sprintf("%+v", u) != "{Room:w Mode:events Count:2 Members:map[p:online q:] Partial:false Next: Version:4}" {
		t.Fatalf("update = %+v, want the snapshot of w", u)
	}
	c0.send(map[string]any{"type": "room_change", "room": "x", "user_id": "p", "event": "join", "status": "online", "count": 1, "version": 1})
	c0.send(map[string]any{"type": "room_change", "room": "w", "user_id": "q", "event": "status", "status": "busy", "count": 2, "version": 4})
	if u := nextUpdate(t, c); fmt.Sprintf("%+v", u) != "{Room:w UserID:q Kind:status Status:busy Count:2 Version:4 Snapshot:false}" {
		t.Fatalf("update = %+v, want q busy in w (nothing of the unwatched x)", u)
	}

	c0.nc.Close()
	wantState(t, c, Disconnected)
	// What changes while the client is away is sent on the reconnect.
	if err := c.Leave(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Join(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	wantState(t, c, Connected)
	c1 := f.conn(1)
	for _, want := range []string{"leave a", "join c", "watch_room w"} {
		m := c1.next(t, want[:len(want)-2])
		if got := fmt.Sprint(m["type"], " ", m["room"]); got != want {
			t.Fatalf("sent %q after the reconnect, want %q", got, want)
		}
	}
	c1.send(map[string]any{"type": "room", "room": "w", "mode": "events", "count": 2,
		"members": map[string]any{"p": "online", "q": "busy"}, "next": nil, "version": 4})
	c1.send(map[string]any{"type": "room", "room": "w", "mode": "events", "count": 1,
		"members": map[string]any{"q": "busy"}, "next": nil, "version": 5})
	// The first room message matches the view: nothing; the second lost p.
	if u := nextUpdate(t, c); fmt.Sprintf("%+v", u) != "{Room:w UserID:p Kind:leave Status: Count:1 Version:5 Snapshot:true}" {
		t.Fatalf("update = %+v, want p's leave found by the snapshot", u)
	}
	select {
	case m := <-c1.msgs:
		if m["type"] != "heartbeat" {
			t.Fatalf("sent %v after the rooms, want nothing more", m)
		}
	case <-time.After(100 * time.Millisecond):
	}
	if got := fmt.Sprint(c.JoinedRooms(), c.WatchedRooms()); got != "[c] [w]" {
		t.Fatalf("rooms = %s, want [c] [w]", got)
	}
}

// A room in interval mode: its room message says so, each room_interval
// becomes a RoomInterval and moves the view (joined added with no status,
// left taken out); a room message in the other mode is a RoomSnapshot;
// after a reconnect the fresh room message is told as a RoomInterval of
// what differs, or as nothing.
func TestRoomIntervalMode(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{})
	ctx := context.Background()
	wantState(t, c, Connected)
	if err := c.WatchRoom(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	c0 := f.conn(0)
	c0.next(t, "watch_room")
	view := func() string {
		t.Helper()
		r, ok := c.Room("big")
		if !ok {
			t.Fatal("Room(big): not held")
		}
		var members []string
		for _, id := range slices.Sorted(maps.Keys(r.Members)) {
			members = append(members, id+":"+string(r.Members[id]))
		}
		return fmt.Sprintf("%s n%d %v next %q v%d", r.Mode, r.Count, members, r.Next, r.Version)
	}
	wantUpdate := func(want string) {
		t.Helper()
		if u := nextUpdate(t, c); fmt.Sprintf("%+v", u) != want {
			t.Fatalf("update = %+v\nwant     %s", u, want)
		}
	}
	c0.send(map[string]any{"type": "room", "room": "big", "mode": "interval", "count": 1500,
		"members": map[string]any{"a": "online", "b": nil}, "next": "b", "version": 40})
	wantUpdate("{Room:big Mode:interval Count:1500 Members:map[a:online b:] Partial:true Next:b Version:40}")
	c0.send(map[string]any{"type": "room_interval", "room": "big", "count": 1501,
		"joined": []string{"c", "d"}, "left": []string{"a"}, "more_joined": 3, "more_left": 2, "version": 47})
	wantUpdate("{Room:big Count:1501 Joined:[c d] Left:[a] MoreJoined:3 MoreLeft:2 Version:47 Snapshot:false}")
	if got := view(); got != `interval n1501 [b: c: d:] next "b" v47` {
		t.Fatalf("view after the interval: %s", got)
	}
	c0.send(map[string]any{"type": "room_interval", "room": "other", "count": 5, "joined": []string{"x"}, "left": []string{}, "more_joined": 0, "more_left": 0, "version": 3})

	// Back to events mode: the room message stands for itself.
	c0.send(map[string]any{"type": "room", "room": "big", "mode": "events", "count": 2,
		"members": map[string]any{"b": "busy", "c": "online"}, "next": nil, "version": 90})
	wantUpdate("{Room:big Mode:events Count:2 Members:map[b:busy c:online] Partial:false Next: Version:90}")
	// And into interval mode again, every member listed.
	c0.send(map[string]any{"type": "room", "room": "big", "mode": "interval", "count": 3,
		"members": map[string]any{"b": "busy", "c": "online", "e": "away"}, "next": nil, "version": 91})
	wantUpdate("{Room:big Mode:interval Count:3 Members:map[b:busy c:online e:away] Partial:false Next: Version:91}")

	c0.nc.Close()
	wantState(t, c, Disconnected)
	wantState(t, c, Connected)
	c1 := f.conn(1)
	c1.next(t, "watch_room")
	// The same room: nothing. Then one left, one joined, one changed its
	// status (the view takes it; interval mode tells no status).
	c1.send(map[string]any{"type": "room", "room": "big", "mode": "interval", "count": 3,
		"members": map[string]any{"b": "busy", "c": "online", "e": "away"}, "next": nil, "version": 91})
	c1.send(map[string]any{"type": "room", "room": "big", "mode": "interval", "count": 3,
		"members": map[string]any{"b": "online", "e": "away", "f": nil}, "next": nil, "version": 93})
	wantUpdate("{Room:big Count:3 Joined:[f] Left:[c] MoreJoined:0 MoreLeft:0 Version:93 Snapshot:true}")
	if got := view(); got != `interval n3 [b:online e:away f:] next "" v93` {
		t.Fatalf("view after the reconnect: %s", got)
	}
}

// A leave refused (unavailable) before the client noted it as sent — the
// server answers that fast — is still sent again after the backoff.
func TestLeaveRefusedBeforeItsSendReturned(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	ctx := context.Background()
	wantState(t, c, Connected)
	c0 := f.conn(0)
	if err := c.Join(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	c0.next(t, "join")
	afterRoomSend = func(typ, room string) {
		if typ != "leave" {
			return
		}
		c0.next(t, "leave")
		c0.send(map[string]any{"type": "error", "code": "unavailable", "message": "the state store is down",
			"request": "leave", "room": room})
		if se, ok := nextUpdate(t, c).(*ServerError); !ok || se.Code != "unavailable" {
			t.Errorf("update = %#v, want the leave refused", se)
		}
	}
	t.Cleanup(func() { afterRoomSend = nil })
	if err := c.Leave(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	afterRoomSend = nil
	if m := c0.next(t, "leave"); m["room"] != "doc" {
		t.Fatalf("sent %v, want the leave of doc again", m)
	}
}

// A room change of status that the view holds already (the server sent
// the room message read after the change, and the change after it) is
// no update; a change of it is.
func TestRoomStatusAlreadyHeld(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{})
	ctx := context.Background()
	wantState(t, c, Connected)
	if err := c.WatchRoom(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	c0 := f.conn(0)
	c0.next(t, "watch_room")
	c0.send(map[string]any{"type": "room", "room": "doc", "mode": "events", "count": 1,
		"members": map[string]any{"a": "online"}, "next": nil, "version": 7})
	if u := nextUpdate(t, c); fmt.Sprintf("%+v", u) != "{Room:doc Mode:events Count:1 Members:map[a:online] Partial:false Next: Version:7}" {
		t.Fatalf("update = %+v", u)
	}
	c0.send(map[string]any{"type": "room_change", "room": "doc", "event": "status", "user_id": "a", "status": "online", "count": 1, "version": 7})
	c0.send(map[string]any{"type": "room_change", "room": "doc", "event": "status", "user_id": "a", "status": "busy", "count": 1, "version": 7})
	if u := nextUpdate(t, c); fmt.Sprintf("%+v", u) != "{Room:doc UserID:a Kind:status Status:busy Count:1 Version:7 Snapshot:false}" {
		t.Fatalf("update = %+v, want only the change to busy", u)
	}
	if r, _ := c.Room("doc"); r.Members["a"] != Busy {
		t.Fatalf("view %+v", r)
	}
}

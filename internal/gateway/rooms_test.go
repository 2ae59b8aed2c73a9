package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// roomPages are the tracker's member pages as the query reader reads them
// (the app's adapter, in small).
type roomPages struct{ tr *tracker.Tracker }

func (p roomPages) RoomPage(ctx context.Context, room, after string, limit int, out []string) (query.RoomPage, error) {
	pg, err := p.tr.RoomPage(ctx, room, after, limit, out)
	return query.RoomPage{Members: pg.Members, Count: pg.Count, Version: pg.Version, More: pg.More}, err
}

// roomSnapshots read a room for the room hub: its first page as the
// viewer sees it; and members' true states.
type roomSnapshots struct{ r *query.Reader }

func (s roomSnapshots) RoomSnapshot(ctx context.Context, viewer, room string, limit int) (fanout.RoomSnapshot, error) {
	v, err := s.r.Room(ctx, viewer, room, "", limit)
	return fanout.RoomSnapshot{Version: v.Version, Count: v.Count, Members: v.Members, Next: v.Next}, err
}

func (s roomSnapshots) MemberStates(ctx context.Context, ids []string, out []presence.Snapshot) error {
	return s.r.States(ctx, ids, out)
}

// dialRooms connects as user's device with a token whose rooms claim is
// rooms.
func (n *node) dialRooms(user, device string, rooms ...string) *client {
	n.t.Helper()
	tok, err := auth.Token{User: user, Rooms: rooms}.Sign(secret, n.clk.Now(), time.Hour)
	if err != nil {
		n.t.Fatal(err)
	}
	q := "?token=" + tok
	if device != "" {
		q += "&device_id=" + device
	}
	return n.dialQuery(q, nil)
}

// watchRoom watches room and returns its snapshot (the room message).
func (c *client) watchRoom(room string) map[string]any {
	c.t.Helper()
	c.send(`{"type":"watch_room","room":"` + room + `"}`)
	m := c.msgType("room")
	if m["room"] != room {
		c.t.Fatalf("room message %v, want room %q", m, room)
	}
	return m
}

// roomChange reads the next message, which must be the room_change event
// of user in room.
func (c *client) roomChange(room, user, event string) map[string]any {
	c.t.Helper()
	m := c.msgType("room_change")
	if m["room"] != room || m["user_id"] != user || m["event"] != event {
		c.t.Fatalf("got %v, want %s %s in %s", m, user, event, room)
	}
	return m
}

// members waits until room has k members (a join or leave sent on another
// socket is applied).
func (n *node) members(room string, k int) {
	n.t.Helper()
	testwait.For(n.t, fmt.Sprintf("room %s with %d members", room, k), func() bool {
		c, err := n.tr.RoomCounts(context.Background(), []string{room}, nil)
		return err == nil && c[0] == k
	})
}

func (n *node) sweep() {
	n.t.Helper()
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		n.t.Fatal(err)
	}
}

// A watcher of a room sees the joins and leaves of another socket's
// device, each as its own message in the room's version order; what it
// stops watching it hears no more of.
func TestRoomJoinLeaveWatch(t *testing.T) {
	n := newNode(t, opts{})
	z := n.dialRooms("zed", "", "doc-42")
	z.msgType("welcome")
	z.send(`{"type":"join","room":"doc-42"}`)
	n.members("doc-42", 1)
	a := n.dialRooms("alice", "laptop", "doc-*")
	a.msgType("welcome")
	w := n.dialRooms("bob", "phone", "doc-42")
	w.msgType("welcome")
	snap := w.watchRoom("doc-42")
	if m := snap["members"].(map[string]any); snap["count"] != 1.0 || len(m) != 1 || m["zed"] != "online" || snap["mode"] != "events" || snap["next"] != nil {
		t.Fatalf("snapshot %v", snap)
	}
	a.send(`{"type":"join","room":"doc-42"}`)
	j := w.roomChange("doc-42", "alice", "join")
	if j["status"] != "online" || j["count"] != 2.0 || j["version"].(float64) != snap["version"].(float64)+1 {
		t.Fatalf("join %v after snapshot %v", j, snap)
	}
	// A second device of the user in the room is no second member; its
	// leave is no leave of the user.
	a2 := n.dialRooms("alice", "tablet", "doc-*")
	a2.msgType("welcome")
	a2.send(`{"type":"join","room":"doc-42"}`)
	a2.send(`{"type":"leave","room":"doc-42"}`)
	a2.watchRoom("doc-42") // both applied
	w.silent(50 * time.Millisecond)
	// Join, leave and join again: every event comes, none is coalesced.
	a.send(`{"type":"leave","room":"doc-42"}`)
	a.send(`{"type":"join","room":"doc-42"}`)
	l := w.roomChange("doc-42", "alice", "leave")
	if l["status"] != nil || l["count"] != 1.0 || l["version"].(float64) <= j["version"].(float64) {
		t.Fatalf("leave %v after join %v", l, j)
	}
	j2 := w.roomChange("doc-42", "alice", "join")
	if j2["version"].(float64) <= l["version"].(float64) {
		t.Fatalf("join %v after leave %v", j2, l)
	}
	// A new watcher reads the member in its snapshot.
	w2 := n.dialRooms("carol", "", "*")
	w2.msgType("welcome")
	if m := w2.watchRoom("doc-42")["members"].(map[string]any); len(m) != 2 || m["alice"] != "online" {
		t.Fatalf("snapshot members %v", m)
	}
	// Success has no answer of its own.
	a.silent(30 * time.Millisecond)
	w.send(`{"type":"unwatch_room","room":"doc-42"}`)
	w.send(`{"type":"watch_room","room":"doc-43"}`) // after the unwatch, which has no answer
	w.errorCode("room_not_allowed")
	a.send(`{"type":"leave","room":"doc-42"}`)
	w2.roomChange("doc-42", "alice", "leave")
	w.silent(50 * time.Millisecond)
	// A bye leaves every room at once.
	a.send(`{"type":"join","room":"doc-42"}`)
	w2.roomChange("doc-42", "alice", "join")
	a.send(`{"type":"bye"}`)
	a.closed(1000)
	w2.roomChange("doc-42", "alice", "leave")
}

// A socket that closes without a bye stays in its rooms for the close
// grace: a reconnect within it shows nothing; one that does not come
// back leaves when the grace ends, long before its ttl.
func TestRoomCloseGrace(t *testing.T) {
	n := newNode(t, opts{})
	a := n.dialRooms("alice", "laptop", "r")
	a.msgType("welcome")
	a.send(`{"type":"join","room":"r"}`)
	n.members("r", 1)
	w := n.dialRooms("bob", "", "r")
	w.msgType("welcome")
	if m := w.watchRoom("r")["members"].(map[string]any); len(m) != 1 {
		t.Fatalf("members %v", m)
	}
	a.nc.Close()
	testwait.For(t, "drop", func() bool { return n.gw.Stats().Connections == 1 })
	n.clk.Advance(presence.DefaultCloseGrace - time.Millisecond)
	n.sweep()
	again := n.dialRooms("alice", "laptop", "r")
	again.msgType("welcome")
	n.clk.Advance(20 * time.Second)
	n.sweep()
	w.silent(100 * time.Millisecond)
	// Still in the room, with no join of its own.
	late := n.dialRooms("carol", "", "r")
	late.msgType("welcome")
	if m := late.watchRoom("r")["members"].(map[string]any); len(m) != 1 || m["alice"] != "online" {
		t.Fatalf("after the reconnect: members %v", m)
	}
	again.nc.Close()
	testwait.For(t, "drop", func() bool { return n.gw.Stats().Connections == 2 })
	n.clk.Advance(presence.DefaultCloseGrace - time.Millisecond)
	n.sweep()
	w.silent(50 * time.Millisecond)
	n.clk.Advance(time.Millisecond)
	n.sweep()
	if l := w.roomChange("r", "alice", "leave"); l["count"] != 0.0 {
		t.Fatalf("leave %v", l)
	}
}

// Going invisible is a leave of every room for everyone; coming back a
// join.
func TestRoomInvisible(t *testing.T) {
	n := newNode(t, opts{})
	a := n.dialRooms("alice", "", "r")
	a.msgType("welcome")
	a.send(`{"type":"join","room":"r"}`)
	n.members("r", 1)
	w := n.dialRooms("bob", "", "r")
	w.msgType("welcome")
	w.watchRoom("r")
	a.send(`{"type":"set_status","status":"invisible"}`)
	w.roomChange("r", "alice", "leave")
	a.send(`{"type":"set_status","status":"busy"}`)
	if j := w.roomChange("r", "alice", "join"); j["status"] != "busy" {
		t.Fatalf("join %v", j)
	}
}

// The closing of a watching socket removes it from the room hub.
func TestRoomWatcherGoneOnClose(t *testing.T) {
	n := newNode(t, opts{})
	w := n.dialRooms("bob", "", "a", "b")
	w.msgType("welcome")
	w.watchRoom("a")
	w.watchRoom("b")
	if s := n.rooms.Stats(); s.Watchers != 2 || s.Rooms != 2 {
		t.Fatalf("stats %+v, want 2 watchers of 2 rooms", s)
	}
	w.nc.Close()
	testwait.For(t, "the watcher removed", func() bool { s := n.rooms.Stats(); return s.Watchers == 0 && s.Rooms == 0 })
}

// A token without a rooms claim enters no room; one with a claim the
// rooms it matches; -dev without a token every room.
func TestRoomClaim(t *testing.T) {
	n := newNode(t, opts{dev: true})
	none := n.dial("1", "")
	none.msgType("welcome")
	for _, typ := range []string{"join", "leave", "watch_room", "unwatch_room"} {
		none.send(`{"type":"` + typ + `","room":"r"}`)
		m := none.msgType("error")
		if m["code"] != "room_not_allowed" || !strings.Contains(m["message"].(string), `"r"`) {
			t.Fatalf("%s without a claim: %v", typ, m)
		}
	}
	some := n.dialRooms("2", "", "team-7-*", "lobby")
	some.msgType("welcome")
	for _, room := range []string{"lobby", "team-7-", "team-7-x"} {
		some.send(`{"type":"join","room":"` + room + `"}`)
		if m := some.watchRoom(room)["members"].(map[string]any); len(m) != 1 || m["2"] != "online" {
			t.Fatalf("%s: members %v", room, m)
		}
	}
	for _, room := range []string{"lobby2", "team-8-x", "team-7"} {
		some.send(`{"type":"join","room":"` + room + `"}`)
		some.errorCode("room_not_allowed")
		some.send(`{"type":"watch_room","room":"` + room + `"}`)
		some.errorCode("room_not_allowed")
	}
	dev := n.dialQuery("?user_id=3", nil)
	dev.msgType("welcome")
	dev.send(`{"type":"join","room":"anything"}`)
	if m := dev.watchRoom("anything")["members"].(map[string]any); len(m) != 1 || m["3"] != "online" {
		t.Fatalf("members %v", m)
	}
}

// hideRooms is the node's tracker without its rooms.
type hideRooms struct{ gateway.Tracker }

// failRooms is a tracker whose rooms fail with err.
type failRooms struct {
	gateway.Tracker
	err error
}

func (f failRooms) Join(context.Context, string, string, string) (presence.RoomEvent, error) {
	return presence.RoomEvent{}, f.err
}

func (f failRooms) Leave(context.Context, string, string, string) (presence.RoomEvent, error) {
	return presence.RoomEvent{}, f.err
}

func TestRoomErrors(t *testing.T) {
	t.Run("rooms_unavailable", func(t *testing.T) {
		n := newNode(t, opts{noRooms: true, tweak: func(c *gateway.Config) { c.Tracker = hideRooms{c.Tracker} }})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		for _, typ := range []string{"join", "leave", "watch_room", "unwatch_room"} {
			c.send(`{"type":"` + typ + `","room":"r"}`)
			c.errorCode("rooms_unavailable")
		}
	})
	t.Run("rooms_unavailable from the store", func(t *testing.T) {
		n := newNode(t, opts{tweak: func(c *gateway.Config) { c.Tracker = failRooms{c.Tracker, tracker.ErrRoomsUnsupported} }})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		c.send(`{"type":"join","room":"r"}`)
		c.errorCode("rooms_unavailable")
	})
	t.Run("internal", func(t *testing.T) {
		n := newNode(t, opts{tweak: func(c *gateway.Config) { c.Tracker = failRooms{c.Tracker, errors.New("disk on fire")} }})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		c.send(`{"type":"leave","room":"r"}`)
		if m := c.msgType("error"); m["code"] != "internal" || strings.Contains(m["message"].(string), "fire") {
			t.Fatalf("error %v", m)
		}
	})
	t.Run("too_many_rooms", func(t *testing.T) {
		n := newNode(t, opts{maxRooms: 2})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		c.send(`{"type":"join","room":"a"}`)
		c.send(`{"type":"join","room":"b"}`)
		c.send(`{"type":"join","room":"a"}`) // in it already: no more
		c.send(`{"type":"join","room":"c"}`)
		c.errorCode("too_many_rooms")
		c.send(`{"type":"leave","room":"a"}`)
		c.send(`{"type":"join","room":"c"}`)
		c.silent(50 * time.Millisecond)
	})
	t.Run("device_not_alive", func(t *testing.T) {
		n := newNode(t, opts{})
		c := n.dialRooms("1", "phone", "*")
		c.msgType("welcome")
		// The device ends apart from its socket (a bye over HTTP).
		if _, err := n.tr.Bye(context.Background(), "1", "phone"); err != nil {
			t.Fatal(err)
		}
		c.send(`{"type":"join","room":"r"}`)
		c.errorCode("device_not_alive")
		// A heartbeat brings it back, and it may join.
		c.send(`{"type":"heartbeat"}`)
		c.send(`{"type":"join","room":"r"}`)
		if m := c.watchRoom("r")["members"].(map[string]any); len(m) != 1 || m["1"] != "online" {
			t.Fatalf("members %v", m)
		}
	})
	t.Run("too_many_watched_rooms", func(t *testing.T) {
		n := newNode(t, opts{maxWatched: 2})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		c.watchRoom("a")
		c.watchRoom("b")
		c.watchRoom("a") // watched already: a fresh snapshot, no more
		c.send(`{"type":"watch_room","room":"c"}`)
		if m := c.msgType("error"); m["code"] != "too_many_watched_rooms" || !strings.Contains(m["message"].(string), "-max-watched-rooms 2") {
			t.Fatalf("a third room with a cap of 2: %v", m)
		}
		c.send(`{"type":"unwatch_room","room":"a"}`)
		c.watchRoom("c")
	})
	t.Run("rate_limited", func(t *testing.T) {
		n := newNode(t, opts{tweak: func(c *gateway.Config) { c.Rate, c.Burst = 10000, 1000 }})
		c := n.dialRooms("1", "phone", "*")
		c.msgType("welcome")
		for range 100 {
			c.send(`{"type":"join","room":"r"}`)
			c.send(`{"type":"leave","room":"r"}`)
		}
		c.send(`{"type":"join","room":"r"}`)
		m := c.msgType("error")
		if msg, _ := m["message"].(string); m["code"] != "rate_limited" || !strings.Contains(msg, "bursts of 200") || !strings.Contains(msg, "retry in 1s") {
			t.Fatalf("error %v", m)
		}
		// Counted per device, across its sockets; another device has its own.
		c2 := n.dialRooms("1", "phone", "*")
		c2.msgType("welcome")
		c2.send(`{"type":"leave","room":"r"}`)
		c2.errorCode("rate_limited")
		other := n.dialRooms("1", "tablet", "*")
		other.msgType("welcome")
		other.send(`{"type":"leave","room":"r"}`)
		other.silent(30 * time.Millisecond)
		// Nothing of the refused join was done; a token comes back.
		n.clk.Advance(100 * time.Millisecond)
		w := n.dialRooms("2", "", "r")
		w.msgType("welcome")
		if m := w.watchRoom("r")["members"].(map[string]any); len(m) != 0 {
			t.Fatalf("members %v after a refused join", m)
		}
		c.send(`{"type":"join","room":"r"}`)
		if j := w.roomChange("r", "1", "join"); j["count"] != 1.0 {
			t.Fatalf("the join with a token back: %v", j)
		}
		if m := w.watchRoom("r")["members"].(map[string]any); len(m) != 1 {
			t.Fatalf("members %v after the join", m)
		}
	})
}

// A watcher of an empty room sees the first join as a room_change above
// its snapshot's version (an empty room is no room: the join that makes
// it comes at a version of its own), not a fresh room message.
func TestRoomWatchEmptyRoom(t *testing.T) {
	n := newNode(t, opts{})
	w := n.dialRooms("bob", "", "r")
	w.msgType("welcome")
	snap := w.watchRoom("r")
	a := n.dialRooms("alice", "", "r")
	a.msgType("welcome")
	a.send(`{"type":"join","room":"r"}`)
	if j := w.roomChange("r", "alice", "join"); j["version"].(float64) <= snap["version"].(float64) || j["count"] != 1.0 {
		t.Fatalf("join %v after snapshot %v", j, snap)
	}
}

// recordRooms is a tracker that records the joins it is asked for.
type recordRooms struct {
	gateway.Tracker
	mu    sync.Mutex
	joins []string
}

func (r *recordRooms) Join(_ context.Context, user, device, room string) (presence.RoomEvent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.joins = append(r.joins, user+"/"+device+" "+room)
	return presence.RoomEvent{}, nil
}

func (r *recordRooms) Leave(context.Context, string, string, string) (presence.RoomEvent, error) {
	return presence.RoomEvent{}, nil
}

func (r *recordRooms) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.joins
	r.joins = nil
	slices.Sort(out)
	return out
}

// TestRejoinRooms: after the state store lost its rooms, each open
// connection joins again the rooms it joined and did not leave — not
// those it left, nor a closed connection's.
func TestRejoinRooms(t *testing.T) {
	rec := &recordRooms{}
	n := newNode(t, opts{tweak: func(c *gateway.Config) { rec.Tracker = c.Tracker; c.Tracker = rec }})
	a := n.dialRooms("alice", "phone", "*")
	a.msgType("welcome")
	b := n.dialRooms("bob", "pc", "*")
	b.msgType("welcome")
	gone := n.dialRooms("carol", "tab", "*")
	gone.msgType("welcome")
	for _, m := range []struct {
		c    *client
		msgs []string
	}{
		{a, []string{`{"type":"join","room":"doc"}`, `{"type":"join","room":"call"}`, `{"type":"leave","room":"call"}`}},
		{b, []string{`{"type":"join","room":"doc"}`}},
		{gone, []string{`{"type":"join","room":"doc"}`}},
	} {
		for _, s := range m.msgs {
			m.c.send(s)
		}
	}
	testwait.For(t, "the four joins", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.joins) == 4
	})
	rec.take()
	gone.nc.Close()
	testwait.For(t, "carol's connection to close", func() bool { return n.gw.Stats().Connections == 2 })
	joined, err := n.gw.RejoinRooms(context.Background())
	if err != nil || joined != 2 {
		t.Fatalf("RejoinRooms: %d, %v", joined, err)
	}
	if got, want := rec.take(), []string{"alice/phone doc", "bob/pc doc"}; !slices.Equal(got, want) {
		t.Fatalf("rejoined %q, want %q", got, want)
	}
}

// failWatch is a room hub whose watches fail with err (the snapshot's
// read, as while the state store is down).
type failWatch struct {
	gateway.RoomHub
	err error
}

func (f failWatch) Watch(context.Context, gateway.RoomSink, string) error { return f.err }

// roomError reads the next message, which must be an error with code that
// answers a message of type request about room ("" and "": names
// neither).
func (c *client) roomError(code, request, room string) map[string]any {
	c.t.Helper()
	m := c.msgType("error")
	got, named := m["room"]
	gotReq, namedReq := m["request"]
	if m["code"] != code || (room == "") == named || (room != "" && got != room) ||
		(request == "") == namedReq || (request != "" && gotReq != request) {
		c.t.Fatalf("got error %v, want %s answering %q of room %q", m, code, request, room)
	}
	return m
}

// TestRoomErrorsNameTheRoom: every error that answers a room message names
// the room it named and the message's type (request), so that a client can
// tell exactly which join, leave, watch or unwatch was refused and retry
// or drop that one; a room id that is not valid is never echoed.
func TestRoomErrorsNameTheRoom(t *testing.T) {
	t.Run("unavailable", func(t *testing.T) {
		n := newNode(t, opts{tweak: func(c *gateway.Config) {
			c.Tracker = failRooms{c.Tracker, tracker.ErrUnavailable}
			c.Rooms = failWatch{c.Rooms, tracker.ErrUnavailable}
		}})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		for _, typ := range []string{"join", "leave", "watch_room"} {
			c.send(`{"type":"` + typ + `","room":"doc-` + typ + `"}`)
			c.roomError("unavailable", typ, "doc-"+typ)
		}
	})
	t.Run("room_not_allowed", func(t *testing.T) {
		n := newNode(t, opts{})
		c := n.dialRooms("1", "", "lobby")
		c.msgType("welcome")
		for _, typ := range []string{"join", "leave", "watch_room", "unwatch_room"} {
			c.send(`{"type":"` + typ + `","room":"doc-42"}`)
			c.roomError("room_not_allowed", typ, "doc-42")
		}
	})
	t.Run("rooms_unavailable", func(t *testing.T) {
		n := newNode(t, opts{noRooms: true, tweak: func(c *gateway.Config) { c.Tracker = hideRooms{c.Tracker} }})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		for _, typ := range []string{"join", "leave", "watch_room", "unwatch_room"} {
			c.send(`{"type":"` + typ + `","room":"r-` + typ + `"}`)
			c.roomError("rooms_unavailable", typ, "r-"+typ)
		}
	})
	t.Run("caps", func(t *testing.T) {
		n := newNode(t, opts{maxRooms: 1, maxWatched: 1})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		c.send(`{"type":"join","room":"a"}`)
		c.send(`{"type":"join","room":"b"}`)
		c.roomError("too_many_rooms", "join", "b")
		c.watchRoom("a")
		c.send(`{"type":"watch_room","room":"b"}`)
		c.roomError("too_many_watched_rooms", "watch_room", "b")
	})
	t.Run("device_not_alive", func(t *testing.T) {
		n := newNode(t, opts{})
		c := n.dialRooms("1", "phone", "*")
		c.msgType("welcome")
		if _, err := n.tr.Bye(context.Background(), "1", "phone"); err != nil {
			t.Fatal(err)
		}
		c.send(`{"type":"join","room":"r"}`)
		c.roomError("device_not_alive", "join", "r")
	})
	t.Run("rate_limited", func(t *testing.T) {
		// The joins and leaves of a device: its own bucket.
		n := newNode(t, opts{tweak: func(c *gateway.Config) { c.Rate, c.Burst = 10000, 1000 }})
		c := n.dialRooms("1", "phone", "*")
		c.msgType("welcome")
		for range 100 {
			c.send(`{"type":"join","room":"r"}`)
			c.send(`{"type":"leave","room":"r"}`)
		}
		c.send(`{"type":"join","room":"doc-7"}`)
		c.roomError("rate_limited", "join", "doc-7")
		c.send(`{"type":"leave","room":"doc-7"}`)
		c.roomError("rate_limited", "leave", "doc-7")

		// The messages of a connection, refused before they are read: the
		// clock is fake, so the burst does not refill.
		n = newNode(t, opts{tweak: func(c *gateway.Config) { c.Rate, c.Burst = 8, 8 }})
		c = n.dialRooms("1", "phone", "*")
		c.msgType("welcome")
		for range 8 {
			c.send(`{"type":"unwatch_room","room":"none"}`) // nothing to answer
		}
		c.send(`{"type":"join","room":"doc-8"}`)
		c.roomError("rate_limited", "join", "doc-8")
		for _, typ := range []string{"watch_room", "leave", "unwatch_room"} {
			c.send(`{"type":"` + typ + `","room":"doc-9"}`)
			c.roomError("rate_limited", typ, "doc-9")
		}
		c.send(`{"type":"subscribe","user_ids":["2"]}`)
		c.roomError("rate_limited", "", "")
		c.send(`{"type":"join","room":"` + strings.Repeat("x", 65) + `"}`)
		c.roomError("rate_limited", "", "")
	})
	t.Run("invalid", func(t *testing.T) {
		n := newNode(t, opts{})
		c := n.dialRooms("1", "", "*")
		c.msgType("welcome")
		// A valid room in a message refused for another field: named.
		for _, typ := range []string{"join", "leave", "watch_room", "unwatch_room"} {
			c.send(`{"type":"` + typ + `","room":"doc-1","active":true}`)
			c.roomError("invalid_json", typ, "doc-1")
		}
		// What is not a valid room id is never sent back.
		for _, msg := range []string{
			`{"type":"join","room":"` + strings.Repeat("x", 65) + `"}`,
			`{"type":"watch_room","room":"a b"}`,
			`{"type":"leave","room":"a,b"}`,
			`{"type":"join","room":""}`,
			`{"type":"join","room":7}`,
			`{"type":"join"}`,
			`{"type":"join","room":"\u202ex","active":true}`,
		} {
			c.send(msg)
			m := c.msgType("error")
			_, named := m["room"]
			_, namedReq := m["request"]
			if named || namedReq || (m["code"] != "invalid_id" && m["code"] != "invalid_json") {
				t.Fatalf("%s: %v", msg, m)
			}
		}
		// Errors of other messages name no room.
		c.send(`{"type":"subscribe","user_ids":[]}`)
		c.roomError("invalid_id", "", "")
	})
}

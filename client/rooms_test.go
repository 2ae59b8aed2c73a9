package client_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// Rooms against the real server: joins, leaves, statuses, and the
// reconnects that must show nothing (within the close grace) or only what
// changed meanwhile.

// dialRooms connects user's device with a token that lets it into every
// room; cut, when not nil, dials its connections.
func dialRooms(t *testing.T, n *node, user, device string, cut *cutter) *client.Client {
	t.Helper()
	tok, err := auth.Token{User: user, Rooms: []string{"*"}}.Sign(secret, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := client.Config{
		URL: n.url(), Token: tok, DeviceID: device,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	}
	if cut != nil {
		cfg.NetDial = cut.dial
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", user, err)
	}
	t.Cleanup(func() { c.Close() })
	if u := next(t, c); u != (client.StateChange{State: client.Connected}) {
		t.Fatalf("first update = %#v, want Connected", u)
	}
	return c
}

// nextRoomUpdate skips connection state changes and returns the next
// RoomSnapshot, RoomChange or RoomInterval.
func nextRoomUpdate(t *testing.T, c *client.Client) client.Update {
	t.Helper()
	for {
		switch u := next(t, c).(type) {
		case client.RoomSnapshot, client.RoomChange, client.RoomInterval:
			return u
		case client.StateChange:
			continue
		default:
			t.Fatalf("update = %#v, want one of a room", u)
		}
	}
}

// wantRoom takes the next room update, a snapshot, and checks its members
// ("id:status" sorted; a hidden status reads "id:").
func wantRoom(t *testing.T, c *client.Client, room string, members ...string) client.RoomSnapshot {
	t.Helper()
	u := nextRoomUpdate(t, c)
	s, ok := u.(client.RoomSnapshot)
	if !ok || s.Room != room || s.Count != len(members) || fmt.Sprint(memberList(s.Members)) != fmt.Sprint(members) {
		t.Fatalf("update = %#v, want the snapshot of %s with %v", u, room, members)
	}
	return s
}

func memberList(m map[string]client.Status) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(m)) {
		out = append(out, id+":"+string(m[id]))
	}
	return out
}

// wantChange takes the next room update, a change, and checks it as
// "kind user status count" (status empty for a leave).
func wantChange(t *testing.T, c *client.Client, room, want string, snapshot bool) client.RoomChange {
	t.Helper()
	u := nextRoomUpdate(t, c)
	ch, ok := u.(client.RoomChange)
	got := ""
	if ok {
		got = fmt.Sprintf("%s %s %s %d", ch.Kind, ch.UserID, ch.Status, ch.Count)
	}
	if !ok || ch.Room != room || got != want || ch.Snapshot != snapshot {
		t.Fatalf("update = %#v, want the change %q of %s (snapshot %v)", u, want, room, snapshot)
	}
	return ch
}

// quietRooms asserts that c delivers no room update for d (connection
// state changes are allowed).
func quietRooms(t *testing.T, c *client.Client, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case u := <-c.Updates():
			if _, ok := u.(client.StateChange); !ok {
				t.Fatalf("unexpected update %#v", u)
			}
		case <-deadline:
			return
		}
	}
}

func TestE2ERoomJoinsLeavesAndStatuses(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	w := dialRooms(t, n, "w", "watcher", nil)
	if err := w.WatchRoom(ctx, "doc-42"); err != nil {
		t.Fatal(err)
	}
	if s := wantRoom(t, w, "doc-42"); s.Partial {
		t.Fatalf("snapshot of an empty room = %+v", s)
	}

	a := dialRooms(t, n, "a", "laptop", nil)
	if err := a.Join(ctx, "doc-42"); err != nil {
		t.Fatal(err)
	}
	join := wantChange(t, w, "doc-42", "join a online 1", false)
	if err := a.Join(ctx, "doc-42"); err != nil { // joined already: nothing
		t.Fatal(err)
	}
	// The joiner may watch too: its own join is in the room's snapshot.
	if err := a.WatchRoom(ctx, "doc-42"); err != nil {
		t.Fatal(err)
	}
	if s := wantRoom(t, a, "doc-42", "a:online"); s.Version != join.Version {
		t.Fatalf("a's snapshot %+v, want version %d", s, join.Version)
	}

	b := dialRooms(t, n, "b", "phone", nil)
	if err := b.Join(ctx, "doc-42"); err != nil {
		t.Fatal(err)
	}
	bJoin := wantChange(t, w, "doc-42", "join b online 2", false)
	wantChange(t, a, "doc-42", "join b online 2", false)
	if bJoin.Version <= join.Version {
		t.Fatalf("b's join at version %d after a's at %d", bJoin.Version, join.Version)
	}
	if err := b.SetStatus(ctx, client.Busy, ""); err != nil {
		t.Fatal(err)
	}
	st := wantChange(t, w, "doc-42", "status b busy 2", false)
	if st.Version != bJoin.Version {
		t.Fatalf("a change of status moved the room's version: %d after %d", st.Version, bJoin.Version)
	}
	wantChange(t, a, "doc-42", "status b busy 2", false)
	if err := b.Leave(ctx, "doc-42"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, "doc-42", "leave b  1", false)
	wantChange(t, a, "doc-42", "leave b  1", false)
	if got, ok := a.Room("doc-42"); !ok || fmt.Sprint(memberList(got.Members)) != "[a:online]" || got.Count != 1 {
		t.Fatalf("a.Room = %+v, %v; want a alone", got, ok)
	}
	if got := a.JoinedRooms(); fmt.Sprint(got) != "[doc-42]" {
		t.Fatalf("JoinedRooms = %v", got)
	}

	// After UnwatchRoom nothing more arrives about the room.
	if err := w.UnwatchRoom(ctx, "doc-42"); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.Room("doc-42"); ok || len(w.WatchedRooms()) != 0 {
		t.Fatalf("the room is still held after UnwatchRoom: %v", w.WatchedRooms())
	}
	if err := b.Join(ctx, "doc-42"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, a, "doc-42", "join b busy 2", false) // a still watches: b's join has happened
	quietRooms(t, w, 300*time.Millisecond)
}

// TestE2ERoomReconnectWithinGrace: a device that loses its connection and
// is back within the close grace never left its rooms: another watcher
// sees nothing, and the device's own view of the room stays as it was.
func TestE2ERoomReconnectWithinGrace(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	w := dialRooms(t, n, "w", "watcher", nil)
	if err := w.WatchRoom(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantRoom(t, w, "call")
	cut := &cutter{}
	a := dialRooms(t, n, "a", "laptop", cut)
	if err := a.Join(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	if err := a.WatchRoom(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, "call", "join a online 1", false)
	before := wantRoom(t, a, "call", "a:online")

	cut.cut()
	wantReconnected(t, a)
	quietRooms(t, w, 500*time.Millisecond) // no leave, no join
	quietRooms(t, a, 100*time.Millisecond) // the fresh room message matches what a held
	if got, ok := a.Room("call"); !ok || fmt.Sprint(memberList(got.Members)) != "[a:online]" || got.Version != before.Version {
		t.Fatalf("a.Room after the reconnect = %+v, %v; want %+v", got, ok, before)
	}

	// a watches again on its new connection: it hears of the next join
	// live, as w does.
	b := dialRooms(t, n, "b", "phone", nil)
	if err := b.Join(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, "call", "join b online 2", false)
	// Live, or in the room message of a's watch if b's join came first
	// (nothing orders the two sockets): either way once.
	if u, ok := nextRoomUpdate(t, a).(client.RoomChange); !ok || u.Kind != client.RoomJoin || u.UserID != "b" || u.Count != 2 {
		t.Fatalf("a's update = %#v, want b's join", u)
	}
	quietRooms(t, a, 100*time.Millisecond)
	// And a's device is in the room still: its leave is seen.
	if err := a.Leave(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, "call", "leave a  1", false)
}

// TestE2ERoomReconnectCatchesUp: while a watcher is away, one member
// leaves, another joins and a third changes status; the room message of
// its reconnect replaces its view, reported as exactly those changes. A
// leave made while disconnected goes out on the reconnect.
func TestE2ERoomReconnectCatchesUp(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	cut := &cutter{}
	a := dialRooms(t, n, "a", "laptop", cut)
	if err := a.Join(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	if err := a.WatchRoom(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantRoom(t, a, "call", "a:online")
	b := dialRooms(t, n, "b", "phone", nil)
	c := dialRooms(t, n, "c", "phone", nil)
	if err := b.Join(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, a, "call", "join b online 2", false)
	if err := c.Join(ctx, "call"); err != nil { // after b's: sockets do not order each other
		t.Fatal(err)
	}
	wantChange(t, a, "call", "join c online 3", false)
	w := dialRooms(t, n, "w", "watcher", nil)
	if err := w.WatchRoom(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantRoom(t, w, "call", "a:online", "b:online", "c:online")

	cut.hold(true)
	cut.cut()
	if sc, ok := next(t, a).(client.StateChange); !ok || sc.State != client.Disconnected {
		t.Fatalf("update = %#v, want Disconnected", sc)
	}
	if err := a.Leave(ctx, "call"); err != nil { // recorded, sent on the reconnect
		t.Fatal(err)
	}
	if err := b.Leave(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, "call", "leave b  2", false)
	d := dialRooms(t, n, "d", "phone", nil)
	if err := d.Join(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, "call", "join d online 3", false)
	if err := c.SetStatus(ctx, client.Away, ""); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, "call", "status c away 3", false)

	cut.hold(false)
	if u := next(t, a); u != (client.StateChange{State: client.Connected}) {
		t.Fatalf("update = %#v, want Connected", u)
	}
	// a's leave goes out before its watch: its room message no longer
	// lists a.
	wantChange(t, w, "call", "leave a  2", false)
	wantChange(t, a, "call", "leave a  2", true)
	wantChange(t, a, "call", "leave b  1", true)
	wantChange(t, a, "call", "join d online 2", true)
	ch := wantChange(t, a, "call", "status c away 2", true)
	if got, _ := a.Room("call"); got.Count != 2 || fmt.Sprint(memberList(got.Members)) != "[c:away d:online]" || got.Version != ch.Version {
		t.Fatalf("a.Room after catching up = %+v", got)
	}
	quietRooms(t, a, 200*time.Millisecond)
	if got := a.JoinedRooms(); len(got) != 0 {
		t.Fatalf("JoinedRooms after Leave = %v", got)
	}
}

func TestE2ERoomRefusals(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	// A token without the rooms claim enters no room: the server says so.
	plain := dial(t, n, "p", "phone")
	if err := plain.Join(ctx, "doc-42"); err != nil {
		t.Fatal(err)
	}
	u := next(t, plain)
	if se, ok := u.(*client.ServerError); !ok || se.Code != "room_not_allowed" {
		t.Fatalf("update = %#v, want room_not_allowed", u)
	}

	// What the server would refuse anyway is refused here, changing nothing.
	tok, err := auth.Token{User: "a", Rooms: []string{"*"}}.Sign(secret, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a, err := client.Dial(ctx, client.Config{URL: n.url(), Token: tok, MaxRooms: 1, MaxWatchedRooms: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, bad := range []string{"", "a,b", "with space"} {
		if err := a.Join(ctx, bad); err == nil {
			t.Errorf("Join(%q) = nil, want an error", bad)
		}
		if err := a.WatchRoom(ctx, bad); err == nil {
			t.Errorf("WatchRoom(%q) = nil, want an error", bad)
		}
	}
	if err := a.Join(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if err := a.Join(ctx, "two"); !errors.Is(err, client.ErrTooManyRooms) {
		t.Fatalf("a second Join with MaxRooms 1 = %v, want ErrTooManyRooms", err)
	}
	if err := a.WatchRoom(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if err := a.WatchRoom(ctx, "two"); !errors.Is(err, client.ErrTooManyWatchedRooms) {
		t.Fatalf("a second WatchRoom with MaxWatchedRooms 1 = %v, want ErrTooManyWatchedRooms", err)
	}
	if got := fmt.Sprint(a.JoinedRooms(), a.WatchedRooms()); got != "[one] [one]" {
		t.Fatalf("rooms after the refusals: %s", got)
	}
	a.Close()
	if err := a.Join(ctx, "three"); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Join after Close = %v, want ErrClosed", err)
	}
}

// intervalsUntil takes c's room updates of room, each a RoomInterval
// (a RoomChange or RoomSnapshot fails the test), until c's view of the
// room lists want ("id:status" sorted); it returns the users the
// intervals named as joined and as left, sorted.
func intervalsUntil(t *testing.T, c *client.Client, room string, want ...string) (joined, left []string) {
	t.Helper()
	for {
		if r, ok := c.Room(room); ok && fmt.Sprint(memberList(r.Members)) == fmt.Sprint(want) {
			if r.Count != len(want) || r.Mode != client.RoomModeInterval {
				t.Fatalf("view of %s = %+v, want %d members in interval mode", room, r, len(want))
			}
			slices.Sort(joined)
			slices.Sort(left)
			return joined, left
		}
		u := nextRoomUpdate(t, c)
		iv, ok := u.(client.RoomInterval)
		if !ok || iv.Room != room || iv.Snapshot || iv.MoreJoined != 0 || iv.MoreLeft != 0 {
			t.Fatalf("update = %#v, want a RoomInterval of %s", u, room)
		}
		joined, left = append(joined, iv.Joined...), append(left, iv.Left...)
	}
}

// TestE2ERoomIntervalMode: a room of more members than
// -room-interval-above switches into interval mode (a RoomSnapshot that
// says so), where its watchers get RoomIntervals with the joins and
// leaves and no RoomChange — none for a change of status either; a
// watcher back from a cut is told what it missed as one RoomInterval; and
// below nine tenths of the threshold the room is back in events mode.
func TestE2ERoomIntervalMode(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0", func(c *app.Config) {
		c.RoomIntervalAbove, c.RoomInterval = 10, 200*time.Millisecond
	})
	ctx := context.Background()
	w := dialRooms(t, n, "w", "watcher", nil)
	if err := w.WatchRoom(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if s := wantRoom(t, w, "big"); s.Mode != client.RoomModeEvents {
		t.Fatalf("snapshot of an empty room = %+v, want events mode", s)
	}
	users := map[string]*client.Client{}
	var here []string // "id:online" of the members, sorted
	join := func(id string) {
		t.Helper()
		if users[id] == nil {
			users[id] = dialRooms(t, n, id, "phone", nil)
		}
		if err := users[id].Join(ctx, "big"); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		id := fmt.Sprintf("u%02d", i)
		join(id)
		wantChange(t, w, "big", fmt.Sprintf("join %s online %d", id, i+1), false)
		here = append(here, id+":online")
	}
	// The eleventh member: interval mode, told by a fresh room message
	// (every member listed, none of the join itself).
	join("u10")
	here = append(here, "u10:online")
	s := wantRoom(t, w, "big", here...)
	if s.Mode != client.RoomModeInterval || s.Partial || s.Next != "" {
		t.Fatalf("snapshot at 11 members = %+v, want interval mode, all listed", s)
	}

	// A change of status is not told in interval mode; joins and leaves
	// come in RoomIntervals. x follows u05's presence: the change is made.
	if err := users["u05"].SetStatus(ctx, client.Busy, ""); err != nil {
		t.Fatal(err)
	}
	x := dial(t, n, "x", "phone")
	if err := x.Subscribe(ctx, "u05"); err != nil {
		t.Fatal(err)
	}
	for ev := (client.Event{}); ev.Status != client.Busy; {
		ev = nextEvent(t, x)
	}
	join("u11")
	if err := users["u00"].Leave(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	// The view: u05 as the room message showed it, u11 with no status.
	joined, left := intervalsUntil(t, w, "big", "u01:online", "u02:online", "u03:online", "u04:online", "u05:online",
		"u06:online", "u07:online", "u08:online", "u09:online", "u10:online", "u11:")
	if fmt.Sprint(joined, left) != "[u11] [u00]" {
		t.Fatalf("intervals named joined %v, left %v; want [u11] [u00]", joined, left)
	}

	// A watcher cut off while the room changes: its fresh room message is
	// told as one RoomInterval of the difference.
	cut := &cutter{}
	r := dialRooms(t, n, "r", "laptop", cut)
	if err := r.WatchRoom(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if s := nextRoomUpdate(t, r).(client.RoomSnapshot); s.Mode != client.RoomModeInterval || s.Count != 11 || s.Members["u05"] != client.Busy {
		t.Fatalf("r's snapshot = %+v, want 11 members in interval mode, u05 busy", s)
	}
	cut.hold(true)
	cut.cut()
	if sc, ok := next(t, r).(client.StateChange); !ok || sc.State != client.Disconnected {
		t.Fatalf("update = %#v, want Disconnected", sc)
	}
	join("u12")
	if err := users["u01"].Leave(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	joined, left = intervalsUntil(t, w, "big", "u02:online", "u03:online", "u04:online", "u05:online",
		"u06:online", "u07:online", "u08:online", "u09:online", "u10:online", "u11:", "u12:")
	if fmt.Sprint(joined, left) != "[u12] [u01]" {
		t.Fatalf("intervals named joined %v, left %v; want [u12] [u01]", joined, left)
	}
	cut.hold(false)
	if u := next(t, r); u != (client.StateChange{State: client.Connected}) {
		t.Fatalf("update = %#v, want Connected", u)
	}
	iv, ok := nextRoomUpdate(t, r).(client.RoomInterval)
	if !ok || !iv.Snapshot || iv.Count != 11 || fmt.Sprint(iv.Joined, iv.Left) != "[u12] [u01]" {
		t.Fatalf("r's update after the reconnect = %#v, want the RoomInterval of u12's join and u01's leave", iv)
	}
	if got, _ := r.Room("big"); got.Count != 11 || got.Mode != client.RoomModeInterval || got.Members["u12"] != client.Online {
		t.Fatalf("r's view after the reconnect = %+v", got)
	}

	// Below nine tenths of 10 (8 members): events mode again, told by a
	// fresh room message with every status as it is.
	for _, id := range []string{"u02", "u03", "u04"} {
		if err := users[id].Leave(ctx, "big"); err != nil {
			t.Fatal(err)
		}
	}
	var back client.RoomSnapshot
	for {
		u := nextRoomUpdate(t, w)
		if _, ok := u.(client.RoomInterval); ok {
			continue // of the leaves before the switch
		}
		if back, ok = u.(client.RoomSnapshot); !ok {
			t.Fatalf("update = %#v, want RoomIntervals, then the RoomSnapshot of the switch", u)
		}
		break
	}
	want := "[u05:busy u06:online u07:online u08:online u09:online u10:online u11:online u12:online]"
	if back.Mode != client.RoomModeEvents || back.Count != 8 || fmt.Sprint(memberList(back.Members)) != want {
		t.Fatalf("snapshot at 8 members = %+v, want events mode with %s", back, want)
	}
	join("u02")
	wantChange(t, w, "big", "join u02 online 9", false)
	if err := users["u06"].SetStatus(ctx, client.Away, ""); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, "big", "status u06 away 9", false)
}

// nextRoomError skips connection state changes and returns the next
// update, which must be a *ServerError naming room with code.
func nextRoomError(t *testing.T, c *client.Client, code, room string) *client.ServerError {
	t.Helper()
	for {
		switch u := next(t, c).(type) {
		case client.StateChange:
			continue
		case client.RoomChange:
			if u.Kind == client.RoomStatus {
				// The hub's read of a member again after a join may
				// restate the member's status: not what is awaited.
				continue
			}
			t.Fatalf("update = %#v, want the server error %s of %s", u, code, room)
		case *client.ServerError:
			if u.Code != code || u.Room != room {
				t.Fatalf("server error %#v, want %s naming room %q", u, code, room)
			}
			return u
		default:
			t.Fatalf("update = %#v, want the server error %s of %s", u, code, room)
		}
	}
}

// TestE2ERoomRetriedWhileRedisHangs: Redis hangs (SIGSTOP) under the node,
// which refuses joins and watches with unavailable, naming the room. The
// client keeps both rooms as wanted and sends them again after a backoff
// until Redis answers: the watcher then sees the join, and the watch
// delivers its room. A join the application left meanwhile is not sent
// again.
func TestE2ERoomRetriedWhileRedisHangs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis and PostgreSQL")
	}
	rs, pg := testsvc.Redis(t), testsvc.Postgres(t)
	n := startNode(t, t.TempDir(), "127.0.0.1:0", func(c *app.Config) {
		c.RedisURL, c.PostgresURL, c.NoIngest = rs.URL, pg.NewDatabase(t), true
	})
	ctx := context.Background()
	w := dialRooms(t, n, "w", "watcher", nil)
	if err := w.WatchRoom(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	wantRoom(t, w, "doc")
	a := dialRooms(t, n, "a", "laptop", nil)

	if err := rs.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = rs.Resume()
		}
	}()
	if err := a.Join(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	nextRoomError(t, a, "unavailable", "doc")
	if err := a.WatchRoom(ctx, "call"); err != nil {
		t.Fatal(err)
	}
	if err := a.Join(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	// The refusals of doc (retried meanwhile), call and gone come in some
	// order; gone is left once refused.
	for seen := map[string]bool{}; !seen["call"] || !seen["gone"]; {
		u := next(t, a)
		se, ok := u.(*client.ServerError)
		if !ok || se.Code != "unavailable" || se.Room == "" {
			if _, state := u.(client.StateChange); state {
				continue
			}
			t.Fatalf("update = %#v while Redis hangs, want an unavailable naming a room", u)
		}
		seen[se.Room] = true
	}
	if err := a.Leave(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(a.JoinedRooms(), a.WatchedRooms()); got != "[doc] [call]" {
		t.Fatalf("rooms while Redis hangs: %s, want [doc] [call]: a retryable refusal keeps them", got)
	}
	if err := rs.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true

	// The retries get through: the watcher sees a in doc, and a's watch of
	// call delivers its room.
	testwait.For(t, "the watcher to see a in doc", func() bool {
		r, ok := w.Room("doc")
		return ok && r.Count == 1 && r.Members["a"] == client.Online
	})
	testwait.For(t, "a's watch of call to deliver its room", func() bool {
		_, ok := a.Room("call")
		return ok
	})
	// gone was left before Redis answered: no retry joined it. A room
	// joined after that shows the retries are done with it.
	if err := a.Join(ctx, "marker"); err != nil {
		t.Fatal(err)
	}
	if err := w.WatchRoom(ctx, "marker"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "a in marker", func() bool {
		r, ok := w.Room("marker")
		return ok && r.Count == 1
	})
	if err := w.WatchRoom(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the room gone to be read", func() bool {
		_, ok := w.Room("gone")
		return ok
	})
	if r, _ := w.Room("gone"); r.Count != 0 {
		t.Fatalf("gone, left while its join was refused, has %+v", r)
	}
}

// TestE2ERoomRefusedForGood: a join or watch the server refuses with a
// code no retry cures is dropped from the rooms the client holds, and the
// application is told, the room named.
func TestE2ERoomRefusedForGood(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0", func(c *app.Config) { c.MaxRooms, c.MaxWatchedRooms = 1, 1 })
	ctx := context.Background()
	tok, err := auth.Token{User: "a", Rooms: []string{"doc-*"}}.Sign(secret, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The client's own caps are the defaults, above the server's.
	a, err := client.Dial(ctx, client.Config{URL: n.url(), Token: tok, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	next(t, a) // Connected

	if err := a.Join(ctx, "lobby"); err != nil {
		t.Fatal(err)
	}
	nextRoomError(t, a, "room_not_allowed", "lobby")
	if err := a.WatchRoom(ctx, "lobby"); err != nil {
		t.Fatal(err)
	}
	nextRoomError(t, a, "room_not_allowed", "lobby")
	if got := fmt.Sprint(a.JoinedRooms(), a.WatchedRooms()); got != "[] []" {
		t.Fatalf("rooms after room_not_allowed: %s, want none", got)
	}

	if err := a.Join(ctx, "doc-1"); err != nil {
		t.Fatal(err)
	}
	if err := a.WatchRoom(ctx, "doc-1"); err != nil {
		t.Fatal(err)
	}
	wantRoom(t, a, "doc-1", "a:online")
	if err := a.Join(ctx, "doc-2"); err != nil {
		t.Fatal(err)
	}
	nextRoomError(t, a, "too_many_rooms", "doc-2")
	if err := a.WatchRoom(ctx, "doc-2"); err != nil {
		t.Fatal(err)
	}
	nextRoomError(t, a, "too_many_watched_rooms", "doc-2")
	if got := fmt.Sprint(a.JoinedRooms(), a.WatchedRooms()); got != "[doc-1] [doc-1]" {
		t.Fatalf("rooms after too_many_rooms and too_many_watched_rooms: %s, want [doc-1] [doc-1]", got)
	}
	// Dropped, the rooms may be asked for again once there is room.
	if err := a.Leave(ctx, "doc-1"); err != nil {
		t.Fatal(err)
	}
	wantChange(t, a, "doc-1", "leave a  0", false) // a watches doc-1 still: it sees its own leave
	if err := a.UnwatchRoom(ctx, "doc-1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Join(ctx, "doc-2"); err != nil {
		t.Fatal(err)
	}
	if err := a.WatchRoom(ctx, "doc-2"); err != nil {
		t.Fatal(err)
	}
	wantRoom(t, a, "doc-2", "a:online")
}

// TestE2ERoomLeaveRetriedWhileRedisHangs: a leave the node refuses while
// Redis hangs (unavailable, naming the leave and its room) is sent again
// after a backoff until Redis answers — the device would otherwise stay in
// the room until it ends, while the application believes it left — and
// only the leave: the room's watch, refused by nothing, stays as it was.
func TestE2ERoomLeaveRetriedWhileRedisHangs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis and PostgreSQL")
	}
	rs, pg := testsvc.Redis(t), testsvc.Postgres(t)
	n := startNode(t, t.TempDir(), "127.0.0.1:0", func(c *app.Config) {
		c.RedisURL, c.PostgresURL, c.NoIngest = rs.URL, pg.NewDatabase(t), true
	})
	ctx := context.Background()
	w := dialRooms(t, n, "w", "watcher", nil)
	if err := w.WatchRoom(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	wantRoom(t, w, "doc")
	a := dialRooms(t, n, "a", "laptop", nil)
	if err := a.Join(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	if err := a.WatchRoom(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	wantRoom(t, a, "doc", "a:online")
	b := dialRooms(t, n, "b", "phone", nil)
	testwait.For(t, "a in doc, as its watcher sees it", func() bool {
		r, ok := w.Room("doc")
		return ok && r.Count == 1
	})

	if err := rs.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = rs.Resume()
		}
	}()
	// Another user's join refused first has the node take the store as
	// down, so that a's leave is refused without reaching Redis (a call
	// that does reach it runs once Redis answers again).
	if err := b.Join(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if se := nextRoomError(t, b, "unavailable", "other"); se.Request != "join" {
		t.Fatalf("server error %#v, want the join refused", se)
	}
	if err := a.Leave(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	if se := nextRoomError(t, a, "unavailable", "doc"); se.Request != "leave" {
		t.Fatalf("server error %#v, want the leave refused", se)
	}
	if got := fmt.Sprint(a.JoinedRooms(), a.WatchedRooms()); got != "[] [doc]" {
		t.Fatalf("rooms after the refused leave: %s, want [] [doc]", got)
	}
	if err := rs.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	testwait.For(t, "the watcher to see a leave doc", func() bool {
		r, ok := w.Room("doc")
		return ok && r.Count == 0
	})
	if got := fmt.Sprint(a.JoinedRooms(), a.WatchedRooms()); got != "[] [doc]" {
		t.Fatalf("rooms after the leave got through: %s, want [] [doc]", got)
	}
}

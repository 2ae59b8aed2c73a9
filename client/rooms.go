package client

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// Rooms (docs/protocol.md "Rooms"). The client keeps what the application
// asked for — the rooms this device is in, the rooms it watches — and
// sends it again on every connection, so a reconnect within the close
// grace shows nothing to anyone. It also holds each watched room as it
// last saw it: a fresh "room" message after a reconnect (or a resync of
// the server) replaces that view, and only what differs reaches the
// application, as RoomChanges marked Snapshot (a RoomInterval marked
// Snapshot in interval mode).
//
// A big room (more members than the server's -room-interval-above, 1,000
// by default) is in interval mode: its room message lists only the first
// 100 members, and instead of a RoomChange per join and leave the client
// delivers one RoomInterval per interval (-room-interval, 5 s) in which
// the room changed, naming the users who joined and left, without their
// statuses. The view of such a room (Room) is that first page, plus the
// users named as joined since (their status Hidden: not sent), minus
// those named as left: it lists some members, not all of them, and Count
// is the one number that covers the whole room.

// RoomSnapshot is a watched room as the client first sees it: replace
// whatever you hold of the room with it. It comes once per WatchRoom, and
// again in place of the room's changes when the application has let too
// many of them wait (see Updates), when the room switches mode (the
// server sends a fresh room message then), or when either the old or the
// new view of the room lists only a page of its members.
type RoomSnapshot struct {
	Room string
	// Mode is how the room's changes come from now on: RoomChanges
	// (RoomModeEvents) or RoomIntervals (RoomModeInterval).
	Mode RoomMode
	// Count is all the room's members, listed or not.
	Count int
	// Members are the members listed, each with its status as this viewer
	// may see it (Hidden when it may not, and for a member added by a
	// RoomInterval, which names ids only). It is the application's copy.
	Members map[string]Status
	// Partial: the room has more members than the server listed (Next is
	// set). Its watchers are told joins and leaves, but no member's change
	// of status.
	Partial bool
	// Next is the cursor of the members after those listed, for
	// GET /v1/rooms/{room}?after= (docs/http-api.md); empty when the room
	// message listed them all.
	Next string
	// Version grows with every join and leave of the room.
	Version uint64
}

// RoomMode is how the server tells a watched room's changes.
type RoomMode string

// Modes of a room. A room goes into interval mode when it has more members
// than the server's -room-interval-above (1,000 by default) and back into
// events mode below nine tenths of that; each switch comes as a
// RoomSnapshot.
const (
	// RoomModeEvents: a RoomChange for each join, leave and change of
	// status.
	RoomModeEvents RoomMode = "events"
	// RoomModeInterval: the room is big. Its room message lists the first
	// 100 members, and a RoomInterval comes once per interval in which the
	// room changed; no RoomChange, no member's change of status.
	RoomModeInterval RoomMode = "interval"
)

// RoomInterval is what changed in a watched room in interval mode since the
// last RoomInterval (or the RoomSnapshot): the net joins and leaves — a
// user who joined and left within one interval is in neither.
type RoomInterval struct {
	Room string
	// Count is the room's members now.
	Count int
	// Joined and Left are users who joined and left, sorted by id, at most
	// 256 of each; MoreJoined and MoreLeft count those beyond them. The
	// client adds Joined to its view of the room (status Hidden: the
	// message carries ids only) and takes Left out of it.
	Joined, Left         []string
	MoreJoined, MoreLeft int
	// Version is the room's version now.
	Version uint64
	// Snapshot: the joins and leaves were found by comparing a fresh room
	// message (after a reconnect, or when the server had missed events)
	// with the room as the client held it, not sent by the server.
	Snapshot bool
}

// RoomChange is one change of a watched room.
type RoomChange struct {
	Room   string
	UserID string
	Kind   RoomChangeKind
	// Status is the member's status as this viewer may see it after the
	// change; Hidden for a leave.
	Status Status
	// Count is the room's members after the change.
	Count int
	// Version is the room's version after the change (a change of status
	// leaves it as it was).
	Version uint64
	// Snapshot: the change was found by comparing a fresh room message
	// (after a reconnect, or when the server had missed events) with the
	// room as the client held it, not sent live: a member who left while
	// the client was away is reported as a leave only then.
	Snapshot bool
}

// RoomChangeKind says what a RoomChange is.
type RoomChangeKind string

// Kinds of RoomChange. Watchers are told the kind only, never why: a
// leave, a bye, an ended device and going invisible look the same.
const (
	RoomJoin   RoomChangeKind = "join"
	RoomLeave  RoomChangeKind = "leave"
	RoomStatus RoomChangeKind = "status"
)

func (RoomSnapshot) isUpdate() {}
func (RoomChange) isUpdate()   {}
func (RoomInterval) isUpdate() {}

// Errors of the client's own limits of rooms.
var (
	// ErrTooManyRooms: Join would put the device in more than
	// Config.MaxRooms rooms.
	ErrTooManyRooms = fmt.Errorf("client: too many rooms")
	// ErrTooManyWatchedRooms: WatchRoom would watch more than
	// Config.MaxWatchedRooms rooms.
	ErrTooManyWatchedRooms = fmt.Errorf("client: too many watched rooms")
)

// roomView is a watched room as the client holds it.
type roomView struct {
	sentOn  *conn // the connection its watch_room went out on; nil: none yet
	have    bool  // a room message arrived since the watch
	mode    RoomMode
	count   int
	members map[string]Status
	next    string // of the last room message
	version uint64
}

func (v *roomView) snapshot(room string) RoomSnapshot {
	return RoomSnapshot{Room: room, Mode: v.mode, Count: v.count, Members: maps.Clone(v.members),
		Partial: v.next != "", Next: v.next, Version: v.version}
}

// Join puts this device in the room (its watchers see the user join, if no
// other device of the user is there). The set of rooms joined outlives
// connections: after a reconnect the client joins them again, which within
// the close grace nobody sees. Joining a room joined already does nothing.
// While disconnected Join only records the room; an error of the send
// leaves it recorded too, and the next connection sends it. A room id the
// server would refuse is an error, and so is joining more than MaxRooms
// rooms (ErrTooManyRooms); either changes nothing. The server's refusals
// arrive as *ServerError on Updates, naming the room: the client joins
// again after a backoff where a retry can cure the refusal (unavailable,
// rate_limited), and otherwise (room_not_allowed, too_many_rooms, …) no
// longer holds the room joined (see ServerError).
func (c *Client) Join(ctx context.Context, room string) error {
	return c.roomOp(ctx, room, func() (string, error) {
		if _, ok := c.joined[room]; ok {
			return "", nil
		}
		if len(c.joined) >= c.cfg.MaxRooms {
			return "", fmt.Errorf("%w: %d joined, at most %d", ErrTooManyRooms, len(c.joined), c.cfg.MaxRooms)
		}
		c.joined[room] = nil
		delete(c.leaving, room)
		return "join", nil
	}, func(cn *conn) {
		if _, ok := c.joined[room]; ok {
			c.joined[room] = cn
		}
	})
}

// Leave takes this device out of the room. Leaving a room not joined does
// nothing. While disconnected it records the leave, which the next
// connection sends (the server keeps the device in its rooms through the
// close grace). A leave the server refuses with a code a retry can cure
// (unavailable, rate_limited) is sent again after a backoff, and by the
// next connection, until it gets through or the room is joined again;
// the *ServerError reaches Updates either way.
func (c *Client) Leave(ctx context.Context, room string) error {
	return c.roomOp(ctx, room, func() (string, error) {
		if _, ok := c.joined[room]; !ok {
			return "", nil
		}
		delete(c.joined, room)
		c.leaving[room] = struct{}{}
		return "leave", nil
	}, func(cn *conn) {
		c.leaveSentLocked(cn, room)
	})
}

// leaveSentLocked notes that a leave of room went out on cn: it is no
// longer due on the next connection — unless its refusal came meanwhile
// (the server may answer before the sender gets here) and planned it
// again. c.mu is held.
func (c *Client) leaveSentLocked(cn *conn, room string) {
	if !cn.retries.planned(reqLeave, room) {
		delete(c.leaving, room)
	}
}

// WatchRoom watches the room: a RoomSnapshot follows, then a RoomChange for
// each join, leave and change of status — or, while the room is big
// (RoomModeInterval), a RoomInterval per interval. Watched rooms outlive
// connections: after a reconnect the client watches them again, and the
// server's fresh room message replaces the view it held, reported as the
// RoomChanges (Snapshot set) that tell the two apart — nothing when
// nothing changed. Watching a room watched already does nothing. Watching
// more than MaxWatchedRooms rooms is ErrTooManyWatchedRooms; the server's
// refusals arrive as *ServerError naming the room: the client watches
// again after a backoff where a retry can cure the refusal, and otherwise
// no longer holds the room watched (see ServerError).
func (c *Client) WatchRoom(ctx context.Context, room string) error {
	return c.roomOp(ctx, room, func() (string, error) {
		if _, ok := c.watched[room]; ok {
			return "", nil
		}
		if len(c.watched) >= c.cfg.MaxWatchedRooms {
			return "", fmt.Errorf("%w: %d watched, at most %d", ErrTooManyWatchedRooms, len(c.watched), c.cfg.MaxWatchedRooms)
		}
		c.watched[room] = &roomView{}
		return "watch_room", nil
	}, func(cn *conn) {
		if v := c.watched[room]; v != nil {
			v.sentOn = cn
		}
	})
}

// UnwatchRoom stops watching the room; updates about it that the
// application has not taken yet are dropped. A watch ends with its
// connection, so while disconnected there is nothing to send. An unwatch
// the server refuses with a code a retry can cure (rate_limited) is sent
// again after a backoff while the room stays unwatched and the connection
// lasts.
func (c *Client) UnwatchRoom(ctx context.Context, room string) error {
	return c.roomOp(ctx, room, func() (string, error) {
		if _, ok := c.watched[room]; !ok {
			return "", nil
		}
		delete(c.watched, room)
		c.q.dropRoom(room)
		if c.cur == nil {
			return "", nil
		}
		return "unwatch_room", nil
	}, func(*conn) {})
}

// roomOp validates room, applies change under mu (it returns the message
// to send, or "" for none) and sends that message on the current
// connection, calling sent under mu once it went out — all under roomMu,
// so each room's messages leave in the order of its changes, also with
// respect to what a new connection sends again (resendRooms).
func (c *Client) roomOp(ctx context.Context, room string, change func() (string, error), sent func(*conn)) error {
	if err := presence.ValidateID(room); err != nil {
		return fmt.Errorf("client: room id %q: %w", room, err)
	}
	c.roomMu.Lock()
	defer c.roomMu.Unlock()
	c.mu.Lock()
	if c.isClosedLocked() {
		c.mu.Unlock()
		return ErrClosed
	}
	typ, err := change()
	cn := c.cur
	c.mu.Unlock()
	if err != nil || typ == "" || cn == nil {
		return err
	}
	// The application's own message about the room replaces a retry of a
	// refused one (retry.go).
	cn.retries.supersede(typ, room)
	if err := c.sendRoom(ctx, cn, typ, room); err != nil {
		return err
	}
	if afterRoomSend != nil {
		afterRoomSend(typ, room)
	}
	c.mu.Lock()
	sent(cn)
	c.mu.Unlock()
	return nil
}

// afterRoomSend, set by tests only, runs between a room message's send
// and the bookkeeping after it: where the server's answer may come first.
var afterRoomSend func(typ, room string)

// sendRoom sends one room message, paced below the server's limit of
// messages per connection.
func (c *Client) sendRoom(ctx context.Context, cn *conn, typ, room string) error {
	if err := c.roomPace.wait(ctx, c.ctx); err != nil {
		return err
	}
	return cn.sendJSON(ctx, roomMsg{Type: typ, Room: room})
}

// resendRooms sends on a new connection what the rooms need: the leaves
// recorded while disconnected, the joins and the watches, each unless it
// went out on cn already. It runs beside the read loop, as the pacing may
// take seconds.
func (c *Client) resendRooms(ctx context.Context, cn *conn) {
	type op struct{ typ, room string }
	var ops []op
	c.mu.Lock()
	for _, r := range slices.Sorted(maps.Keys(c.leaving)) {
		ops = append(ops, op{"leave", r})
	}
	for _, r := range slices.Sorted(maps.Keys(c.joined)) {
		ops = append(ops, op{"join", r})
	}
	for _, r := range slices.Sorted(maps.Keys(c.watched)) {
		ops = append(ops, op{"watch_room", r})
	}
	c.mu.Unlock()
	for _, o := range ops {
		if !c.resendRoom(ctx, cn, o.typ, o.room) {
			return
		}
	}
}

// resendRoom sends one message of resendRooms if it is still due; false
// when the connection is no longer usable.
func (c *Client) resendRoom(ctx context.Context, cn *conn, typ, room string) bool {
	c.roomMu.Lock()
	defer c.roomMu.Unlock()
	c.mu.Lock()
	due := false
	switch typ {
	case "leave":
		_, due = c.leaving[room]
	case "join":
		on, ok := c.joined[room]
		due = ok && on != cn
	case "watch_room":
		v, ok := c.watched[room]
		due = ok && v.sentOn != cn
	}
	current := c.cur == cn
	c.mu.Unlock()
	if !current {
		return false
	}
	if !due {
		return true
	}
	if err := c.sendRoom(ctx, cn, typ, room); err != nil {
		cn.close() // the read loop notices and the run loop reconnects
		return false
	}
	c.mu.Lock()
	switch typ {
	case "leave":
		delete(c.leaving, room)
	case "join":
		c.joined[room] = cn
	case "watch_room":
		c.watched[room].sentOn = cn
	}
	c.mu.Unlock()
	return true
}

// Room returns the watched room as the client holds it now; false when the
// room is not watched or its first room message has not arrived yet.
func (c *Client) Room(room string) (RoomSnapshot, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.watched[room]
	if v == nil || !v.have {
		return RoomSnapshot{}, false
	}
	return v.snapshot(room), true
}

// JoinedRooms returns the rooms this device is in (or is to be in once
// connected), sorted.
func (c *Client) JoinedRooms() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.joined))
}

// WatchedRooms returns the rooms watched, sorted.
func (c *Client) WatchedRooms() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.watched))
}

// handleRoom applies a room message: the first of a watch, one in the
// other mode, or one of a room listed in part (before or now) is delivered
// as it is; a later one replaces the view, delivered as what differs.
func (c *Client) handleRoom(m *serverMsg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.watched[m.Room]
	if v == nil {
		return // unwatched meanwhile
	}
	fresh := roomView{sentOn: v.sentOn, have: true, mode: RoomModeEvents, count: m.Count, version: m.Version,
		members: make(map[string]Status, len(m.Members))}
	if m.Mode == string(RoomModeInterval) {
		fresh.mode = RoomModeInterval
	}
	if m.Next != nil {
		fresh.next = *m.Next
	}
	for id, s := range m.Members {
		fresh.members[id] = statusOf(s)
	}
	old := *v
	*v = fresh
	if !old.have || old.mode != fresh.mode || old.next != "" || fresh.next != "" {
		c.q.pushRoom(m.Room, v.snapshot(m.Room), c.roomSnapshotFunc(m.Room))
		return
	}
	changes := diffRoom(m.Room, old.members, old.count, fresh.members, fresh.version)
	if fresh.mode == RoomModeInterval {
		// As the server tells this mode: the joins and leaves, ids only.
		iv := RoomInterval{Room: m.Room, Count: fresh.count, Version: fresh.version, Snapshot: true}
		for _, ch := range changes {
			switch ch.Kind {
			case RoomJoin:
				iv.Joined = append(iv.Joined, ch.UserID)
			case RoomLeave:
				iv.Left = append(iv.Left, ch.UserID)
			}
		}
		if iv.Joined != nil || iv.Left != nil {
			c.q.pushRoom(m.Room, iv, c.roomSnapshotFunc(m.Room))
		}
		return
	}
	for _, ch := range changes {
		c.q.pushRoom(m.Room, ch, c.roomSnapshotFunc(m.Room))
	}
}

// handleRoomInterval applies what changed in a watched room in interval
// mode: the joined are added to the view (status unknown: Hidden), the
// left taken out.
func (c *Client) handleRoomInterval(m *serverMsg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.watched[m.Room]
	if v == nil || !v.have {
		return // unwatched, or from before the watch's room message
	}
	for _, id := range m.Left {
		delete(v.members, id)
	}
	for _, id := range m.Joined {
		if _, ok := v.members[id]; !ok {
			v.members[id] = Hidden
		}
	}
	v.count, v.version = m.Count, max(v.version, m.Version)
	iv := RoomInterval{Room: m.Room, Count: m.Count, Joined: m.Joined, Left: m.Left,
		MoreJoined: m.MoreJoined, MoreLeft: m.MoreLeft, Version: m.Version}
	c.q.pushRoom(m.Room, iv, c.roomSnapshotFunc(m.Room))
}

// handleRoomChange applies a live change of a watched room.
func (c *Client) handleRoomChange(m *serverMsg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.watched[m.Room]
	if v == nil || !v.have {
		return // unwatched, or from before the watch's room message
	}
	ch := RoomChange{Room: m.Room, UserID: m.UserID, Kind: RoomChangeKind(m.Event), Status: statusOf(m.Status), Count: m.Count, Version: m.Version}
	switch ch.Kind {
	case RoomStatus:
		if held, ok := v.members[m.UserID]; ok && held == ch.Status && v.count == m.Count {
			// The view holds it already: the server may send a change
			// of status its room message showed (a change that reached
			// it while the message was being read); an update is a
			// change of the view.
			v.version = max(v.version, m.Version)
			return
		}
		v.members[m.UserID] = ch.Status
	case RoomJoin:
		v.members[m.UserID] = ch.Status
	case RoomLeave:
		ch.Status = Hidden
		delete(v.members, m.UserID)
	default:
		c.log.Debug("presence: ignoring a room change", "event", m.Event)
		return
	}
	v.count, v.version = m.Count, max(v.version, m.Version)
	c.q.pushRoom(m.Room, ch, c.roomSnapshotFunc(m.Room))
}

// roomSnapshotFunc returns the room's current view for the queue to put
// in place of changes the application has let wait; the queue calls it
// while c.mu is held by the caller of pushRoom.
func (c *Client) roomSnapshotFunc(room string) func() RoomSnapshot {
	return func() RoomSnapshot { return c.watched[room].snapshot(room) }
}

// diffRoom is what turns a room of old members (count of them) into one of
// fresh members at version: the leaves, then the joins, then the changes
// of status, each in the order of the user ids, with the count after it.
func diffRoom(room string, old map[string]Status, count int, fresh map[string]Status, version uint64) []RoomChange {
	var out []RoomChange
	for _, id := range slices.Sorted(maps.Keys(old)) {
		if _, ok := fresh[id]; !ok {
			count--
			out = append(out, RoomChange{Room: room, UserID: id, Kind: RoomLeave, Count: count, Version: version, Snapshot: true})
		}
	}
	ids := slices.Sorted(maps.Keys(fresh))
	for _, id := range ids {
		if _, ok := old[id]; !ok {
			count++
			out = append(out, RoomChange{Room: room, UserID: id, Kind: RoomJoin, Status: fresh[id], Count: count, Version: version, Snapshot: true})
		}
	}
	for _, id := range ids {
		if s, ok := old[id]; ok && s != fresh[id] {
			out = append(out, RoomChange{Room: room, UserID: id, Kind: RoomStatus, Status: fresh[id], Count: count, Version: version, Snapshot: true})
		}
	}
	return out
}

func statusOf(s *string) Status {
	if s == nil {
		return Hidden
	}
	return Status(*s)
}

// pacer spaces messages to stay within a rate: burst at once, then one
// every every. It reserves a slot and waits for it. Safe for concurrent
// use.
type pacer struct {
	every time.Duration
	burst int

	mu  sync.Mutex // guards tat
	tat time.Time  // theoretical arrival time of the next message
}

// Room messages count against the server's messages per connection (20 a
// second, bursts of 40), with heartbeats and subscribes: the client keeps
// room messages well below.
const (
	roomEvery = time.Second / 15
	roomBurst = 24
)

func (p *pacer) wait(ctx, life context.Context) error {
	p.mu.Lock()
	now := time.Now()
	p.tat = later(p.tat, now).Add(p.every)
	delay := p.tat.Sub(now) - time.Duration(p.burst)*p.every
	p.mu.Unlock()
	if delay <= 0 {
		return nil
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-life.Done():
		return ErrClosed
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

package fanout_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/testwait"
)

// roomSink records the room messages it is given, decoded.
type roomSink struct {
	viewer string
	mu     sync.Mutex
	got    []map[string]any
}

func (s *roomSink) Viewer() string { return s.viewer }

func (s *roomSink) DeliverRoom(room string, b []byte) {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(fmt.Sprintf("frame of %s is not JSON: %s", room, b))
	}
	s.mu.Lock()
	s.got = append(s.got, m)
	s.mu.Unlock()
}

func (s *roomSink) msgs() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// lines formats the messages as "type user event status version".
func (s *roomSink) lines() []string {
	var out []string
	for _, m := range s.msgs() {
		switch m["type"] {
		case "room":
			if m["mode"] == "interval" {
				out = append(out, fmt.Sprintf("room v%.0f interval n%v listed %d next %v", m["version"], m["count"], len(m["members"].(map[string]any)), m["next"]))
				break
			}
			out = append(out, fmt.Sprintf("room v%.0f", m["version"]))
		case "room_interval":
			out = append(out, fmt.Sprintf("interval n%v +%v -%v +%v -%v v%.0f", m["count"], m["joined"], m["left"], m["more_joined"], m["more_left"], m["version"]))
		case "room_change":
			out = append(out, fmt.Sprintf("%v %v %v n%v v%.0f", m["event"], m["user_id"], m["status"], m["count"], m["version"]))
		default:
			out = append(out, fmt.Sprint(m))
		}
	}
	return out
}

// roomModel is a RoomReader over a map of rooms; reads may be held.
type roomModel struct {
	mu      sync.Mutex
	version map[string]uint64
	members map[string][]string
	reads   int
	limits  []int         // of each read
	hold    chan struct{} // when set, a read waits for it to close
	// shows is how a read shows a member, where set (else online,
	// visible, at no version).
	shows map[string]privacy.View
}

func newRoomModel() *roomModel {
	return &roomModel{version: map[string]uint64{}, members: map[string][]string{}}
}

func (m *roomModel) RoomSnapshot(ctx context.Context, viewer, room string, limit int) (fanout.RoomSnapshot, error) {
	m.mu.Lock()
	hold := m.hold
	m.mu.Unlock()
	if hold != nil {
		<-hold
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	v, members := m.version[room], m.members[room]
	m.limits = append(m.limits, limit)
	snap := fanout.RoomSnapshot{Version: v, Count: len(members)}
	for i, id := range members {
		if i == limit {
			snap.Next = members[i-1]
			break
		}
		v, ok := m.shows[id]
		if !ok {
			v = privacy.View{UserID: id, StatusVisible: true, Status: presence.Online}
		}
		snap.Members = append(snap.Members, v)
	}
	return snap, nil
}

// MemberStates knows no member's state: the model holds rooms only.
func (m *roomModel) MemberStates(context.Context, []string, []presence.Snapshot) error { return nil }

func (m *roomModel) set(room string, v uint64, members ...string) {
	m.mu.Lock()
	m.version[room], m.members[room] = v, members
	m.mu.Unlock()
}

// holdReads makes the reads from now on wait until release is called,
// which lets the reads waiting and those after it through.
func (m *roomModel) holdReads() (release func()) {
	hold := make(chan struct{})
	m.mu.Lock()
	m.hold = hold
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		m.hold = nil
		m.mu.Unlock()
		close(hold)
	}
}

// show sets how reads show member from now on.
func (m *roomModel) show(member string, st presence.Status, v uint64) {
	m.mu.Lock()
	if m.shows == nil {
		m.shows = map[string]privacy.View{}
	}
	m.shows[member] = privacy.View{UserID: member, StatusVisible: true, Status: st, Version: v}
	m.mu.Unlock()
}

func (m *roomModel) readCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reads
}

// contactBook is ContactLists over a map.
type contactBook map[string][]string

func (c contactBook) Contacts(_ context.Context, owner string) ([]string, error) {
	return c[owner], nil
}

func newRoomHub(t *testing.T, m *roomModel, c contactBook, cfg fanout.RoomConfig) *fanout.RoomHub {
	t.Helper()
	cfg.Reader, cfg.Contacts = m, c
	h, err := fanout.NewRoomHub(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

func join(room, user string, v uint64, n int, status presence.Status, vis presence.Visibility) *presence.RoomEvent {
	return &presence.RoomEvent{Room: room, UserID: user, Kind: presence.RoomJoin, Reason: presence.ReasonJoined,
		Count: n, Version: v, Status: status, Settings: presence.Settings{Status: vis, LastSeen: vis}}
}

func leave(room, user string, v uint64, n int) *presence.RoomEvent {
	return &presence.RoomEvent{Room: room, UserID: user, Kind: presence.RoomLeave, Reason: presence.ReasonLeft, Count: n, Version: v}
}

func waitLines(t *testing.T, s *roomSink, want ...string) {
	t.Helper()
	testwait.Forf(t, func() string { return fmt.Sprintf("%s to be sent %q, has %q", s.viewer, want, s.lines()) }, func() bool {
		return slices.Equal(s.lines(), want)
	})
}

func watch(t *testing.T, h *fanout.RoomHub, s fanout.RoomSink, room string) {
	t.Helper()
	if err := h.Watch(context.Background(), s, room); err != nil {
		t.Fatal(err)
	}
}

// Each watcher is shown a joining member's status as its relation allows:
// the member itself, a contact, a stranger.
func TestRoomJoinStatusPerViewer(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 10)
	h := newRoomHub(t, m, contactBook{"dave": {"bob"}}, fanout.RoomConfig{})
	dave, bob, carol := &roomSink{viewer: "dave"}, &roomSink{viewer: "bob"}, &roomSink{viewer: "carol"}
	for _, s := range []*roomSink{dave, bob, carol} {
		watch(t, h, s, "doc")
	}
	h.PublishRoom(join("doc", "dave", 11, 1, presence.Busy, presence.Contacts))
	h.PublishRoom(join("doc", "erin", 12, 2, presence.Online, presence.Nobody))
	h.PublishRoom(join("doc", "fred", 13, 3, presence.Away, presence.Everyone))
	h.PublishRoom(leave("doc", "dave", 14, 2))
	waitLines(t, dave, "room v10", "join dave busy n1 v11", "join erin <nil> n2 v12", "join fred away n3 v13", "leave dave <nil> n2 v14")
	waitLines(t, bob, "room v10", "join dave busy n1 v11", "join erin <nil> n2 v12", "join fred away n3 v13", "leave dave <nil> n2 v14")
	waitLines(t, carol, "room v10", "join dave <nil> n1 v11", "join erin <nil> n2 v12", "join fred away n3 v13", "leave dave <nil> n2 v14")
}

// Events that come out of order are sent in order; those at or below
// what a watcher's snapshot holds are not sent at all.
func TestRoomEventsInOrder(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5, "alice")
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{})
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "doc")
	h.PublishRoom(join("doc", "carol", 8, 4, presence.Online, presence.Everyone))
	h.PublishRoom(join("doc", "bob", 7, 3, presence.Online, presence.Everyone))
	h.PublishRoom(join("doc", "old", 5, 1, presence.Online, presence.Everyone)) // the snapshot has it
	h.PublishRoom(join("doc", "ann", 6, 2, presence.Online, presence.Everyone))
	h.PublishRoom(join("doc", "ann", 6, 2, presence.Online, presence.Everyone)) // a duplicate
	waitLines(t, s, "room v5", "join ann online n2 v6", "join bob online n3 v7", "join carol online n4 v8")
	// The duplicate may come after the lines: the hub applies what it is
	// published in its own time.
	testwait.Forf(t, func() string { return fmt.Sprintf("stats %+v: 2 stale events and 1 gap", h.Stats()) }, func() bool {
		st := h.Stats()
		return st.Stale == 2 && st.Gaps == 1
	})
	if got := s.lines(); len(got) != 4 {
		t.Fatalf("sent %q after the duplicate, want nothing more", got)
	}
}

// An event missing for GapWait gets the watchers a fresh snapshot, and
// the events after it are applied from there.
func TestRoomGapResyncs(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5)
	fc := clock.NewFake(time.Unix(1000, 0))
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{Clock: fc, GapWait: 40 * time.Millisecond})
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "doc")
	h.PublishRoom(join("doc", "bob", 7, 2, presence.Online, presence.Everyone)) // 6 never comes
	testwait.For(t, "the gap to be seen", func() bool { return h.Stats().Gaps == 1 })
	testwait.NothingWithin(100*time.Millisecond, "a resync before GapWait passed on the hub's clock")
	waitLines(t, s, "room v5")
	m.set("doc", 7, "ann", "bob")
	fc.Advance(time.Second)
	waitLines(t, s, "room v5", "room v7")
	h.PublishRoom(leave("doc", "ann", 8, 1))
	waitLines(t, s, "room v5", "room v7", "leave ann <nil> n1 v8")
}

// Events published while a watcher's snapshot is read are sent after it
// if they are newer than it.
func TestRoomEventsDuringSnapshot(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5)
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{})
	first := &roomSink{viewer: "first"}
	watch(t, h, first, "doc")
	release := m.holdReads()
	late := &roomSink{viewer: "late"}
	done := make(chan error, 1)
	go func() { done <- h.Watch(context.Background(), late, "doc") }()
	testwait.For(t, "the late watcher registered", func() bool { return h.Stats().Watchers == 2 })
	h.PublishRoom(join("doc", "ann", 6, 1, presence.Online, presence.Everyone))
	h.PublishRoom(join("doc", "bob", 7, 2, presence.Online, presence.Everyone))
	waitLines(t, first, "room v5", "join ann online n1 v6", "join bob online n2 v7")
	m.set("doc", 6, "ann") // the snapshot read has ann, not bob
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitLines(t, late, "room v6", "join bob online n2 v7")
}

// A member's change of status goes to each class of watcher that may see
// it and was not shown it; an offline one (its leave follows) to nobody.
func TestRoomMemberStatus(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5, "dave")
	h := newRoomHub(t, m, contactBook{"dave": {"bob"}}, fanout.RoomConfig{})
	dave, bob, carol := &roomSink{viewer: "dave"}, &roomSink{viewer: "bob"}, &roomSink{viewer: "carol"}
	for _, s := range []*roomSink{dave, bob, carol} {
		watch(t, h, s, "doc")
	}
	set := presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts}
	ev := func(st presence.Status, v uint64) *presence.Event {
		return &presence.Event{UserID: "dave", Status: st, Self: st, Prev: presence.Online, Version: v, Settings: set}
	}
	h.Publish(ev(presence.Away, 100))
	h.Publish(ev(presence.Away, 101)) // the same view: nothing
	h.Publish(&presence.Event{UserID: "nobody-here", Status: presence.Busy, Version: 1})
	h.Publish(ev(presence.Offline, 102))
	h.PublishRoom(leave("doc", "dave", 6, 0))
	waitLines(t, dave, "room v5", "status dave away n1 v5", "leave dave <nil> n0 v6")
	waitLines(t, bob, "room v5", "status dave away n1 v5", "leave dave <nil> n0 v6")
	waitLines(t, carol, "room v5", "leave dave <nil> n0 v6")
	// Once dave left, his changes are not even queued.
	before := h.Stats().Published
	h.Publish(ev(presence.Busy, 103))
	if h.Stats().Published != before {
		t.Fatal("a change of a user in no watched room was queued")
	}
}

func TestRoomWatchLimitAndRemove(t *testing.T) {
	m := newRoomModel()
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{MaxWatched: 2})
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "a")
	watch(t, h, s, "b")
	watch(t, h, s, "a") // again: a fresh snapshot, no new room
	if err := h.Watch(context.Background(), s, "c"); !errors.Is(err, fanout.ErrTooManyWatchedRooms) {
		t.Fatalf("a third room with a cap of 2: %v", err)
	}
	h.Unwatch(s, "a")
	watch(t, h, s, "c")
	h.Remove(s)
	if st := h.Stats(); st.Rooms != 0 || st.Watchers != 0 || h.Watched(s) != 0 {
		t.Fatalf("after Remove: %+v", st)
	}
	h.PublishRoom(join("c", "ann", 1, 1, presence.Online, presence.Everyone))
	testwait.NothingWithin(50*time.Millisecond, "a delivery to a removed sink")
	waitLines(t, s, "room v0", "room v0", "room v0", "room v0")
}

// A queue that overflows loses events; every watched room is resynced.
func TestRoomQueueOverflowResyncs(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 1)
	cfg := fanout.RoomConfig{Queue: 1, Reader: m, Contacts: contactBook{}}
	h, err := fanout.NewRoomHub(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "doc")
	// Run is not running yet: the second event finds the queue full.
	h.PublishRoom(join("doc", "ann", 2, 1, presence.Online, presence.Everyone))
	h.PublishRoom(join("doc", "bob", 3, 2, presence.Online, presence.Everyone))
	if st := h.Stats(); st.Dropped != 1 {
		t.Fatalf("stats %+v, want one dropped", st)
	}
	m.set("doc", 3, "ann", "bob")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitLines(t, s, "room v1", "join ann online n1 v2", "room v3")
	if m.readCount() != 2 {
		t.Fatalf("snapshots read: %d, want 2", m.readCount())
	}
}

// An empty room is no room in the store: the join that makes it again
// comes at a version of its own, which the hub takes as the next one.
func TestRoomMadeAgain(t *testing.T) {
	m := newRoomModel()
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{GapWait: time.Hour})
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "doc") // no room: version 0
	h.PublishRoom(join("doc", "ann", 1<<32+1, 1, presence.Online, presence.Everyone))
	h.PublishRoom(leave("doc", "ann", 1<<32+2, 0))
	// The room made again after others raised the floor; its second join
	// comes first.
	h.PublishRoom(join("doc", "cid", 1<<32+41, 2, presence.Online, presence.Everyone))
	h.PublishRoom(join("doc", "bob", 1<<32+40, 1, presence.Online, presence.Everyone))
	waitLines(t, s, "room v0", "join ann online n1 v4294967297", "leave ann <nil> n0 v4294967298",
		"join bob online n1 v4294967336", "join cid online n2 v4294967337")
	if st := h.Stats(); st.Resyncs != 0 {
		t.Fatalf("stats %+v: a resync", st)
	}
}

// A room above IntervalAbove members sends its watchers one room_interval
// message per interval with the net joins and leaves, whatever the number
// of changes; below nine tenths of it, events again. Each switch sends a
// fresh snapshot in the new mode.
func TestRoomIntervalMode(t *testing.T) {
	m := newRoomModel()
	m.set("big", 2, "a", "b")
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{IntervalAbove: 3, Interval: 50 * time.Millisecond})
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "big")
	ev := func(kind presence.RoomKind, user string, v uint64, n int) *presence.RoomEvent {
		if kind == presence.RoomJoin {
			return join("big", user, v, n, presence.Online, presence.Everyone)
		}
		return leave("big", user, v, n)
	}
	h.PublishRoom(ev(presence.RoomJoin, "c", 3, 3))
	waitLines(t, s, "room v2", "join c online n3 v3")
	m.set("big", 4, "a", "b", "c", "d")
	h.PublishRoom(ev(presence.RoomJoin, "d", 4, 4)) // above 3: interval mode
	waitLines(t, s, "room v2", "join c online n3 v3", "room v4 interval n4 listed 4 next <nil>")
	// Many changes, one message an interval, the net of them.
	v := uint64(4)
	next := func(kind presence.RoomKind, user string, n int) {
		v++
		h.PublishRoom(ev(kind, user, v, n))
	}
	for range 50 {
		next(presence.RoomJoin, "e", 5)
		next(presence.RoomLeave, "e", 4)
	}
	next(presence.RoomJoin, "f", 5)
	next(presence.RoomLeave, "a", 4)
	testwait.For(t, "an interval message", func() bool { return len(s.lines()) == 4 })
	testwait.NothingWithin(150*time.Millisecond, "a second interval message with nothing changed")
	if got := s.lines()[3]; got != "interval n4 +[f] -[a] +0 -0 v106" {
		t.Fatalf("interval message %q", got)
	}
	// Down to 2, below nine tenths of 3: events again, from a snapshot.
	m.set("big", 108, "b", "c")
	next(presence.RoomLeave, "d", 3)
	next(presence.RoomLeave, "f", 2)
	waitLines(t, s, "room v2", "join c online n3 v3", "room v4 interval n4 listed 4 next <nil>",
		"interval n4 +[f] -[a] +0 -0 v106", "room v108")
	next(presence.RoomJoin, "g", 3)
	waitLines(t, s, "room v2", "join c online n3 v3", "room v4 interval n4 listed 4 next <nil>",
		"interval n4 +[f] -[a] +0 -0 v106", "room v108", "join g online n3 v109")
	if st := h.Stats(); st.Intervals != 1 {
		t.Fatalf("stats %+v: want 1 interval message", st)
	}
}

// slowFirstRead is a RoomReader whose first read by viewer slow takes
// the room as it is when the read starts and returns only once release
// is closed (a page read, then slow status reads); every other read is
// the model's.
type slowFirstRead struct {
	*roomModel
	started, release chan struct{}
	once             sync.Once
}

func (r *slowFirstRead) RoomSnapshot(ctx context.Context, viewer, room string, limit int) (fanout.RoomSnapshot, error) {
	first := false
	if viewer == "slow" {
		r.once.Do(func() { first = true })
	}
	snap, err := r.roomModel.RoomSnapshot(ctx, viewer, room, limit)
	if first {
		close(r.started)
		<-r.release
	}
	return snap, err
}

// A snapshot read before another watcher's newer one made the room known
// to the hub is not sent as it is: the events between the two were
// never kept, so its watcher would hold a stale room for good. It is read
// again.
func TestRoomOlderSnapshotReadAgain(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5, "alice")
	rd := &slowFirstRead{roomModel: m, started: make(chan struct{}), release: make(chan struct{})}
	h, err := fanout.NewRoomHub(fanout.RoomConfig{Reader: rd, Contacts: contactBook{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = h.Run(ctx); close(ran) }()
	t.Cleanup(func() { cancel(); <-ran })

	slow, fast := &roomSink{viewer: "slow"}, &roomSink{viewer: "fast"}
	done := make(chan error, 1)
	go func() { done <- h.Watch(context.Background(), slow, "doc") }()
	<-rd.started // slow's read holds the room at v5
	m.set("doc", 6, "alice", "bob")
	h.PublishRoom(join("doc", "bob", 6, 2, presence.Online, presence.Everyone))
	testwait.For(t, "bob's join to be held for the room's first snapshot", func() bool { return h.Stats().Published == 1 })
	watch(t, h, fast, "doc") // reads v6: the hub now holds the room at v6
	close(rd.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.PublishRoom(join("doc", "carol", 7, 3, presence.Online, presence.Everyone))
	waitLines(t, fast, "room v6", "join carol online n3 v7")
	waitLines(t, slow, "room v6", "join carol online n3 v7")
}

// heldContacts is ContactLists whose lookups wait for release.
type heldContacts struct {
	started, release chan struct{}
	once             sync.Once
}

func (c *heldContacts) Contacts(context.Context, string) ([]string, error) {
	c.once.Do(func() { close(c.started) })
	<-c.release
	return nil, nil
}

// A member's change of status published right after its join, while the
// join still waits in the hub's queue, reaches the watchers after the
// join: they are not left with the status the join carried.
func TestRoomStatusRightAfterJoin(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5)
	c := &heldContacts{started: make(chan struct{}), release: make(chan struct{})}
	h, err := fanout.NewRoomHub(fanout.RoomConfig{Reader: m, Contacts: c})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = h.Run(ctx); close(ran) }()
	t.Cleanup(func() { cancel(); <-ran })
	carol := &roomSink{viewer: "carol"}
	watch(t, h, carol, "doc")

	// Run reads bob's contact list for his join (he shows his status to
	// contacts) and waits there: the join is not applied yet.
	set := presence.Settings{Status: presence.Contacts, LastSeen: presence.Everyone}
	h.PublishRoom(&presence.RoomEvent{Room: "doc", UserID: "bob", Kind: presence.RoomJoin, Reason: presence.ReasonJoined,
		Count: 1, Version: 6, Status: presence.Online, Settings: set})
	<-c.started
	// bob shows his status to everyone now.
	h.Publish(&presence.Event{UserID: "bob", Status: presence.Online, Self: presence.Online, Prev: presence.Online, Version: 9,
		Settings:     presence.Settings{Status: presence.Everyone, LastSeen: presence.Everyone},
		SettingsOnly: true, SettingsChanged: true, PrevSettings: set})
	close(c.release)
	waitLines(t, carol, "room v5", "join bob <nil> n1 v6", "status bob online n1 v6")
}

// blockRoom is a roomModel whose reads of one room wait while armed.
type blockRoom struct {
	*roomModel
	room    string
	armed   chan struct{} // closed: reads of room wait for release
	release chan struct{}
	waiting chan struct{} // closed once a read waits
	once    sync.Once
}

func (b *blockRoom) RoomSnapshot(ctx context.Context, viewer, room string, limit int) (fanout.RoomSnapshot, error) {
	select {
	case <-b.armed:
		if room == b.room {
			b.once.Do(func() { close(b.waiting) })
			<-b.release
		}
	default:
	}
	return b.roomModel.RoomSnapshot(ctx, viewer, room, limit)
}

// A resync reads its snapshots off the goroutine that applies every
// room's events: a slow read for one room holds up no other room.
func TestRoomResyncHoldsUpNoOtherRoom(t *testing.T) {
	m := newRoomModel()
	m.set("a", 5)
	m.set("b", 5)
	b := &blockRoom{roomModel: m, room: "a", armed: make(chan struct{}), release: make(chan struct{}), waiting: make(chan struct{})}
	fc := clock.NewFake(time.Unix(1000, 0))
	h, err := fanout.NewRoomHub(fanout.RoomConfig{Reader: b, Contacts: contactBook{}, Clock: fc, GapWait: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "a")
	watch(t, h, s, "b")
	close(b.armed)
	h.PublishRoom(join("a", "ann", 7, 2, presence.Online, presence.Everyone)) // 6 never comes
	testwait.For(t, "the gap to be seen", func() bool { return h.Stats().Gaps == 1 })
	fc.Advance(time.Second)
	<-b.waiting // a's resync read is stuck
	h.PublishRoom(join("b", "bob", 6, 1, presence.Online, presence.Everyone))
	waitLines(t, s, "room v5", "room v5", "join bob online n1 v6")
	m.set("a", 7, "x", "ann")
	close(b.release)
	waitLines(t, s, "room v5", "room v5", "join bob online n1 v6", "room v7")
}

// A room in interval mode is read for a new watcher one page deep: the
// page its snapshot lists.
func TestRoomIntervalSnapshotReadsOnePage(t *testing.T) {
	m := newRoomModel()
	var members []string
	for i := range 150 {
		members = append(members, fmt.Sprintf("u%03d", i))
	}
	m.set("big", 9, members...)
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{IntervalAbove: 100})
	first, second := &roomSink{viewer: "one"}, &roomSink{viewer: "two"}
	watch(t, h, first, "big")
	watch(t, h, second, "big")
	waitLines(t, second, "room v9 interval n150 listed 100 next u099")
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Equal(m.limits, []int{1000, 100}) {
		t.Fatalf("reads of %v members, want 1000 (the room unknown) then 100", m.limits)
	}
}

// A member's change of status while its join is held back (an earlier
// event is missing) is what the join shows once applied: a status hidden
// meanwhile is not shown.
func TestRoomStatusWhileJoinHeldBack(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5, "x")
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{GapWait: time.Hour})
	s := &roomSink{viewer: "carol"}
	watch(t, h, s, "doc")
	h.PublishRoom(join("doc", "dave", 7, 3, presence.Online, presence.Everyone)) // 6 is late
	hidden := presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	h.Publish(&presence.Event{UserID: "dave", Status: presence.Busy, Self: presence.Busy, Prev: presence.Online, Version: 9,
		Settings: hidden, SettingsChanged: true, PrevSettings: presence.Settings{}})
	testwait.For(t, "the change applied", func() bool { return h.Stats().Published == 2 && len(s.lines()) == 1 })
	testwait.NothingWithin(50*time.Millisecond, "the change overtaking the held join")
	h.PublishRoom(join("doc", "erin", 6, 2, presence.Online, presence.Everyone))
	waitLines(t, s, "room v5", "join erin online n2 v6", "join dave <nil> n3 v7")
}

// While no room is watched, the changes of the node pass without being
// queued (Publish is on the path of every change).
func TestRoomNothingQueuedWhileNoRoomWatched(t *testing.T) {
	h := newRoomHub(t, newRoomModel(), contactBook{}, fanout.RoomConfig{})
	h.Publish(&presence.Event{UserID: "ann", Status: presence.Busy, Version: 1})
	h.PublishRoom(join("doc", "ann", 1, 1, presence.Online, presence.Everyone))
	if st := h.Stats(); st.Published != 0 {
		t.Fatalf("stats %+v: queued with no room watched", st)
	}
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "doc")
	h.PublishRoom(join("doc", "bob", 2, 2, presence.Online, presence.Everyone))
	if st := h.Stats(); st.Published != 1 {
		t.Fatalf("stats %+v: want the join of a watched room queued", st)
	}
}

// failRoom is a roomModel whose reads fail once armed is closed.
type failRoom struct {
	*roomModel
	armed chan struct{}
}

func (f *failRoom) RoomSnapshot(ctx context.Context, viewer, room string, limit int) (fanout.RoomSnapshot, error) {
	select {
	case <-f.armed:
		return fanout.RoomSnapshot{}, errors.New("the store does not answer")
	default:
	}
	return f.roomModel.RoomSnapshot(ctx, viewer, room, limit)
}

// A watcher whose room cannot be read again for a resync is told with an
// error that names the room and the watch_room as the request refused — the
// watch ended, and a client is to send it again — and watches it no more.
func TestRoomResyncFailureNamesTheWatch(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5)
	f := &failRoom{roomModel: m, armed: make(chan struct{})}
	fc := clock.NewFake(time.Unix(1000, 0))
	h, err := fanout.NewRoomHub(fanout.RoomConfig{Reader: f, Contacts: contactBook{}, Clock: fc, GapWait: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "doc")
	close(f.armed)
	h.PublishRoom(join("doc", "ann", 7, 2, presence.Online, presence.Everyone)) // 6 never comes
	testwait.For(t, "the gap to be seen", func() bool { return h.Stats().Gaps == 1 })
	fc.Advance(time.Second)
	testwait.For(t, "the error", func() bool { return len(s.msgs()) == 2 })
	m2 := s.msgs()[1]
	if m2["type"] != "error" || m2["code"] != "unavailable" || m2["request"] != "watch_room" || m2["room"] != "doc" {
		t.Fatalf("got %v, want an unavailable of the watch_room of doc", m2)
	}
	if h.Watched(s) != 0 {
		t.Fatalf("still watching %d rooms", h.Watched(s))
	}
}

// A member's change that a watcher's snapshot already shows is not sent
// to that watcher — neither one that reached the hub while the snapshot
// was read nor one that reached it after — while the watchers who were
// not shown it get it, and the member's next change goes to everyone.
func TestRoomStatusTheSnapshotShows(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5, "dave")
	m.show("dave", presence.Online, 3)
	// The hub's clock stands still: the window in which a snapshot
	// stands for what it showed does not pass however slow the run.
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{Clock: clock.NewFake(time.Unix(1000, 0))})
	first := &roomSink{viewer: "first"}
	watch(t, h, first, "doc")
	set := presence.Settings{Status: presence.Everyone, LastSeen: presence.Everyone}
	change := func(st presence.Status, v uint64) *presence.Event {
		return &presence.Event{UserID: "dave", Status: st, Self: st, Prev: presence.Online, Version: v, Settings: set}
	}

	// During the read: dave's change is made, the read sees it, and the
	// change reaches the hub before the snapshot is sent.
	release := m.holdReads()
	during := &roomSink{viewer: "during"}
	done := make(chan error, 1)
	go func() { done <- h.Watch(context.Background(), during, "doc") }()
	testwait.For(t, "the second watcher registered", func() bool { return h.Stats().Watchers == 2 })
	m.show("dave", presence.Away, 4)
	h.Publish(change(presence.Away, 4))
	waitLines(t, first, "room v5", "status dave away n1 v5")
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// After the read: the change is made and read, and reaches the hub
	// only once the snapshot was sent.
	m.show("dave", presence.Busy, 6)
	after := &roomSink{viewer: "after"}
	watch(t, h, after, "doc")
	h.Publish(change(presence.Busy, 6))
	waitLines(t, first, "room v5", "status dave away n1 v5", "status dave busy n1 v5")
	waitLines(t, during, "room v5", "status dave busy n1 v5")

	// The next change goes to everyone.
	h.Publish(change(presence.Online, 7))
	waitLines(t, first, "room v5", "status dave away n1 v5", "status dave busy n1 v5", "status dave online n1 v5")
	waitLines(t, during, "room v5", "status dave busy n1 v5", "status dave online n1 v5")
	waitLines(t, after, "room v5", "status dave online n1 v5")
	if st := h.Stats(); st.Repeats != 2 {
		t.Errorf("repeats %d, want 2 (one to each later watcher)", st.Repeats)
	}
}

// A snapshot stands for the members it showed ahead of the hub for a
// while only (the changes then on their way reach the hub within it):
// after that, a change at its version is sent again.
func TestRoomSnapshotCoversForAWhile(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5, "dave")
	m.show("dave", presence.Online, 3)
	fc := clock.NewFake(time.Unix(1000, 0))
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{Clock: fc})
	first := &roomSink{viewer: "first"}
	watch(t, h, first, "doc")
	m.show("dave", presence.Busy, 6)
	late := &roomSink{viewer: "late"}
	watch(t, h, late, "doc")
	fc.Advance(3 * time.Second)
	h.Publish(&presence.Event{UserID: "dave", Status: presence.Busy, Self: presence.Busy, Prev: presence.Online, Version: 6,
		Settings: presence.Settings{Status: presence.Everyone, LastSeen: presence.Everyone}})
	waitLines(t, first, "room v5", "status dave busy n1 v5")
	waitLines(t, late, "room v5", "status dave busy n1 v5")
}

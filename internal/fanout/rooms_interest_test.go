package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
)

// busInterest is a RoomInterest that does what the bus does: it keeps
// a subscription per room and per user in step with the hub's
// RoomWatched and MemberWatched, whatever order the calls come in. It
// logs each call; block, when set, holds WatchRooms until it is closed.
type busInterest struct {
	h *fanout.RoomHub

	mu      sync.Mutex
	rooms   map[string]bool
	users   map[string]bool
	log     []string
	entered chan string   // each WatchRooms' rooms, when set
	block   chan struct{} // WatchRooms waits for it, when set
	reads   func() int    // the snapshot reads so far, logged by WatchRooms
}

func newBusInterest() *busInterest {
	return &busInterest{rooms: map[string]bool{}, users: map[string]bool{}}
}

func (b *busInterest) WatchRooms(rooms []string) {
	b.mu.Lock()
	for _, r := range rooms {
		b.rooms[r] = b.h.RoomWatched(r)
		b.log = append(b.log, fmt.Sprintf("+room %s after %d reads", r, b.reads()))
	}
	entered, block := b.entered, b.block
	b.mu.Unlock()
	for _, r := range rooms {
		if entered != nil {
			entered <- r
		}
	}
	if block != nil {
		<-block
	}
}

func (b *busInterest) UnwatchRooms(rooms []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range rooms {
		b.rooms[r] = b.h.RoomWatched(r)
		b.log = append(b.log, "-room "+r)
	}
}

func (b *busInterest) Watch(users []string) { b.reconcile(users) }

func (b *busInterest) Unwatch(users []string) { b.reconcile(users) }

func (b *busInterest) reconcile(users []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, u := range users {
		b.users[u] = b.h.MemberWatched(u)
	}
}

// subscribed returns the rooms and users subscribed now, sorted.
func (b *busInterest) subscribed() (rooms, users []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for r, on := range b.rooms {
		if on {
			rooms = append(rooms, r)
		}
	}
	for u, on := range b.users {
		if on {
			users = append(users, u)
		}
	}
	sort.Strings(rooms)
	sort.Strings(users)
	return rooms, users
}

func (b *busInterest) calls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.log)
}

// waitSubscribed waits until b subscribes to exactly rooms and users.
func waitSubscribed(t *testing.T, b *busInterest, rooms, users []string) {
	t.Helper()
	testwait.Forf(t, func() string {
		r, u := b.subscribed()
		return fmt.Sprintf("subscriptions to rooms %v and users %v, have %v and %v", rooms, users, r, u)
	}, func() bool {
		r, u := b.subscribed()
		return slices.Equal(r, rooms) && slices.Equal(u, users)
	})
}

// newInterestHub returns a running hub with b as its interest, set with
// SetInterest as the node does.
func newInterestHub(t *testing.T, m *roomModel, b *busInterest, cfg fanout.RoomConfig) *fanout.RoomHub {
	t.Helper()
	h := newRoomHub(t, m, contactBook{}, cfg)
	b.h, b.reads = h, m.readCount
	h.SetInterest(b)
	return h
}

// The interest hears of a room when it gets its first watcher, before
// its snapshot is read, and when it lost its last; and of the members
// of watched rooms as they come and go: those of the snapshot, a joining
// one as soon as its join is queued, a leaving one.
func TestRoomInterestRoomsAndMembers(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5, "ann", "bob")
	m.set("other", 3, "bob")
	b := newBusInterest()
	h := newInterestHub(t, m, b, fanout.RoomConfig{GapWait: time.Hour})
	zed, yan := &roomSink{viewer: "zed"}, &roomSink{viewer: "yan"}
	watch(t, h, zed, "doc")
	watch(t, h, yan, "doc") // a second watcher: no call
	watch(t, h, yan, "other")
	waitSubscribed(t, b, []string{"doc", "other"}, []string{"ann", "bob"})

	// carol's join is held back (6 is missing): she is watched already,
	// so that her changes of status on other nodes follow her join.
	h.PublishRoom(join("doc", "carol", 7, 2, presence.Online, presence.Everyone))
	waitSubscribed(t, b, []string{"doc", "other"}, []string{"ann", "bob", "carol"})
	h.PublishRoom(leave("doc", "ann", 6, 1))
	waitLines(t, zed, "room v5", "leave ann <nil> n1 v6", "join carol online n2 v7")
	waitSubscribed(t, b, []string{"doc", "other"}, []string{"bob", "carol"})

	h.Unwatch(zed, "doc")
	if _, u := b.subscribed(); len(u) != 2 {
		t.Fatalf("after one of two watchers left: users %v", u)
	}
	h.Remove(yan)
	waitSubscribed(t, b, nil, nil)
	want := []string{"+room doc after 0 reads", "+room other after 2 reads"}
	got := b.calls()
	if !slices.Equal(got[:2], want) || len(got) != 4 || !slices.Contains(got, "-room doc") || !slices.Contains(got, "-room other") {
		t.Fatalf("room calls %q, want %q then both rooms' ends", got, want)
	}
	if h.MemberWatched("bob") || h.RoomWatched("doc") {
		t.Fatal("bob or doc still watched after the last watcher left")
	}
}

// A second watcher of a room whose first watcher is still telling the
// interest (the bus subscribing) does not read its snapshot before that
// call returned: an event of another node published meanwhile would
// reach neither its snapshot nor it. A Watch that waits gives up with its
// ctx.
func TestRoomSnapshotWaitsForTheFirstWatchersInterest(t *testing.T) {
	m := newRoomModel()
	m.set("doc", 5, "ann")
	b := newBusInterest()
	b.entered, b.block = make(chan string, 1), make(chan struct{})
	h := newInterestHub(t, m, b, fanout.RoomConfig{})
	first, second, third := &roomSink{viewer: "first"}, &roomSink{viewer: "second"}, &roomSink{viewer: "third"}
	done := make(chan error, 2)
	go func() { done <- h.Watch(context.Background(), first, "doc") }()
	if r := <-b.entered; r != "doc" {
		t.Fatalf("WatchRooms(%s), want doc", r)
	}
	go func() { done <- h.Watch(context.Background(), second, "doc") }()
	testwait.For(t, "the second watcher registered", func() bool { return h.Stats().Watchers == 2 })
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- h.Watch(ctx, third, "doc") }()
	testwait.For(t, "the third watcher registered", func() bool { return h.Stats().Watchers == 3 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("a Watch whose ctx ended while it waited: %v", err)
	}
	testwait.NothingWithin(50*time.Millisecond, "a snapshot read before WatchRooms returned")
	if n := m.readCount(); n != 0 {
		t.Fatalf("%d snapshots read while the room's WatchRooms was under way", n)
	}
	close(b.block)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	waitLines(t, first, "room v5")
	waitLines(t, second, "room v5")
	if st := h.Stats(); st.Watchers != 2 || len(third.lines()) != 0 {
		t.Fatalf("stats %+v, third got %q", st, third.lines())
	}
}

// Resync sends every watcher of every room a fresh snapshot (after the
// node was cut off from the other nodes' events), and events go on from
// there.
func TestRoomResync(t *testing.T) {
	m := newRoomModel()
	m.set("a", 5)
	m.set("b", 2, "x")
	h := newRoomHub(t, m, contactBook{}, fanout.RoomConfig{})
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "a")
	watch(t, h, s, "b")
	// Events missed meanwhile: a is at 7, b as it was.
	m.set("a", 7, "ann", "bob")
	h.Resync()
	testwait.For(t, "both rooms resynced", func() bool { return h.Stats().Resyncs == 2 })
	testwait.For(t, "the fresh snapshots", func() bool { return len(s.lines()) == 4 })
	h.PublishRoom(join("a", "cid", 8, 3, presence.Online, presence.Everyone))
	h.PublishRoom(leave("b", "x", 3, 0))
	testwait.For(t, "the events after", func() bool { return len(s.lines()) == 6 })
	got := s.lines()
	sort.Strings(got[2:4]) // the two rooms' snapshots come in any order
	want := []string{"room v5", "room v2", "room v2", "room v7"}
	if !slices.Equal(got[:4], want) || !slices.Contains(got[4:], "join cid online n3 v8") || !slices.Contains(got[4:], "leave x <nil> n0 v3") {
		t.Fatalf("sent %q", got)
	}
}

// Watchers coming and going on many rooms at once: in the end the
// interest subscribes to nothing, and while one room stays watched, to it
// and its members.
func TestRoomInterestConcurrent(t *testing.T) {
	m := newRoomModel()
	for i := range 5 {
		m.set(fmt.Sprint("r", i), 1, fmt.Sprint("m", i), "shared")
	}
	b := newBusInterest()
	h := newInterestHub(t, m, b, fanout.RoomConfig{})
	stay := &roomSink{viewer: "stay"}
	watch(t, h, stay, "r0")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			s := &roomSink{viewer: fmt.Sprint("v", g)}
			for i := range 100 {
				room := fmt.Sprint("r", (i+g)%5)
				if err := h.Watch(context.Background(), s, room); err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					h.Unwatch(s, room)
				}
				if i%7 == 0 {
					h.Remove(s)
				}
			}
			h.Remove(s)
		})
	}
	wg.Wait()
	waitSubscribed(t, b, []string{"r0"}, []string{"m0", "shared"})
	h.Remove(stay)
	waitSubscribed(t, b, nil, nil)
}

// A room in interval mode shows no member's status: the hub wants none of
// its members' changes, not even a joining one's while the join waits in
// its queue, so the bus never subscribes to them.
func TestRoomInterestNoMembersOfBigRooms(t *testing.T) {
	m := newRoomModel()
	m.set("big", 5, "ann", "bob", "cid")
	m.set("small", 1, "eve")
	b := newBusInterest()
	// Run is not running: the joins stay queued.
	h, err := fanout.NewRoomHub(fanout.RoomConfig{Reader: m, Contacts: contactBook{}, IntervalAbove: 2})
	if err != nil {
		t.Fatal(err)
	}
	b.h, b.reads = h, m.readCount
	h.SetInterest(b)
	s := &roomSink{viewer: "zed"}
	watch(t, h, s, "big")
	watch(t, h, s, "small")
	h.PublishRoom(join("big", "dan", 6, 4, presence.Online, presence.Everyone))
	h.PublishRoom(join("small", "fay", 2, 2, presence.Online, presence.Everyone))
	if h.MemberWatched("dan") || h.MemberWatched("ann") {
		t.Error("a member of a room in interval mode is watched")
	}
	if !h.MemberWatched("fay") || !h.MemberWatched("eve") {
		t.Error("the members of a small room, joining or in its snapshot, are not watched")
	}
}

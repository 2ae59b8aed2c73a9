package natsbus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// The bus and a real room hub, as a node wires them: the hub is the
// bus's Rooms and, with the node's other watchers, its Local; the bus is
// the hub's interest.

// oneRoom is a RoomReader of rooms that hold one member, ann, online and
// seen by all, at version 4; it knows no member's state.
type oneRoom struct{}

func (oneRoom) RoomSnapshot(_ context.Context, _, _ string, _ int) (fanout.RoomSnapshot, error) {
	return fanout.RoomSnapshot{Version: 4, Count: 1,
		Members: []privacy.View{{UserID: "ann", StatusVisible: true, Status: presence.Online}}}, nil
}

func (oneRoom) MemberStates(context.Context, []string, []presence.Snapshot) error { return nil }

// contactLists is fanout.ContactLists over a map.
type contactLists map[string][]string

func (c contactLists) Contacts(_ context.Context, owner string) ([]string, error) {
	return c[owner], nil
}

// roomWatcher is a fanout.RoomSink that keeps what it is sent as lines
// "event user status count version".
type roomWatcher struct {
	viewer string
	mu     sync.Mutex
	lines  []string
}

func (w *roomWatcher) Viewer() string { return w.viewer }

func (w *roomWatcher) DeliverRoom(_ string, frame []byte) {
	var m map[string]any
	if err := json.Unmarshal(frame, &m); err != nil {
		panic(fmt.Sprintf("frame is no JSON: %s", frame))
	}
	line := fmt.Sprintf("%v v%v", m["type"], m["version"])
	if m["type"] == "room_change" {
		status := "null"
		if s, ok := m["status"].(string); ok {
			status = s
		}
		line = fmt.Sprintf("%v %v %s n%v v%v", m["event"], m["user_id"], status, m["count"], m["version"])
	}
	w.mu.Lock()
	w.lines = append(w.lines, line)
	w.mu.Unlock()
}

func (w *roomWatcher) got() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.lines)
}

func (w *roomWatcher) waitFor(t *testing.T, want ...string) {
	t.Helper()
	testwait.Forf(t, func() string { return fmt.Sprintf("%s to be sent %q, has %q", w.viewer, want, w.got()) }, func() bool {
		return slices.Equal(w.got(), want)
	})
}

// nodeLocal is a node's Local: its sockets' watchers (the recorder) and
// the members of its watched rooms (the room hub).
type nodeLocal struct {
	rec   *recorder
	rooms *fanout.RoomHub
}

func (l nodeLocal) Publish(ev *presence.Event) { l.rec.Publish(ev); l.rooms.Publish(ev) }

func (l nodeLocal) Watched(user string) bool {
	return l.rec.Watched(user) || l.rooms.MemberWatched(user)
}

// openWithRoomHub opens a bus with a running room hub wired to it.
func (e *env) openWithRoomHub(t *testing.T, name string, contacts contactLists) (*node, *fanout.RoomHub) {
	h, err := fanout.NewRoomHub(fanout.RoomConfig{Reader: oneRoom{}, Contacts: contacts, GapWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	rec := newRecorder()
	n := e.open(name, func(c *Config) { c.Local, c.Rooms = nodeLocal{rec, h}, h })
	n.rec = rec
	h.SetInterest(n.Bus)
	return n, h
}

// A room's join published on one node reaches the room hub of another
// whose watchers watch the room, each watcher shown the member's status
// as its relation allows (from the message's header); the member's
// changes of status then reach it too, the bus subscribed to the member.
// Its own events the node skips; once its watchers are gone, it
// subscribes to neither the room nor its members.
func TestRoomHubAcrossNodes(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a := e.open("a")
	b, h := e.openWithRoomHub(t, "b", contactLists{"dave": {"bob"}})
	bob, carol := &roomWatcher{viewer: "bob"}, &roomWatcher{viewer: "carol"}
	for _, w := range []*roomWatcher{bob, carol} {
		if err := h.Watch(context.Background(), w, "doc"); err != nil {
			t.Fatal(err)
		}
	}
	if st := b.Stats(); st.RoomSubscriptions != 1 {
		t.Fatalf("b subscribes to %d rooms once doc is watched, want 1", st.RoomSubscriptions)
	}
	testwait.For(t, "b to subscribe to ann, a member", func() bool { return b.Stats().Subscriptions == 1 })

	// dave, busy, shows his status to contacts: bob is one, carol not.
	a.PublishRoom(roomEvent("doc", "dave", presence.RoomJoin, 5))
	bob.waitFor(t, "room v4", "join dave busy n1 v5")
	carol.waitFor(t, "room v4", "join dave null n1 v5")
	testwait.For(t, "b to subscribe to dave, a member now", func() bool { return b.Stats().Subscriptions == 2 })
	b.roundTrip(t) // the server has the subscription: the bus flushes it, but counts it first
	away := event("dave", 20)
	away.Status, away.Self = presence.Away, presence.Away
	away.Settings = presence.Settings{Status: presence.Contacts, LastSeen: presence.Everyone}
	a.Publish(away)
	bob.waitFor(t, "room v4", "join dave busy n1 v5", "status dave away n1 v5")

	// b's own join comes back to it and is skipped (its tracker gave it
	// to its room hub): the hub gets nothing of it from the bus.
	skipped := b.Stats().SkippedOwn
	b.PublishRoom(roomEvent("doc", "erin", presence.RoomJoin, 6))
	testwait.For(t, "b to skip its own join", func() bool { return b.Stats().SkippedOwn == skipped+1 })
	if st := h.Stats(); st.Published != 2 {
		t.Fatalf("room hub stats %+v: want dave's join and change only", st)
	}

	h.Unwatch(bob, "doc")
	h.Unwatch(carol, "doc")
	testwait.For(t, "b to unsubscribe from doc and its members", func() bool {
		st := b.Stats()
		return st.RoomSubscriptions == 0 && st.Subscriptions == 0
	})
	b.roundTrip(t)
	received := b.Stats().Received
	b.watch("marker")
	a.PublishRoom(roomEvent("doc", "fred", presence.RoomJoin, 7))
	a.Publish(event("dave", 21))
	a.Publish(event("marker", 1))
	testwait.For(t, "the marker on b", func() bool { return len(b.rec.of("marker")) == 1 })
	if got := b.Stats().Received; got != received+1 {
		t.Fatalf("b received %d messages after its watchers left, want the marker only", got-received)
	}
}

// roundTrip waits for a round trip of n's connection to NATS: the server
// has processed what n sent before.
func (n *node) roundTrip(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

package fanout_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// A node's real parts — memory store with its rooms, SQLite, tracker,
// query reader — under a room hub, on a fake clock. The tracker's
// changes go to the hub (the node's own) unless the test turns them
// away: a change made on another node, which the bus delivers only once
// it subscribed to the member.

type realNode struct {
	tr      *tracker.Tracker
	durable *sqlitestore.Store
	reader  *query.Reader
	hub     *fanout.RoomHub
	pub     *switchPub
}

// switchPub is the tracker's publisher: the room hub's, while on.
type switchPub struct {
	off atomic.Bool
	mu  sync.Mutex
	hub *fanout.RoomHub
}

func (p *switchPub) to() *fanout.RoomHub {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.off.Load() {
		return nil
	}
	return p.hub
}

func (p *switchPub) Publish(ev *presence.Event) {
	if h := p.to(); h != nil {
		h.Publish(ev)
	}
}

func (p *switchPub) PublishRoom(ev *presence.RoomEvent) {
	if h := p.to(); h != nil {
		h.PublishRoom(ev)
	}
}

// trackerRooms is the reader's Rooms: the tracker's pages.
type trackerRooms struct{ tr *tracker.Tracker }

func (r trackerRooms) RoomPage(ctx context.Context, room, after string, limit int, out []string) (query.RoomPage, error) {
	pg, err := r.tr.RoomPage(ctx, room, after, limit, out)
	return query.RoomPage{Members: pg.Members, Count: pg.Count, Version: pg.Version, More: pg.More}, err
}

// readerRooms is the hub's RoomReader over the query reader, as the
// node's; after, when set, runs once a snapshot was read and before the
// hub has it.
type readerRooms struct {
	r     *query.Reader
	after func()
}

func (s readerRooms) RoomSnapshot(ctx context.Context, viewer, room string, limit int) (fanout.RoomSnapshot, error) {
	v, err := s.r.Room(ctx, viewer, room, "", limit)
	if s.after != nil {
		s.after()
	}
	return fanout.RoomSnapshot{Version: v.Version, Count: v.Count, Members: v.Members, Next: v.Next}, err
}

func (s readerRooms) MemberStates(ctx context.Context, ids []string, out []presence.Snapshot) error {
	return s.r.States(ctx, ids, out)
}

// watchHook is a RoomInterest that does what the bus does (busInterest)
// and, when before is set, calls it with the users of each Watch before
// the subscriptions are made: what it changes is what a node's bus misses.
type watchHook struct {
	*busInterest
	before func(users []string)
}

func (w watchHook) Watch(users []string) {
	if w.before != nil {
		w.before(users)
	}
	w.busInterest.Watch(users)
}

// newRealNode starts the parts; afterSnapshot and beforeWatch are the
// hooks of readerRooms and watchHook (nil: none); with beforeWatch the
// hub has an interest, as with a bus.
func newRealNode(t *testing.T, afterSnapshot func(), beforeWatch func([]string)) *realNode {
	t.Helper()
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	durable, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(t.TempDir(), "p.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = durable.Close() })
	epoch, err := durable.NextEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rules := presence.Rules{TTL: time.Minute, IdleAfter: 5 * time.Minute, Epoch: epoch}
	store := memstore.New(memstore.Config{Rules: rules})
	n := &realNode{durable: durable, pub: &switchPub{}}
	if n.tr, err = tracker.New(tracker.Config{Store: store, Durable: durable, Publisher: n.pub, Clock: clk}); err != nil {
		t.Fatal(err)
	}
	if n.reader, err = query.New(query.Config{States: n.tr, Profiles: durable, Contacts: durable, Clock: clk, Rooms: trackerRooms{n.tr}}); err != nil {
		t.Fatal(err)
	}
	if n.hub, err = fanout.NewRoomHub(fanout.RoomConfig{Reader: readerRooms{n.reader, afterSnapshot}, Contacts: durable, GapWait: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if beforeWatch != nil {
		b := newBusInterest()
		b.h, b.reads = n.hub, func() int { return 0 }
		n.hub.SetInterest(watchHook{b, beforeWatch})
	}
	n.pub.mu.Lock()
	n.pub.hub = n.hub
	n.pub.mu.Unlock()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = n.hub.Run(rctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return n
}

// online brings user's device up and into rooms.
func (n *realNode) online(t *testing.T, user string, rooms ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := n.tr.Heartbeat(ctx, user, "d1", true); err != nil {
		t.Fatal(err)
	}
	for _, r := range rooms {
		if _, err := n.tr.Join(ctx, user, "d1", r); err != nil {
			t.Fatal(err)
		}
	}
}

// elsewhere runs f as another node would: its changes do not reach the
// hub.
func (n *realNode) elsewhere(f func()) {
	n.pub.off.Store(true)
	defer n.pub.off.Store(false)
	f()
}

func (n *realNode) setStatus(t *testing.T, user string, m presence.Manual) {
	t.Helper()
	if _, err := n.tr.SetStatus(context.Background(), user, m, ""); err != nil {
		t.Error(err) // also from the hub's goroutines
	}
}

// statusLines is what s was sent of members' statuses, as
// "status user status".
func statusLines(s *roomSink) []string {
	var out []string
	for _, m := range s.msgs() {
		if m["type"] == "room_change" && m["event"] == "status" {
			out = append(out, fmt.Sprintf("status %v %v", m["user_id"], m["status"]))
		}
	}
	return out
}

func waitStatuses(t *testing.T, s *roomSink, want ...string) {
	t.Helper()
	testwait.Forf(t, func() string { return fmt.Sprintf("%s to be sent %q, has %q", s.viewer, want, s.lines()) }, func() bool {
		return slices.Equal(statusLines(s), want)
	})
}

// A member's change made on another node after the room's snapshot was
// read and before the bus's subscription to the member reached NATS
// never arrives on the bus: once subscribed, the hub reads the member
// again and sends the watchers what changed, each as its class may see
// it — a contact the new status, a stranger the status hidden when the
// member hid it meanwhile.
func TestRoomMemberChangedBeforeTheBusSubscribed(t *testing.T) {
	var n *realNode
	var once sync.Once
	n = newRealNode(t, nil, func(users []string) {
		if !slices.Contains(users, "dave") {
			return
		}
		once.Do(func() {
			n.elsewhere(func() {
				n.setStatus(t, "dave", presence.ManualBusy)
				if err := n.tr.SetSettings(context.Background(), "dave", presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts}); err != nil {
					t.Error(err)
				}
			})
		})
	})
	ctx := context.Background()
	if err := n.durable.SetContacts(ctx, "dave", []string{"bob"}); err != nil {
		t.Fatal(err)
	}
	n.online(t, "dave", "doc")
	n.online(t, "erin", "doc")
	bob, carol := &roomSink{viewer: "bob"}, &roomSink{viewer: "carol"}
	for _, s := range []*roomSink{bob, carol} {
		if err := n.hub.Watch(ctx, s, "doc"); err != nil {
			t.Fatal(err)
		}
	}
	waitStatuses(t, bob, "status dave busy")
	// The hub tells its interest of bob's watch in its own time: carol's
	// snapshot was read before the changes (she is then sent dave
	// hidden) or after them (it shows him hidden, and nothing follows).
	var carolSent []string
	testwait.Forf(t, func() string { return fmt.Sprintf("carol to see dave hidden, has %q", carol.lines()) }, func() bool {
		switch lines := statusLines(carol); {
		case slices.Equal(lines, []string{"status dave <nil>"}):
			carolSent = lines
			return true
		case len(lines) == 0:
			ms := carol.msgs()
			if len(ms) == 0 || ms[0]["type"] != "room" {
				return false
			}
			members, _ := ms[0]["members"].(map[string]any)
			st, ok := members["dave"]
			return ok && st == nil
		}
		return false
	})

	// What did not change is not sent again: erin's state was read too.
	if st := n.hub.Stats(); st.MemberReads < 2 {
		t.Fatalf("stats %+v: dave and erin read again", st)
	}
	n.setStatus(t, "erin", presence.ManualAway) // a marker: it follows the reads' changes
	waitStatuses(t, bob, "status dave busy", "status erin away")
	waitStatuses(t, carol, append(carolSent, "status erin away")...)
}

// The node's own change of a member made after the room's snapshot was
// read and before the hub indexed the member reaches the room's watchers
// too, without a bus: the hub reads its new members again.
func TestRoomMemberChangedBeforeItsIndex(t *testing.T) {
	var n *realNode
	var once sync.Once
	n = newRealNode(t, func() {
		once.Do(func() { n.setStatus(t, "dave", presence.ManualAway) })
	}, nil)
	n.online(t, "dave", "doc")
	carol := &roomSink{viewer: "carol"}
	if err := n.hub.Watch(context.Background(), carol, "doc"); err != nil {
		t.Fatal(err)
	}
	waitStatuses(t, carol, "status dave away")
	if m := carol.msgs()[0]; m["type"] != "room" || fmt.Sprint(m["members"]) != "map[dave:online]" {
		t.Fatalf("carol's snapshot %v: dave online, read before his change", m)
	}
}

// A member read again unchanged sends nothing; one whose change reached
// the hub meanwhile is not sent the older state read before it.
func TestRoomMemberReadAgainUnchanged(t *testing.T) {
	n := newRealNode(t, nil, func([]string) {})
	n.online(t, "dave", "doc")
	n.online(t, "erin", "doc")
	carol := &roomSink{viewer: "carol"}
	if err := n.hub.Watch(context.Background(), carol, "doc"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "dave and erin read again", func() bool { return n.hub.Stats().MemberReads >= 2 })
	n.setStatus(t, "erin", presence.ManualBusy) // a marker: it follows the reads' changes
	waitStatuses(t, carol, "status erin busy")
}

// A member who joins a watched room and then watches it itself is shown
// its own status by its snapshot; the hub's re-read of the new member
// (its join may predate the bus's subscription) finds that status again
// and sends nothing, to it or to the room's other watchers.
func TestRoomMemberReadAgainAfterItsOwnSnapshot(t *testing.T) {
	release := make(chan struct{})
	n := newRealNode(t, nil, func(users []string) {
		if slices.Contains(users, "dave") {
			<-release // dave's read waits for his own watch
		}
	})
	ctx := context.Background()
	n.online(t, "erin", "doc")
	carol := &roomSink{viewer: "carol"}
	if err := n.hub.Watch(ctx, carol, "doc"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "erin read again", func() bool { return n.hub.Stats().MemberReads >= 1 })
	reads := n.hub.Stats().MemberReads
	n.online(t, "dave", "doc")
	testwait.For(t, "dave's join applied", func() bool { return len(carol.msgs()) == 2 })
	dave := &roomSink{viewer: "dave"}
	if err := n.hub.Watch(ctx, dave, "doc"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "dave's snapshot", func() bool { return len(dave.msgs()) > 0 })
	close(release)
	testwait.For(t, "dave read again", func() bool { return n.hub.Stats().MemberReads > reads })
	n.setStatus(t, "erin", presence.ManualBusy) // a marker: it follows the read's change
	waitStatuses(t, carol, "status erin busy")
	waitStatuses(t, dave, "status erin busy")
}

// A change of a member that shows its watchers nothing new (its status
// text, a room view shows none) sends them nothing, though no change
// was sent to them before: their snapshots showed that status.
func TestRoomMemberChangeShowingNothingNew(t *testing.T) {
	n := newRealNode(t, nil, nil)
	ctx := context.Background()
	n.online(t, "dave", "doc")
	n.online(t, "erin", "doc")
	n.setStatus(t, "dave", presence.ManualBusy)
	carol := &roomSink{viewer: "carol"}
	dave := &roomSink{viewer: "dave"}
	for _, s := range []*roomSink{carol, dave} {
		if err := n.hub.Watch(ctx, s, "doc"); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "dave and erin read again", func() bool { return n.hub.Stats().MemberReads >= 2 })
	if _, err := n.tr.SetStatus(ctx, "dave", presence.ManualBusy, "in a call"); err != nil {
		t.Fatal(err)
	}
	n.setStatus(t, "erin", presence.ManualAway) // a marker: it follows dave's change
	waitStatuses(t, carol, "status erin away")
	waitStatuses(t, dave, "status erin away")
}

package tracker_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// roomRecorder is a recorder that also takes room events.
type roomRecorder struct {
	recorder
	rmu   sync.Mutex
	rooms []string
}

func (r *roomRecorder) PublishRoom(ev *presence.RoomEvent) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.rooms = append(r.rooms, fmt.Sprintf("%s %s %s %s %d", ev.Kind, ev.Room, ev.UserID, ev.Reason, ev.Count))
}

func (r *roomRecorder) takeRooms() []string {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	out := r.rooms
	r.rooms = nil
	slices.Sort(out)
	return out
}

func newRoomFixture(t *testing.T) (*fixture, *roomRecorder) {
	t.Helper()
	f := &fixture{t: t, ctx: t.Context(), clock: clock.NewFake(start), durable: newMemDurable(),
		store: memstore.New(memstore.Config{Rules: rules})}
	pub := &roomRecorder{}
	tr, err := tracker.New(tracker.Config{Store: f.store, Durable: f.durable, Publisher: pub, Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	f.tr, f.pub = tr, &pub.recorder
	return f, pub
}

func wantRoomEvents(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: published %q, want %q", what, got, want)
	}
}

// Every way a membership ends reaches the publisher: a leave, a close
// past the grace (the sweep), going invisible; and a join is published
// once per member, not per device.
func TestRoomEventsPublished(t *testing.T) {
	f, pub := newRoomFixture(t)
	if _, err := f.tr.Join(f.ctx, "alice", "phone", "doc"); !errors.Is(err, presence.ErrDeviceNotAlive) {
		t.Fatalf("join before the first beat: %v", err)
	}
	if _, err := f.tr.SocketConnect(f.ctx, "alice", "phone"); err != nil {
		t.Fatal(err)
	}
	f.beat("alice", "laptop", true)
	f.beat("bob", "phone", true)
	for _, j := range [][3]string{{"alice", "phone", "doc"}, {"alice", "laptop", "doc"}, {"alice", "phone", "call"}, {"bob", "phone", "doc"}} {
		if _, err := f.tr.Join(f.ctx, j[0], j[1], j[2]); err != nil {
			t.Fatal(err)
		}
	}
	wantRoomEvents(t, "joins", pub.takeRooms(), "join doc alice joined 1", "join call alice joined 1", "join doc bob joined 2")
	if _, err := f.tr.Leave(f.ctx, "alice", "phone", "call"); err != nil {
		t.Fatal(err)
	}
	wantRoomEvents(t, "a leave", pub.takeRooms(), "leave call alice left 0")
	f.status("bob", presence.ManualInvisible, "")
	wantRoomEvents(t, "bob invisible", pub.takeRooms(), "leave doc bob invisible 1")
	f.status("bob", presence.ManualNone, "")
	wantRoomEvents(t, "bob back", pub.takeRooms(), "join doc bob visible 2")
	// The phone's socket closes; it ends after the grace, the laptop lives on.
	if err := f.tr.Disconnect(f.ctx, "alice", "phone", f.tr.Now()); err != nil {
		t.Fatal(err)
	}
	f.at(time.Second)
	f.beat("alice", "laptop", true)
	if _, err := f.tr.Bye(f.ctx, "alice", "laptop"); err != nil {
		t.Fatal(err)
	}
	wantRoomEvents(t, "the laptop's bye", pub.takeRooms())
	f.at(presence.DefaultCloseGrace + time.Second)
	f.sweep()
	wantRoomEvents(t, "the sweep after the phone's grace", pub.takeRooms(), "leave doc alice ended 1")
	if st := f.tr.Stats(); st.RoomEvents != 7 {
		t.Fatalf("RoomEvents %d, want 7", st.RoomEvents)
	}
	p, err := f.tr.RoomPage(f.ctx, "doc", "", 10, nil)
	if err != nil || !slices.Equal(p.Members, []string{"bob"}) || p.Count != 1 {
		t.Fatalf("doc: %+v %v", p, err)
	}
	n, err := f.tr.RoomCounts(f.ctx, []string{"doc", "call"}, nil)
	if err != nil || !slices.Equal(n, []int{1, 0}) {
		t.Fatalf("counts %v %v", n, err)
	}
}

// storeOnly is a Store with no ability beyond tracker.Store.
type storeOnly struct{ tracker.Store }

func TestRoomsUnsupported(t *testing.T) {
	tr, err := tracker.New(tracker.Config{Store: storeOnly{memstore.New(memstore.Config{})}, Durable: newMemDurable()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := tr.Join(ctx, "a", "d", "r"); !errors.Is(err, tracker.ErrRoomsUnsupported) {
		t.Fatalf("join: %v", err)
	}
	if _, err := tr.RoomPage(ctx, "r", "", 1, nil); !errors.Is(err, tracker.ErrRoomsUnsupported) {
		t.Fatalf("page: %v", err)
	}
	if _, err := tr.RoomCounts(ctx, []string{"r"}, nil); !errors.Is(err, tracker.ErrRoomsUnsupported) {
		t.Fatalf("counts: %v", err)
	}
}

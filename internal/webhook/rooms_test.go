package webhook

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wire"
)

func roomEvent(room, user string, kind presence.RoomKind, version uint64) *presence.RoomEvent {
	ev := &presence.RoomEvent{Room: room, UserID: user, Kind: kind, Reason: presence.ReasonJoined,
		Count: 1, Version: version, At: 1795000003000}
	if kind == presence.RoomLeave {
		ev.Reason, ev.Count = presence.ReasonLeft, 0
	}
	return ev
}

// roomsOf returns what r got of room.
func (r *receiver) roomsOf(room string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rooms[room])
}

// The body puts the changes of a batch in "events" and its room events,
// when it has any, in "room_events", each list in the order of the log.
func TestEncodeRooms(t *testing.T) {
	c1 := wire.AppendChange(nil, event("ann", 1))
	c2 := wire.AppendChange(nil, event("bob", 2))
	j := wire.AppendRoomEvent(nil, roomEvent("doc", "ann", presence.RoomJoin, 7))
	l := wire.AppendRoomEvent(nil, roomEvent("doc", "ann", presence.RoomLeave, 8))
	for _, tc := range []struct {
		batch [][]byte
		want  string
	}{
		{[][]byte{c1, c2}, `{"events":[` + string(c1) + `,` + string(c2) + `]}`},
		{[][]byte{j, c1, l, c2}, `{"events":[` + string(c1) + `,` + string(c2) + `],"room_events":[` + string(j) + `,` + string(l) + `]}`},
		{[][]byte{j}, `{"events":[],"room_events":[` + string(j) + `]}`},
	} {
		var batch []entry
		for _, d := range tc.batch {
			batch = append(batch, entry{data: d})
		}
		if got := string(encode(nil, batch)); got != tc.want {
			t.Errorf("encode:\n got %s\nwant %s", got, tc.want)
		}
	}
}

// Room events go through the outbox like changes: Confirm waits for them,
// they are signed and delivered in order in "room_events", and those the
// endpoint had not taken when the node stopped are delivered from the
// file by the next Sender, still as room events.
func TestRoomEventsThroughTheOutbox(t *testing.T) {
	path := filepath.Join(t.TempDir(), "presenced.db")
	r := newReceiver(t)
	cfg := Config{URLs: []string{"http://" + r.addr + "/hook"}, Linger: time.Millisecond,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, DrainTimeout: 100 * time.Millisecond}
	cfg.Outbox = openDB(t, path)
	s := run(t, cfg)
	s.Publish(event("ann", 1))
	s.PublishRoom(roomEvent("doc", "ann", presence.RoomJoin, 1))
	s.PublishRoom(roomEvent("r:doc", "ann", presence.RoomJoin, 1))
	if !s.Confirm(context.Background()) {
		t.Fatal("Confirm: false")
	}
	testwait.For(t, "the first room events", func() bool { return len(r.roomsOf("r:doc")) == 1 })
	// Acknowledged and out of the outbox, or the restart below sends the
	// first batch again (delivery is at least once).
	testwait.For(t, "the first batch acknowledged", func() bool { return s.Stats().Queued == 0 })
	r.down()
	s.PublishRoom(roomEvent("doc", "bob", presence.RoomJoin, 2))
	s.Publish(event("ann", 2))
	s.PublishRoom(roomEvent("doc", "ann", presence.RoomLeave, 3))
	if !s.Confirm(context.Background()) {
		t.Fatal("Confirm: false")
	}
	s.stop()
	cfg.Outbox.(*sqlitestore.Store).Close()

	r.up()
	cfg.Outbox = openDB(t, path)
	s = run(t, cfg)
	testwait.For(t, "the room events left in the outbox", func() bool { return len(r.roomsOf("doc")) >= 3 })
	testwait.For(t, "every event delivered", func() bool { return s.Stats().Queued == 0 })
	s.stop()
	if got, want := r.roomsOf("doc"), []string{"join ann 1", "join bob 2", "leave ann 3"}; !slices.Equal(got, want) {
		t.Errorf("doc's events %q, want %q", got, want)
	}
	r.checkAll(t, []string{"ann"}, 2)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) != 1 || len(r.got["ann"]) != 2 {
		t.Errorf("changes %v, want ann's two", r.got)
	}
}

// Room events on the change stream reach the endpoint in "room_events",
// in order, once; the changes beside them in "events".
func TestStreamRoomEvents(t *testing.T) {
	e := newStreamEnv(t, testsvc.SharedNATS(t))
	r := newReceiver(t)
	a, _ := e.node("a", Config{URLs: []string{"http://" + r.addr + "/hook"}, MaxBatch: 4, Linger: 5 * time.Millisecond})
	users := names(3)
	var want []string
	for v := uint64(1); v <= 10; v++ {
		for _, u := range users {
			e.bus.Publish(event(u, v))
			kind := presence.RoomJoin
			if v%2 == 0 {
				kind = presence.RoomLeave
			}
			ev := roomEvent("doc", u, kind, uint64(len(want)+1))
			e.bus.PublishRoom(ev)
			want = append(want, ev.Kind.String()+" "+u+" "+strconv.FormatUint(ev.Version, 10))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Timeout)
	defer cancel()
	if !e.bus.Wait(ctx, e.bus.Mark()) {
		t.Fatal("the stream did not take the events")
	}
	testwait.For(t, "every event", func() bool { return a.Stats().Delivered == uint64(2*len(want)) })
	a.stop()
	if got := r.roomsOf("doc"); !slices.Equal(got, want) {
		t.Errorf("doc's events:\n got %q\nwant %q", got, want)
	}
	r.checkAll(t, users, 10)
	if st := a.Stats(); st.Dropped != 0 {
		t.Errorf("stats %+v: nothing dropped", st)
	}
}

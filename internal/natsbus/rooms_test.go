package natsbus

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wire"
)

// roomEvent is a join (busy, shown to contacts, last_seen to everyone)
// or a leave.
func roomEvent(room, user string, kind presence.RoomKind, version uint64) *presence.RoomEvent {
	ev := &presence.RoomEvent{Room: room, UserID: user, Kind: kind, Reason: presence.ReasonJoined,
		Count: 1, Version: version, At: 1795000003000,
		Status: presence.Busy, Settings: presence.Settings{Status: presence.Contacts, LastSeen: presence.Everyone}}
	if kind == presence.RoomLeave {
		ev.Reason, ev.Count = presence.ReasonBye, 0
		ev.Status, ev.Settings = 0, presence.Settings{}
	}
	return ev
}

// Room events go to the stream, in order with the changes of users, each
// to its room's subject with its id, once however often it is published;
// a user whose id would make "r:<room>:<version>" is not taken for a room.
// The other node's mirror and watchers are handed none of them.
func TestRoomEventsOnTheStream(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	var bm mirrorLog
	a := e.open("a")
	b := e.open("b", func(c *Config) { c.Mirror = bm.mirror })
	b.watch("dave", "r:doc")

	a.Publish(event("dave", 3))
	join := roomEvent("doc", "dave", presence.RoomJoin, 5)
	a.PublishRoom(join)
	a.PublishRoom(join) // a re-published event: one copy
	a.Publish(event("r:doc", 5))
	a.PublishRoom(roomEvent("döc 42", "dave", presence.RoomLeave, 6))
	a.Publish(event("marker", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !a.Wait(ctx, a.Mark()) {
		t.Fatal("Wait: the stream did not acknowledge the events")
	}
	if st := a.Stats(); st.Published != 6 || st.PublishedRooms != 3 || st.Acked != 6 {
		t.Errorf("a's stats: published %d (rooms %d), acked %d; want 6 (3), 6", st.Published, st.PublishedRooms, st.Acked)
	}

	testwait.For(t, "b's mirror to get the marker", func() bool { return bm.of("marker") == 1 })
	if bm.of("dave") != 1 || bm.of("r:doc") != 1 {
		t.Errorf("b's mirror got dave %d, r:doc %d times, want once each", bm.of("dave"), bm.of("r:doc"))
	}
	testwait.For(t, "b's watchers to get r:doc", func() bool { return len(b.rec.of("r:doc")) == 1 })
	if got := len(b.rec.of("dave")); got != 1 {
		t.Errorf("b's watchers got %d events of dave, want 1 (no room event)", got)
	}
	if st := b.Stats(); st.Decoding != 0 || st.Mirrored != 3 {
		t.Errorf("b: %d undecodable, %d mirrored; want 0, 3", st.Decoding, st.Mirrored)
	}

	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msgs := readStream(t, e.openStream(t, nc), 5)
	b64 := base64.RawURLEncoding.EncodeToString
	// The join's member status and settings are in a header, not in
	// the body that the stream's readers and webhooks get.
	want := []struct{ subject, id, body, member string }{
		{e.subject + "." + b64([]byte("dave")), "dave:3", "", ""},
		{e.subject + ".r." + b64([]byte("doc")), "r,doc:5",
			`{"room":"doc","user_id":"dave","event":"join","reason":"joined","count":1,"version":5,"at":"2026-11-18T11:06:43.000Z"}`,
			"busy contacts everyone"},
		{e.subject + "." + b64([]byte("r:doc")), "r:doc:5", "", ""},
		{e.subject + ".r." + b64([]byte("döc 42")), "r,döc 42:6",
			`{"room":"döc 42","user_id":"dave","event":"leave","reason":"bye","count":0,"version":6,"at":"2026-11-18T11:06:43.000Z"}`, ""},
		{e.subject + "." + b64([]byte("marker")), "marker:1", "", ""},
	}
	if len(msgs) != len(want) {
		t.Fatalf("the stream holds %d messages, want %d", len(msgs), len(want))
	}
	for i, w := range want {
		m := msgs[i]
		if m.Subject != w.subject || m.Header.Get(jetstream.MsgIDHeader) != w.id || m.Header.Get(nodeHeader) != "a" {
			t.Errorf("message %d: subject %q, id %q, node %q; want %q, %q, a", i, m.Subject,
				m.Header.Get(jetstream.MsgIDHeader), m.Header.Get(nodeHeader), w.subject, w.id)
		}
		if w.body != "" && string(m.Data) != w.body {
			t.Errorf("message %d:\n got %s\nwant %s", i, m.Data, w.body)
		}
		if w.body != "" && !json.Valid(m.Data) {
			t.Errorf("message %d is no JSON: %s", i, m.Data)
		}
		if got := m.Header.Get(memberHeader); got != w.member {
			t.Errorf("message %d: %s %q, want %q", i, memberHeader, got, w.member)
		}
	}
}

// readStream reads n messages of s, oldest first.
func readStream(t *testing.T, s jetstream.Stream, n int) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if int(info.State.Msgs) != n {
		t.Fatalf("the stream holds %d messages, want %d", info.State.Msgs, n)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// The subject of a room is never a user's, and a room's message id never
// a user's, whatever the ids.
func TestRoomSubjectsAndIDsApart(t *testing.T) {
	ids := []string{"r", "doc", "r:doc", "r,doc", "r.doc", "a:1", "ü", "x:r,1"}
	users := map[string]string{}
	msgIDs := map[string]string{}
	for _, id := range ids {
		if presence.ValidateID(id) != nil {
			continue // no such user or room
		}
		for v := uint64(0); v < 3; v++ {
			msgIDs[msgID(id, v)] = "user " + id
		}
		users[subjectOf("p.", id)] = "user " + id
	}
	for _, id := range ids {
		if presence.ValidateID(id) != nil {
			continue
		}
		if who, ok := users[roomSubjectOf("p.", id)]; ok {
			t.Errorf("room %q has the subject of %s", id, who)
		}
		for v := uint64(0); v < 3; v++ {
			if who, ok := msgIDs[roomMsgID(id, v)]; ok {
				t.Errorf("room %q version %d has the message id of %s", id, v, who)
			}
		}
	}
	if got := roomSubjectOf("p.", "doc"); got != "p.r."+base64.RawURLEncoding.EncodeToString([]byte("doc")) {
		t.Errorf("roomSubjectOf = %q", got)
	}
	if fmt.Sprint(roomMsgID("doc", 5)) != "r,doc:5" {
		t.Errorf("roomMsgID = %q", roomMsgID("doc", 5))
	}
}

// PublishRoom never blocks either: beyond the queue's bound it drops and
// counts.
func TestPublishRoomNeverBlocks(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a := e.openIdle("a", func(c *Config) { c.QueueSize = 2 })
	for v := uint64(1); v <= 5; v++ {
		a.PublishRoom(roomEvent("doc", "dave", presence.RoomJoin, v))
	}
	if st := a.Stats(); st.Published != 2 || st.Dropped != 3 || st.Queued != 2 {
		t.Errorf("published %d, dropped %d, queued %d; want 2, 3, 2", st.Published, st.Dropped, st.Queued)
	}
}

// A room event's body decodes to the event it was made of, but for the
// member's status and settings, which its header carries.
func TestRoomCodecRoundTrip(t *testing.T) {
	var evs []presence.RoomEvent
	for r := presence.ReasonJoined; r <= presence.ReasonVisible; r++ {
		kind := presence.RoomLeave
		if r == presence.ReasonJoined || r == presence.ReasonVisible {
			kind = presence.RoomJoin
		}
		evs = append(evs, presence.RoomEvent{Room: "döc \"42\".x", UserID: "zoë:1", Kind: kind, Reason: r,
			Count: int(r) * 1000, Version: 1<<63 + uint64(r), At: 1795000003123})
	}
	evs = append(evs, presence.RoomEvent{Room: "r", UserID: "u", Kind: presence.RoomLeave, Reason: presence.ReasonEnded})
	for _, ev := range evs {
		data := wire.AppendRoomEvent(nil, &ev)
		var got presence.RoomEvent
		if err := decodeRoomEvent(data, &got); err != nil {
			t.Fatalf("decode %s: %v", data, err)
		}
		if got != ev {
			t.Errorf("%s decoded to %+v, want %+v", data, got, ev)
		}
	}
	for _, bad := range []string{
		``, `not json`, `{}`,
		`{"room":"","user_id":"u","event":"join","reason":"joined","count":1,"version":1,"at":"2026-11-18T11:06:43.000Z"}`,
		`{"room":"r","user_id":"","event":"join","reason":"joined","count":1,"version":1,"at":"2026-11-18T11:06:43.000Z"}`,
		`{"room":"r","user_id":"u","event":"status","reason":"joined","count":1,"version":1,"at":"2026-11-18T11:06:43.000Z"}`,
		`{"room":"r","user_id":"u","event":"join","reason":"pushed","count":1,"version":1,"at":"2026-11-18T11:06:43.000Z"}`,
		`{"room":"r","user_id":"u","event":"join","reason":"joined","version":1,"at":"2026-11-18T11:06:43.000Z"}`,
		`{"room":"r","user_id":"u","event":"join","reason":"joined","count":-1,"version":1,"at":"2026-11-18T11:06:43.000Z"}`,
		`{"room":"r","user_id":"u","event":"join","reason":"joined","count":1,"version":1,"at":"today"}`,
	} {
		var ev presence.RoomEvent
		if err := decodeRoomEvent([]byte(bad), &ev); err == nil {
			t.Errorf("%s decoded: %+v", bad, ev)
		}
	}
}

// A join's member header gives the receiving node the member's status
// and settings; without one, or with one it cannot read, the join shows
// the member to nobody. A leave has none and needs none.
func TestMemberHeader(t *testing.T) {
	for _, st := range []presence.Status{presence.Online, presence.Away, presence.Busy} {
		for _, sv := range []presence.Visibility{presence.Everyone, presence.Contacts, presence.Nobody} {
			for _, lv := range []presence.Visibility{presence.Everyone, presence.Contacts, presence.Nobody} {
				ev := presence.RoomEvent{Kind: presence.RoomJoin, Status: st, Settings: presence.Settings{Status: sv, LastSeen: lv}}
				v := memberValue(&ev)
				got := presence.RoomEvent{Kind: presence.RoomJoin}
				if err := decodeMember(v, &got); err != nil || got != ev {
					t.Errorf("%q decoded to %+v (%v), want %+v", v, got, err, ev)
				}
			}
		}
	}
	hidden := presence.RoomEvent{Kind: presence.RoomJoin, Status: presence.Offline, Settings: hiddenMember}
	for _, v := range []string{"", "busy", "busy contacts", "busy friends everyone", "invisible everyone everyone", "busy everyone everyone x"} {
		got := presence.RoomEvent{Kind: presence.RoomJoin, Status: presence.Busy}
		err := decodeMember(v, &got)
		if got != hidden {
			t.Errorf("%q: %+v, want the member hidden", v, got)
		}
		if (v == "") != (err == nil) {
			t.Errorf("%q: error %v", v, err)
		}
	}
	leave := presence.RoomEvent{Kind: presence.RoomLeave}
	if err := decodeMember("", &leave); err != nil || leave != (presence.RoomEvent{Kind: presence.RoomLeave}) {
		t.Errorf("a leave: %+v, %v", leave, err)
	}
}

// FuzzDecodeRoom: decoding a room's message never panics, and what
// decodes encodes back to an event that decodes the same.
func FuzzDecodeRoom(f *testing.F) {
	f.Add(wire.AppendRoomEvent(nil, roomEvent("döc 42", "dave", presence.RoomJoin, 7)))
	f.Add(wire.AppendRoomEvent(nil, roomEvent("r", "u", presence.RoomLeave, 1<<40)))
	f.Add([]byte(`{"room":"r","user_id":"u","count":0}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev, again presence.RoomEvent
		if decodeRoomEvent(data, &ev) != nil {
			return
		}
		out := wire.AppendRoomEvent(nil, &ev)
		if err := decodeRoomEvent(out, &again); err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", out, err)
		}
		if again != ev {
			t.Fatalf("round trip: %+v, then %+v", ev, again)
		}
	})
}

// roomRecorder is a RoomLocal that records the room events it is given;
// watched says which rooms its (imaginary) watchers watch.
type roomRecorder struct {
	mu      sync.Mutex
	watched map[string]bool
	events  []presence.RoomEvent
}

func (r *roomRecorder) PublishRoom(ev *presence.RoomEvent) {
	r.mu.Lock()
	r.events = append(r.events, *ev)
	r.mu.Unlock()
}

func (r *roomRecorder) RoomWatched(room string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watched[room]
}

func (r *roomRecorder) set(room string, on bool) {
	r.mu.Lock()
	if r.watched == nil {
		r.watched = map[string]bool{}
	}
	r.watched[room] = on
	r.mu.Unlock()
}

// of returns the events recorded of room.
func (r *roomRecorder) of(room string) []presence.RoomEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []presence.RoomEvent
	for _, ev := range r.events {
		if ev.Room == room {
			out = append(out, ev)
		}
	}
	return out
}

// openRooms opens a bus whose Config.Rooms is a roomRecorder.
func (e *env) openRooms(name string) (*node, *roomRecorder) {
	rr := &roomRecorder{}
	return e.open(name, func(c *Config) { c.Rooms = rr }), rr
}

func (n *node) watchRooms(rr *roomRecorder, rooms ...string) {
	for _, r := range rooms {
		rr.set(r, true)
	}
	n.WatchRooms(rooms)
}

func (n *node) unwatchRooms(rr *roomRecorder, rooms ...string) {
	for _, r := range rooms {
		rr.set(r, false)
	}
	n.UnwatchRooms(rooms)
}

// A room's joins and leaves reach the nodes that watch the room, a join
// with the member's status and settings; not a node that does not, not
// one that stopped, and not the node that published them.
func TestRoomEventsReachWatchingNodes(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a, ar := e.openRooms("a")
	b, br := e.openRooms("b")
	c, cr := e.openRooms("c")
	a.watchRooms(ar, "doc", "marker") // a's own events must not come back to it
	b.watchRooms(br, "doc", "marker")
	c.watchRooms(cr, "marker")
	if st := b.Stats(); st.RoomSubscriptions != 2 || st.Subscriptions != 0 {
		t.Fatalf("b subscribes to %d rooms and %d users, want 2 and 0", st.RoomSubscriptions, st.Subscriptions)
	}

	join := roomEvent("doc", "dave", presence.RoomJoin, 5)
	a.PublishRoom(join)
	a.PublishRoom(roomEvent("doc", "dave", presence.RoomLeave, 6))
	a.PublishRoom(roomEvent("marker", "m", presence.RoomJoin, 1))
	// One publisher, one connection: whoever gets the marker got doc's
	// events before.
	testwait.For(t, "the marker on b", func() bool { return len(br.of("marker")) == 1 })
	testwait.For(t, "the marker on c", func() bool { return len(cr.of("marker")) == 1 })
	if got := br.of("doc"); len(got) != 2 || got[0] != *join || got[1] != *roomEvent("doc", "dave", presence.RoomLeave, 6) {
		t.Errorf("b got %+v, want the join %+v (busy, to contacts) and the leave", got, *join)
	}
	if got := cr.of("doc"); len(got) != 0 {
		t.Errorf("c, which does not watch doc, got %+v", got)
	}
	testwait.For(t, "a to skip its own events", func() bool { return a.Stats().SkippedOwn == 3 })
	if got := ar.of("doc"); len(got) != 0 {
		t.Errorf("a got its own events back: %+v", got)
	}
	if st := b.Stats(); st.DeliveredRooms != 3 || st.Delivered != 3 || st.Decoding != 0 {
		t.Errorf("b's stats: %+v", st)
	}

	b.unwatchRooms(br, "doc")
	if n := b.Stats().RoomSubscriptions; n != 1 {
		t.Errorf("b has %d room subscriptions after unwatching doc, want 1", n)
	}
	a.PublishRoom(roomEvent("doc", "erin", presence.RoomJoin, 7))
	a.PublishRoom(roomEvent("marker", "m", presence.RoomLeave, 2))
	testwait.For(t, "the second marker on b", func() bool { return len(br.of("marker")) == 2 })
	if got := br.of("doc"); len(got) != 2 {
		t.Errorf("b got %d events of doc after unwatching, want still 2", len(got))
	}
	// A room's subject is not a user's: watching the user "doc" gets none.
	b.watch("doc")
	a.PublishRoom(roomEvent("doc", "fred", presence.RoomJoin, 8))
	a.PublishRoom(roomEvent("marker", "m", presence.RoomJoin, 3))
	testwait.For(t, "the third marker on b", func() bool { return len(br.of("marker")) == 3 })
	if len(br.of("doc")) != 2 || len(b.rec.all()) != 0 {
		t.Errorf("b, watching the user doc, got room events %+v, changes %+v", br.of("doc"), b.rec.all())
	}
}

// What another publisher sends to a room's subject: a join without the
// member header shows the member to nobody; one received again (a
// publish retried after a lost ack), even after a newer one, is
// delivered once; one that does not decode, or names another room than
// its subject, is counted and dropped.
func TestRoomMessagesReceived(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	b, br := e.openRooms("b")
	b.watchRooms(br, "doc")
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	subj := roomSubjectOf(b.prefix, "doc")
	send := func(data []byte, member string) {
		t.Helper()
		m := &nats.Msg{Subject: subj, Data: data, Header: nats.Header{}}
		if member != "" {
			m.Header.Set(memberHeader, member)
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	body := func(ev *presence.RoomEvent) []byte { return wire.AppendRoomEvent(nil, ev) }
	send(body(roomEvent("doc", "dave", presence.RoomJoin, 5)), "")
	send(body(roomEvent("doc", "dave", presence.RoomJoin, 5)), "online everyone everyone")
	send(body(roomEvent("doc", "erin", presence.RoomJoin, 6)), "away everyone nobody")
	send(body(roomEvent("doc", "dave", presence.RoomJoin, 5)), "")
	send([]byte("not json"), "")
	send(body(roomEvent("other", "dave", presence.RoomJoin, 7)), "online everyone everyone")
	send(body(roomEvent("doc", "fred", presence.RoomJoin, 8)), "online friends everyone")
	testwait.For(t, "all seven handled", func() bool {
		st := b.Stats()
		return st.Delivered+st.Duplicates+st.Decoding == 7
	})
	got := br.of("doc")
	hidden := roomEvent("doc", "dave", presence.RoomJoin, 5)
	hidden.Status, hidden.Settings = presence.Offline, presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	erin := roomEvent("doc", "erin", presence.RoomJoin, 6)
	erin.Status, erin.Settings = presence.Away, presence.Settings{Status: presence.Everyone, LastSeen: presence.Nobody}
	fred := roomEvent("doc", "fred", presence.RoomJoin, 8)
	fred.Status, fred.Settings = presence.Offline, presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	if len(got) != 3 || got[0] != *hidden || got[1] != *erin || got[2] != *fred {
		t.Errorf("delivered %+v\nwant %+v, %+v, %+v", got, *hidden, *erin, *fred)
	}
	if st := b.Stats(); st.Duplicates != 2 || st.Decoding != 2 {
		t.Errorf("stats %+v, want 2 duplicates and 2 decoding errors", st)
	}
}

// Without Config.Rooms the bus subscribes to no room.
func TestNoRoomsNoRoomSubscriptions(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a := e.open("a")
	a.WatchRooms([]string{"doc"})
	if n := a.Stats().RoomSubscriptions; n != 0 {
		t.Fatalf("%d room subscriptions without Config.Rooms", n)
	}
}

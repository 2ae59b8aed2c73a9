package kafka_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wire"
)

// producer starts a changes producer with a queue of queue changes (the
// default if 0), running until the test ends.
func (w *world) producer(queue int) *kafka.Producer {
	w.t.Helper()
	p, err := kafka.NewProducer(kafka.ProducerConfig{
		Brokers:      w.cluster.ListenAddrs(),
		Topic:        changesT,
		ClientID:     "producer",
		QueueLen:     queue,
		DrainTimeout: time.Second,
		Logger:       slog.New(slog.NewTextHandler(w.t.Output(), nil)).With("component", "producer"),
	})
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() {
		p.Run(ctx)
		close(done)
	}()
	w.t.Cleanup(func() {
		cancel()
		<-done
	})
	return p
}

// readChanges reads the changes topic from its start until it has n
// records, in offset order per partition.
func (w *world) readChanges(n int) []*kgo.Record {
	w.t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(w.cluster.ListenAddrs()...),
		kgo.ConsumeTopics(changesT),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		w.t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(20 * time.Second)
	for len(recs) < n {
		if time.Now().After(deadline) {
			w.t.Fatalf("read %d changes, want %d", len(recs), n)
		}
		ctx, cancel := context.WithTimeout(w.ctx, time.Second)
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		cancel()
	}
	slices.SortStableFunc(recs, func(a, b *kgo.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	return recs
}

// checkChanges checks that recs are exactly the changes evs, each keyed
// by its user and encoded as on the NATS stream, every user's on one
// partition, in the order of their versions (which only grow).
func checkChanges(t *testing.T, recs []*kgo.Record, evs []presence.Event) {
	t.Helper()
	type key struct {
		user    string
		version uint64
	}
	want := map[key]presence.Event{}
	order := map[string][]uint64{} // versions per user, as published
	for _, ev := range evs {
		want[key{ev.UserID, ev.Version}] = ev
		order[ev.UserID] = append(order[ev.UserID], ev.Version)
	}
	if len(recs) != len(evs) {
		t.Errorf("%d records, want %d changes", len(recs), len(evs))
	}
	got := map[string][]uint64{}
	part := map[string]int32{}
	for _, r := range recs {
		var m struct {
			User    string `json:"user_id"`
			Version uint64 `json:"version"`
		}
		if err := json.Unmarshal(r.Value, &m); err != nil {
			t.Fatalf("record %s: %v", r.Value, err)
		}
		if string(r.Key) != m.User {
			t.Errorf("record of %s keyed %q", m.User, r.Key)
		}
		ev, ok := want[key{m.User, m.Version}]
		if !ok {
			t.Errorf("record %s: no such change published", r.Value)
			continue
		}
		if w := wire.AppendChange(nil, &ev); !bytes.Equal(r.Value, w) {
			t.Errorf("record %s, want %s", r.Value, w)
		}
		if p, seen := part[m.User]; seen && p != r.Partition {
			t.Errorf("user %s on partitions %d and %d", m.User, p, r.Partition)
		}
		part[m.User] = r.Partition
		got[m.User] = append(got[m.User], m.Version)
	}
	for u, vs := range order {
		if !slices.Equal(got[u], vs) {
			t.Errorf("user %s: versions %v on the topic, published %v", u, got[u], vs)
		}
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				t.Errorf("user %s: versions %v do not grow", u, vs)
			}
		}
	}
}

// TestProducer: every change the tracker publishes is produced once,
// keyed by its user, as the NATS stream's message, each user's in order.
func TestProducer(t *testing.T) {
	w := newWorld(t)
	p := w.producer(0)
	w.pubs.add(p)
	for round := range 3 {
		for _, u := range users("u", 0, 20) {
			for _, step := range []func() (presence.Change, error){
				func() (presence.Change, error) { return w.tr.Heartbeat(w.ctx, u, "d", true) },
				func() (presence.Change, error) {
					return w.tr.SetStatus(w.ctx, u, presence.ManualBusy, fmt.Sprintf("in meeting %d", round))
				},
				func() (presence.Change, error) { return w.tr.SetStatus(w.ctx, u, presence.ManualNone, "") },
				func() (presence.Change, error) { return w.tr.Bye(w.ctx, u, "d") },
			} {
				if _, err := step(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	evs := w.rec.events()
	if len(evs) != 3*20*4 {
		t.Fatalf("%d changes published, want %d", len(evs), 3*20*4)
	}
	testwait.For(t, "every change produced", func() bool { return p.Stats().Produced == uint64(len(evs)) })
	checkChanges(t, w.readChanges(len(evs)), evs)
	if s := p.Stats(); s.Queued != 0 || s.Dropped != 0 || s.Failed != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestProducerQueueBound: while the brokers cannot be reached, changes
// wait, at most QueueLen of them; the rest are dropped and counted. When
// the brokers are back, what waited is produced, in order.
func TestProducerQueueBound(t *testing.T) {
	w := newWorld(t)
	w.gate.close()
	p := w.producer(5)
	var evs []presence.Event
	for i := range 8 {
		ev := presence.Event{UserID: "u", Status: presence.Online, Prev: presence.Offline, Version: uint64(100 + i), At: epoch.UnixMilli(), LastSeen: epoch.UnixMilli()}
		p.Publish(&ev)
		evs = append(evs, ev)
	}
	if s := p.Stats(); s.Queued != 5 || s.Dropped != 3 || s.Produced != 0 {
		t.Errorf("brokers away: stats %+v, want 5 queued, 3 dropped", s)
	}
	w.gate.open()
	testwait.For(t, "the queue produced", func() bool { s := p.Stats(); return s.Produced == 5 && s.Queued == 0 })
	checkChanges(t, w.readChanges(5), evs[:5])
}

// TestProducerLeavesOutSelfOnly: a change only the user sees (the text of
// an invisible user) is not produced: nothing anyone else sees changed.
func TestProducerLeavesOutSelfOnly(t *testing.T) {
	w := newWorld(t)
	p := w.producer(0)
	w.pubs.add(p)
	for _, step := range []func() (presence.Change, error){
		func() (presence.Change, error) { return w.tr.Heartbeat(w.ctx, "u", "d", true) },
		func() (presence.Change, error) { return w.tr.SetStatus(w.ctx, "u", presence.ManualInvisible, "lunch") },
		func() (presence.Change, error) {
			return w.tr.SetStatus(w.ctx, "u", presence.ManualInvisible, "gone fishing")
		},
		func() (presence.Change, error) { return w.tr.SetStatus(w.ctx, "u", presence.ManualNone, "back") },
	} {
		if _, err := step(); err != nil {
			t.Fatal(err)
		}
	}
	evs := w.rec.events()
	if len(evs) != 4 || !evs[2].SelfOnly {
		t.Fatalf("published %+v, want 4 changes, the third only the user's", evs)
	}
	want := append(slices.Clone(evs[:2]), evs[3])
	testwait.For(t, "the changes produced", func() bool { return p.Stats().Produced == 3 })
	checkChanges(t, w.readChanges(3), want)
}

// TestProducerTopicMissing: changes for a topic that does not exist fail,
// counted, and are not kept forever.
func TestProducerTopicMissing(t *testing.T) {
	w := newWorld(t)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: w.cluster.ListenAddrs(), Topic: "no.such.topic"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 3 {
		p.Publish(&presence.Event{UserID: "u", Status: presence.Online, Version: uint64(i + 1), At: epoch.UnixMilli()})
	}
	testwait.For(t, "the changes failed", func() bool { s := p.Stats(); return s.Failed == 3 && s.Queued == 0 })
	if s := p.Stats(); s.Produced != 0 || s.Dropped != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestProducerRooms: every join and leave the tracker publishes is
// produced on the changes topic, keyed by its room, marked "kind: room",
// as the NATS stream's message, each room's in order; the changes of
// users beside them are produced as before, with no header.
func TestProducerRooms(t *testing.T) {
	w := newWorld(t)
	p := w.producer(0)
	w.pubs.add(p)
	rooms := []string{"doc-1", "doc-2", "r:doc"}
	for _, u := range users("u", 0, 6) {
		if _, err := w.tr.Heartbeat(w.ctx, u, "d", true); err != nil {
			t.Fatal(err)
		}
		for _, room := range rooms {
			if _, err := w.tr.Join(w.ctx, u, "d", room); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := w.tr.Leave(w.ctx, u, "d", "doc-2"); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range users("u", 0, 3) {
		if _, err := w.tr.Bye(w.ctx, u, "d"); err != nil { // leaves doc-1 and r:doc
			t.Fatal(err)
		}
	}
	evs, rms := w.rec.events(), w.rec.roomEvents()
	if want := 6*(3+1) + 3*2; len(rms) != want {
		t.Fatalf("%d room events published, want %d", len(rms), want)
	}
	n := len(evs) + len(rms)
	testwait.For(t, "every event produced", func() bool { return p.Stats().Produced == uint64(n) })
	var changes, roomRecs []*kgo.Record
	for _, r := range w.readChanges(n) {
		switch {
		case len(r.Headers) == 0:
			changes = append(changes, r)
		case len(r.Headers) == 1 && r.Headers[0].Key == kafka.KindHeader && string(r.Headers[0].Value) == kafka.KindRoom:
			roomRecs = append(roomRecs, r)
		default:
			t.Errorf("record %s: headers %v", r.Value, r.Headers)
		}
	}
	checkChanges(t, changes, evs)

	want := map[string][]string{} // the room's events, in order, as produced
	for i := range rms {
		want[rms[i].Room] = append(want[rms[i].Room], string(wire.AppendRoomEvent(nil, &rms[i])))
	}
	got := map[string][]string{}
	part := map[string]int32{}
	for _, r := range roomRecs {
		room := string(r.Key)
		got[room] = append(got[room], string(r.Value))
		if p, seen := part[room]; seen && p != r.Partition {
			t.Errorf("room %s on partitions %d and %d", room, p, r.Partition)
		}
		part[room] = r.Partition
		if r.Timestamp.UnixMilli() != w.clk.Now().UnixMilli() {
			t.Errorf("record %s: timestamp %v, want the event's", r.Value, r.Timestamp)
		}
	}
	for _, room := range rooms {
		if !slices.Equal(got[room], want[room]) {
			t.Errorf("room %s on the topic:\n%v\nwant\n%v", room, got[room], want[room])
		}
	}
	if len(got) != len(rooms) {
		t.Errorf("records keyed by %d rooms, want %d", len(got), len(rooms))
	}
}

// TestProducerRoomsShareTheBound: room events wait in the one queue of
// QueueLen, beyond which they are dropped and counted like changes.
func TestProducerRoomsShareTheBound(t *testing.T) {
	w := newWorld(t)
	w.gate.close()
	p := w.producer(3)
	p.Publish(&presence.Event{UserID: "u", Status: presence.Online, Version: 1, At: epoch.UnixMilli()})
	for v := uint64(1); v <= 4; v++ {
		p.PublishRoom(&presence.RoomEvent{Room: "doc", UserID: "u", Kind: presence.RoomJoin, Reason: presence.ReasonJoined,
			Count: 1, Version: v, At: epoch.UnixMilli()})
	}
	if s := p.Stats(); s.Queued != 3 || s.Dropped != 2 {
		t.Errorf("brokers away: stats %+v, want 3 queued, 2 dropped", s)
	}
	w.gate.open()
	testwait.For(t, "the queue produced", func() bool { s := p.Stats(); return s.Produced == 3 && s.Queued == 0 })
	recs := w.readChanges(3)
	var rooms []uint64
	for _, r := range recs {
		if len(r.Headers) == 1 {
			var m struct{ Version uint64 }
			if err := json.Unmarshal(r.Value, &m); err != nil {
				t.Fatal(err)
			}
			rooms = append(rooms, m.Version)
		}
	}
	if !slices.Equal(rooms, []uint64{1, 2}) {
		t.Errorf("room versions on the topic %v, want [1 2]", rooms)
	}
}

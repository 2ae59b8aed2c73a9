package natsbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// recorder is a Local that records what it is given; watched says which
// users its (imaginary) watchers watch.
type recorder struct {
	mu       sync.Mutex // guards the fields below
	watched  map[string]int
	events   []presence.Event
	contacts []string
}

func newRecorder() *recorder { return &recorder{watched: map[string]int{}} }

func (r *recorder) Publish(ev *presence.Event) {
	r.mu.Lock()
	r.events = append(r.events, *ev)
	r.mu.Unlock()
}

func (r *recorder) Watched(user string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watched[user] > 0
}

func (r *recorder) setWatched(user string, on bool) {
	r.mu.Lock()
	if on {
		r.watched[user] = 1
	} else {
		delete(r.watched, user)
	}
	r.mu.Unlock()
}

func (r *recorder) onContacts(owner string) {
	r.mu.Lock()
	r.contacts = append(r.contacts, owner)
	r.mu.Unlock()
}

// of returns the events recorded for user.
func (r *recorder) of(user string) []presence.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []presence.Event
	for _, ev := range r.events {
		if ev.UserID == user {
			out = append(out, ev)
		}
	}
	return out
}

func (r *recorder) all() []presence.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]presence.Event(nil), r.events...)
}

func (r *recorder) contactsSeen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.contacts...)
}

// env is a set of buses on one server with one stream and subject.
type env struct {
	t       *testing.T
	url     string
	stream  string
	subject string
}

func newEnv(t *testing.T, srv *testsvc.Server) *env {
	u := testsvc.Unique(t)
	return &env{t: t, url: srv.URL, stream: "S_" + u, subject: "p_" + u + ".changes"}
}

type node struct {
	*Bus
	rec    *recorder
	cancel context.CancelFunc
	done   chan error
}

// open opens a bus and runs it until the test ends.
// openStream opens the env's stream through nc, as another service would.
func (e *env) openStream(t *testing.T, nc *nats.Conn) jetstream.Stream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (e *env) open(name string, mod ...func(*Config)) *node {
	e.t.Helper()
	n := e.openIdle(name, mod...)
	n.start()
	return n
}

// openIdle opens a bus without running it.
func (e *env) openIdle(name string, mod ...func(*Config)) *node {
	e.t.Helper()
	rec := newRecorder()
	cfg := Config{
		URL: e.url, NodeID: name, Stream: e.stream, Subject: e.subject,
		Local: rec, OnContactsChanged: rec.onContacts,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		cfg.Logger = slog.Default()
	}
	for _, f := range mod {
		f(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := Open(ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	n := &node{Bus: b, rec: rec}
	e.t.Cleanup(func() {
		n.stop()
		b.Close()
	})
	return n
}

func (n *node) start() {
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan error, 1)
	go func() { n.done <- n.Run(ctx) }()
}

func (n *node) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	<-n.done
	n.cancel = nil
}

func (n *node) watch(users ...string) {
	for _, u := range users {
		n.rec.setWatched(u, true)
	}
	n.Watch(users)
}

func (n *node) unwatch(users ...string) {
	for _, u := range users {
		n.rec.setWatched(u, false)
	}
	n.Unwatch(users)
}

func event(user string, version uint64) *presence.Event {
	return &presence.Event{
		UserID: user, Status: presence.Busy, Prev: presence.Online, Self: presence.Busy,
		Text: "in a meeting", SelfText: "in a meeting", LastSeen: 1795000000123, Version: version,
		At:       1795000001000,
		Settings: presence.Settings{Status: presence.Everyone, LastSeen: presence.Contacts},
	}
}

func TestDeliveryFollowsWatching(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a, b, c := e.open("a"), e.open("b"), e.open("c")
	a.watch("u1", "marker") // A's own events must not come back to it
	b.watch("u1", "marker")
	c.watch("marker")

	a.Publish(event("u1", 1))
	a.Publish(event("marker", 1))
	// One publisher, one connection: whoever gets the marker got u1 before.
	testwait.For(t, "the marker on b", func() bool { return len(b.rec.of("marker")) == 1 })
	testwait.For(t, "the marker on c", func() bool { return len(c.rec.of("marker")) == 1 })
	if got := b.rec.of("u1"); len(got) != 1 || got[0] != *event("u1", 1) {
		t.Errorf("b got %+v, want exactly one %+v", got, *event("u1", 1))
	}
	if got := c.rec.of("u1"); len(got) != 0 {
		t.Errorf("c, which does not watch u1, got %+v", got)
	}
	testwait.For(t, "a to skip its own events", func() bool { return a.Stats().SkippedOwn == 2 })
	if got := a.rec.all(); len(got) != 0 {
		t.Errorf("a got its own events back: %+v", got)
	}

	b.unwatch("u1")
	if n := b.Stats().Subscriptions; n != 1 {
		t.Errorf("b has %d subscriptions after unwatching u1, want 1", n)
	}
	a.Publish(event("u1", 2))
	a.Publish(event("marker", 2))
	testwait.For(t, "the second marker on b", func() bool { return len(b.rec.of("marker")) == 2 })
	if got := b.rec.of("u1"); len(got) != 1 {
		t.Errorf("b got %d events of u1 after unwatching, want still 1", len(got))
	}
	st := b.Stats()
	if st.Delivered != 3 || st.Decoding != 0 {
		t.Errorf("b's stats: %+v", st)
	}
	testwait.For(t, "a's acks", func() bool { return a.Stats().Acked == 4 })
}

// A bus on a shared connection (the node's one, also used by ingest)
// delivers like one with its own; closing it leaves the connection to its
// owner, with the bus's subscriptions gone, and another bus can use it.
func TestSharedConn(t *testing.T) {
	srv := testsvc.SharedNATS(t)
	e := newEnv(t, srv)
	conn, err := jsstream.Dial(srv.URL, "shared", nil, JetStreamOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	a := e.open("a", func(c *Config) { c.Conn, c.URL = conn, "" })
	b := e.open("b")
	a.watch("u1")
	b.watch("u2")
	b.Publish(event("u1", 1))
	a.Publish(event("u2", 1))
	testwait.For(t, "u1 on a (shared connection)", func() bool { return len(a.rec.of("u1")) == 1 })
	testwait.For(t, "u2 on b", func() bool { return len(b.rec.of("u2")) == 1 })
	subs := conn.NC.NumSubscriptions()
	a.stop()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !conn.NC.IsConnected() {
		t.Fatal("closing a bus closed the shared connection")
	}
	if n := conn.NC.NumSubscriptions(); n >= subs {
		t.Errorf("%d subscriptions on the shared connection after the bus closed, %d before: want fewer", n, subs)
	}
	a2 := e.open("a2", func(c *Config) { c.Conn, c.URL = conn, "" })
	a2.watch("u1")
	b.Publish(event("u1", 2))
	testwait.For(t, "u1 on a second bus of the shared connection", func() bool { return len(a2.rec.of("u1")) == 1 })
}

func TestAwkwardUserIDs(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a, b := e.open("a"), e.open("b")
	ids := []string{"a.b", "*", ">", "a b", "x.*.>", "Zoë", "用户", "🙂", "a:1", "a", "a.", ".a", "-_"}
	b.watch(ids...)
	for i, id := range ids {
		a.Publish(event(id, uint64(i+1)))
	}
	testwait.For(t, "every id on b", func() bool { return len(b.rec.all()) >= len(ids) })
	for i, id := range ids {
		got := b.rec.of(id)
		if len(got) != 1 || got[0].Version != uint64(i+1) {
			t.Errorf("user %q: got %+v, want one event of version %d", id, got, i+1)
		}
	}
	if got := len(b.rec.all()); got != len(ids) {
		t.Errorf("b got %d events, want %d", got, len(ids))
	}
}

func TestStreamKeepsOneCopy(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a, b := e.open("a"), e.open("b")
	ev := event("4.2 ü", 7)
	a.Publish(ev)
	a.Publish(ev)
	noText := &presence.Event{UserID: "9", Status: presence.Offline, Prev: presence.Away, Version: 1, At: 1795000002000,
		Settings: presence.Settings{Status: presence.Nobody, LastSeen: presence.Everyone}}
	a.Publish(noText)
	testwait.For(t, "a's acks", func() bool { return a.Stats().Acked == 3 })
	b.Publish(ev) // another node, same change: still one copy
	testwait.For(t, "b's ack", func() bool { return b.Stats().Acked == 1 })

	// A plain JetStream consumer, as another service would read the stream.
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s := e.openStream(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("stream holds %d messages, want 2", info.State.Msgs)
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
		m.Ack()
	}
	if err := batch.Error(); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		subject, id, node string
		json              map[string]any
	}{
		{e.subject + ".NC4yIMO8", "4.2 ü:7", "a", map[string]any{
			"user_id": "4.2 ü", "status": "busy", "prev": "online", "text": "in a meeting",
			"last_seen": "2026-11-18T11:06:40.123Z", "version": 7.0, "at": "2026-11-18T11:06:41.000Z",
			"settings": map[string]any{"status": "everyone", "last_seen": "contacts"},
		}},
		{e.subject + ".OQ", "9:1", "a", map[string]any{
			"user_id": "9", "status": "offline", "prev": "away", "text": "",
			"last_seen": nil, "version": 1.0, "at": "2026-11-18T11:06:42.000Z",
			"settings": map[string]any{"status": "nobody", "last_seen": "everyone"},
		}},
	}
	if len(msgs) != len(want) {
		t.Fatalf("consumer got %d messages, want %d", len(msgs), len(want))
	}
	for i, w := range want {
		m := msgs[i]
		if m.Subject() != w.subject {
			t.Errorf("message %d: subject %q, want %q", i, m.Subject(), w.subject)
		}
		if got := m.Headers().Get("Nats-Msg-Id"); got != w.id {
			t.Errorf("message %d: Nats-Msg-Id %q, want %q", i, got, w.id)
		}
		if got := m.Headers().Get("Presenced-Node"); got != w.node {
			t.Errorf("message %d: Presenced-Node %q, want %q", i, got, w.node)
		}
		var got map[string]any
		if err := json.Unmarshal(m.Data(), &got); err != nil {
			t.Fatalf("message %d: %v: %s", i, err, m.Data())
		}
		if fmt.Sprint(got) != fmt.Sprint(w.json) {
			t.Errorf("message %d:\n got %v\nwant %v", i, got, w.json)
		}
	}
}

// TestWatchThenPublish: once Watch returns, a change published by another
// node is delivered (Watch flushed the subscription to the server). The
// other node here publishes straight on its own connection, with no queue
// in between that would give the subscription time to arrive anyway.
func TestWatchThenPublish(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	b := e.open("b")
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const n = 200
	for i := range n {
		u := fmt.Sprint("w", i)
		b.watch(u)
		m := &nats.Msg{Subject: subjectOf(b.prefix, u), Data: appendEvent(nil, event(u, 1)),
			Header: nats.Header{nodeHeader: {"other"}}}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "all events on b", func() bool { return len(b.rec.all()) == n })
}

// TestWatchUnwatchRace: the hub's pattern — Watch after a user's first
// watcher, Unwatch after the last — from many goroutines at once ends
// subscribed iff watched.
func TestWatchUnwatchRace(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	b := e.open("b")
	users := []string{"r0", "r1", "r2"}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				u := users[rng.IntN(len(users))]
				if rng.IntN(2) == 0 {
					b.rec.mu.Lock()
					b.rec.watched[u]++
					first := b.rec.watched[u] == 1
					b.rec.mu.Unlock()
					if first {
						b.Watch([]string{u})
					}
				} else {
					b.rec.mu.Lock()
					if b.rec.watched[u] == 0 {
						b.rec.mu.Unlock()
						continue
					}
					b.rec.watched[u]--
					last := b.rec.watched[u] == 0
					b.rec.mu.Unlock()
					if last {
						b.Unwatch([]string{u})
					}
				}
			}
		}()
	}
	wg.Wait()
	want := 0
	for _, u := range users {
		watched := b.rec.Watched(u)
		b.subsMu.Lock()
		_, subscribed := b.subs[u]
		b.subsMu.Unlock()
		if watched != subscribed {
			t.Errorf("user %s: watched %v, subscribed %v", u, watched, subscribed)
		}
		if watched {
			want++
		}
	}
	if got := b.Stats().Subscriptions; got != want {
		t.Errorf("Subscriptions = %d, want %d", got, want)
	}
}

func TestContactsAnnouncement(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a, b, c := e.open("a"), e.open("b"), e.open("c")
	a.watch("owner") // a's own announcement does not come back to it
	b.watch("owner", "marker")
	c.watch("marker")
	a.ContactsChanged("owner")
	a.ContactsChanged("marker")
	testwait.For(t, "the marker on c", func() bool { return len(c.rec.contactsSeen()) == 1 })
	testwait.For(t, "both on b", func() bool { return len(b.rec.contactsSeen()) == 2 })
	if got := b.rec.contactsSeen(); got[0] != "owner" || got[1] != "marker" {
		t.Errorf("b saw %v", got)
	}
	if got := c.rec.contactsSeen(); got[0] != "marker" {
		t.Errorf("c, which does not watch owner, saw %v", got)
	}
	a.ContactsChanged("marker")
	testwait.For(t, "the second marker on b", func() bool { return len(b.rec.contactsSeen()) == 3 })
	if got := a.rec.contactsSeen(); len(got) != 0 {
		t.Errorf("a saw its own announcements: %v", got)
	}
	// The announcements are not in the stream.
	if got := a.Stats().Acked; got != 0 {
		t.Errorf("Acked = %d after announcements only", got)
	}
}

// TestNATSRestart: events published while NATS is down wait and are
// published after it returns, once each; subscriptions come back.
func TestNATSRestart(t *testing.T) {
	srv := testsvc.NATS(t)
	e := newEnv(t, srv)
	a := e.open("a") // keeps running: its publishes fail and are retried
	q := e.open("q") // stopped during the outage: its events wait in the queue
	b := e.open("b")
	b.watch("during", "queued", "after")
	a.Publish(event("before", 1))
	testwait.For(t, "the first ack", func() bool { return a.Stats().Acked == 1 })

	q.stop()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	// Until a's client reads the end of its connection, what it
	// publishes goes into the dead socket as if sent.
	testwait.For(t, "a to see NATS gone", func() bool { return !a.nc.IsConnected() })
	for v := uint64(1); v <= 5; v++ {
		a.Publish(event("during", v))
		q.Publish(event("queued", v))
	}
	a.ContactsChanged("during") // kept and sent after reconnection
	testwait.For(t, "a's failed publish held for retry", func() bool {
		st := a.Stats()
		return st.InFlight > 0 && st.InFlight+st.Queued == 5
	})
	if st := a.Stats(); st.Announced != 0 {
		t.Errorf("announced while NATS was down: %+v", st)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// Acked counts at the ack, InFlight when the publisher next looks:
	// wait for both.
	testwait.For(t, "a's events acked", func() bool { st := a.Stats(); return st.Acked == 6 && st.InFlight == 0 })
	testwait.For(t, "a's announcement sent", func() bool { return a.Stats().Announced == 1 })
	if st := a.Stats(); st.Retried == 0 || st.Dropped != 0 || st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("a's stats after the restart: %+v", st)
	}

	// b's subscriptions are back once it has reconnected.
	testwait.For(t, "b reconnected", func() bool { return b.nc.IsConnected() && q.nc.IsConnected() })
	if err := b.nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	q.start()
	testwait.For(t, "the queued events on b", func() bool { return len(b.rec.of("queued")) == 5 })
	a.Publish(event("after", 1))
	testwait.For(t, "an event after the restart on b", func() bool { return len(b.rec.of("after")) == 1 })
	for i, ev := range b.rec.of("queued") {
		if ev.Version != uint64(i+1) {
			t.Errorf("queued event %d has version %d", i, ev.Version)
		}
	}

	// The stream holds every event once.
	s := e.openStream(t, b.nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 12 {
		t.Errorf("stream holds %d messages, want 12", info.State.Msgs)
	}
	seen := map[string]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get("Nats-Msg-Id")
		if seen[id] {
			t.Errorf("%s stored twice", id)
		}
		seen[id] = true
	}
}

// TestPausedServer: publishes whose acks do not come back in time (a hung
// server) are sent again and still land once in the stream and once at the
// watchers.
func TestPausedServer(t *testing.T) {
	defer func(d time.Duration) { ackTimeout = d }(ackTimeout)
	ackTimeout = 200 * time.Millisecond
	srv := testsvc.NATS(t)
	e := newEnv(t, srv)
	a, b := e.open("a"), e.open("b")
	b.watch("p")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	for v := uint64(1); v <= 3; v++ {
		a.Publish(event("p", v))
	}
	testwait.For(t, "a retry", func() bool { return a.Stats().Retried >= 1 })
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the acks", func() bool { return a.Stats().Acked == 3 })
	s := e.openStream(t, b.nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Errorf("stream holds %d messages, want 3", info.State.Msgs)
	}
	// Every copy a sent reaches b: the original and each retry.
	copies := 3 + a.Stats().Retried
	testwait.For(t, "every copy handled by b", func() bool {
		st := b.Stats()
		return st.Received == copies && st.Delivered+st.Duplicates == copies
	})
	got := b.rec.of("p")
	if len(got) != 3 {
		t.Errorf("b got %d events, want 3: %+v (stats %+v)", len(got), got, b.Stats())
	}
	t.Logf("a: %+v", a.Stats())
	t.Logf("b: %+v", b.Stats())
}

// TestStreamDeleted: a publish that finds no stream (an operator deleted
// it) creates it again and lands — also when another node subscribes to
// the user (watched), so that the publish is not refused at once but
// times out.
func TestStreamDeleted(t *testing.T) {
	defer func(d time.Duration) { ackTimeout = d }(ackTimeout)
	ackTimeout = 300 * time.Millisecond
	for _, watched := range []bool{false, true} {
		t.Run(fmt.Sprint("watched=", watched), func(t *testing.T) {
			e := newEnv(t, testsvc.SharedNATS(t))
			a := e.open("a")
			if watched {
				b := e.open("b")
				b.watch("d")
			}
			a.Publish(event("d", 1))
			testwait.For(t, "the first ack", func() bool { return a.Stats().Acked == 1 })
			js, err := jetstream.New(a.nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := js.DeleteStream(ctx, e.stream); err != nil {
				t.Fatal(err)
			}
			a.Publish(event("d", 2))
			testwait.For(t, "the second ack", func() bool { return a.Stats().Acked == 2 })
			s, err := js.Stream(ctx, e.stream)
			if err != nil {
				t.Fatal(err)
			}
			m, err := s.GetLastMsgForSubject(ctx, subjectOf(a.prefix, "d"))
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Header.Get("Nats-Msg-Id"); got != "d:2" {
				t.Errorf("last message %q, want d:2", got)
			}
			if st := a.Stats(); st.StreamRecreated != 1 || st.StreamMissing {
				t.Errorf("stats %+v, want the stream re-created once, not missing", st)
			}
		})
	}
}

// TestPublishNeverBlocks: with nobody draining the queue, Publish drops
// and counts instead of waiting.
func TestPublishNeverBlocks(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a := e.openIdle("a", func(c *Config) { c.QueueSize = 10 })
	done := make(chan struct{})
	go func() {
		for v := range uint64(100) {
			a.Publish(event("u", v+1))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked")
	}
	st := a.Stats()
	if st.Published != 10 || st.Dropped != 90 || st.Queued != 10 {
		t.Errorf("stats %+v, want 10 published, 90 dropped, 10 queued", st)
	}
	a.start()
	testwait.For(t, "the queued events acked", func() bool { return a.Stats().Acked == 10 })
}

// TestCloseFlushes: what is queued when Close is called is published.
func TestCloseFlushes(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a := e.openIdle("a")
	b := e.open("b")
	for v := range uint64(20) {
		a.Publish(event("c", v+1))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Acked != 20 || st.Queued != 0 {
		t.Errorf("after Close: %+v", st)
	}
	if err := a.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
	_ = b
}

func TestIsSubjectOf(t *testing.T) {
	users := []string{"a", "ab", "abc", "4.2 ü", strings.Repeat("x", 47), strings.Repeat("y", 48), strings.Repeat("z", 49), strings.Repeat("é", 32)}
	for _, u := range users {
		s := subjectOf("p.", u)
		if !isSubjectOf(s, "p.", u) {
			t.Errorf("isSubjectOf(%q, %q) = false", s, u)
		}
		if isSubjectOf(s, "q.", u) || isSubjectOf(s, "p.", u+"1") || isSubjectOf(s, "p.", "A"+u[1:]) {
			t.Errorf("isSubjectOf accepts a wrong subject for %q", u)
		}
	}
	if n := testing.AllocsPerRun(100, func() { isSubjectOf("p.NC4yIMO8", "p.", "4.2 ü") }); n != 0 {
		t.Errorf("isSubjectOf allocates %v times", n)
	}
}

// TestCloseWhileRunning: Close stops Run (which returns ErrClosed) and
// publishes what was queued.
func TestCloseWhileRunning(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a := e.openIdle("a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	for v := range uint64(100) {
		a.Publish(event("cw", v+1))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Run returned %v, want ErrClosed", err)
	}
	if st := a.Stats(); st.Acked != 100 || st.Queued != 0 || st.InFlight != 0 {
		t.Errorf("after Close: %+v", st)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	a.Publish(event("cw", 101))
	if st := a.Stats(); st.Dropped != 1 || st.Published != 100 {
		t.Errorf("Publish after Close: %+v, want it dropped", st)
	}
}

// TestNoGoroutineLeft: after Run returned and Close, nothing of the bus
// (nor of nats.go for it) is left running.
func TestNoGoroutineLeft(t *testing.T) {
	srv := testsvc.SharedNATS(t)
	e := newEnv(t, srv)
	base := runtime.NumGoroutine()
	a, b := e.openIdle("a"), e.openIdle("b")
	a.start()
	b.start()
	b.watch("g1", "g2")
	a.Publish(event("g1", 1))
	a.ContactsChanged("g2")
	testwait.For(t, "the delivery", func() bool { return len(b.rec.of("g1")) == 1 })
	b.unwatch("g1")
	for _, n := range []*node{a, b} {
		n.stop()
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Forf(t, func() string {
		buf := make([]byte, 1<<16)
		return fmt.Sprintf("the bus's goroutines to end: %d goroutines, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	}, func() bool { return runtime.NumGoroutine() <= base })
}

// contactsIdle reports whether no owner's announcement waits for, or is
// in, OnContactsChanged.
func (b *Bus) contactsIdle() bool {
	b.contMu.Lock()
	defer b.contMu.Unlock()
	return len(b.contState) == 0
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := Open(ctx, Config{Local: newRecorder()}); err == nil {
		t.Error("Open without URL succeeded")
	}
	if _, err := Open(ctx, Config{URL: "nats://127.0.0.1:1"}); err == nil {
		t.Error("Open without Local succeeded")
	}
	for _, c := range []Config{
		{Stream: "a.b"}, {Stream: "a b"}, {Subject: "a.*"}, {Subject: "a..b"}, {Subject: "a."}, {Subject: "a>"},
		{MaxAge: time.Minute, Duplicates: time.Hour}, {MaxAge: -time.Hour}, {QueueSize: -1},
	} {
		c.URL, c.Local = "nats://127.0.0.1:1", newRecorder()
		if _, err := Open(ctx, c); err == nil || strings.Contains(err.Error(), "connect") {
			t.Errorf("Open(%+v) = %v, want a configuration error", c, err)
		}
	}
	_, err := Open(ctx, Config{URL: "nats://127.0.0.1:1", Local: newRecorder()})
	if err == nil {
		t.Fatal("Open with NATS unreachable succeeded")
	}
	t.Log(err)
}

// TestManyOpenAtOnce: nodes starting together all create or update the
// stream without error.
func TestManyOpenAtOnce(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.openIdle(fmt.Sprint("n", i))
		}()
	}
	wg.Wait()
}

// TestStreamUpdated: Open brings an existing stream to the configuration.
func TestStreamUpdated(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	e.openIdle("a", func(c *Config) { c.MaxAge = time.Hour })
	b := e.openIdle("b", func(c *Config) { c.MaxAge = 2 * time.Hour; c.Duplicates = time.Minute })
	cfg := e.openStream(t, b.nc).CachedInfo().Config
	if cfg.MaxAge != 2*time.Hour || cfg.Duplicates != time.Minute || len(cfg.Subjects) != 1 || cfg.Subjects[0] != e.subject+".>" || cfg.Storage != jetstream.FileStorage {
		t.Errorf("stream config %+v", cfg)
	}
}

func TestPublishAllocs(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	a := e.openIdle("a", func(c *Config) { c.QueueSize = 1 << 20 })
	ev := event("u", 1)
	a.Publish(ev) // grow the buffer once
	if n := testing.AllocsPerRun(1000, func() { a.Publish(ev) }); n != 0 {
		t.Errorf("Publish allocates %v times per call", n)
	}
}

func BenchmarkPublish(b *testing.B) {
	srv := testsvc.SharedNATS(b)
	u := testsvc.Unique(b)
	bus, err := Open(context.Background(), Config{
		URL: srv.URL, Stream: "S_" + u, Subject: "p_" + u, Local: newRecorder(), QueueSize: 1 << 16,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer bus.Close()
	ev := event("u", 1)
	// Stand in for the publisher goroutine: empty the queue continuously.
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		var buf []item
		for {
			select {
			case <-stop:
				return
			case <-bus.q.notify:
			}
			buf = bus.q.take(buf[:0])
			bus.q.n.Add(-int64(len(buf)))
		}
	}()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bus.Publish(ev)
		}
	})
	b.StopTimer()
	close(stop)
	<-drained
	bus.q.take(nil)
	bus.q.n.Store(0)
	b.ReportMetric(float64(bus.Stats().Dropped)/float64(b.N), "dropped/op")
}

// TestBadMessages: what does not decode, or names another user than its
// subject, is counted and dropped; the dispatcher goes on.
func TestBadMessages(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	b := e.open("b")
	b.watch("u")
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	subj := subjectOf(b.prefix, "u")
	bad := [][]byte{
		nil,
		[]byte("not json"),
		[]byte(`{"user_id":"u","status":"invisible","prev":"online","at":"2026-11-18T11:06:41.000Z","settings":{"status":"everyone","last_seen":"everyone"}}`),
		[]byte(`{"user_id":"u","status":"online","prev":"online","at":"yesterday","settings":{"status":"everyone","last_seen":"everyone"}}`),
		[]byte(`{"user_id":"u","status":"online","prev":"online","at":"2026-11-18T11:06:41.000Z","settings":{"status":"friends","last_seen":"everyone"}}`),
		appendEvent(nil, event("someone else", 1)),
	}
	for _, data := range bad {
		if err := nc.Publish(subj, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Publish(subj, appendEvent(nil, event("u", 9))); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the good message", func() bool { return len(b.rec.of("u")) == 1 })
	if st := b.Stats(); st.Decoding != uint64(len(bad)) || st.Delivered != 1 || len(b.rec.all()) != 1 {
		t.Errorf("stats %+v, recorded %+v; want %d decoding errors and one delivery", st, b.rec.all(), len(bad))
	}
}

// TestDuplicateDropped: an event received again (a publish retried after
// its ack was lost), even after a newer one, is delivered once.
func TestDuplicateDropped(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	b := e.open("b")
	b.watch("u")
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, v := range []uint64{5, 5, 6, 5} {
		if err := nc.Publish(subjectOf(b.prefix, "u"), appendEvent(nil, event("u", v))); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "all four handled", func() bool { st := b.Stats(); return st.Delivered+st.Duplicates == 4 })
	got := b.rec.of("u")
	if len(got) != 2 || got[0].Version != 5 || got[1].Version != 6 || b.Stats().Duplicates != 2 {
		t.Errorf("delivered %+v, stats %+v; want versions 5 and 6, two duplicates", got, b.Stats())
	}
}

// TestSlowConsumerCounted: with the dispatcher not running, the shared
// channel fills and what nats.go drops is counted.
func TestSlowConsumerCounted(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	b := e.openIdle("b")
	b.watch("u")
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const extra = 10
	for i := range incomingBuffer + extra {
		if err := nc.Publish(subjectOf(b.prefix, "u"), appendEvent(nil, event("u", uint64(i+1)))); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	testwait.For(t, "the drops counted", func() bool { return b.Stats().SlowConsumer == extra })
	b.start()
	testwait.For(t, "the channel emptied", func() bool { return b.Stats().Delivered == incomingBuffer })
	b.unwatch("u") // the count of a subscription survives its end
	if got := b.Stats().SlowConsumer; got != extra {
		t.Errorf("SlowConsumer = %d after unwatch, want %d", got, extra)
	}
}

// privacyEvents are events whose privacy fields cross the bus: an
// invisible user's (the user's own devices see invisible) and a change of
// settings (the watchers who lost sight are told).
func privacyEvents() []presence.Event {
	inv := *event("u", 3)
	inv.Status, inv.Self = presence.Offline, presence.Invisible
	set := *event("u", 4)
	set.Self = set.Status
	set.SettingsOnly, set.SettingsChanged = true, true
	set.PrevSettings = presence.Settings{Status: presence.Nobody, LastSeen: presence.Everyone}
	merged := set
	merged.SettingsOnly = false
	// An invisible user whose text changed since they vanished: the
	// change everyone sees keeps the text of then, the user's own goes
	// with it; and a change only the user sees.
	frozen := inv
	frozen.Text, frozen.SelfText = "lunch", "gone fishing"
	own := frozen
	own.Version, own.Prev, own.SelfOnly = 5, presence.Offline, true
	return []presence.Event{inv, set, merged, frozen, own}
}

func TestCodecPrivacyFields(t *testing.T) {
	for _, ev := range privacyEvents() {
		data := appendEvent(nil, &ev)
		var got presence.Event
		if err := decodeEvent(data, &got); err != nil {
			t.Fatalf("decode %s: %v", data, err)
		}
		if got != ev {
			t.Errorf("%s decoded to %+v, want %+v", data, got, ev)
		}
	}
	// The true status and text are on the bus only where they are not
	// the public ones.
	if data := appendEvent(nil, event("u", 1)); bytes.Contains(data, []byte("self_status")) || bytes.Contains(data, []byte("self_text")) {
		t.Errorf("%s names a true status or text that is the public one", data)
	}
	// A true status that does not go with the public one is refused.
	bad := []byte(`{"user_id":"u","status":"online","prev":"online","text":"","last_seen":null,"version":1,"at":"2026-11-18T11:06:41.000Z","settings":{"status":"everyone","last_seen":"everyone"},"self_status":"invisible"}`)
	var ev presence.Event
	if err := decodeEvent(bad, &ev); err == nil {
		t.Errorf("%s decoded: %+v", bad, ev)
	}
}

// FuzzDecode: decoding never panics, and what decodes encodes back to an
// event that decodes the same.
func FuzzDecode(f *testing.F) {
	f.Add(appendEvent(nil, event("4.2 ü", 7)))
	f.Add(appendEvent(nil, &presence.Event{UserID: "x"}))
	for _, ev := range privacyEvents() {
		f.Add(appendEvent(nil, &ev))
	}
	f.Add([]byte(`{"user_id":"","last_seen":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev, again presence.Event
		if decodeEvent(data, &ev) != nil {
			return
		}
		out := appendEvent(nil, &ev)
		if err := decodeEvent(out, &again); err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", out, err)
		}
		if again != ev {
			t.Fatalf("round trip: %+v, then %+v", ev, again)
		}
	})
}

// Changes dropped because the dispatcher was behind are changes missed by
// the node's watchers, as while disconnected: OnReconnect (the node's
// resync) is called.
func TestSlowConsumerAsksForResync(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	var resyncs atomic.Int64
	b := e.openIdle("b", func(c *Config) { c.OnReconnect = func() { resyncs.Add(1) } })
	b.watch("u")
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i := range incomingBuffer + 10 {
		if err := nc.Publish(subjectOf(b.prefix, "u"), appendEvent(nil, event("u", uint64(i+1)))); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	testwait.For(t, "the drops counted", func() bool { return b.Stats().SlowConsumer > 0 })
	testwait.For(t, "a resync requested", func() bool { return resyncs.Load() > 0 })
	b.start()
}

// OnContactsChanged reads a database: while it is slow, the changes of
// the watched users still reach Local, and the announcements of one owner
// that pile up meanwhile are folded into one call.
func TestSlowContactsCallbackDoesNotHoldChanges(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	release := make(chan struct{})
	var calls atomic.Int64
	b := e.open("b", func(c *Config) {
		c.OnContactsChanged = func(string) {
			calls.Add(1)
			<-release
		}
	})
	a := e.open("a")
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the nodes' own cleanups, which wait for Run
	b.watch("owner", "u")
	a.ContactsChanged("owner")
	testwait.For(t, "the callback entered", func() bool { return calls.Load() == 1 })
	for range 5 {
		a.ContactsChanged("owner")
	}
	a.Publish(event("u", 1))
	testwait.For(t, "u's change delivered while the callback is blocked", func() bool { return len(b.rec.of("u")) == 1 })
	unblock()
	// The announcements had all arrived (before u's change): once no
	// owner waits for the callback, every call that was to come came.
	testwait.For(t, "the announcements served", func() bool { return calls.Load() >= 2 && b.contactsIdle() })
	if n := calls.Load(); n != 2 {
		t.Errorf("OnContactsChanged called %d times, want 2 (5 announcements while one ran fold into one)", n)
	}
}

// A change of an owner that arrives after the owner's contact-list
// announcement is delivered only once OnContactsChanged returned: the hub
// must not filter it with the relations of before the change (a watcher
// just removed from the list would see it). Of several, the newest is
// delivered.
func TestChangeAfterAnnouncementWaitsForTheCallback(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	release := make(chan struct{})
	var calls atomic.Int64
	b := e.open("b", func(c *Config) {
		c.OnContactsChanged = func(string) {
			calls.Add(1)
			<-release
		}
	})
	a := e.open("a")
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	b.watch("owner", "u")
	a.Publish(event("owner", 1)) // before the change: delivered at once
	testwait.For(t, "owner's change before the announcement", func() bool { return len(b.rec.of("owner")) == 1 })
	a.ContactsChanged("owner")
	testwait.For(t, "the callback entered", func() bool { return calls.Load() == 1 })
	a.Publish(event("owner", 2))
	a.Publish(event("owner", 3))
	// u's change marks that owner's have arrived: the dispatcher hands
	// one node's changes on in the order it sent them.
	a.Publish(event("u", 1))
	testwait.For(t, "u's change", func() bool { return len(b.rec.of("u")) == 1 })
	if got := b.rec.of("owner"); len(got) != 1 {
		t.Fatalf("owner's changes delivered while its contact list was being read: %+v", got[1:])
	}
	unblock()
	testwait.For(t, "owner's newest change after the callback", func() bool { return len(b.rec.of("owner")) == 2 })
	testwait.NothingWithin(100*time.Millisecond, "owner's older parked change delivered after its newest")
	if got := b.rec.of("owner"); len(got) != 2 || got[1].Version != 3 {
		t.Errorf("owner's changes: %+v, want versions 1 and 3", got)
	}
	a.Publish(event("owner", 4)) // nothing pending any more: at once
	testwait.For(t, "a later change", func() bool { return len(b.rec.of("owner")) == 3 })
}

package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
)

// checkTransitions compares the transitions published per user with want
// (users missing from want must have none).
func checkTransitions(t *testing.T, got, want map[string][]string) {
	t.Helper()
	for u, w := range want {
		if !slices.Equal(got[u], w) {
			t.Errorf("user %s: transitions %v, want %v", u, got[u], w)
		}
	}
	for u, g := range got {
		if _, ok := want[u]; !ok {
			t.Errorf("user %s: transitions %v, want none", u, g)
		}
	}
}

func users(prefix string, from, to int) []string {
	var us []string
	for i := from; i < to; i++ {
		us = append(us, fmt.Sprintf("%s%d", prefix, i))
	}
	return us
}

func TestIngest(t *testing.T) {
	w := newWorld(t)
	c := w.node("n1", nil)

	var recs []*kgo.Record
	for _, u := range users("u", 0, 30) {
		recs = append(recs, w.event("session_connected", u, "d1", -time.Second))
	}
	w.produce(recs...)
	testwait.For(t, "the connects applied and committed", w.committedAll)
	n := len(recs)

	recs = recs[:0]
	for _, u := range users("u", 0, 10) {
		recs = append(recs, w.event("heartbeat", u, "d1", 0), w.event("session_disconnected", u, "d1", 0))
	}
	for _, u := range users("s", 0, 5) { // sessions within one poll: shown coming and going
		recs = append(recs, w.event("session_connected", u, "d1", 0), w.event("session_disconnected", u, "d1", 0))
	}
	recs = append(recs,
		&kgo.Record{Key: []byte("u0"), Value: []byte("not json")},
		&kgo.Record{Key: []byte("u0"), Value: []byte(`{"type":"nap","user_id":"u0","device_id":"d1","at":"2026-11-23T01:00:00Z"}`)},
		&kgo.Record{Key: []byte("u0"), Value: []byte(`{"type":"heartbeat","user_id":"a b","device_id":"d1","at":"2026-11-23T01:00:00Z"}`)},
		&kgo.Record{Key: []byte("u0"), Value: []byte(`{"type":"heartbeat","user_id":"u0","device_id":"d1","at":"2026-11-23T02:00:00Z"}`)}, // an hour ahead
		&kgo.Record{Key: []byte("u0"), Value: []byte(`{"type":"heartbeat","user_id":"u0","device_id":"d1","at":"2026-11-23T01:00:00Z","pad":"` + strings.Repeat("x", ingest.MaxMessageSize) + `"}`)},
		w.event("heartbeat", "old", "d1", -2*ttl), // stale
	)
	w.produce(recs...)
	testwait.For(t, "the second batch applied and committed", w.committedAll)
	n += len(recs)

	want := map[string][]string{}
	for i, u := range users("u", 0, 30) {
		want[u] = []string{"offline>online"}
		if i < 10 {
			want[u] = append(want[u], "online>offline")
		}
	}
	for _, u := range users("s", 0, 5) {
		want[u] = []string{"offline>online", "online>offline"}
	}
	checkTransitions(t, w.rec.transitions(), want)

	s := c.Stats()
	if s.Invalid != 5 || s.Stale != 1 {
		t.Errorf("invalid %d, stale %d; want 5, 1", s.Invalid, s.Stale)
	}
	if sum := s.Applied + s.Coalesced + s.Stale + s.Ignored + s.Invalid + s.Refused + s.GivenUp; s.Consumed != uint64(n) || sum != s.Consumed {
		t.Errorf("consumed %d (produced %d), accounted for %d: %+v", s.Consumed, n, sum, s)
	}
	if s.Partitions != partitions || len(s.Lag) != partitions {
		t.Errorf("partitions %d, lag %v; want %d partitions", s.Partitions, s.Lag, partitions)
	}
	for p, n := range s.Lag {
		if n != 0 {
			t.Errorf("partition %d: lag %d after everything was applied", p, n)
		}
	}
}

// dying is a node's tracker that dies: after left more calls, every call
// blocks until the test ends and then fails, applying nothing.
type dying struct {
	tr ingest.Tracker

	mu      sync.Mutex // guards the fields below
	left    int
	blocked int
	end     chan struct{}
}

func (d *dying) pass() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.left > 0 {
		d.left--
		return true
	}
	d.blocked++
	return false
}

func (d *dying) setLeft(n int) {
	d.mu.Lock()
	d.left = n
	d.mu.Unlock()
}

func (d *dying) waiting() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.blocked
}

var errDead = errors.New("the node is dead")

func (d *dying) Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	if !d.pass() {
		<-d.end
		return presence.Change{}, errDead
	}
	return d.tr.Heartbeat(ctx, user, device, active)
}

func (d *dying) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	if !d.pass() {
		<-d.end
		return presence.Change{}, errDead
	}
	return d.tr.Bye(ctx, user, device)
}

// TestNodeKilledMidBatch: two nodes in one group; one dies in the middle
// of applying a poll (its tracker calls stop, its connections drop). Its
// partitions move to the other node, which applies what the dead node did
// not commit: nothing is lost, and what the dead node had applied shows
// nothing twice.
func TestNodeKilledMidBatch(t *testing.T) {
	w := newWorld(t)
	sw := newNetSwitch()
	dy := &dying{tr: w.tr, left: 1 << 30, end: make(chan struct{})}
	a := w.node("a", dy, kgo.Dialer(sw.dial))
	t.Cleanup(func() { close(dy.end) }) // before a's own cleanup: its calls return

	all := users("u", 0, 40)
	var recs []*kgo.Record
	for _, u := range all {
		recs = append(recs, w.event("session_connected", u, "d1", -time.Second))
	}
	w.produce(recs...)
	testwait.For(t, "the first batch applied and committed", w.committedAll)

	b := w.node("b", nil)
	testwait.For(t, "the partitions shared by both nodes", func() bool {
		o := w.owned()
		return o["a"] == partitions/2 && o["b"] == partitions/2
	})

	// A reconnects on d2 and leaves d1; the first half also leave d2.
	const left = 5
	dy.setLeft(left)
	recs = recs[:0]
	for i, u := range all {
		recs = append(recs, w.event("session_connected", u, "d2", 0), w.event("session_disconnected", u, "d1", 0))
		if i < 20 {
			recs = append(recs, w.event("heartbeat", u, "d2", 0), w.event("session_disconnected", u, "d2", 0))
		}
	}
	w.produce(recs...)
	testwait.For(t, "node a dying in the middle of its poll", func() bool { return dy.waiting() > 0 })
	sw.kill()

	testwait.For(t, "node b owning every partition", func() bool {
		o := w.owned()
		return len(o) == 1 && o["b"] == partitions
	})
	testwait.For(t, "everything applied and committed", w.committedAll)

	for i, u := range all {
		want := 1
		if i < 20 {
			want = 0
		}
		if n := w.devices(u); n != want {
			t.Errorf("user %s: %d devices alive, want %d", u, n, want)
		}
	}
	want := map[string][]string{}
	for i, u := range all {
		want[u] = []string{"offline>online"}
		if i < 20 {
			want[u] = append(want[u], "online>offline")
		}
	}
	checkTransitions(t, w.rec.transitions(), want)
	if sa, sb := a.Stats(), b.Stats(); sb.Applied == 0 || sa.Applied < left {
		t.Errorf("applied: a %d, b %d; want a ≥ %d (it died after those), b > 0", sa.Applied, sb.Applied, left)
	}
}

// TestPartitionMoves: a partition moves to a node that joins the group,
// and back when that node leaves; each change is applied once.
func TestPartitionMoves(t *testing.T) {
	w := newWorld(t)
	a := w.node("a", nil)
	u := users("u", 0, 40)
	v := users("v", 0, 20)

	var recs []*kgo.Record
	for _, x := range u {
		recs = append(recs, w.event("session_connected", x, "d1", -time.Second))
	}
	w.produce(recs...)
	testwait.For(t, "the first batch applied and committed", w.committedAll)
	if o := w.owned(); o["a"] != partitions {
		t.Fatalf("owned %v, want every partition on a", o)
	}

	b, stopB := w.stoppableNode("b")
	testwait.For(t, "partitions moved to b", func() bool {
		o := w.owned()
		return o["a"] == partitions/2 && o["b"] == partitions/2
	})
	appliedA := a.Stats().Applied

	recs = recs[:0]
	for _, x := range u[:20] {
		recs = append(recs, w.event("session_disconnected", x, "d1", 0))
	}
	for _, x := range v {
		recs = append(recs, w.event("session_connected", x, "d1", 0))
	}
	w.produce(recs...)
	testwait.For(t, "the second batch applied and committed", w.committedAll)
	if a.Stats().Applied == appliedA || b.Stats().Applied == 0 {
		t.Errorf("second batch: a applied %d, b %d; want both some", a.Stats().Applied-appliedA, b.Stats().Applied)
	}

	stopB()
	testwait.For(t, "partitions back on a", func() bool {
		o := w.owned()
		return len(o) == 1 && o["a"] == partitions
	})
	recs = recs[:0]
	for _, x := range u[20:] {
		recs = append(recs, w.event("session_disconnected", x, "d1", 0))
	}
	w.produce(recs...)
	testwait.For(t, "the third batch applied and committed", w.committedAll)

	want := map[string][]string{}
	for _, x := range u {
		want[x] = []string{"offline>online", "online>offline"}
	}
	for _, x := range v {
		want[x] = []string{"offline>online"}
	}
	checkTransitions(t, w.rec.transitions(), want)
}

// TestBrokersUnreachable: every broker is unreachable for 10 s. The
// changes this node makes meanwhile wait in the producer's queue and are
// produced, in order, when the brokers are back; the consumer, whose
// session expired meanwhile, joins the group again and goes on.
func TestBrokersUnreachable(t *testing.T) {
	w := newWorld(t)
	p := w.producer(0)
	w.pubs.add(p)
	c := w.node("n1", nil)

	u := users("u", 0, 10)
	var recs []*kgo.Record
	for _, x := range u {
		recs = append(recs, w.event("session_connected", x, "d1", -time.Second))
	}
	w.produce(recs...)
	testwait.For(t, "the connects applied and committed", w.committedAll)
	testwait.For(t, "their changes produced", func() bool { return p.Stats().Produced == uint64(len(u)) })

	w.gate.close()
	// Clients of this node's own WebSocket come and change their status
	// while Kafka is away: nothing blocks, the changes wait.
	v := users("v", 0, 10)
	for _, x := range v {
		if _, err := w.tr.Heartbeat(w.ctx, x, "ws", true); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.Queued != len(v) || s.Produced != uint64(len(u)) {
		t.Errorf("brokers away: producer stats %+v, want %d queued", s, len(v))
	}
	time.Sleep(10 * time.Second) // the scenario: the outage, five of the consumer's 2 s sessions
	if s := p.Stats(); s.Queued != len(v) || s.Dropped != 0 || s.Failed != 0 {
		t.Errorf("after 10 s away: producer stats %+v, want %d queued, none lost", s, len(v))
	}
	w.gate.open()
	back := time.Now()

	testwait.For(t, "the queued changes produced", func() bool { s := p.Stats(); return s.Queued == 0 && s.Produced == uint64(len(u)+len(v)) })
	t.Logf("the queued changes were produced %v after the brokers were back", time.Since(back).Round(time.Millisecond))
	recs = recs[:0]
	for _, x := range u {
		recs = append(recs, w.event("session_disconnected", x, "d1", 0))
	}
	w.produce(recs...)
	t.Logf("the connection layer produced again %v after the brokers were back", time.Since(back).Round(time.Millisecond))
	testwait.For(t, "the consumer applying again", func() bool { return w.committedAll() && len(w.rec.events()) == 2*len(u)+len(v) })
	t.Logf("the consumer applied new events %v after the brokers were back", time.Since(back).Round(time.Millisecond))

	want := map[string][]string{}
	for _, x := range u {
		want[x] = []string{"offline>online", "online>offline"}
	}
	for _, x := range v {
		want[x] = []string{"offline>online"}
	}
	checkTransitions(t, w.rec.transitions(), want)
	evs := w.rec.events()
	testwait.For(t, "every change produced", func() bool { return p.Stats().Produced == uint64(len(evs)) })
	checkChanges(t, w.readChanges(len(evs)), evs)
	t.Logf("consumer after the outage: %+v", c.Stats())
}

// flaky is a tracker that fails every call while down, always for the
// user doomed, and refuses the user crowded (too many devices).
type flaky struct {
	tr       ingest.Tracker
	down     atomic.Bool
	failures atomic.Int64
}

var errStoreDown = errors.New("the store is down")

func (f *flaky) fail(user string) error {
	switch {
	case user == "crowded":
		return fmt.Errorf("beat: %w", presence.ErrTooManyDevices)
	case user == "doomed" || f.down.Load():
		f.failures.Add(1)
		return errStoreDown
	}
	return nil
}

func (f *flaky) Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	if err := f.fail(user); err != nil {
		return presence.Change{}, err
	}
	return f.tr.Heartbeat(ctx, user, device, active)
}

func (f *flaky) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	if err := f.fail(user); err != nil {
		return presence.Change{}, err
	}
	return f.tr.Bye(ctx, user, device)
}

// TestTrackerErrors: while the tracker fails, the events are tried again
// and their offsets not committed; afterwards they are applied and
// committed. An event the tracker refuses is skipped, one that keeps
// failing is given up after MaxAttempts; neither stops the others.
func TestTrackerErrors(t *testing.T) {
	w := newWorld(t)
	f := &flaky{tr: w.tr}
	c, _ := w.startNodeWith("n1", f, func(cfg *kafka.ConsumerConfig) {
		cfg.MaxAttempts = 10
		cfg.RetryDelay, cfg.RetryMaxDelay = 20*time.Millisecond, 100*time.Millisecond
	})
	u := users("u", 0, 10)
	var recs []*kgo.Record
	for _, x := range u[:5] {
		recs = append(recs, w.event("session_connected", x, "d1", -time.Second))
	}
	w.produce(recs...)
	testwait.For(t, "the first batch applied and committed", w.committedAll)

	f.down.Store(true)
	recs = recs[:0]
	for _, x := range append(u[5:], "doomed", "crowded") {
		recs = append(recs, w.event("session_connected", x, "d1", 0))
	}
	w.produce(recs...)
	testwait.For(t, "tracker calls failing", func() bool { return f.failures.Load() >= 3 })
	if w.committedAll() {
		t.Error("offsets committed past events that failed")
	}
	lag := int64(0)
	for _, n := range c.Stats().Lag {
		lag += n
	}
	if lag == 0 {
		t.Errorf("no lag while events wait: %+v", c.Stats())
	}
	f.down.Store(false)

	testwait.For(t, "everything applied or skipped, and committed", w.committedAll)
	want := map[string][]string{}
	for _, x := range u {
		want[x] = []string{"offline>online"}
	}
	checkTransitions(t, w.rec.transitions(), want)
	if s := c.Stats(); s.Refused != 1 || s.GivenUp != 1 || s.Retried == 0 {
		t.Errorf("stats %+v, want 1 refused, 1 given up, some retried", s)
	}
}

// TestIngestTopicCreatedLater: a node started before its ingest topic
// exists consumes it once it is created.
func TestIngestTopicCreatedLater(t *testing.T) {
	w := newWorld(t)
	const topic = "presence.updates.later"
	w.startNodeWith("n1", nil, func(cfg *kafka.ConsumerConfig) { cfg.Topic = topic })
	// The node looks for its topic, finds none, and waits.
	testwait.NothingWithin(2*time.Second, "the node joining its group before its topic exists")
	if g := w.cluster.GroupInfo(group); g != nil && len(g.Members) > 0 {
		t.Fatalf("the node joined its group before its topic existed: %+v", g)
	}
	if err := w.cluster.CreateTopic(topic, 2, nil); err != nil {
		t.Fatal(err)
	}
	r := w.event("session_connected", "kim", "d1", 0)
	r.Topic = topic
	w.produce(r)
	testwait.For(t, "kim online", func() bool { return w.devices("kim") == 1 })
}

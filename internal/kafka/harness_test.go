package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
)

const (
	ttl        = time.Minute
	partitions = 4
	ingestT    = "presence.updates"
	changesT   = "presence.changes"
	group      = "presenced"
)

var epoch = time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)

// world is one deployment under test: an in-process Kafka cluster
// (kfake: the Kafka protocol, consumer groups and rebalances included)
// behind a gate that can make every broker unreachable, and a real tracker
// over a memory store on a fake clock, shared by the nodes as Redis would
// be, whose changes a recorder keeps.
type world struct {
	t       *testing.T
	ctx     context.Context
	cluster *kfake.Cluster
	gate    *gate
	clk     *clock.Fake
	store   *memstore.Store
	tr      *tracker.Tracker
	rec     *recorder
	pubs    *publishers
	gw      *kgo.Client // the connection layer: produces session events
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	g := &gate{conns: map[net.Conn]struct{}{}}
	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, ingestT, changesT),
		kfake.GroupMinSessionTimeout(500*time.Millisecond),
		kfake.ListenFn(g.listen),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	t.Cleanup(g.open) // let every client say goodbye before the cluster closes
	clk := clock.NewFake(epoch)
	store := memstore.New(memstore.Config{Rules: presence.Rules{TTL: ttl, IdleAfter: 5 * time.Minute}})
	rec := &recorder{}
	pubs := &publishers{ps: []tracker.Publisher{rec}}
	tr, err := tracker.New(tracker.Config{Store: store, Durable: benchfix.Nop{}, Clock: clk, Publisher: pubs})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := kgo.NewClient(
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.DefaultProduceTopic(ingestT),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	return &world{
		t: t, ctx: ctx, cluster: cluster, gate: g, clk: clk, store: store, tr: tr, rec: rec, pubs: pubs, gw: gw,
	}
}

// node starts a consumer on tr (the world's tracker if nil) with the
// world's options and opts, running until the test ends.
func (w *world) node(name string, tr ingest.Tracker, opts ...kgo.Opt) *kafka.Consumer {
	w.t.Helper()
	c, _ := w.startNode(name, tr, opts...)
	return c
}

// stoppableNode starts a consumer on the world's tracker and returns a
// function that stops it (leaving the group) before the test ends.
func (w *world) stoppableNode(name string) (*kafka.Consumer, func()) {
	w.t.Helper()
	return w.startNode(name, nil)
}

func (w *world) startNode(name string, tr ingest.Tracker, opts ...kgo.Opt) (*kafka.Consumer, func()) {
	w.t.Helper()
	return w.startNodeWith(name, tr, nil, opts...)
}

// startNodeWith is startNode with the consumer's config changed by edit.
func (w *world) startNodeWith(name string, tr ingest.Tracker, edit func(*kafka.ConsumerConfig), opts ...kgo.Opt) (*kafka.Consumer, func()) {
	w.t.Helper()
	if tr == nil {
		tr = w.tr
	}
	cfg := kafka.ConsumerConfig{
		Brokers:       w.cluster.ListenAddrs(),
		Topic:         ingestT,
		Group:         group,
		ClientID:      name,
		Tracker:       tr,
		TTL:           ttl,
		Clock:         w.clk,
		Logger:        slog.New(slog.NewTextHandler(w.t.Output(), nil)).With("node", name),
		RetryDelay:    50 * time.Millisecond,
		CommitTimeout: time.Second,
		// Short sessions, so that a killed node is noticed within the test.
		SessionTimeout: 2 * time.Second,
		ClientOptions:  opts,
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := kafka.NewConsumer(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			w.t.Errorf("%s: Run: %v", name, err)
		}
		c.Close()
	})
	w.t.Cleanup(stop)
	return c, stop
}

// event renders one session event at the fake clock's now + d.
func (w *world) event(typ, user, device string, d time.Duration) *kgo.Record {
	at := w.clk.Now().Add(d).UTC().Format(wire.TimeLayout)
	return &kgo.Record{Key: []byte(user), Value: fmt.Appendf(nil, `{"type":%q,"user_id":%q,"device_id":%q,"at":%q}`, typ, user, device, at)}
}

// produce writes records to the ingest topic, keyed as they are.
func (w *world) produce(recs ...*kgo.Record) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	if err := w.gw.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		w.t.Fatalf("produce: %v", err)
	}
}

// devices returns the alive devices of user now.
func (w *world) devices(user string) int {
	w.t.Helper()
	out := make([]presence.Snapshot, 1)
	if err := w.store.Get(w.ctx, w.clk.Now().UnixMilli(), []string{user}, out); err != nil {
		w.t.Fatal(err)
	}
	return out[0].Devices
}

// committedAll reports whether the group committed every partition of the
// ingest topic up to its end.
func (w *world) committedAll() bool {
	info := w.cluster.GroupInfo(group)
	if info == nil {
		return false
	}
	for _, p := range w.cluster.PartitionInfos(ingestT) {
		if p.HighWatermark == 0 {
			continue
		}
		if c, ok := info.Commits[ingestT][p.Partition]; !ok || c.Offset != p.HighWatermark {
			return false
		}
	}
	return true
}

// owned returns the partitions of the ingest topic each member (by client
// id) is assigned now.
func (w *world) owned() map[string]int {
	m := map[string]int{}
	if info := w.cluster.GroupInfo(group); info != nil {
		for _, mem := range info.Members {
			m[mem.ClientID] += len(mem.Assignment[ingestT])
		}
	}
	return m
}

// recorder is a tracker.Publisher that keeps every change.
type recorder struct {
	mu    sync.Mutex
	evs   []presence.Event
	rooms []presence.RoomEvent
}

func (r *recorder) Publish(ev *presence.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, *ev)
	r.mu.Unlock()
}

func (r *recorder) PublishRoom(ev *presence.RoomEvent) {
	r.mu.Lock()
	r.rooms = append(r.rooms, *ev)
	r.mu.Unlock()
}

// roomEvents returns the room events published.
func (r *recorder) roomEvents() []presence.RoomEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]presence.RoomEvent(nil), r.rooms...)
}

// transitions returns, per user, the public transitions published, as
// "offline>online".
func (r *recorder) transitions() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string][]string{}
	for _, ev := range r.evs {
		m[ev.UserID] = append(m[ev.UserID], ev.Prev.String()+">"+ev.Status.String())
	}
	return m
}

func (r *recorder) events() []presence.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]presence.Event(nil), r.evs...)
}

// publishers hands every change to each of its publishers; more can be
// added while the tracker runs.
type publishers struct {
	mu sync.Mutex // guards ps
	ps []tracker.Publisher
}

func (p *publishers) add(pub tracker.Publisher) {
	p.mu.Lock()
	p.ps = append(p.ps, pub)
	p.mu.Unlock()
}

func (p *publishers) Publish(ev *presence.Event) {
	p.mu.Lock()
	ps := p.ps
	p.mu.Unlock()
	for _, pub := range ps {
		pub.Publish(ev)
	}
}

func (p *publishers) PublishRoom(ev *presence.RoomEvent) {
	p.mu.Lock()
	ps := p.ps
	p.mu.Unlock()
	for _, pub := range ps {
		if rp, ok := pub.(tracker.RoomPublisher); ok {
			rp.PublishRoom(ev)
		}
	}
}

// gate stands between the brokers and every client: closed, it cuts the
// connections open and resets every new one at once — the brokers are
// unreachable, for every node alike.
type gate struct {
	mu     sync.Mutex // guards the fields below
	closed bool
	conns  map[net.Conn]struct{}
}

func (g *gate) listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &gatedListener{Listener: ln, g: g}, nil
}

// close makes the brokers unreachable.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for c := range g.conns {
		c.Close()
	}
	clear(g.conns)
}

// open makes them reachable again.
func (g *gate) open() {
	g.mu.Lock()
	g.closed = false
	g.mu.Unlock()
}

type gatedListener struct {
	net.Listener
	g *gate
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.g.mu.Lock()
		if l.g.closed {
			l.g.mu.Unlock()
			c.Close()
			continue
		}
		l.g.conns[c] = struct{}{}
		l.g.mu.Unlock()
		return c, nil
	}
}

// netSwitch is one node's network: cut, every connection of its clients
// is closed and no new one is made — the node is gone as far as the
// brokers can tell.
type netSwitch struct {
	mu    sync.Mutex // guards the fields below
	cut   bool
	conns map[net.Conn]struct{}
}

func newNetSwitch() *netSwitch { return &netSwitch{conns: map[net.Conn]struct{}{}} }

func (s *netSwitch) dial(ctx context.Context, network, host string) (net.Conn, error) {
	s.mu.Lock()
	cut := s.cut
	s.mu.Unlock()
	if cut {
		return nil, errors.New("netswitch: cut")
	}
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut {
		c.Close()
		return nil, errors.New("netswitch: cut")
	}
	s.conns[c] = struct{}{}
	return c, nil
}

func (s *netSwitch) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut = true
	for c := range s.conns {
		c.Close()
	}
	clear(s.conns)
}

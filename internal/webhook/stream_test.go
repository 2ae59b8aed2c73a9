package webhook

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/natsbus"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// nobody is a natsbus.Local that watches nobody.
type nobody struct{}

func (nobody) Publish(*presence.Event) {}
func (nobody) Watched(string) bool     { return false }

// streamEnv is one change stream (a bus publishing to it) and the names
// of its leases, unique to the test, on a NATS server.
type streamEnv struct {
	t                                 *testing.T
	srv                               *testsvc.Server
	stream, subject, leases, leaseSub string
	bus                               *natsbus.Bus
}

func newStreamEnv(t *testing.T, srv *testsvc.Server) *streamEnv {
	u := testsvc.Unique(t)
	e := &streamEnv{t: t, srv: srv, stream: "WH_" + u, subject: "wh_" + u + ".changes",
		leases: "WHL_" + u, leaseSub: "whl_" + u + ".leases"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := natsbus.Open(ctx, natsbus.Config{URL: srv.URL, NodeID: "publisher", Stream: e.stream, Subject: e.subject,
		Local: nobody{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(rctx); close(done) }()
	t.Cleanup(func() { stop(); <-done; b.Close() })
	e.bus = b
	return e
}

// node is a Sender reading the env's stream through a connection of its
// own.
func (e *streamEnv) node(name string, cfg Config) (*running, *jsstream.Conn) {
	e.t.Helper()
	cfg, conn := e.config(name, cfg)
	return run(e.t, cfg), conn
}

// config is cfg reading the env's stream through a connection of its
// own, as node name.
func (e *streamEnv) config(name string, cfg Config) (Config, *jsstream.Conn) {
	e.t.Helper()
	conn, err := jsstream.Dial(e.srv.URL, name, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(conn.Close)
	cfg.Stream = &StreamConfig{Conn: conn, Stream: e.stream, Confirmer: e.bus, NodeID: name,
		AckWait: time.Second, LeaseTTL: 600 * time.Millisecond, LeaseStream: e.leases, LeaseSubject: e.leaseSub}
	return cfg, conn
}

// publish publishes versions from…to of each user and waits for the
// stream to hold them (it may have to be created again first: Wait
// reports false at once while it is missing).
func (e *streamEnv) publish(users []string, from, to uint64) {
	e.t.Helper()
	for v := from; v <= to; v++ {
		for _, u := range users {
			e.bus.Publish(event(u, v))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Timeout)
	defer cancel()
	testwait.Forf(e.t, func() string { return fmt.Sprintf("the stream to take the changes: %+v", e.bus.Stats()) },
		func() bool { return e.bus.Wait(ctx, e.bus.Mark()) })
}

// TestStreamDelivery: two nodes read one change stream; every change
// reaches the endpoint once, each user's in order, through one node (the
// lease holder); a change of settings alone and a message that is no
// change are not sent.
func TestStreamDelivery(t *testing.T) {
	e := newStreamEnv(t, testsvc.SharedNATS(t))
	r := newReceiver(t)
	cfg := Config{URLs: []string{"http://" + r.addr + "/hook"}, MaxBatch: 16, Linger: 5 * time.Millisecond}
	a, _ := e.node("a", cfg)
	b, _ := e.node("b", cfg)
	users := names(10)
	e.publish(users, 1, 10)
	e.bus.Publish(&presence.Event{UserID: "u0", SettingsOnly: true, SettingsChanged: true, Version: 100, At: 1})
	// A change only the user sees (an invisible user's text) is no
	// webhook's either, as on the embedded node's outbox.
	e.bus.Publish(&presence.Event{UserID: "u1", Status: presence.Offline, Prev: presence.Offline,
		Self: presence.Invisible, SelfText: "gone fishing", SelfOnly: true, Version: 101, At: 1})
	conn, err := jsstream.Dial(e.srv.URL, "garbage", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.NC.Publish(e.subject+".eA", []byte("not a change")); err != nil {
		t.Fatal(err)
	}
	e.publish(users, 11, 30)
	testwait.For(t, "every change", func() bool { return r.count() >= len(users)*30 })
	testwait.For(t, "the garbage skipped", func() bool { return a.Stats().Dropped+b.Stats().Dropped == 1 })
	a.stop()
	b.stop()
	r.checkAll(t, users, 30)
	if n := r.count(); n != len(users)*30 {
		t.Errorf("%d changes arrived, want %d: each once", n, len(users)*30)
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.Delivered != 0 && sb.Delivered != 0 {
		t.Errorf("both nodes delivered (%d and %d): one holds the lease", sa.Delivered, sb.Delivered)
	}
}

// TestStreamTakeover: the node that holds the lease loses NATS while the
// endpoint fails a batch it holds (a node that died, as far as the others
// can tell); the other node takes the endpoint over and delivers that
// batch first, then the rest, each user's in order.
func TestStreamTakeover(t *testing.T) {
	e := newStreamEnv(t, testsvc.SharedNATS(t))
	r := newReceiver(t)
	cfg := Config{URLs: []string{"http://" + r.addr + "/hook"}, MaxBatch: 8, Linger: 5 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	a, aConn := e.node("a", cfg)
	b, bConn := e.node("b", cfg)
	users := names(4)
	e.publish(users, 1, 5)
	testwait.For(t, "the first changes", func() bool { return r.count() >= len(users)*5 })
	r.mode.Store(modeFail)
	e.publish(users, 6, 10)
	leader, conn, other := a, aConn, b
	testwait.For(t, "a batch held", func() bool {
		switch {
		case a.endpoints[0].held.Load() > 0:
			leader, conn, other = a, aConn, b
		case b.endpoints[0].held.Load() > 0:
			leader, conn, other = b, bConn, a
		default:
			return false
		}
		return true
	})
	conn.NC.Close() // the holder is cut off: no renewal, no ack
	e.publish(users, 11, 15)
	// The other node takes over once the lease lapsed, and is given the
	// batch again once its AckWait passed.
	testwait.For(t, "the other node holding the batch", func() bool { return other.endpoints[0].held.Load() > 0 })
	r.mode.Store(modeOK)
	testwait.For(t, "every change", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, u := range users {
			if vs := r.got[u]; len(vs) == 0 || vs[len(vs)-1] != 15 {
				return false
			}
		}
		return true
	})
	leader.stop()
	r.checkAll(t, users, 15)
}

// TestStreamConsumerLost: the endpoint's consumer is deleted (NATS lost
// its store, or an operator) while a node delivers; the node creates it
// again from the moment it last answered, and no change is lost.
func TestStreamConsumerLost(t *testing.T) {
	e := newStreamEnv(t, testsvc.SharedNATS(t))
	r := newReceiver(t)
	cfg := Config{URLs: []string{"http://" + r.addr + "/hook"}, MaxBatch: 8, Linger: 5 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	_, conn := e.node("a", cfg)
	users := names(3)
	e.publish(users, 1, 5)
	testwait.For(t, "the first changes", func() bool { return r.count() >= len(users)*5 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.JS.DeleteConsumer(ctx, e.stream, ConsumerPrefix+endpointKey(cfg.URLs[0])); err != nil {
		t.Fatal(err)
	}
	e.publish(users, 6, 10)
	testwait.For(t, "every change", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, u := range users {
			if vs := r.got[u]; len(vs) == 0 || vs[len(vs)-1] != 10 {
				return false
			}
		}
		return true
	})
	r.checkAll(t, users, 10)
	if _, err := conn.JS.Consumer(ctx, e.stream, ConsumerPrefix+endpointKey(cfg.URLs[0])); err != nil {
		t.Errorf("the consumer was not created again: %v", err)
	}
}

// versionsOf returns the versions r got of each of users, in the order
// they came.
func (r *receiver) versionsOf(users []string) map[string][]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]uint64{}
	for _, u := range users {
		out[u] = slices.Clone(r.got[u])
	}
	return out
}

// TestStreamConsumerLostBeforeLead: a node starts (its endpoint's
// consumer created or found), and before it first delivers, the consumer
// is lost — with the stream, which NATS lost and the bus created again
// holding the changes made since, or alone (an operator deleted it) —
// and changes are made. The node creates the consumer again from where
// it stood: every change of the new stream, or every change after those
// the consumer had acknowledged; not only what comes once it delivers,
// nor everything the stream ever held.
func TestStreamConsumerLostBeforeLead(t *testing.T) {
	for _, withStream := range []bool{true, false} {
		name := "consumer alone"
		if withStream {
			name = "with the stream"
		}
		t.Run(name, func(t *testing.T) {
			e := newStreamEnv(t, testsvc.SharedNATS(t))
			r := newReceiver(t)
			users := names(3)
			e.publish(users, 1, 5) // before the node: not its endpoint's
			cfg, conn := e.config("a", Config{URLs: []string{"http://" + r.addr + "/hook"}, MaxBatch: 8, Linger: 5 * time.Millisecond,
				MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
			cfg.Secret = secret
			s, err := New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if withStream {
				err = conn.JS.DeleteStream(ctx, e.stream)
			} else {
				err = conn.JS.DeleteConsumer(ctx, e.stream, ConsumerPrefix+endpointKey(cfg.URLs[0]))
			}
			if err != nil {
				t.Fatal(err)
			}
			e.publish(users, 6, 10)
			rctx, stop := context.WithCancel(context.Background())
			a := &running{Sender: s, cancel: stop, done: make(chan struct{})}
			go func() { s.Run(rctx); close(a.done) }()
			defer a.stop()
			testwait.For(t, "every change since the loss", func() bool {
				for _, vs := range r.versionsOf(users) {
					if !slices.Contains(vs, 10) {
						return false
					}
				}
				return true
			})
			a.stop()
			for u, vs := range r.versionsOf(users) {
				got := slices.Compact(slices.Sorted(slices.Values(vs)))
				if fmt.Sprint(got) != "[6 7 8 9 10]" {
					t.Errorf("%s got versions %v, want 6 to 10", u, vs)
				}
			}
		})
	}
}

// TestStreamConsumerLostBehind: the endpoint's consumer is deleted while
// the endpoint is behind — it failed while the changes were made, took
// one batch more than a second later, and fails the next — so the
// changes it has not had are much older than the last time the consumer
// answered. Created again from the first change it had not acknowledged,
// it loses none of them (created again from a moment shortly before it
// last answered, it skipped them).
func TestStreamConsumerLostBehind(t *testing.T) {
	e := newStreamEnv(t, testsvc.SharedNATS(t))
	r := newReceiver(t)
	r.mode.Store(modeFail)
	cfg := Config{URLs: []string{"http://" + r.addr + "/hook"}, MaxBatch: 4, Linger: 5 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	a, conn := e.node("a", cfg)
	users := names(4)
	made := time.Now()
	e.publish(users, 1, 5) // 5 batches of 4: each version of every user
	testwait.For(t, "the first batch in hand", func() bool { return a.endpoints[0].held.Load() > 0 })
	// The scenario: the next batch is taken more than a second after
	// the changes were made (the wait is for the start from a moment;
	// from a sequence, nothing depends on it).
	time.Sleep(time.Until(made.Add(1500 * time.Millisecond)))
	fails := r.fails.Load()
	r.mode.Store(modeOnce)
	testwait.For(t, "the next batch refused", func() bool { return r.count() > 0 && r.fails.Load() > fails })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.JS.DeleteConsumer(ctx, e.stream, ConsumerPrefix+endpointKey(cfg.URLs[0])); err != nil {
		t.Fatal(err)
	}
	r.mode.Store(modeOK)
	testwait.For(t, "every change", func() bool {
		for _, vs := range r.versionsOf(users) {
			if !slices.Contains(vs, 5) {
				return false
			}
		}
		return true
	})
	a.stop()
	r.checkAll(t, users, 5)
}

// TestStreamConfirmWhileTheStreamIsMissing: while the change stream is
// missing and cannot be created again (a stream of another service holds
// one of its subjects), Confirm does not hold callers up, however long
// ConfirmTimeout: it reports false and counts each change unconfirmed,
// as while the outbox refuses writes; once the stream is back, Confirm
// waits for it again.
func TestStreamConfirmWhileTheStreamIsMissing(t *testing.T) {
	e := newStreamEnv(t, testsvc.SharedNATS(t))
	r := newReceiver(t)
	s, conn := e.node("a", Config{URLs: []string{"http://" + r.addr + "/hook"}, ConfirmTimeout: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.JS.DeleteStream(ctx, e.stream); err != nil {
		t.Fatal(err)
	}
	blocker := e.stream + "_OTHER"
	if _, err := conn.JS.CreateStream(ctx, jetstream.StreamConfig{Name: blocker, Subjects: []string{e.subject + ".x"}}); err != nil {
		t.Fatal(err)
	}
	e.bus.Publish(event("ann", 1))
	testwait.For(t, "the stream found missing", func() bool { return e.bus.Stream().Missing })
	confirmed := make(chan bool, 1)
	go func() {
		for v := uint64(2); v <= 10; v++ {
			e.bus.Publish(event("ann", v))
			if s.Confirm(context.Background()) {
				confirmed <- true
				return
			}
		}
		confirmed <- false
	}()
	select {
	case ok := <-confirmed:
		if ok {
			t.Fatal("Confirm: true while the stream is missing")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Confirm waits while the stream is missing")
	}
	if st := s.Stats(); st.Unconfirmed != 9 {
		t.Errorf("stats %+v: want 9 unconfirmed", st)
	}
	if err := conn.JS.DeleteStream(ctx, blocker); err != nil {
		t.Fatal(err)
	}
	e.bus.Publish(event("ann", 11))
	testwait.For(t, "Confirm true again", func() bool { return s.Confirm(context.Background()) })
}

package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

const ttl = time.Minute

var epoch = time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)

// world is one deployment under test: a real tracker over a memory store
// on a fake clock, a NATS server, names of its own, and a publisher.
type world struct {
	t       *testing.T
	ctx     context.Context
	clk     *clock.Fake
	store   *memstore.Store
	tr      *tracker.Tracker
	srv     *testsvc.Server
	cfg     ingest.Config
	pub     jetstream.JetStream
	pubConn *nats.Conn
	n       int // message ids
}

func newWorld(t *testing.T, srv *testsvc.Server, rules presence.Rules) *world {
	t.Helper()
	if rules.TTL == 0 {
		rules.TTL = ttl
	}
	if rules.IdleAfter == 0 {
		rules.IdleAfter = 5 * time.Minute
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	clk := clock.NewFake(epoch)
	store := memstore.New(memstore.Config{Rules: rules})
	tr, err := tracker.New(tracker.Config{Store: store, Durable: benchfix.Nop{}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	name := testsvc.Unique(t)
	w := &world{t: t, ctx: ctx, clk: clk, store: store, tr: tr, srv: srv}
	w.cfg = ingest.Config{
		URL:        srv.URL,
		Stream:     strings.ToUpper(name),
		Subject:    name + ".ingest",
		Durable:    name,
		Tracker:    tr,
		Clock:      clk,
		TTL:        ttl,
		AckWait:    5 * time.Second,
		RetryDelay: 50 * time.Millisecond,
		FetchWait:  time.Second,
		Logger:     slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	nc, err := nats.Connect(srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w.pubConn = nc
	if w.pub, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return w
}

// open opens a consumer with the world's config changed by edit and runs
// it until the test ends. It returns the consumer and Run's result.
func (w *world) open(tr ingest.Tracker, edit func(*ingest.Config)) (*ingest.Consumer, <-chan error) {
	w.t.Helper()
	cfg := w.cfg
	if tr != nil {
		cfg.Tracker = tr
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := ingest.Open(w.ctx, cfg)
	if err != nil {
		w.t.Fatalf("Open: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(w.ctx) }()
	w.t.Cleanup(func() {
		c.Close()
		if err := <-done; err != nil && !errors.Is(err, ingest.ErrClosed) {
			w.t.Errorf("Run: %v", err)
		}
	})
	return c, done
}

// event renders one message.
func event(typ, user, device string, at time.Time, active *bool) []byte {
	s := fmt.Sprintf(`{"type":%q,"user_id":%q,"device_id":%q,"at":%q`, typ, user, device, at.UTC().Format(wire.TimeLayout))
	if active != nil {
		s += fmt.Sprintf(`,"active":%v`, *active)
	}
	return []byte(s + "}")
}

// publish publishes data with a fresh Nats-Msg-Id and returns the id.
func (w *world) publish(data []byte) string {
	w.t.Helper()
	w.n++
	id := fmt.Sprintf("m%d", w.n)
	w.publishID(id, data)
	return id
}

// publishID publishes data with the given Nats-Msg-Id, retrying while the
// server is away, and reports whether the stream took it as a duplicate.
func (w *world) publishID(id string, data []byte) bool {
	w.t.Helper()
	var dup bool
	testwait.NoErr(w.t, "publish "+id, func() error {
		ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
		defer cancel()
		ack, err := w.pub.Publish(ctx, w.cfg.Subject+".gw1", data, jetstream.WithMsgID(id))
		if err == nil {
			dup = ack.Duplicate
		}
		return err
	})
	return dup
}

// status returns the status and alive devices of user now.
func (w *world) status(user string) (presence.Status, int) {
	w.t.Helper()
	out := make([]presence.Snapshot, 1)
	if err := w.store.Get(w.ctx, w.clk.Now().UnixMilli(), []string{user}, out); err != nil {
		w.t.Fatal(err)
	}
	return out[0].Status, out[0].Devices
}

// settled waits until the durable consumer has nothing pending or
// unacknowledged: every message published so far has ended.
func (w *world) settled() {
	w.t.Helper()
	testwait.For(w.t, "the consumer to settle", func() bool {
		ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
		defer cancel()
		c, err := w.pub.Consumer(ctx, w.cfg.Stream, w.cfg.Durable)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

func ptr(b bool) *bool { return &b }

func TestConnectedThenDisconnected(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, _ := w.open(nil, nil)

	w.publish(event("session_connected", "42", "tab-1", w.clk.Now(), nil))
	testwait.For(t, "user online", func() bool { s, _ := w.status("42"); return s == presence.Online })

	w.clk.Advance(time.Second)
	w.publish(event("session_disconnected", "42", "tab-1", w.clk.Now(), nil))
	testwait.For(t, "user offline", func() bool { s, n := w.status("42"); return s == presence.Offline && n == 0 })

	// The consumer counts an event just after the tracker applied it: the
	// status can be read a moment before the count moves.
	testwait.For(t, "both events counted", func() bool { return c.Stats().Applied >= 2 })
	if st := c.Stats(); st.Applied != 2 || st.Invalid+st.Stale+st.Ignored+st.Retried != 0 {
		t.Errorf("Stats = %+v, want 2 applied and nothing else", st)
	}
}

func TestBackgroundHeartbeatKeepsOnlineWithoutActivity(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, _ := w.open(nil, nil)

	connectedAt := w.clk.Now().UnixMilli()
	w.publish(event("session_connected", "7", "phone", w.clk.Now(), nil))
	testwait.For(t, "connect applied", func() bool { return c.Stats().Applied == 1 })

	w.clk.Advance(40 * time.Second)
	w.publish(event("heartbeat", "7", "phone", w.clk.Now(), ptr(false)))
	testwait.For(t, "heartbeat applied", func() bool { return c.Stats().Applied == 2 })

	// Past the first beat's ttl, the background beat keeps the device.
	w.clk.Advance(30 * time.Second)
	if s, n := w.status("7"); s != presence.Online || n != 1 {
		t.Fatalf("after a background beat: status %v with %d devices, want online with 1", s, n)
	}
	u, _, ok, err := w.tr.Debug(w.ctx, "7")
	if err != nil || !ok || len(u.Devices) != 1 {
		t.Fatalf("Debug = %+v, %v, %v", u, ok, err)
	}
	d := u.Devices[0]
	if d.LastActive != connectedAt || d.LastBeat != connectedAt+(40*time.Second).Milliseconds() {
		t.Errorf("device %+v: want LastActive %d (the connect) and LastBeat 40s later", d, connectedAt)
	}
}

// countingTracker counts the calls per user and passes them on.
type countingTracker struct {
	next ingest.Tracker
	mu   sync.Mutex // guards calls
	// calls counts the calls per user.
	calls map[string]int
}

func newCounting(next ingest.Tracker) *countingTracker {
	return &countingTracker{next: next, calls: map[string]int{}}
}

func (c *countingTracker) count(user string) {
	c.mu.Lock()
	c.calls[user]++
	c.mu.Unlock()
}

func (c *countingTracker) get(user string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[user]
}

func (c *countingTracker) Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	c.count(user)
	return c.next.Heartbeat(ctx, user, device, active)
}

func (c *countingTracker) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	c.count(user)
	return c.next.Bye(ctx, user, device)
}

func TestTwoNodesApplyEachMessageOnce(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	ct := newCounting(w.tr)
	small := func(cfg *ingest.Config) { cfg.Batch = 8 }
	a, _ := w.open(ct, small)
	b, _ := w.open(ct, small)

	const n = 200
	for i := range n {
		w.publish(event("session_connected", fmt.Sprint("u", i), "d", w.clk.Now(), nil))
	}
	testwait.For(t, "all applied", func() bool { return a.Stats().Applied+b.Stats().Applied >= n })
	w.settled()
	for i := range n {
		if got := ct.get(fmt.Sprint("u", i)); got != 1 {
			t.Errorf("user u%d: applied %d times, want once", i, got)
		}
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.Applied+sb.Applied != n {
		t.Errorf("applied %d + %d, want %d", sa.Applied, sb.Applied, n)
	}
	t.Logf("node a applied %d, node b %d", sa.Applied, sb.Applied)
}

func TestWorkersKeepTheOrderOfADevice(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, _ := w.open(nil, func(cfg *ingest.Config) { cfg.Workers = 4 })
	const n = 100
	for i := range n {
		at := w.clk.Now()
		w.publish(event("session_connected", fmt.Sprint("o", i), "d", at, nil))
		w.publish(event("heartbeat", fmt.Sprint("o", i), "d", at.Add(time.Millisecond), nil))
		w.publish(event("session_disconnected", fmt.Sprint("o", i), "d", at.Add(2*time.Millisecond), nil))
	}
	testwait.For(t, "all applied", func() bool { return c.Stats().Applied == 3*n })
	for i := range n {
		if s, _ := w.status(fmt.Sprint("o", i)); s != presence.Offline {
			t.Errorf("user o%d: status %v after connect, heartbeat, disconnect; want offline", i, s)
		}
	}
}

func TestDuplicatePublishAppliedOnce(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	ct := newCounting(w.tr)
	c, _ := w.open(ct, nil)

	msg := event("session_connected", "dup", "d", w.clk.Now(), nil)
	if w.publishID("same-id", msg) {
		t.Fatal("first publish reported as a duplicate")
	}
	if !w.publishID("same-id", msg) {
		t.Error("second publish with the same Nats-Msg-Id not reported as a duplicate")
	}
	w.publish(event("session_connected", "marker", "d", w.clk.Now(), nil))
	testwait.For(t, "marker applied", func() bool { return ct.get("marker") == 1 })
	w.settled()
	if got := ct.get("dup"); got != 1 {
		t.Errorf("duplicate publish applied %d times, want once", got)
	}
	if st := c.Stats(); st.Applied != 2 {
		t.Errorf("Stats = %+v, want 2 applied", st)
	}
}

// failingTracker fails the first fails calls with a transient error (or
// with err, when set), then passes them on.
type failingTracker struct {
	next  ingest.Tracker
	err   error
	mu    sync.Mutex // guards fails
	fails int        // calls still to fail; negative: all
}

var errStoreDown = errors.New("store: connection refused")

func (f *failingTracker) fail() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails == 0 {
		return nil
	}
	if f.fails > 0 {
		f.fails--
	}
	if f.err != nil {
		return f.err
	}
	return errStoreDown
}

func (f *failingTracker) Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	if err := f.fail(); err != nil {
		return presence.Change{}, fmt.Errorf("heartbeat: %w", err)
	}
	return f.next.Heartbeat(ctx, user, device, active)
}

func (f *failingTracker) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	if err := f.fail(); err != nil {
		return presence.Change{}, fmt.Errorf("bye: %w", err)
	}
	return f.next.Bye(ctx, user, device)
}

func TestFailureDefersTheRestOfTheBatch(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	ft := &failingTracker{next: w.tr, fails: 1}
	c, err := ingest.Open(w.ctx, w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Close()
	// Five messages in one batch; the first fails: the four others are
	// handed back untried, and all five are applied later.
	for i := range 5 {
		w.publish(event("session_connected", fmt.Sprint("b", i), "d", w.clk.Now(), nil))
	}
	c, _ = w.open(ft, func(cfg *ingest.Config) { cfg.RetryDelay, cfg.Workers = time.Second, 1 })
	testwait.For(t, "all applied", func() bool { return c.Stats().Applied == 5 })
	w.settled()
	if st := c.Stats(); st.Retried != 5 || st.GivenUp != 0 {
		t.Errorf("Stats = %+v, want 5 retried (1 failed, 4 deferred), 5 applied", st)
	}
}

func TestFailedApplyIsRedelivered(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, _ := w.open(&failingTracker{next: w.tr, fails: 1}, nil)

	w.publish(event("session_connected", "retry", "d", w.clk.Now(), nil))
	testwait.For(t, "user online after a redelivery", func() bool { s, _ := w.status("retry"); return s == presence.Online })
	w.settled()
	if st := c.Stats(); st.Retried != 1 || st.Applied != 1 || st.GivenUp != 0 {
		t.Errorf("Stats = %+v, want 1 retried then 1 applied", st)
	}
}

func TestGivenUpAfterMaxDeliver(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, _ := w.open(&failingTracker{next: w.tr, fails: -1}, func(cfg *ingest.Config) { cfg.MaxDeliver = 3 })

	w.publish(event("session_connected", "never", "d", w.clk.Now(), nil))
	testwait.For(t, "given up", func() bool { return c.Stats().GivenUp == 1 })
	w.settled()
	if st := c.Stats(); st.Retried != 2 || st.Applied != 0 {
		t.Errorf("Stats = %+v, want 2 retried and 1 given up", st)
	}
	if s, _ := w.status("never"); s != presence.Offline {
		t.Errorf("status %v, want offline", s)
	}
}

func TestClientErrorTerminates(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{MaxDevices: 1})
	c, _ := w.open(nil, nil)

	w.publish(event("session_connected", "u", "one", w.clk.Now(), nil))
	w.publish(event("session_connected", "u", "two", w.clk.Now(), nil))
	testwait.For(t, "refused", func() bool { return c.Stats().Refused == 1 })
	w.settled()
	if st := c.Stats(); st.Applied != 1 || st.Retried != 0 {
		t.Errorf("Stats = %+v, want 1 applied, 1 refused, no retry", st)
	}
	if _, n := w.status("u"); n != 1 {
		t.Errorf("%d devices alive, want 1", n)
	}
}

func TestStaleHeartbeatSkipped(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, _ := w.open(nil, nil)

	w.publish(event("heartbeat", "old", "d", w.clk.Now().Add(-ttl-time.Second), nil))
	w.publish(event("session_connected", "old2", "d", w.clk.Now().Add(-2*ttl), nil))
	testwait.For(t, "stale skipped", func() bool { return c.Stats().Stale == 2 })
	w.settled()
	for _, u := range []string{"old", "old2"} {
		if s, _ := w.status(u); s != presence.Offline {
			t.Errorf("user %s: status %v, want offline", u, s)
		}
	}
	if st := c.Stats(); st.Applied != 0 {
		t.Errorf("Stats = %+v, want nothing applied", st)
	}
}

func TestConnectAfterDisconnectDoesNotResurrect(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, _ := w.open(nil, nil)

	connected := event("session_connected", "z", "d", w.clk.Now(), nil)
	w.publish(connected)
	w.clk.Advance(time.Second)
	w.publish(event("session_disconnected", "z", "d", w.clk.Now(), nil))
	testwait.For(t, "offline", func() bool { return c.Stats().Applied == 2 })
	if s, _ := w.status("z"); s != presence.Offline {
		t.Fatalf("status %v after the disconnect, want offline", s)
	}

	// The same connect again, as a redelivery or a republish would bring
	// it (a new message id, so the stream does not drop it).
	w.clk.Advance(time.Second)
	w.publish(connected)
	testwait.For(t, "ignored", func() bool { return c.Stats().Ignored == 1 })
	if s, _ := w.status("z"); s != presence.Offline {
		t.Errorf("status %v after the old connect came again, want offline", s)
	}

	// A real reconnect, later, is applied; the old disconnect coming again
	// then does not end it.
	w.publish(event("session_connected", "z", "d", w.clk.Now(), nil))
	testwait.For(t, "reconnect applied", func() bool { return c.Stats().Applied == 3 })
	w.publish(event("session_disconnected", "z", "d", w.clk.Now().Add(-time.Second), nil))
	testwait.For(t, "old disconnect ignored", func() bool { return c.Stats().Ignored == 2 })
	if s, _ := w.status("z"); s != presence.Online {
		t.Errorf("status %v after the reconnect and an old disconnect, want online", s)
	}
}

func TestRedeliveredConnectAfterDisconnectIgnored(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, err := ingest.Open(w.ctx, w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Another node takes the connect, and hands it back (its tracker call
	// failed) only after the disconnect was applied here.
	w.publish(event("session_connected", "r", "d", w.clk.Now(), nil))
	raw, err := w.pub.Consumer(w.ctx, w.cfg.Stream, w.cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := raw.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	for m := range batch.Messages() {
		held = append(held, m)
	}
	if len(held) != 1 {
		t.Fatalf("the other node fetched %d messages, want 1 (%v)", len(held), batch.Error())
	}

	done := make(chan error, 1)
	go func() { done <- c.Run(w.ctx) }()
	w.publish(event("session_disconnected", "r", "d", w.clk.Now().Add(time.Second), nil))
	testwait.For(t, "the disconnect", func() bool { return c.Stats().Applied == 1 })
	if err := held[0].Nak(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the redelivered connect", func() bool { return c.Stats().Ignored == 1 })
	w.settled()
	if s, n := w.status("r"); s != presence.Offline || n != 0 {
		t.Errorf("status %v with %d devices, want offline", s, n)
	}
	if st := c.Stats(); st.Applied != 1 {
		t.Errorf("Stats = %+v, want 1 applied (the disconnect), 1 ignored", st)
	}
	c.Close()
	<-done
}

func TestUnackedMessageRedeliveredToAnotherNode(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	w.cfg.AckWait = time.Second
	b, err := ingest.Open(w.ctx, w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	// Another node takes the message and dies before its ack.
	w.publish(event("session_connected", "orphan", "d", w.clk.Now(), nil))
	raw, err := w.pub.Consumer(w.ctx, w.cfg.Stream, w.cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := raw.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for range batch.Messages() {
		got++
	}
	if got != 1 {
		t.Fatalf("the dying node fetched %d messages, want 1 (%v)", got, batch.Error())
	}

	done := make(chan error, 1)
	go func() { done <- b.Run(w.ctx) }()
	testwait.For(t, "applied by the surviving node", func() bool { s, _ := w.status("orphan"); return s == presence.Online })
	w.settled()
	if st := b.Stats(); st.Applied != 1 {
		t.Errorf("Stats = %+v, want 1 applied", st)
	}
	b.Close()
	if err := <-done; !errors.Is(err, ingest.ErrClosed) {
		t.Errorf("Run = %v, want ErrClosed", err)
	}
}

func TestInvalidMessagesTerminated(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, _ := w.open(nil, nil)

	now := w.clk.Now()
	at := now.Format(wire.TimeLayout)
	bad := []string{
		`not json`,
		`[]`,
		`{"type":"heartbeat","user_id":"a b","device_id":"d","at":"` + at + `"}`,
		`{"type":"heartbeat","user_id":"u","device_id":"","at":"` + at + `"}`,
		`{"type":"heartbeat","user_id":"u,v","device_id":"d","at":"` + at + `"}`,
		`{"type":"heartbeat","user_id":"cafe\u0301","device_id":"d","at":"` + at + `"}`, // not NFC
		`{"type":"heartbeat","user_id":"u","device_id":"\u212a","at":"` + at + `"}`,     // Kelvin sign: K in NFC
		`{"type":"reboot","user_id":"u","device_id":"d","at":"` + at + `"}`,
		`{"user_id":"u","device_id":"d","at":"` + at + `"}`,
		`{"type":"heartbeat","user_id":"u","device_id":"d"}`,
		`{"type":"heartbeat","user_id":"u","device_id":"d","at":"yesterday"}`,
		`{"type":"heartbeat","user_id":"u","device_id":"d","at":"` + now.Add(time.Minute).Format(wire.TimeLayout) + `"}`,
		`{"type":"heartbeat","user_id":"u","device_id":"d","at":"` + at + `","pad":"` + strings.Repeat("x", ingest.MaxMessageSize) + `"}`,
	}
	for _, b := range bad {
		w.publish([]byte(b))
	}
	w.publish(event("heartbeat", "good", "d", now, nil))
	testwait.For(t, "the valid message after the invalid ones", func() bool { s, _ := w.status("good"); return s == presence.Online })
	w.settled()
	st := c.Stats()
	if st.Invalid != uint64(len(bad)) || st.Applied != 1 || st.Retried != 0 {
		t.Errorf("Stats = %+v, want %d invalid and 1 applied", st, len(bad))
	}
	if s, _ := w.status("u"); s != presence.Offline {
		t.Errorf("user u: status %v, want offline", s)
	}
}

func TestResumesAfterNATSRestart(t *testing.T) {
	srv := testsvc.NATS(t)
	w := newWorld(t, srv, presence.Rules{})
	c, _ := w.open(nil, nil)

	w.publish(event("session_connected", "before", "d", w.clk.Now(), nil))
	testwait.For(t, "applied before the restart", func() bool { return c.Stats().Applied == 1 })

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	w.publish(event("session_connected", "after", "d", w.clk.Now(), nil))
	testwait.For(t, "applied after the restart", func() bool { s, _ := w.status("after"); return s == presence.Online })
	w.settled() // counted before its acknowledgement
	if st := c.Stats(); st.Applied != 2 {
		t.Errorf("Stats = %+v, want 2 applied", st)
	}
}

func TestRecreatesStreamLostWithTheServer(t *testing.T) {
	srv := testsvc.NATS(t)
	w := newWorld(t, srv, presence.Rules{})
	c, _ := w.open(nil, nil)
	w.publish(event("session_connected", "before", "d", w.clk.Now(), nil))
	testwait.For(t, "applied before the restart", func() bool { return c.Stats().Applied == 1 })

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(srv.Dir, "jetstream")); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The publish fails (no stream) until the consumer created it again.
	w.publish(event("session_connected", "after", "d", w.clk.Now(), nil))
	testwait.For(t, "applied after the stream came back", func() bool { s, _ := w.status("after"); return s == presence.Online })
}

func TestCloseStopsRun(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	c, err := ingest.Open(w.ctx, w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(w.ctx) }()
	w.publish(event("session_connected", "x", "d", w.clk.Now(), nil))
	testwait.For(t, "applied", func() bool { return c.Stats().Applied == 1 })
	if err := c.Run(w.ctx); err == nil || errors.Is(err, ingest.ErrClosed) {
		t.Errorf("a second Run while one runs = %v, want an error", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ingest.ErrClosed) {
			t.Errorf("Run = %v, want ErrClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if err := c.Run(context.Background()); !errors.Is(err, ingest.ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
}

func TestOpenManyAtOnce(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			c, err := ingest.Open(w.ctx, w.cfg)
			if err != nil {
				errs <- err
				return
			}
			c.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Open: %v", err)
	}
}

func TestOpenValidates(t *testing.T) {
	for _, cfg := range []ingest.Config{
		{Tracker: &countingTracker{}, TTL: ttl},
		{URL: "nats://127.0.0.1:1", TTL: ttl},
		{URL: "nats://127.0.0.1:1", Tracker: &countingTracker{}},
	} {
		if _, err := ingest.Open(context.Background(), cfg); err == nil {
			t.Errorf("Open(%+v) succeeded", cfg)
		}
	}
}

// An unreachable server is a clear error that does not print the
// credentials of the URL.
func TestOpenErrorHidesCredentials(t *testing.T) {
	_, err := ingest.Open(context.Background(), ingest.Config{
		URL: "nats://svc:s3cret@127.0.0.1:1,nats://tok3n@127.0.0.1:2", Tracker: &countingTracker{}, TTL: ttl})
	if err == nil {
		t.Fatal("Open with NATS unreachable succeeded")
	}
	if msg := err.Error(); strings.Contains(msg, "s3cret") || strings.Contains(msg, "tok3n") || !strings.Contains(msg, "127.0.0.1:1") {
		t.Errorf("error %q: want the servers without their credentials", msg)
	}
}

// connectingTracker records which of its methods the consumer called.
type connectingTracker struct {
	ingest.Tracker
	mu    sync.Mutex
	calls []string
}

func (c *connectingTracker) note(s string) {
	c.mu.Lock()
	c.calls = append(c.calls, s)
	c.mu.Unlock()
}

func (c *connectingTracker) Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	c.note("beat")
	return c.Tracker.Heartbeat(ctx, user, device, active)
}

func (c *connectingTracker) Connect(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	c.note("connect")
	return c.Tracker.Heartbeat(ctx, user, device, active)
}

// A session_connected goes to a tracker's Connect when it has one (a
// node that owns the ingest's devices claims the device again), a
// heartbeat to Heartbeat.
func TestConnectGoesToAConnector(t *testing.T) {
	w := newWorld(t, testsvc.SharedNATS(t), presence.Rules{})
	tr := &connectingTracker{Tracker: w.tr}
	c, _ := w.open(tr, nil)
	w.publish(event("session_connected", "42", "tab-1", w.clk.Now(), nil))
	testwait.For(t, "the connect applied", func() bool { return c.Stats().Applied == 1 })
	w.publish(event("heartbeat", "42", "tab-1", w.clk.Now(), nil))
	testwait.For(t, "the beat applied", func() bool { return c.Stats().Applied == 2 })
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if got := strings.Join(tr.calls, ","); got != "connect,beat" {
		t.Errorf("calls %s, want connect,beat", got)
	}
}

package webhook

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/webhooksig"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

var secret = []byte("webhook-test-secret-0123456789abcdef")

// receiver is a real HTTP endpoint that can fail (500), stall (answer
// after the sender's timeout) or be gone (its port closed), and records
// every event of every request it answered 200, checking the signature.
type receiver struct {
	t     *testing.T
	addr  string
	mode  atomic.Int32 // modeOK, modeFail, modeStall, modeSlow, modeOnce
	fails atomic.Int64 // requests answered 500 (modeFail)

	mu       sync.Mutex
	srv      *http.Server
	got      map[string][]uint64 // user → versions in the order received
	rooms    map[string][]string // room → "<event> <user> <version>" in the order received
	requests int
	badSig   int
}

const (
	modeOK int32 = iota
	modeFail
	modeStall
	modeSlow // records, then answers 200 after 300 ms
	modeOnce // answers one request as modeOK, then turns to modeFail
)

func newReceiver(t *testing.T) *receiver {
	r := &receiver{t: t, got: map[string][]uint64{}, rooms: map[string][]string{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(func() { r.down() })
	return r
}

func (r *receiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(r.handle)}
	r.mu.Lock()
	r.srv = srv
	r.mu.Unlock()
	go srv.Serve(ln)
}

// down closes the port: connections are refused.
func (r *receiver) down() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// up listens on the same port again, once it is free.
func (r *receiver) up() {
	r.t.Helper()
	var ln net.Listener
	testwait.NoErr(r.t, "listen on "+r.addr+" again", func() (err error) {
		ln, err = net.Listen("tcp", r.addr)
		return err
	})
	r.serve(ln)
}

func (r *receiver) handle(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	switch r.mode.Load() {
	case modeFail:
		r.fails.Add(1)
		http.Error(w, "down for maintenance", http.StatusInternalServerError)
		return
	case modeOnce:
		if !r.mode.CompareAndSwap(modeOnce, modeFail) {
			r.fails.Add(1)
			http.Error(w, "down for maintenance", http.StatusInternalServerError)
			return
		}
	case modeStall:
		time.Sleep(300 * time.Millisecond) // the scenario: a stall past the sender's timeout
		w.WriteHeader(http.StatusOK)
		return
	}
	if r.mode.Load() == modeSlow {
		defer time.Sleep(300 * time.Millisecond) // the scenario: a slow answer
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if err := webhooksig.Verify(secret, req.Header, body, time.Now(), time.Minute); err != nil {
		r.badSig++
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var b struct {
		Events []struct {
			UserID  string `json:"user_id"`
			Status  string `json:"status"`
			Version uint64 `json:"version"`
		} `json:"events"`
		RoomEvents []struct {
			Room    string `json:"room"`
			UserID  string `json:"user_id"`
			Event   string `json:"event"`
			Version uint64 `json:"version"`
		} `json:"room_events"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		r.t.Errorf("body is not the documented JSON: %v: %s", err, body)
		return
	}
	for _, ev := range b.Events {
		if ev.Status == "" {
			r.t.Errorf("an entry of events is no change: %s", body)
		}
		r.got[ev.UserID] = append(r.got[ev.UserID], ev.Version)
	}
	for _, ev := range b.RoomEvents {
		r.rooms[ev.Room] = append(r.rooms[ev.Room], fmt.Sprintf("%s %s %d", ev.Event, ev.UserID, ev.Version))
	}
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, vs := range r.got {
		n += len(vs)
	}
	return n
}

// openDB opens a SQLite store at path as an outbox, closed when the
// test ends.
func openDB(t testing.TB, path string) *sqlitestore.Store {
	t.Helper()
	db, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// running is a Sender run until stop (or the end of the test).
type running struct {
	*Sender
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *running) stop() {
	r.cancel()
	<-r.done
}

// run makes a Sender of cfg (its secret set) and runs it.
func run(t testing.TB, cfg Config) *running {
	t.Helper()
	cfg.Secret = secret
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Sender: s, cancel: cancel, done: make(chan struct{})}
	go func() { s.Run(ctx); close(r.done) }()
	t.Cleanup(r.stop)
	return r
}

// start runs a Sender of cfg on an outbox of its own.
func start(t testing.TB, cfg Config) *running {
	t.Helper()
	cfg.Outbox = openDB(t, filepath.Join(t.TempDir(), "presenced.db"))
	return run(t, cfg)
}

func event(user string, version uint64) *presence.Event {
	st := presence.Online
	if version%2 == 0 {
		st = presence.Offline
	}
	return &presence.Event{UserID: user, Status: st, Prev: presence.Offline, Version: version, At: 1}
}

// checkAll fails unless r got versions 1…perUser of each of users, each
// user's in rising order once repeats are left out (a retry or a batch
// delivered again repeats what came before; nothing comes out of order).
func (r *receiver) checkAll(t *testing.T, users []string, perUser uint64) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.badSig != 0 {
		t.Errorf("%d requests with a bad signature", r.badSig)
	}
	for _, u := range users {
		vs := r.got[u]
		seen := map[uint64]bool{}
		for _, v := range vs {
			seen[v] = true
		}
		for v := uint64(1); v <= perUser; v++ {
			if !seen[v] {
				t.Errorf("%s: version %d never arrived (got %v)", u, v, vs)
			}
		}
		last := uint64(0)
		for _, v := range vs {
			if v > last {
				if v != last+1 {
					t.Errorf("%s: %d after %d: a version skipped or out of order", u, v, last)
				}
				last = v
			}
		}
	}
}

func names(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("u%d", i))
	}
	return out
}

// TestDeliveryThroughFailures: while the endpoint answers 500, stalls past
// the timeout and is gone altogether, every event still arrives at least
// once, each user's in version order, every request signed.
func TestDeliveryThroughFailures(t *testing.T) {
	r := newReceiver(t)
	s := start(t, Config{URLs: []string{"http://" + r.addr + "/hook"}, MaxBatch: 16, Linger: 5 * time.Millisecond,
		Timeout: 150 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	users := names(10)
	const perUser = 40
	next := make([]uint64, len(users))
	publish := func(n int) {
		for range n {
			for u := range users {
				next[u]++
				s.Publish(event(users[u], next[u]))
			}
		}
	}
	publish(10)
	testwait.For(t, "the first events", func() bool { return r.count() >= 10*len(users) })
	r.mode.Store(modeFail)
	publish(10)
	testwait.For(t, "retries against a failing endpoint", func() bool { return s.Stats().Retried >= 3 })
	r.mode.Store(modeStall)
	publish(5)
	testwait.For(t, "retries against a stalled endpoint", func() bool { return s.Stats().Retried >= 6 })
	r.mode.Store(modeOK)
	r.down()
	publish(5)
	testwait.For(t, "retries against a closed port", func() bool { return s.Stats().Retried >= 9 })
	r.up()
	publish(10)
	testwait.For(t, "every event", func() bool {
		st := s.Stats()
		return st.Queued == 0 && st.Delivered == uint64(len(users)*perUser)
	})
	r.checkAll(t, users, perUser)
	if st := s.Stats(); st.Dropped != 0 || st.Rejected != 0 {
		t.Errorf("stats %+v: nothing should be dropped or rejected", st)
	}
}

// TestConfirmMeansInTheOutbox: once Confirm returned true, the change is
// in the outbox's file: a Sender started on it after the first stopped
// (the endpoint down all along) delivers it, and nothing twice that was
// delivered before.
func TestConfirmMeansInTheOutbox(t *testing.T) {
	path := filepath.Join(t.TempDir(), "presenced.db")
	r := newReceiver(t)
	cfg := Config{URLs: []string{"http://" + r.addr + "/hook"}, Linger: time.Millisecond,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, DrainTimeout: 100 * time.Millisecond}
	cfg.Outbox = openDB(t, path)
	s := run(t, cfg)
	s.Publish(event("ann", 1))
	if !s.Confirm(context.Background()) {
		t.Fatal("Confirm: false")
	}
	testwait.For(t, "the first change", func() bool { return r.count() == 1 })
	testwait.For(t, "the cursor recorded", func() bool {
		_, cur, err := cfg.Outbox.OutboxState(context.Background())
		return err == nil && cur[endpointKey(cfg.URLs[0])] == 1
	})
	r.down()
	for v := uint64(2); v <= 5; v++ {
		s.Publish(event("ann", v))
	}
	if !s.Confirm(context.Background()) {
		t.Fatal("Confirm: false")
	}
	if st := s.Stats(); st.Unconfirmed != 0 {
		t.Errorf("stats %+v: nothing unconfirmed", st)
	}
	s.stop()
	cfg.Outbox.(*sqlitestore.Store).Close()

	r.up()
	cfg.Outbox = openDB(t, path)
	s = run(t, cfg)
	testwait.For(t, "the changes left in the outbox", func() bool { return r.count() >= 5 })
	s.stop()
	r.mu.Lock()
	got := fmt.Sprint(r.got["ann"])
	r.mu.Unlock()
	if got != "[1 2 3 4 5]" {
		t.Errorf("ann's versions %s, want [1 2 3 4 5]", got)
	}
}

// TestBoundedOutbox: an endpoint that never answers keeps at most QueueLen
// changes in the outbox; the oldest are dropped and counted.
func TestBoundedOutbox(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: refused
	s := start(t, Config{URLs: []string{"http://" + addr}, QueueLen: 10, MaxBatch: 5, Linger: time.Millisecond,
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	for i := range 1000 {
		s.Publish(event("u", uint64(i+1)))
		if i%100 == 99 && !s.Confirm(context.Background()) {
			t.Fatal("Confirm: false")
		}
	}
	testwait.For(t, "the oldest dropped", func() bool { st := s.Stats(); return st.Queued <= 10 && st.Dropped >= 990 })
}

// TestRejected: an endpoint that refuses a request for good (400) is not
// retried; the events are counted, and later ones still go.
func TestRejected(t *testing.T) {
	var calls, bad atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		calls.Add(1)
		if req.Header.Get(webhooksig.SignatureHeader) == "" {
			bad.Add(1)
		}
		if calls.Load() == 1 {
			http.Error(w, "no", http.StatusBadRequest)
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s := start(t, Config{URLs: []string{"http://" + ln.Addr().String()}, Linger: time.Millisecond})
	s.Publish(event("u", 1))
	testwait.For(t, "the refusal", func() bool { return s.Stats().Rejected == 1 })
	s.Publish(event("u", 2))
	testwait.For(t, "the next event", func() bool { return s.Stats().Delivered == 1 })
	if st := s.Stats(); st.Retried != 0 || calls.Load() != 2 || bad.Load() != 0 {
		t.Fatalf("stats %+v, %d calls: a refused request is not retried", st, calls.Load())
	}
}

// TestSettingsOnlyNotSent: a change of settings alone is not a transition.
func TestSettingsOnlyNotSent(t *testing.T) {
	s, err := New(context.Background(), Config{URLs: []string{"http://127.0.0.1:1"}, Secret: secret,
		Outbox: openDB(t, filepath.Join(t.TempDir(), "presenced.db"))})
	if err != nil {
		t.Fatal(err)
	}
	s.Publish(&presence.Event{UserID: "u", SettingsOnly: true, Version: 3})
	if st := s.Stats(); st.Queued != 0 {
		t.Fatalf("a settings-only change was queued: %+v", st)
	}
	// Nor is a change only the user sees: the text of an invisible user.
	s.Publish(&presence.Event{UserID: "u", Status: presence.Offline, Prev: presence.Offline, Text: "lunch",
		Self: presence.Invisible, SelfText: "gone fishing", SelfOnly: true, Version: 4})
	if st := s.Stats(); st.Queued != 0 {
		t.Fatalf("a change only the user sees was queued: %+v", st)
	}
}

// TestConfig: what New refuses.
func TestConfig(t *testing.T) {
	ob := openDB(t, filepath.Join(t.TempDir(), "presenced.db"))
	for name, cfg := range map[string]Config{
		"no URL":          {Secret: secret, Outbox: ob},
		"no secret":       {URLs: []string{"http://a"}, Outbox: ob},
		"no log":          {URLs: []string{"http://a"}, Secret: secret},
		"two logs":        {URLs: []string{"http://a"}, Secret: secret, Outbox: ob, Stream: &StreamConfig{}},
		"a URL twice":     {URLs: []string{"http://a", "http://a"}, Secret: secret, Outbox: ob},
		"a stream of air": {URLs: []string{"http://a"}, Secret: secret, Stream: &StreamConfig{}},
	} {
		if _, err := New(context.Background(), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// BenchmarkPublish is what a change costs the tracker that makes it, with
// one endpoint: a lock and a copy into the outbox's queue (nothing is
// written: Run is not running, and the queue is emptied as it fills).
func BenchmarkPublish(b *testing.B) {
	s, err := New(context.Background(), Config{URLs: []string{"http://127.0.0.1:1"}, Secret: secret, QueueLen: 1 << 20,
		Outbox: openDB(b, filepath.Join(b.TempDir(), "presenced.db"))})
	if err != nil {
		b.Fatal(err)
	}
	ev := event("user-123456", 1)
	ev.Text = "in a meeting"
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s.Publish(ev)
		if i%(1<<19) == 0 {
			s.ob.mu.Lock()
			s.ob.pending = s.ob.pending[:0]
			s.ob.mu.Unlock()
		}
	}
}

// BenchmarkDelivery is the throughput to a local receiver that accepts
// everything, through the SQLite outbox: events a second, batches of 256.
func BenchmarkDelivery(b *testing.B) {
	var n atomic.Int64
	all := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		k := int64(bytesCount(body, `"user_id"`))
		if now := n.Add(k); now >= int64(b.N) && now-k < int64(b.N) {
			close(all)
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	s := start(b, Config{URLs: []string{"http://" + ln.Addr().String()}, QueueLen: b.N + 1, Linger: time.Millisecond})
	b.ResetTimer()
	for i := range b.N {
		s.Publish(event(fmt.Sprintf("u%d", i%1000), uint64(i+1)))
	}
	<-all
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func bytesCount(b []byte, sub string) int {
	n := 0
	for i := 0; i+len(sub) <= len(b); i++ {
		if string(b[i:i+len(sub)]) == sub {
			n++
		}
	}
	return n
}

// TestConfirmWhileTheOutboxFails: while the outbox refuses writes (a
// trigger stands for a full disk), Confirm does not hold callers up: it
// reports false and counts the change unconfirmed; the writer retries,
// and once the outbox takes writes again the change is delivered.
func TestConfirmWhileTheOutboxFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "presenced.db")
	r := newReceiver(t)
	s := run(t, Config{URLs: []string{"http://" + r.addr + "/hook"}, Linger: time.Millisecond,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, ConfirmTimeout: time.Hour,
		Outbox: openDB(t, path)})
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TRIGGER full_disk BEFORE INSERT ON webhook_outbox BEGIN SELECT RAISE(ABORT, 'disk full'); END`); err != nil {
		t.Fatal(err)
	}
	s.Publish(event("ann", 1))
	confirmed := make(chan bool, 1)
	go func() { confirmed <- s.Confirm(context.Background()) }()
	select {
	case ok := <-confirmed:
		if ok {
			t.Fatal("Confirm: true while the outbox refuses writes")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Confirm waits while the outbox refuses writes")
	}
	if st := s.Stats(); st.Unconfirmed != 1 {
		t.Errorf("stats %+v: want 1 unconfirmed", st)
	}
	if _, err := db.Exec(`DROP TRIGGER full_disk`); err != nil {
		t.Fatal(err)
	}
	s.Publish(event("ann", 2))
	// The writer finds out at its next try.
	testwait.For(t, "Confirm true again", func() bool { return s.Confirm(context.Background()) })
	testwait.For(t, "both changes", func() bool { return r.count() == 2 })
}

// TestStopLetsTheRequestFinish: a node stopped while a request is under
// way lets it finish (within DrainTimeout), and records that the endpoint
// has it: the next run does not send it again.
func TestStopLetsTheRequestFinish(t *testing.T) {
	path := filepath.Join(t.TempDir(), "presenced.db")
	r := newReceiver(t)
	r.mode.Store(modeSlow)
	cfg := Config{URLs: []string{"http://" + r.addr + "/hook"}, Linger: time.Millisecond, DrainTimeout: 10 * time.Second,
		Outbox: openDB(t, path)}
	s := run(t, cfg)
	s.Publish(event("ann", 1))
	testwait.For(t, "the request under way", func() bool { return r.count() == 1 })
	s.stop() // while the endpoint takes 300 ms to answer
	cfg.Outbox.(*sqlitestore.Store).Close()

	r.mode.Store(modeOK)
	cfg.Outbox = openDB(t, path)
	s = run(t, cfg)
	s.Publish(event("ann", 2))
	testwait.For(t, "the next change", func() bool { return r.has("ann", 2) })
	s.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := fmt.Sprint(r.got["ann"]); got != "[1 2]" {
		t.Errorf("ann's versions %s, want [1 2]: the change under way at the stop was sent again", got)
	}
}

func (r *receiver) has(user string, version uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.got[user], version)
}

package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"github.com/presenced/presenced/internal/testwait"
)

// These tests exercise the client's own logic — backoff, jitter, the
// update queue, reconnects and version filtering — against a tiny fake
// server that speaks docs/protocol.md. Everything end to end runs against
// the real server in e2e_test.go.

func TestBackoff(t *testing.T) {
	lo, hi := 100*time.Millisecond, 5*time.Second
	for n := range 70 {
		d := hi
		if n < 6 { // 100ms·2⁵ = 3.2s < 5s ≤ 100ms·2⁶
			d = lo << n
		}
		for _, r := range []float64{0, 0.5, 0.999999} {
			got := backoff(n, lo, hi, r)
			if got < d/2 || got > d {
				t.Errorf("backoff(%d, r=%v) = %s, want within [%s, %s]", n, r, got, d/2, d)
			}
		}
	}
	if got := backoff(0, time.Hour, time.Hour, 0.999999); got > time.Hour {
		t.Errorf("backoff with lo = hi = 1h: %s", got)
	}
}

func TestJitter(t *testing.T) {
	d := 10 * time.Second
	for _, tc := range []struct {
		r      float64
		lo, hi time.Duration
	}{
		{0, 9 * time.Second, 9 * time.Second},
		{0.5, 10 * time.Second, 10 * time.Second},
		{0.999999, 10999 * time.Millisecond, 11 * time.Second},
	} {
		if got := jitter(d, tc.r); got < tc.lo || got > tc.hi {
			t.Errorf("jitter(%s, %v) = %s, want within [%s, %s]", d, tc.r, got, tc.lo, tc.hi)
		}
	}
}

func TestEndpoint(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:8080", "ws://127.0.0.1:8080/v1/ws"},
		{"https://example.com/", "wss://example.com/v1/ws"},
		{"https://example.com/presence", "wss://example.com/presence/v1/ws"},
		{"ws://h:1/v1/ws?x=1#f", "ws://h:1/v1/ws"},
		{"wss://h/p/v1/ws", "wss://h/p/v1/ws"},
	} {
		u, err := endpoint(tc.in)
		if err != nil || u.String() != tc.want {
			t.Errorf("endpoint(%q) = %v, %v; want %s", tc.in, u, err, tc.want)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:8080", "ftp://h", "http://", "http://h:x:y/%zz"} {
		if u, err := endpoint(bad); err == nil {
			t.Errorf("endpoint(%q) = %v, want an error", bad, u)
		}
	}
}

func TestQueueCoalescesPresencePerUser(t *testing.T) {
	q := newQueue()
	q.push(StateChange{State: Connected})
	q.push(Event{UserID: "a", Version: 1})
	q.push(Event{UserID: "b", Version: 1})
	q.push(Event{UserID: "a", Version: 2})
	q.push(&ServerError{Code: "x"})
	q.push(Event{UserID: "a", Version: 3})
	want := []Update{StateChange{State: Connected}, Event{UserID: "a", Version: 3}, Event{UserID: "b", Version: 1}, &ServerError{Code: "x"}}
	for i, w := range want {
		got, ok := q.pop()
		if !ok || fmt.Sprint(got) != fmt.Sprint(w) {
			t.Fatalf("pop %d = %v, %v; want %v", i, got, ok, w)
		}
	}
	if got, ok := q.pop(); ok {
		t.Fatalf("pop of an empty queue = %v", got)
	}
}

func TestQueueDropsOldestNotices(t *testing.T) {
	q := newQueue()
	q.push(Event{UserID: "a", Version: 1})
	for i := range maxNotices + 10 {
		q.push(&ServerError{Code: fmt.Sprint(i)})
	}
	if got, _ := q.pop(); got.(Event).UserID != "a" {
		t.Fatalf("first = %v, want the event of a (presence is never dropped)", got)
	}
	for i := 10; i < maxNotices+10; i++ {
		got, ok := q.pop()
		if !ok || got.(*ServerError).Code != fmt.Sprint(i) {
			t.Fatalf("notice = %v, %v; want code %d", got, ok, i)
		}
	}
	if got, ok := q.pop(); ok {
		t.Fatalf("left over: %v", got)
	}
}

func TestDecode(t *testing.T) {
	m, err := decode([]byte(`{"type":"snapshot","users":{"2":{"status":null,"last_seen":null,"status_text":null,"version":null},` +
		`"3":{"status":"busy","last_seen":"2026-11-22T23:08:49.123Z","status_text":"in a meeting","version":4294967301}}}`))
	if err != nil {
		t.Fatal(err)
	}
	hidden := m.Users["2"].event("2", true)
	if hidden != (Event{UserID: "2", Snapshot: true}) {
		t.Errorf("hidden user = %+v", hidden)
	}
	busy := m.Users["3"].event("3", true)
	if busy.Status != Busy || busy.StatusText == nil || *busy.StatusText != "in a meeting" || busy.Version != 4294967301 ||
		!busy.LastSeen.Equal(time.Date(2026, 11, 22, 23, 8, 49, 123e6, time.UTC)) {
		t.Errorf("busy user = %+v", busy)
	}
	for _, bad := range []string{``, `[]`, `{}`, `{"type":1}`, `{"type":"presence","version":-1}`} {
		if _, err := decode([]byte(bad)); err == nil {
			t.Errorf("decode(%s): no error", bad)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"type":"welcome","user_id":"42","device_id":"d-7f3a","heartbeat_interval_ms":7500,"ttl_ms":30000}`))
	f.Add([]byte(`{"type":"presence","user_id":"2","status":"away","last_seen":"2026-11-22T23:13:49.123Z","status_text":null,"version":4294967302}`))
	f.Add([]byte(`{"type":"error","code":"too_many_subscriptions","message":"…"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decode(data)
		if err != nil {
			return
		}
		for id, p := range m.Users {
			p.event(id, true)
		}
		m.wirePresence.event(m.UserID, false)
	})
}

// fake is a minimal server of docs/protocol.md for the client's own logic.
type fake struct {
	t        *testing.T
	srv      *httptest.Server
	interval time.Duration
	refuse   int  // answer upgrades with this status instead
	known    bool // the welcome says the server takes a subscribe's known versions

	mu    sync.Mutex
	conns []*fakeConn
	dials []string // device_id of each upgrade
	auths []string // Authorization of each upgrade
}

type fakeConn struct {
	nc   net.Conn
	wmu  sync.Mutex
	msgs chan map[string]any
}

func newFake(t *testing.T) *fake {
	f := &fake{t: t, interval: time.Hour}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		f.mu.Lock()
		for _, c := range f.conns {
			c.nc.Close()
		}
		f.mu.Unlock()
		f.srv.Close()
	})
	return f
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	refuse, interval, known := f.refuse, f.interval, f.known
	f.dials = append(f.dials, r.URL.Query().Get("device_id"))
	f.auths = append(f.auths, r.Header.Get("Authorization")+" "+r.Header.Get("X-App"))
	n := len(f.dials)
	f.mu.Unlock()
	if refuse != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(refuse)
		fmt.Fprint(w, `{"error":{"code":"unauthorized","message":"bad token"}}`)
		return
	}
	nc, _, _, err := ws.UpgradeHTTP(r, w)
	if err != nil {
		return
	}
	c := &fakeConn{nc: nc, msgs: make(chan map[string]any, 100)}
	device := r.URL.Query().Get("device_id")
	if device == "" {
		device = fmt.Sprintf("gen-%d", n)
	}
	welcome := map[string]any{"type": "welcome", "user_id": "1", "device_id": device,
		"heartbeat_interval_ms": interval.Milliseconds(), "ttl_ms": 30000}
	if known {
		welcome["subscribe_known"] = true
	}
	c.send(welcome)
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
	go func() {
		defer close(c.msgs)
		for {
			data, _, err := wsutil.ReadClientData(c)
			if err != nil {
				return
			}
			var m map[string]any
			if json.Unmarshal(data, &m) == nil {
				c.msgs <- m
			}
		}
	}()
}

func (c *fakeConn) Read(p []byte) (int, error) { return c.nc.Read(p) }
func (c *fakeConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.nc.Write(p)
}

func (c *fakeConn) send(v any) {
	p, _ := json.Marshal(v)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	wsutil.WriteServerText(c.nc, p)
}

// conn waits for the i-th connection (from 0).
func (f *fake) conn(i int) *fakeConn {
	f.t.Helper()
	var c *fakeConn
	testwait.For(f.t, fmt.Sprintf("connection #%d", i), func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.conns) > i {
			c = f.conns[i]
		}
		return c != nil
	})
	return c
}

// next returns the next client message of type typ, skipping heartbeats
// unless asked for.
func (c *fakeConn) next(t *testing.T, typ string) map[string]any {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				t.Fatalf("connection closed while waiting for %s", typ)
			}
			if m["type"] == typ {
				return m
			}
			if m["type"] != "heartbeat" {
				t.Fatalf("got %v, want a %s", m, typ)
			}
		case <-timeout:
			t.Fatalf("no %s message", typ)
		}
	}
}

func (f *fake) dial(t *testing.T, cfg Config) *Client {
	t.Helper()
	cfg.URL = f.srv.URL
	if cfg.Token == "" {
		cfg.Token = "t"
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 20*time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// nextUpdate returns the next update, skipping heartbeat-free noise: none.
func nextUpdate(t *testing.T, c *Client) Update {
	t.Helper()
	select {
	case u, ok := <-c.Updates():
		if !ok {
			t.Fatal("Updates closed")
		}
		return u
	case <-time.After(5 * time.Second):
		t.Fatal("no update")
	}
	return nil
}

func wantState(t *testing.T, c *Client, s State) StateChange {
	t.Helper()
	u := nextUpdate(t, c)
	sc, ok := u.(StateChange)
	if !ok || sc.State != s {
		t.Fatalf("update = %#v, want StateChange %s", u, s)
	}
	return sc
}

func wantEvent(t *testing.T, c *Client, user string, version uint64, snapshot bool) Event {
	t.Helper()
	u := nextUpdate(t, c)
	ev, ok := u.(Event)
	if !ok || ev.UserID != user || ev.Version != version || ev.Snapshot != snapshot {
		t.Fatalf("update = %#v, want Event of %s version %d snapshot %v", u, user, version, snapshot)
	}
	return ev
}

func TestReconnectKeepsDeviceAndResubscribes(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{})
	ctx := context.Background()
	wantState(t, c, Connected)
	if got := c.Welcome().DeviceID; got != "gen-1" {
		t.Fatalf("device id = %q, want the server's gen-1", got)
	}
	if err := c.Subscribe(ctx, "b", "a", "b"); err != nil {
		t.Fatal(err)
	}
	c0 := f.conn(0)
	if m := c0.next(t, "subscribe"); fmt.Sprint(m["user_ids"]) != "[b a]" {
		t.Fatalf("subscribe = %v", m)
	}
	if err := c.Unsubscribe(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	c0.next(t, "unsubscribe")
	if err := c.Subscribe(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	c0.next(t, "subscribe")

	c0.nc.Close() // the server drops the connection
	wantState(t, c, Disconnected)
	wantState(t, c, Connected)
	c1 := f.conn(1)
	if m := c1.next(t, "subscribe"); fmt.Sprint(m["user_ids"]) != "[a c]" {
		t.Fatalf("re-subscribe = %v, want [a c]", m)
	}
	f.mu.Lock()
	dials := fmt.Sprint(f.dials)
	f.mu.Unlock()
	if dials != "[ gen-1]" {
		t.Fatalf("device ids of the upgrades = %s, want none then gen-1", dials)
	}
}

func TestVersionsFilterStaleAndDuplicates(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{DeviceID: "phone"})
	ctx := context.Background()
	wantState(t, c, Connected)
	if err := c.Subscribe(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	c0 := f.conn(0)
	c0.next(t, "subscribe")
	presence := func(c *fakeConn, user string, v uint64) {
		c.send(map[string]any{"type": "presence", "user_id": user, "status": "online", "version": v})
	}
	c0.send(map[string]any{"type": "snapshot", "users": map[string]any{
		"a": map[string]any{"status": "online", "version": 5},
		"b": map[string]any{"status": nil, "version": nil},
	}})
	wantEvent(t, c, "a", 5, true)
	wantEvent(t, c, "b", 0, true)
	presence(c0, "a", 4) // stale
	presence(c0, "a", 5) // duplicate
	presence(c0, "z", 9) // not watched
	presence(c0, "a", 6)
	wantEvent(t, c, "a", 6, false)

	c0.nc.Close()
	wantState(t, c, Disconnected)
	wantState(t, c, Connected)
	c1 := f.conn(1)
	c1.next(t, "subscribe")
	// Unchanged while away: nothing. Changed: the snapshot's newer state.
	c1.send(map[string]any{"type": "snapshot", "users": map[string]any{"a": map[string]any{"status": "online", "version": 6}}})
	c1.send(map[string]any{"type": "snapshot", "users": map[string]any{"a": map[string]any{"status": "away", "version": 7}}})
	if ev := wantEvent(t, c, "a", 7, true); ev.Status != Away {
		t.Fatalf("status = %q, want away", ev.Status)
	}
	c1.send(map[string]any{"type": "error", "code": "rate_limited", "message": "slow down"})
	if u := nextUpdate(t, c); fmt.Sprint(u) != fmt.Sprint(&ServerError{Code: "rate_limited", Message: "slow down"}) {
		t.Fatalf("update = %#v, want the server error", u)
	}
}

func TestHeartbeatsSayWhetherActive(t *testing.T) {
	f := newFake(t)
	f.interval = 20 * time.Millisecond
	c := f.dial(t, Config{})
	c0 := f.conn(0)
	if m := c0.next(t, "heartbeat"); m["active"] != nil {
		t.Fatalf("heartbeat of an active device = %v", m)
	}
	c.SetActive(false)
	for {
		if m := c0.next(t, "heartbeat"); m["active"] == false {
			break
		}
	}
	f.mu.Lock()
	f.interval = time.Hour // the next connection beats only when woken
	f.mu.Unlock()
	c0.nc.Close()
	c1 := f.conn(1)
	c.SetActive(true)
	if m := c1.next(t, "heartbeat"); m["active"] != nil {
		t.Fatalf("heartbeat after becoming active = %v", m)
	}
}

func TestRefusedUpgrade(t *testing.T) {
	f := newFake(t)
	f.refuse = http.StatusUnauthorized
	_, err := Dial(context.Background(), Config{URL: f.srv.URL, Token: "bad"})
	var he *HandshakeError
	if !errors.As(err, &he) || he.StatusCode != 401 || he.Code != "unauthorized" || !permanent(err) {
		t.Fatalf("Dial = %v, want a permanent 401 unauthorized HandshakeError", err)
	}
}

func TestRefusedReconnectCloses(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{})
	wantState(t, c, Connected)
	f.mu.Lock()
	f.refuse = http.StatusForbidden
	f.mu.Unlock()
	f.conn(0).nc.Close()
	wantState(t, c, Disconnected)
	sc := wantState(t, c, Closed)
	var he *HandshakeError
	if !errors.As(sc.Err, &he) || he.StatusCode != 403 {
		t.Fatalf("closed with %v, want the 403", sc.Err)
	}
	if _, ok := <-c.Updates(); ok {
		t.Fatal("Updates still open after Closed")
	}
	<-c.Done()
	if !errors.As(c.Err(), &he) {
		t.Fatalf("Err = %v", c.Err())
	}
	if err := c.Subscribe(context.Background(), "a"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe after closing = %v, want ErrClosed", err)
	}
}

func TestSubscriptionLimit(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{MaxSubscriptions: 2})
	ctx := context.Background()
	if err := c.Subscribe(ctx, "a", "b", "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Subscribe(ctx, "c"); !errors.Is(err, ErrTooManySubscriptions) {
		t.Fatalf("third subscription: %v", err)
	}
	if got := fmt.Sprint(c.Subscriptions()); got != "[a b]" {
		t.Fatalf("subscriptions = %s", got)
	}
}

func TestCloseWhileReconnecting(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{MinBackoff: time.Hour, MaxBackoff: time.Hour})
	f.conn(0).nc.Close()
	wantState(t, c, Connected)
	wantState(t, c, Disconnected)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.SetStatus(ctx, Busy, ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SetStatus while disconnected = %v, want the deadline", err)
	}
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs during the backoff")
	}
	wantState(t, c, Closed)
	if err := c.SetStatus(context.Background(), Busy, ""); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetStatus after Close = %v", err)
	}
}

func TestTokenFuncAndHeaderOnEveryConnection(t *testing.T) {
	f := newFake(t)
	var mu sync.Mutex
	calls := 0
	c := f.dial(t, Config{
		Header: http.Header{"X-App": {"demo"}},
		TokenFunc: func(ctx context.Context) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			return fmt.Sprintf("tok%d", calls), nil
		},
	})
	wantState(t, c, Connected)
	f.conn(0).nc.Close()
	wantState(t, c, Disconnected)
	wantState(t, c, Connected)
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := fmt.Sprint(f.auths); got != "[Bearer tok1 demo Bearer tok2 demo]" {
		t.Fatalf("Authorization and X-App of the upgrades = %s", got)
	}
}

func TestRefusesWhatTheServerWouldRefuse(t *testing.T) {
	f := newFake(t)
	c := f.dial(t, Config{})
	ctx := context.Background()
	for _, ids := range [][]string{{""}, {"a", "b,c"}, {"a", "x\u202ey"}, {string(make([]byte, 65))}} {
		if err := c.Subscribe(ctx, ids...); err == nil {
			t.Errorf("Subscribe(%q) accepted", ids)
		}
	}
	if got := c.Subscriptions(); len(got) != 0 {
		t.Fatalf("refused subscribes recorded %q", got)
	}
	for _, tc := range []struct {
		status Status
		text   string
	}{{"sleeping", ""}, {Hidden, ""}, {Offline, ""}, {Busy, strings.Repeat("é", 141)}, {Busy, "a\nb"}} {
		if err := c.SetStatus(ctx, tc.status, tc.text); err == nil {
			t.Errorf("SetStatus(%q, %q) accepted", tc.status, tc.text)
		}
	}
	if _, err := Dial(ctx, Config{URL: f.srv.URL, Token: "t", DeviceID: "a b"}); err == nil {
		t.Error("Dial accepted the device id \"a b\"")
	}
}

// After a reconnect to a server that takes them, the re-subscribe says
// which version of each watched user the client holds (none for a user
// shown without one); to a server that does not, it says nothing more.
func TestResubscribeSendsKnownVersions(t *testing.T) {
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprint("known=", known), func(t *testing.T) {
			f := newFake(t)
			f.known = known
			c := f.dial(t, Config{})
			wantState(t, c, Connected)
			if err := c.Subscribe(context.Background(), "a", "b", "c"); err != nil {
				t.Fatal(err)
			}
			c0 := f.conn(0)
			c0.next(t, "subscribe")
			c0.send(map[string]any{"type": "snapshot", "users": map[string]any{
				"a": map[string]any{"status": "online", "version": 5},
				"b": map[string]any{"status": nil, "version": nil},
				"c": map[string]any{"status": "busy", "version": 9},
			}})
			wantEvent(t, c, "a", 5, true)
			wantEvent(t, c, "b", 0, true)
			wantEvent(t, c, "c", 9, true)
			c0.send(map[string]any{"type": "presence", "user_id": "a", "status": "away", "version": 6})
			wantEvent(t, c, "a", 6, false)

			c0.nc.Close()
			wantState(t, c, Disconnected)
			wantState(t, c, Connected)
			m := f.conn(1).next(t, "subscribe")
			want := "<nil>"
			if known {
				want = "map[a:6 c:9]"
			}
			if got := fmt.Sprint(m["known"]); got != want || fmt.Sprint(m["user_ids"]) != "[a b c]" {
				t.Fatalf("re-subscribe = %v, want known %s", m, want)
			}
		})
	}
}

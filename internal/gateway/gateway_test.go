package gateway_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
)

// recorder keeps the events the tracker publishes.
type recorder struct {
	mu  sync.Mutex
	evs []presence.Event
}

func (n *node) record() *recorder {
	r := &recorder{}
	n.pubs.mu.Lock()
	n.pubs.subs = append(n.pubs.subs, func(ev *presence.Event) {
		r.mu.Lock()
		r.evs = append(r.evs, *ev)
		r.mu.Unlock()
	})
	n.pubs.mu.Unlock()
	return r
}

func (r *recorder) of(user string) []presence.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []presence.Event
	for _, e := range r.evs {
		if e.UserID == user {
			out = append(out, e)
		}
	}
	return out
}

// With the close grace off the welcome says close_grace_ms 0.
func TestWelcomeNoCloseGrace(t *testing.T) {
	n := newNode(t, opts{tweak: func(c *gateway.Config) { c.CloseGrace = presence.NoCloseGrace }})
	if m := n.dial("42", "").msgType("welcome"); m["close_grace_ms"] != 0.0 {
		t.Fatalf("welcome %v, want close_grace_ms 0", m)
	}
}

func TestWelcome(t *testing.T) {
	n := newNode(t, opts{ttl: 20 * time.Second})
	rec := n.record()
	c := n.dial("42", "")
	m := c.msgType("welcome")
	dev, _ := m["device_id"].(string)
	if raw, err := base64.RawURLEncoding.DecodeString(dev); err != nil || len(raw) != 8 {
		t.Errorf("device id %q: want 8 random bytes in base64url (%v)", dev, err)
	}
	if m["user_id"] != "42" || m["heartbeat_interval_ms"] != 10000.0 || m["ttl_ms"] != 20000.0 ||
		m["close_grace_ms"] != 5000.0 || m["subscribe_known"] != true {
		t.Fatalf("welcome %v", m)
	}
	if len(m) != 7 {
		t.Fatalf("welcome has fields %v", m)
	}
	if runtime.GOOS == "linux" && n.gw.Stats().EpollDisabled {
		t.Fatal("epoll is not in use on Linux")
	}
	// Connecting is a heartbeat: 42 is online.
	if evs := rec.of("42"); len(evs) != 1 || evs[0].Status != presence.Online {
		t.Fatalf("events %+v, want one online", evs)
	}
	// A given device id is kept.
	c2 := n.dial("42", "phone")
	if m := c2.msgType("welcome"); m["device_id"] != "phone" {
		t.Fatalf("welcome %v", m)
	}
	// A token bound to a device binds the socket.
	c3 := n.dialQuery("?token="+n.token("42", "tab"), nil)
	if m := c3.msgType("welcome"); m["device_id"] != "tab" {
		t.Fatalf("welcome %v", m)
	}
	// The Authorization header works as well as the query parameter.
	c4 := n.dialQuery("", http.Header{"Authorization": {"Bearer " + n.token("43", "")}})
	if m := c4.msgType("welcome"); m["user_id"] != "43" {
		t.Fatalf("welcome %v", m)
	}
}

// upgradeReq sends a WebSocket upgrade request by hand and returns the
// refusal.
func upgradeReq(t *testing.T, n *node, q string, hdr http.Header) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("GET", n.srv.URL+"/v1/ws"+q, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if resp.StatusCode != http.StatusSwitchingProtocols {
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("%d body %q: %v", resp.StatusCode, body, err)
		}
	}
	return resp.StatusCode, m
}

func TestAuthMatrix(t *testing.T) {
	n := newNode(t, opts{})
	cases := []struct {
		name string
		q    string
		hdr  http.Header
		code int
		err  string
	}{
		{"no token", "", nil, 401, "unauthorized"},
		{"bad token", "?token=abc.def.ghi", nil, 401, "unauthorized"},
		{"bad header", "", http.Header{"Authorization": {"Bearer nope"}}, 401, "unauthorized"},
		{"api key in query", "?token=" + apiKey, nil, 403, "forbidden"},
		{"api key in header", "", http.Header{"Authorization": {"Bearer " + apiKey}}, 403, "forbidden"},
		{"bare user_id without -dev", "?user_id=42", nil, 401, "unauthorized"},
		{"other user", "?token=" + n.token("1", "") + "&user_id=2", nil, 403, "forbidden"},
		{"other device", "?token=" + n.token("1", "a") + "&device_id=b", nil, 403, "forbidden"},
		{"bad device", "?token=" + n.token("1", "") + "&device_id=a%20b", nil, 400, "invalid_id"},
		{"repeated token", "?token=a&token=b", nil, 400, "invalid_query"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, m := upgradeReq(t, n, tc.q, tc.hdr)
			if code != tc.code {
				t.Fatalf("status %d %v, want %d", code, m, tc.code)
			}
			e, _ := m["error"].(map[string]any)
			if e["code"] != tc.err || e["message"] == "" {
				t.Fatalf("body %v, want code %q", m, tc.err)
			}
		})
	}
	// Not a WebSocket request.
	resp, err := http.Get(n.srv.URL + "/v1/ws?token=" + n.token("1", ""))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Fatalf("plain GET: %d", resp.StatusCode)
	}
	resp, err = http.Post(n.srv.URL+"/v1/ws", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", resp.StatusCode)
	}
}

func TestDevBareUserID(t *testing.T) {
	n := newNode(t, opts{dev: true})
	c := n.dialQuery("?user_id=7&device_id=laptop", nil)
	if m := c.msgType("welcome"); m["user_id"] != "7" || m["device_id"] != "laptop" {
		t.Fatalf("welcome %v", m)
	}
	if code, m := upgradeReq(t, n, "", nil); code != 400 {
		t.Fatalf("dev without user_id: %d %v", code, m)
	}
	// Tokens still work, and the API key is still refused.
	c2 := n.dial("8", "")
	c2.msgType("welcome")
	if code, _ := upgradeReq(t, n, "?token="+apiKey, nil); code != 403 {
		t.Fatalf("api key under -dev: %d", code)
	}
}

func TestHeartbeatSetStatusBye(t *testing.T) {
	n := newNode(t, opts{})
	rec := n.record()
	c := n.dial("1", "d1")
	c.msgType("welcome")
	c.send(`{"type":"heartbeat"}`)
	c.send(`{"type":"heartbeat","active":false}`)
	c.send(`{"type":"set_status","status":"busy","text":"in a meeting"}`)
	testwait.For(t, "busy", func() bool { return len(rec.of("1")) == 2 })
	if ev := rec.of("1")[1]; ev.Status != presence.Busy || ev.Text != "in a meeting" {
		t.Fatalf("event %+v", ev)
	}
	c.send(`{"type":"set_status","status":"online"}`)
	testwait.For(t, "online", func() bool { return len(rec.of("1")) == 3 })
	if ev := rec.of("1")[2]; ev.Status != presence.Online || ev.Text != "" {
		t.Fatalf("event %+v", ev)
	}
	c.send(`{"type":"bye"}`)
	c.closed(1000)
	evs := rec.of("1")
	if len(evs) != 4 || evs[3].Status != presence.Offline {
		t.Fatalf("events %+v, want offline at once after bye", evs)
	}
}

func TestErrors(t *testing.T) {
	n := newNode(t, opts{})
	c := n.dial("1", "")
	c.msgType("welcome")
	cases := []struct{ msg, code string }{
		{`not json`, "invalid_json"},
		{`[1]`, "invalid_json"},
		{`{"type":"heartbeat"} {}`, "invalid_json"},
		{`{"type":"heartbeat","extra":1}`, "invalid_json"},
		{`{"type":"heartbeat","status":"busy"}`, "invalid_json"},
		{`{"type":"heartbeat","active":"yes"}`, "invalid_json"},
		{`{}`, "unknown_type"},
		{`{"type":"dance"}`, "unknown_type"},
		{`{"type":"set_status"}`, "invalid_status"},
		{`{"type":"set_status","status":"sleeping"}`, "invalid_status"},
		{`{"type":"set_status","status":"busy","text":"` + strings.Repeat("x", 141) + `"}`, "invalid_text"},
		{`{"type":"set_status","status":"busy","text":7}`, "invalid_text"},
		{`{"type":"subscribe"}`, "invalid_id"},
		{`{"type":"subscribe","user_ids":[]}`, "invalid_id"},
		{`{"type":"subscribe","user_ids":["a b"]}`, "invalid_id"},
		{`{"type":"unsubscribe","user_ids":"2"}`, "invalid_id"},
		{`{"type":"bye","user_ids":["2"]}`, "invalid_json"},
		{`{"type":"subscribe","user_ids":["2"],"known":{"3":1}}`, "invalid_known"},
		{`{"type":"subscribe","user_ids":["2"],"known":{"2":-1}}`, "invalid_known"},
		{`{"type":"subscribe","user_ids":["2"],"known":{"2":1.5}}`, "invalid_known"},
		{`{"type":"subscribe","user_ids":["2"],"known":{"2":"1"}}`, "invalid_known"},
		{`{"type":"subscribe","user_ids":["2"],"known":{"2":1,"2":2}}`, "invalid_known"},
		{`{"type":"subscribe","user_ids":["2"],"known":[1]}`, "invalid_known"},
		{`{"type":"unsubscribe","user_ids":["2"],"known":{"2":1}}`, "invalid_json"},
		{`{"type":"join"}`, "invalid_id"},
		{`{"type":"leave","room":7}`, "invalid_id"},
		{`{"type":"watch_room","room":"a b"}`, "invalid_id"},
		{`{"type":"unwatch_room","room":""}`, "invalid_id"},
		{`{"type":"join","room":"r","active":true}`, "invalid_json"},
		// Names are exact and given once, as in HTTP bodies.
		{`{"type":"set_status","status":"busy","Status":"invisible"}`, "invalid_json"},
		{`{"type":"set_status","status":"busy","status":"invisible"}`, "invalid_json"},
		{`{"type":"heartbeat","type":"bye"}`, "invalid_json"},
		{`{"Type":"bye"}`, "invalid_json"},
	}
	for _, tc := range cases {
		c.send(tc.msg)
		m := c.msgType("error")
		if m["code"] != tc.code {
			t.Errorf("%s: got %v, want %s", tc.msg, m, tc.code)
		}
	}
	// A binary frame is refused; the connection stays up.
	c.sendFrame(ws.OpBinary, true, []byte(`{"type":"heartbeat"}`))
	c.errorCode("invalid_json")
	// A ping is answered.
	c.sendFrame(ws.OpPing, true, []byte("hi"))
	f, err := c.frame(5 * time.Second)
	if err != nil || f.Header.OpCode != ws.OpPong || string(f.Payload) != "hi" {
		t.Fatalf("ping: %v %v", f, err)
	}
	// A fragmented message is assembled.
	c.sendFrame(ws.OpText, false, []byte(`{"type":`))
	c.sendFrame(ws.OpContinuation, true, []byte(`"dance"}`))
	c.errorCode("unknown_type")
	c.send(`{"type":"heartbeat"}`)
	c.silent(50 * time.Millisecond)
}

func TestTooBig(t *testing.T) {
	n := newNode(t, opts{})
	c := n.dial("1", "")
	c.msgType("welcome")
	c.send(`{"type":"heartbeat","x":"` + strings.Repeat("x", 64<<10) + `"}`)
	c.closed(1009)
	if s := n.gw.Stats(); s.ClosedTooBig != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Fragments add up.
	c = n.dial("1", "")
	c.msgType("welcome")
	c.sendFrame(ws.OpText, false, []byte(strings.Repeat(" ", 40<<10)))
	c.sendFrame(ws.OpContinuation, true, []byte(strings.Repeat(" ", 40<<10)))
	c.closed(1009)
}

// Heartbeats a client sent over time but the server reads in one go (it
// was behind) are one heartbeat: applied once, no rate limit tripped.
func TestHeartbeatsReadTogether(t *testing.T) {
	n := newNode(t, opts{})
	c := n.dial("1", "")
	c.msgType("welcome")
	var buf bytes.Buffer
	for range 100 {
		if err := ws.WriteFrame(&buf, ws.MaskFrameInPlace(ws.NewTextFrame([]byte(`{"type":"heartbeat"}`)))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.nc.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	c.silent(100 * time.Millisecond) // no rate_limited, no close
	testwait.For(t, "coalesced heartbeats", func() bool { return n.gw.Stats().CoalescedBeats > 0 })
	if s := n.gw.Stats(); s.RateLimited != 0 || s.ClosedRate != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRateLimit(t *testing.T) {
	n := newNode(t, opts{})
	c := n.dial("1", "")
	c.msgType("welcome")
	// The fake clock stands still: 40 messages pass, then each is refused.
	// (Not heartbeats: identical heartbeats read together are applied
	// once and count against nothing, see TestHeartbeatsReadTogether.)
	const msg = `{"type":"unsubscribe","user_ids":["x"]}`
	for range 40 {
		c.send(msg)
	}
	c.send(msg)
	c.errorCode("rate_limited")
	// A second later 20 more pass.
	n.clk.Advance(time.Second)
	for range 20 {
		c.send(msg)
	}
	c.silent(50 * time.Millisecond)
	// Persistent abuse closes 1008.
	for range 100 {
		c.send(msg)
	}
	c.closed(1008)
	if s := n.gw.Stats(); s.ClosedRate != 1 || s.RateLimited < 40 {
		t.Fatalf("stats %+v", s)
	}
}

func TestIdleClose(t *testing.T) {
	n := newNode(t, opts{ttl: 10 * time.Second})
	c := n.dial("1", "")
	c.msgType("welcome")
	n.clk.Advance(9 * time.Second)
	c.send(`{"type":"heartbeat"}`)
	c.silent(30 * time.Millisecond)
	n.clk.Advance(9 * time.Second) // 18s after connecting, 9s after the beat
	c.silent(30 * time.Millisecond)
	n.clk.Advance(time.Second)
	c.closed(4001)
	if s := n.gw.Stats(); s.ClosedIdle != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestFragmentsAreNotSpeaking: a fragmented message that never ends does
// not keep a socket alive past one ttl, however many empty continuations
// come, and a message has at most 64 fragments.
func TestFragmentsAreNotSpeaking(t *testing.T) {
	n := newNode(t, opts{ttl: 10 * time.Second})
	c := n.dial("1", "")
	c.msgType("welcome")
	// A ping after each fragment (control frames may come between
	// fragments) says the server read it before the clock moves on.
	seen := func() {
		t.Helper()
		c.sendFrame(ws.OpPing, true, []byte("p"))
		if f, err := c.frame(5 * time.Second); err != nil || f.Header.OpCode != ws.OpPong {
			t.Fatalf("pong: %v %v", f.Header, err)
		}
	}
	c.sendFrame(ws.OpText, false, []byte(`{"type":`))
	seen()
	for range 2 {
		n.clk.Advance(4 * time.Second)
		c.sendFrame(ws.OpContinuation, false, nil)
		seen()
	}
	n.clk.Advance(4 * time.Second)
	c.sendFrame(ws.OpContinuation, false, nil)
	c.closed(4001) // 12 s after its first fragment
	// Fragments per message are bounded, whatever their size.
	c = n.dial("1", "")
	c.msgType("welcome")
	c.sendFrame(ws.OpText, false, []byte(`{"type":`))
	for range 64 {
		c.sendFrame(ws.OpContinuation, false, []byte(" "))
	}
	c.closed(1009)
	// A message in a few fragments is still a message, and speaks.
	c = n.dial("1", "")
	c.msgType("welcome")
	n.clk.Advance(6 * time.Second)
	c.sendFrame(ws.OpText, false, []byte(`{"type":`))
	c.sendFrame(ws.OpContinuation, true, []byte(`"heartbeat"}`))
	n.clk.Advance(6 * time.Second) // 12 s after connecting, 6 s after the message
	c.send(`{"type":"heartbeat"}`)
	c.silent(30 * time.Millisecond)
}

func TestDropDoesNothing(t *testing.T) {
	n := newNode(t, opts{})
	rec := n.record()
	c := n.dial("1", "phone")
	c.msgType("welcome")
	c.nc.Close()
	testwait.For(t, "connection gone", func() bool { return n.gw.Stats().Connections == 0 })
	n.clk.Advance(presence.DefaultCloseGrace - time.Millisecond) // back within the close grace
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	c = n.dial("1", "phone")
	c.msgType("welcome")
	n.clk.Advance(29 * time.Second)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if evs := rec.of("1"); len(evs) != 1 {
		t.Fatalf("events %+v, want only the first online", evs)
	}
}

func TestShutdown(t *testing.T) {
	n := newNode(t, opts{})
	cs := []*client{n.dial("1", ""), n.dial("2", "")}
	for _, c := range cs {
		c.msgType("welcome")
	}
	n.stop()
	for _, c := range cs {
		c.closed(1001)
	}
	<-n.done
	if code, _ := upgradeReq(t, n, "?token="+n.token("3", ""), nil); code != http.StatusServiceUnavailable {
		t.Fatalf("after shutdown: %d", code)
	}
}

// TestPortable runs the message round trip on the portable path (a
// reading goroutine per connection).
func TestPortable(t *testing.T) {
	n := newNode(t, opts{tweak: func(c *gateway.Config) { c.NoEpoll = true }})
	rec := n.record()
	c := n.dial("1", "d")
	c.msgType("welcome")
	if !n.gw.Stats().EpollDisabled {
		t.Fatal("NoEpoll ignored")
	}
	c.send(`{"type":"dance"}`)
	c.errorCode("unknown_type")
	c.send(`{"type":"bye"}`)
	c.closed(1000)
	if evs := rec.of("1"); len(evs) != 2 {
		t.Fatalf("events %+v", evs)
	}
}

func TestMoreErrorCodes(t *testing.T) {
	t.Run("too_many_devices", func(t *testing.T) {
		n := newNode(t, opts{devices: 1})
		n.dial("1", "a").msgType("welcome")
		code, m := upgradeReq(t, n, "?token="+n.token("1", "")+"&device_id=b", nil)
		if e, _ := m["error"].(map[string]any); code != http.StatusConflict || e["code"] != "too_many_devices" {
			t.Fatalf("second device: %d %v", code, m)
		}
	})
	t.Run("unavailable", func(t *testing.T) {
		n := newNode(t, opts{noHub: true})
		c := n.dial("1", "")
		c.msgType("welcome")
		c.send(`{"type":"subscribe","user_ids":["2"]}`)
		c.errorCode("unavailable")
	})
	t.Run("internal", func(t *testing.T) {
		n := newNode(t, opts{})
		c := n.dial("1", "")
		c.msgType("welcome")
		_ = n.durable.Close() // every durable write fails from now on
		c.send(`{"type":"set_status","status":"busy"}`)
		m := c.msgType("error")
		if m["code"] != "internal" || strings.Contains(m["message"].(string), "sql") {
			t.Fatalf("error %v", m)
		}
		c.send(`{"type":"heartbeat"}`) // the connection stays up
		c.silent(30 * time.Millisecond)
	})
}

func TestClientCloseAndProtocolErrors(t *testing.T) {
	n := newNode(t, opts{})
	c := n.dial("1", "")
	c.msgType("welcome")
	c.sendFrame(ws.OpClose, true, ws.NewCloseFrameBody(1000, "done"))
	c.closed(1000) // echoed

	cases := []struct {
		name string
		send func(c *client)
		code ws.StatusCode
	}{
		{"unmasked", func(c *client) {
			_ = ws.WriteFrame(c.nc, ws.NewTextFrame([]byte(`{"type":"heartbeat"}`)))
		}, 1002},
		{"continuation first", func(c *client) { c.sendFrame(ws.OpContinuation, true, []byte("x")) }, 1002},
		{"fragmented ping", func(c *client) { c.sendFrame(ws.OpPing, false, nil) }, 1002},
		{"invalid utf-8", func(c *client) { c.sendFrame(ws.OpText, true, []byte{'"', 0xff, '"'}) }, 1007},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := n.dial("1", "")
			c.msgType("welcome")
			tc.send(c)
			c.closed(tc.code)
		})
	}
}

// Pings have their own allowance: a keepalive ping right after a burst
// of messages is answered; a flood of pings gets no pongs and is closed
// 1008 like a flood of messages.
func TestPingsApartFromMessages(t *testing.T) {
	n := newNode(t, opts{})
	c := n.dial("1", "")
	c.msgType("welcome")
	const msg = `{"type":"unsubscribe","user_ids":["x"]}`
	for range 40 { // the whole message burst (the fake clock stands still)
		c.send(msg)
	}
	c.sendFrame(ws.OpPing, true, []byte("still there?"))
	f, err := c.frame(5 * time.Second)
	if err != nil || f.Header.OpCode != ws.OpPong || string(f.Payload) != "still there?" {
		t.Fatalf("ping after a message burst: %+v %v, want its pong", f, err)
	}
	for range 4 { // the rest of the ping burst
		c.sendFrame(ws.OpPing, true, nil)
		if f, err := c.frame(5 * time.Second); err != nil || f.Header.OpCode != ws.OpPong {
			t.Fatalf("ping within the burst: %+v %v", f, err)
		}
	}
	c.sendFrame(ws.OpPing, true, []byte("over"))
	c.silent(50 * time.Millisecond) // no pong over the limit
	for range 100 {
		c.sendFrame(ws.OpPing, true, nil)
	}
	c.closed(1008)
	if s := n.gw.Stats(); s.ClosedRate != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestUsersGauge: Stats.Users (presenced_ws_users) counts the distinct users
// with a WebSocket open on this node: a user's second socket adds nothing,
// the gauge falls only when a user's last socket closes, whichever way it
// closes (bye, a dropped connection), and it never goes below zero.
func TestUsersGauge(t *testing.T) {
	n := newNode(t, opts{})
	want := func(what string, conns, users int) {
		t.Helper()
		testwait.For(t, what, func() bool {
			s := n.gw.Stats()
			return s.Connections == conns && s.Users == users
		})
	}
	phone := n.dial("1", "phone")
	phone.msgType("welcome")
	laptop := n.dial("1", "laptop")
	laptop.msgType("welcome")
	other := n.dial("2", "phone")
	other.msgType("welcome")
	want("three sockets of two users", 3, 2)

	phone.send(`{"type":"bye"}`)
	phone.closed(1000)
	want("user 1's phone said bye", 2, 2)
	laptop.nc.Close()
	want("user 1's laptop dropped", 1, 1)
	other.nc.Close()
	want("every socket gone", 0, 0)
	again := n.dial("2", "phone")
	again.msgType("welcome")
	want("user 2 back", 1, 1)
}

// dialToken connects with the given token as device.
func (n *node) dialToken(tok, device string) *client {
	n.t.Helper()
	return n.dialQuery("?token="+tok+"&device_id="+device, nil)
}

// TestTokenExpiryCloses: a socket is closed 4003 when its token expires,
// silent or not, and that is no bye: the device keeps its close grace, so
// coming back with a fresh token within it shows nothing to anyone.
func TestTokenExpiryCloses(t *testing.T) {
	n := newNode(t, opts{})
	rec := n.record()
	// exp is in whole seconds: t0 is 03:04:05.678, so this token expires
	// at 03:04:15, 9.322 s from now.
	tok, err := auth.Sign(secret, "1", "", n.clk.Now(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := n.dialToken(tok, "phone")
	c.msgType("welcome")
	n.clk.Advance(9 * time.Second)
	c.send(`{"type":"heartbeat"}`) // a message does not put the expiry off
	c.silent(30 * time.Millisecond)
	n.clk.Advance(time.Second)
	c.closed(4003)
	if s := n.gw.Stats(); s.ClosedExpired != 1 || s.ClosedIdle != 0 {
		t.Fatalf("stats %+v, want one 4003", s)
	}
	testwait.For(t, "connection gone", func() bool { return n.gw.Stats().Connections == 0 })
	n.clk.Advance(presence.DefaultCloseGrace - time.Millisecond)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	c = n.dialToken(n.token("1", ""), "phone")
	c.msgType("welcome")
	n.clk.Advance(29 * time.Second)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if evs := rec.of("1"); len(evs) != 1 || evs[0].Status != presence.Online {
		t.Fatalf("events %+v, want only the first online: the expiry close is not a bye", evs)
	}
	// Not back within the grace: offline at its end, as after any drop.
	c.nc.Close()
	testwait.For(t, "connection gone", func() bool { return n.gw.Stats().Connections == 0 })
	n.clk.Advance(presence.DefaultCloseGrace)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if evs := rec.of("1"); len(evs) != 2 || evs[1].Status != presence.Offline {
		t.Fatalf("events %+v, want online, then offline after the grace", evs)
	}
}

// TestExpiredTokenActsNoMore: a message on a socket whose token has
// expired closes it 4003 and changes nothing, even before a sweep; an
// upgrade with a token past its exp is refused although HTTP would still
// take it within the leeway.
func TestExpiredTokenActsNoMore(t *testing.T) {
	n := newNode(t, opts{tweak: func(c *gateway.Config) { c.IdleCheck = time.Hour }})
	tok, err := auth.Sign(secret, "1", "", n.clk.Now(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := n.dialToken(tok, "phone")
	c.msgType("welcome")
	n.clk.Advance(10 * time.Second)
	c.send(`{"type":"set_status","status":"busy"}`)
	c.closed(4003)
	var s [1]presence.Snapshot
	if err := n.tr.Get(context.Background(), n.tr.Now(), []string{"1"}, s[:]); err != nil {
		t.Fatal(err)
	}
	if s[0].Status != presence.Online {
		t.Fatalf("status %q after a set_status on an expired token, want online", s[0].Status)
	}
	code, m := upgradeReq(t, n, "?token="+tok, nil)
	msg, _ := m["error"].(map[string]any)["message"].(string)
	if code != http.StatusUnauthorized || !strings.Contains(msg, "the token expired at 2026-01-02T03:04:15Z") {
		t.Fatalf("upgrade with the expired token: %d %v, want 401 saying when it expired", code, m)
	}
}

// TestDevSocketsNeverExpire: a socket without a token (dev mode) has no
// expiry: beating, it stays up however long.
func TestDevSocketsNeverExpire(t *testing.T) {
	n := newNode(t, opts{dev: true, ttl: 10 * time.Hour})
	c := n.dialQuery("?user_id=1", nil)
	c.msgType("welcome")
	for range 3 {
		n.clk.Advance(9 * time.Hour)
		c.send(`{"type":"heartbeat"}`)
		c.silent(30 * time.Millisecond)
	}
	if s := n.gw.Stats(); s.ClosedExpired != 0 || s.Connections != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// An idle socket's traffic — heartbeats and pings — is applied by the
// epoll loop itself; anything else read with it, a frame in pieces, or a
// tracker whose beats may wait goes to a worker, in order, and nothing is
// applied twice or lost.
func TestLoopAppliesBeatsAndPings(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the epoll loop is Linux only")
	}
	frames := func(t *testing.T, msgs ...string) []byte {
		var buf bytes.Buffer
		for _, m := range msgs {
			f := ws.NewTextFrame([]byte(m))
			if m == "ping" {
				f = ws.NewPingFrame([]byte("p"))
			}
			if err := ws.WriteFrame(&buf, ws.MaskFrameInPlace(f)); err != nil {
				t.Fatal(err)
			}
		}
		return buf.Bytes()
	}
	write := func(t *testing.T, c *client, b []byte) {
		t.Helper()
		if _, err := c.nc.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	pong := func(t *testing.T, c *client) {
		t.Helper()
		f, err := c.frame(5 * time.Second)
		if err != nil || f.Header.OpCode != ws.OpPong || string(f.Payload) != "p" {
			t.Fatalf("want the pong, got %v %q (%v)", f.Header.OpCode, f.Payload, err)
		}
	}
	beats := func(n *node, want uint64) {
		t.Helper()
		testwait.For(t, fmt.Sprintf("%d heartbeats applied", want), func() bool { return n.tr.Stats().Heartbeats == want })
	}

	t.Run("loop", func(t *testing.T) {
		n := newNode(t, opts{})
		c := n.dial("1", "")
		c.msgType("welcome")
		base := n.tr.Stats().Heartbeats
		loop := n.gw.Stats().LoopReads

		write(t, c, frames(t, `{"type":"heartbeat"}`, "ping"))
		pong(t, c)
		beats(n, base+1)
		if got := n.gw.Stats().LoopReads; got != loop+1 {
			t.Fatalf("loop reads %d, want %d: the beat and ping woke a worker", got, loop+1)
		}

		// A subscribe read with a beat: both applied, in order, by a worker.
		write(t, c, frames(t, `{"type":"heartbeat","active":false}`, `{"type":"subscribe","user_ids":["2"]}`))
		if m := c.msgType("snapshot"); m["users"] == nil {
			t.Fatalf("snapshot %v", m)
		}
		beats(n, base+2)

		// A beat in two pieces: read twice, applied once.
		b := frames(t, `{"type":"heartbeat"}`)
		write(t, c, b[:5])
		c.silent(50 * time.Millisecond)
		write(t, c, b[5:])
		beats(n, base+3)
		if got := n.gw.Stats().LoopReads; got != loop+1 {
			t.Fatalf("loop reads %d, want %d: a read of more than beats was applied in the loop", got, loop+1)
		}

		// And the loop takes the socket again once it is whole.
		write(t, c, frames(t, "ping", `{"type":"heartbeat"}`))
		pong(t, c)
		beats(n, base+4)
		if got := n.gw.Stats().LoopReads; got != loop+2 {
			t.Fatalf("loop reads %d, want %d", got, loop+2)
		}
	})

	t.Run("beats may wait", func(t *testing.T) {
		n := newNode(t, opts{tweak: func(c *gateway.Config) { c.BeatsMayWait = true }})
		c := n.dial("1", "")
		c.msgType("welcome")
		base := n.tr.Stats().Heartbeats
		write(t, c, frames(t, `{"type":"heartbeat"}`, "ping"))
		pong(t, c)
		beats(n, base+1)
		if got := n.gw.Stats().LoopReads; got != 0 {
			t.Fatalf("loop reads %d with BeatsMayWait, want 0", got)
		}
	})
}

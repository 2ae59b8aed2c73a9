package connbudget

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
)

const waitTimeout = 10 * time.Second

// serve runs an HTTP server on a budgeted loopback listener. /hold hijacks
// the connection and keeps it (a WebSocket's place).
func serve(t *testing.T, cfg Config) (*Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, cfg)
	serveOn(t, bl, bl, &http.Server{MaxHeaderBytes: cfg.MaxHeaderBytes, ReadHeaderTimeout: time.Minute})
	return bl, ln.Addr().String()
}

// serveOn runs srv on l (bl or a listener around it) with the test's
// handlers and bl's hooks (ConnState, ConnContext, Handler) until the end
// of the test: /ok, /hold (hijacks the connection and keeps it), /echo
// (answers the body it reads) and /auth (401 without reading the body).
func serveOn(t *testing.T, bl *Listener, l net.Listener, srv *http.Server) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(b)
	})
	mux.HandleFunc("POST /auth", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "who are you", http.StatusUnauthorized)
	})
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	mux.HandleFunc("GET /hold", func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\n\r\n"))
		mu.Lock()
		held = append(held, c)
		mu.Unlock()
	})
	srv.Handler, srv.ConnState, srv.ConnContext = bl.Handler(mux), bl.ConnState, bl.ConnContext
	go srv.Serve(l)
	t.Cleanup(func() {
		srv.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
}

// dialFrom connects to addr from the loopback source address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: waitTimeout}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends GET path on c and reads the answer (status and body).
func get(t *testing.T, c net.Conn, path string) (int, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(waitTimeout))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return resp.StatusCode, ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// closedByServer reports whether the server closed c (a read ends in EOF
// or a reset, not a timeout).
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var b [1]byte
	_, err := c.Read(b[:])
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

// jsonError decodes an {"error":{code,message}} body.
func jsonError(t *testing.T, body string) (code, message string) {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code == "" {
		t.Fatalf("not a JSON error: %q (%v)", body, err)
	}
	return e.Error.Code, e.Error.Message
}

// stalledCount counts the pending connections that stalled.
func stalledCount(bl *Listener) int {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	n := 0
	for c := bl.pending.head; c != nil; c = c.links[global].next {
		if bl.stalled(c, mono()) {
			n++
		}
	}
	return n
}

// Connections that never send a request take no more than Pending places
// once they stalled: each new one closes the oldest.
func TestPendingCap(t *testing.T) {
	bl, addr := serve(t, Config{Pending: 5, Stall: 50 * time.Millisecond})
	var silent []net.Conn
	for range 5 {
		silent = append(silent, dialFrom(t, "127.0.0.1", addr))
	}
	testwait.For(t, "5 stalled", func() bool { return stalledCount(bl) == 5 })
	for range 3 {
		silent = append(silent, dialFrom(t, "127.0.0.1", addr))
	}
	testwait.For(t, "8 accepted", func() bool { s := bl.Stats(); return s.Pending+int(s.Evicted) == 8 })
	if s := bl.Stats(); s.Pending != 5 || s.Evicted != 3 || s.Open != 5 {
		t.Fatalf("stats %+v, want 5 pending and open, 3 evicted", s)
	}
	for i, c := range silent {
		if got, want := closedByServer(c), i < 3; got != want {
			t.Errorf("silent connection %d closed: %v, want %v (the oldest go first)", i, got, want)
		}
	}
	// A client that sends its request gets its answer.
	if code, body := get(t, dialFrom(t, "127.0.0.1", addr), "/ok"); code != 200 || body != "ok" {
		t.Fatalf("a well-behaved request: %d %q", code, body)
	}
}

// At the node's cap a new connection takes the place of the oldest idle
// keep-alive connection; busy ones (a WebSocket) are never closed for it,
// and when all are busy the new one is refused with a JSON 503.
func TestMaxEvictsIdleThenRefuses(t *testing.T) {
	bl, addr := serve(t, Config{Max: 4})
	held := dialFrom(t, "127.0.0.1", addr)
	if code, _ := get(t, held, "/hold"); code != 101 {
		t.Fatalf("hold: %d", code)
	}
	var idle []net.Conn
	for range 3 {
		c := dialFrom(t, "127.0.0.1", addr)
		if code, _ := get(t, c, "/ok"); code != 200 {
			t.Fatal(code)
		}
		idle = append(idle, c)
		testwait.For(t, "idle in order", func() bool { return bl.Stats().Idle == len(idle) })
	}
	// Two newcomers: the two oldest idle connections make room.
	for range 2 {
		if code, _ := get(t, dialFrom(t, "127.0.0.1", addr), "/ok"); code != 200 {
			t.Fatalf("newcomer: %d", code)
		}
	}
	for i, want := range []bool{true, true, false} {
		if got := closedByServer(idle[i]); got != want {
			t.Errorf("idle connection %d closed: %v, want %v (the oldest make room)", i, got, want)
		}
	}
	if closedByServer(held) {
		t.Fatal("the busy connection was closed")
	}
	// Every place busy: refused.
	for range 3 {
		c := dialFrom(t, "127.0.0.1", addr)
		if code, _ := get(t, c, "/hold"); code != 101 {
			t.Fatalf("hold: %d", code)
		}
	}
	testwait.For(t, "4 held", func() bool { s := bl.Stats(); return s.Idle == 0 && s.Pending == 0 && s.Open == 4 })
	code, body := get(t, dialFrom(t, "127.0.0.1", addr), "/ok")
	if c, msg := jsonError(t, body); code != 503 || c != "too_many_connections" || !strings.Contains(msg, "4 connections") {
		t.Fatalf("over the cap: %d %s", code, body)
	}
	if s := bl.Stats(); s.Refused != 1 || s.Open != 4 {
		t.Fatalf("stats %+v", s)
	}
}

// One source address holds at most PerAddr places; other addresses are
// not affected.
func TestPerAddrCap(t *testing.T) {
	bl, addr := serve(t, Config{PerAddr: 2})
	for range 2 {
		if code, _ := get(t, dialFrom(t, "127.0.0.2", addr), "/hold"); code != 101 {
			t.Fatal(code)
		}
	}
	code, body := get(t, dialFrom(t, "127.0.0.2", addr), "/ok")
	if c, _ := jsonError(t, body); code != 429 || c != "too_many_connections" {
		t.Fatalf("third from one address: %d %s", code, body)
	}
	if code, _ := get(t, dialFrom(t, "127.0.0.3", addr), "/ok"); code != 200 {
		t.Fatalf("another address: %d", code)
	}
	// The address's idle connection makes room for its newcomer.
	other := dialFrom(t, "127.0.0.3", addr)
	if code, _ := get(t, other, "/ok"); code != 200 {
		t.Fatal(code)
	}
	testwait.For(t, "idle", func() bool { return bl.Stats().Idle == 2 })
	if code, _ := get(t, dialFrom(t, "127.0.0.3", addr), "/ok"); code != 200 {
		t.Fatal(code)
	}
}

// Closing a connection gives its place back; an idle connection that
// begins its next request is pending again.
func TestPlacesComeBack(t *testing.T) {
	bl, addr := serve(t, Config{Max: 100, PerAddr: 100, Pending: 100})
	var cs []net.Conn
	for range 10 {
		c := dialFrom(t, "127.0.0.1", addr)
		if code, _ := get(t, c, "/ok"); code != 200 {
			t.Fatal(code)
		}
		cs = append(cs, c)
	}
	testwait.For(t, "10 idle", func() bool { return bl.Stats().Idle == 10 })
	fmt.Fprintf(cs[0], "GET /ok HTTP/1.1\r\n") // half a request
	testwait.For(t, "one pending", func() bool { s := bl.Stats(); return s.Idle == 9 && s.Pending == 1 })
	for _, c := range cs {
		c.Close()
	}
	testwait.For(t, "all closed", func() bool { s := bl.Stats(); return s.Open == 0 && s.Idle == 0 && s.Pending == 0 })
	bl.mu.Lock()
	n := len(bl.addrs)
	bl.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d addresses still held", n)
	}
}

// net/http's own answers to requests it cannot read are JSON too.
func TestCannedAnswersAreJSON(t *testing.T) {
	_, addr := serve(t, Config{MaxHeaderBytes: 4096})
	for _, tc := range []struct {
		req    string
		status int
		code   string
	}{
		{"GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 10000) + "\r\n\r\n", 431, "headers_too_large"},
		{"GET /ok HTTP/1.1\r\n\r\n", 400, "bad_request"}, // no Host
		{"GARBAGE\r\n\r\n", 400, "bad_request"},          // no request line
		{"GET /ok HTTP/2.5\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
		{"POST /ok HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "not_implemented"},
	} {
		c := dialFrom(t, "127.0.0.1", addr)
		c.SetDeadline(time.Now().Add(waitTimeout))
		io.WriteString(c, tc.req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.req[:min(len(tc.req), 30)], err)
		}
		b, _ := io.ReadAll(resp.Body)
		code, msg := jsonError(t, string(b))
		if resp.StatusCode != tc.status || code != tc.code || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%q: %d %s %s, want %d %s", tc.req[:min(len(tc.req), 30)], resp.StatusCode, resp.Header.Get("Content-Type"), b, tc.status, tc.code)
		}
		if tc.status == 431 && !strings.Contains(msg, "4096 bytes") {
			t.Errorf("431 does not name the limit: %s", msg)
		}
	}
}

// A handler's own answers pass untouched, whatever they hold.
func TestRewriteLeavesHandlersAlone(t *testing.T) {
	for _, b := range []string{
		"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nDate: x\r\n\r\nno",
		"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nDate: x\r\n\r\n",
		"HTTP/1.1 200 OK" + cannedHeaders + "200 OK",
		"\x81\x05HTTP/",
	} {
		if _, ok := rewrite([]byte(b), 0); ok {
			t.Errorf("rewrote %q", b)
		}
	}
}

func TestDefaults(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		want  Config
	}{
		{20000, Config{Max: 18750, PerAddr: 4687, Pending: 1024}},
		{1024, Config{Max: 924, PerAddr: 231, Pending: 115}},
		{1 << 40, Config{Max: 1006632960, PerAddr: 251658240, Pending: 1024}},
	} {
		if got := Defaults(tc.limit); got != tc.want {
			t.Errorf("Defaults(%d) = %+v, want %+v", tc.limit, got, tc.want)
		}
	}
}

// TestForMax: the per-address and pending caps are shares of the overall
// one, never above it.
func TestForMax(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want Config
	}{
		{100, Config{Max: 100, PerAddr: 25, Pending: 16}},
		{2000, Config{Max: 2000, PerAddr: 500, Pending: 250}},
		{100000, Config{Max: 100000, PerAddr: 25000, Pending: 1024}},
		{10, Config{Max: 10, PerAddr: 10, Pending: 10}},
	} {
		if got := ForMax(tc.n); got != tc.want {
			t.Errorf("ForMax(%d) = %+v, want %+v", tc.n, got, tc.want)
		}
	}
}

// BenchmarkRequestCycle is the listener's bookkeeping of one keep-alive
// request: its first bytes make the idle connection pending, its headers
// read make it busy, its answer idle again (1,000 other connections open).
func BenchmarkRequestCycle(b *testing.B) {
	bl := New(nil, Config{Max: 100000, PerAddr: 100000, Pending: 100000})
	conns := make([]*Conn, 1001)
	for i := range conns {
		c, _, r := bl.admit(fakeConn{addr: &net.TCPAddr{IP: net.IPv4(10, 0, byte(i>>8), byte(i))}})
		if r != nil {
			b.Fatal(r.message)
		}
		bl.ConnState(c, http.StateActive)
		bl.ConnState(c, http.StateIdle)
		conns[i] = c
	}
	c := conns[0]
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		c.l.set(c, statePending) // what Read does on an idle connection's first bytes
		bl.ConnState(c, http.StateActive)
		bl.ConnState(c, http.StateIdle)
	}
}

type fakeConn struct {
	net.Conn
	addr net.Addr
}

func (f fakeConn) RemoteAddr() net.Addr { return f.addr }

// BenchmarkKeepAliveRequest compares one keep-alive request over loopback
// on a plain listener and on a budgeted one, in one run.
func BenchmarkKeepAliveRequest(b *testing.B) {
	for _, budgeted := range []bool{false, true} {
		name := "plain"
		if budgeted {
			name = "budgeted"
		}
		b.Run(name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
			var serve net.Listener = ln
			if budgeted {
				bl := New(ln, Defaults(FileLimit()))
				srv.ConnState = bl.ConnState
				serve = bl
			}
			go srv.Serve(serve)
			defer srv.Close()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			req := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// BenchmarkBodyRequest compares one keep-alive POST with a small body
// (an HTTP heartbeat's size) over loopback on a plain listener and on a
// budgeted one with Handler, whose handler reads the body and answers
// with headers of its own, as the API does, in one run.
func BenchmarkBodyRequest(b *testing.B) {
	for _, budgeted := range []bool{false, true} {
		name := "plain"
		if budgeted {
			name = "budgeted"
		}
		b.Run(name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json") // as the API's answers do
				w.Header().Set("Content-Length", "15")
				io.WriteString(w, `{"status":"ok"}`)
			})
			srv := &http.Server{}
			var serve net.Listener = ln
			if budgeted {
				bl := New(ln, Defaults(FileLimit()))
				h = bl.Handler(h)
				srv.ConnState, srv.ConnContext = bl.ConnState, bl.ConnContext
				serve = bl
			}
			srv.Handler = h
			go srv.Serve(serve)
			defer srv.Close()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			req := []byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 39\r\n\r\n{\"user_id\":\"alice\",\"device_id\":\"phone\"}")
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.Close {
					b.Fatal("the connection is not kept")
				}
			}
		})
	}
}

// wrapped is a connection around another that names it, as a *tls.Conn
// and wsaccept's replayed connections do.
type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

// TestStatesThroughWrappers: ConnState finds its connection under any
// number of wrappers (a connection wsaccept replays, around a *tls.Conn,
// around one of ours).
func TestStatesThroughWrappers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, Config{Max: 10, Pending: 10})
	defer bl.Close()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c, err := bl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if st := bl.Stats(); st.Pending != 1 {
		t.Fatalf("a new connection: %+v, want it pending", st)
	}
	bl.ConnState(wrapped{wrapped{c}}, http.StateIdle)
	if st := bl.Stats(); st.Pending != 0 || st.Idle != 1 {
		t.Errorf("idle through two wrappers: %+v, want idle", st)
	}
}

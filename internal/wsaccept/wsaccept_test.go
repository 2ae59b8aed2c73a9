package wsaccept_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tlscert/tlstest"
	"github.com/presenced/presenced/internal/wsaccept"
)

// node is an http.Server behind a wsaccept.Listener whose upgrades are
// recorded instead of served.
type node struct {
	l      *wsaccept.Listener
	addr   string
	mu     sync.Mutex
	ups    []string // request URIs taken as upgrades, with what followed the head
	states []http.ConnState
}

func start(t *testing.T, cfg wsaccept.Config) *node {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{addr: inner.Addr().String()}
	cfg.Path = "/v1/ws"
	cfg.Upgrade = func(c net.Conn, br *bufio.Reader, r *http.Request) bool {
		early := make([]byte, br.Buffered())
		_, _ = io.ReadFull(br, early)
		n.mu.Lock()
		n.ups = append(n.ups, r.Method+" "+r.RequestURI+" host="+r.Host+" remote="+fmt.Sprint(r.RemoteAddr != "")+" early="+string(early))
		n.mu.Unlock()
		fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\n\r\n")
		_ = c.Close()
		return true
	}
	cfg.State = func(_ net.Conn, s http.ConnState) {
		n.mu.Lock()
		n.states = append(n.states, s)
		n.mu.Unlock()
	}
	cfg.Refuse = func(w io.Writer, status int, code, msg string) {
		body := fmt.Sprintf(`{"error":{"code":%q,"message":%q}}`, code, msg)
		fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, http.StatusText(status), len(body), body)
	}
	n.l = wsaccept.New(inner, cfg)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "http %s %s", r.Method, r.URL.Path)
	})}
	go func() { _ = srv.Serve(n.l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return n
}

// send writes req on a new connection and returns all it reads back.
func (n *node) send(t *testing.T, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

func TestSortsFirstRequests(t *testing.T) {
	n := start(t, wsaccept.Config{})
	// An upgrade, with a frame sent right after its head.
	got := n.send(t, "GET /v1/ws?user_id=a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\nFRAME")
	if !strings.HasPrefix(got, "HTTP/1.1 101") {
		t.Errorf("upgrade answered %q", got)
	}
	// Everything else goes to net/http with its first bytes in front.
	for _, req := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"GET /v1/wsx HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"GET /v1/ws/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"POST /v1/ws HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
		"GET /v1/presence/42 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
	} {
		path := strings.Fields(req)[1]
		if got := n.send(t, req); !strings.Contains(got, "200 OK") || !strings.HasSuffix(got, "http "+strings.Fields(req)[0]+" "+path) {
			t.Errorf("%q answered %q, want net/http's", path, got)
		}
	}
	// The hijacked state is told after Upgrade returns, which may be after
	// the client read the 101 and its close.
	testwait.For(t, "the upgrade's states", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return len(n.states) >= 2
	})
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.ups) != 1 || n.ups[0] != "GET /v1/ws?user_id=a host=x remote=true early=FRAME" {
		t.Errorf("upgrades %q", n.ups)
	}
	if fmt.Sprint(n.states) != fmt.Sprint([]http.ConnState{http.StateActive, http.StateHijacked}) {
		t.Errorf("states told %v, want active then hijacked", n.states)
	}
	if st := n.l.Stats(); st.Upgrades != 1 || st.Passed != 5 {
		t.Errorf("stats %+v", st)
	}
}

func TestKeepAliveAfterThePassedFirstRequest(t *testing.T) {
	n := start(t, wsaccept.Config{})
	c, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i := range 3 {
		fmt.Fprintf(c, "GET /r%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("http GET /r%d", i); string(b) != want {
			t.Errorf("request %d: %q, want %q", i, b, want)
		}
	}
}

func TestBadHeadsRefused(t *testing.T) {
	n := start(t, wsaccept.Config{MaxHeaderBytes: 1024})
	got := n.send(t, "GET /v1/ws HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 2000)+"\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 431") || !strings.Contains(got, `"code":"headers_too_large"`) {
		t.Errorf("oversized head answered %q", got)
	}
	got = n.send(t, "GET /v1/ws HTTP/1.1\r\nHost x\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 400") || !strings.Contains(got, `"code":"bad_request"`) {
		t.Errorf("malformed head answered %q", got)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.ups) != 0 {
		t.Errorf("bad heads upgraded: %q", n.ups)
	}
}

func TestSilentConnectionClosedAtTheHeaderTimeout(t *testing.T) {
	n := start(t, wsaccept.Config{HeaderTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a silent connection: read %v, want EOF (closed)", err)
	}
}

func TestCloseEndsHeadsBeingRead(t *testing.T) {
	n := start(t, wsaccept.Config{HeaderTimeout: time.Minute})
	c, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /v1/") // half a request line
	testwait.For(t, "the head being read", func() bool { return n.l.Reading() == 1 })
	closed := make(chan error, 1)
	go func() { closed <- n.l.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited on a head being read")
	}
	if _, err := n.l.Accept(); err == nil {
		t.Error("Accept after Close: no error")
	}
}

// TestTLSGoesToNetHTTPWhole: a TLS connection is not sorted (net/http
// must do its handshake to fill Request.TLS, which the origin rules
// read), so its requests — an upgrade included — reach net/http with TLS
// state.
func TestTLSGoesToNetHTTPWhole(t *testing.T) {
	ca := tlstest.NewCA(t)
	certFile, keyFile := ca.Issue(t, t.TempDir(), "127.0.0.1", 2)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inner := tls.NewListener(tcp, &tls.Config{Certificates: []tls.Certificate{cert}})
	upgraded := false
	l := wsaccept.New(inner, wsaccept.Config{Path: "/v1/ws", Upgrade: func(net.Conn, *bufio.Reader, *http.Request) bool {
		upgraded = true
		return false
	}})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls=%v path=%s", r.TLS != nil, r.URL.Path)
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}}
	for _, path := range []string{"/", "/v1/ws"} {
		resp, err := hc.Get("https://" + tcp.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := "tls=true path=" + path; string(b) != want {
			t.Errorf("GET %s over TLS: %q, want %q", path, b, want)
		}
	}
	if upgraded {
		t.Error("a TLS request was sorted off net/http")
	}
}

// Nothing is taken off the listener before the server asks for its first
// connection: an upgrade that arrives while the node is still starting
// (its gateway not yet running) waits for it instead of being handed over
// and refused.
func TestNothingTakenBeforeTheServerServes(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var upgrades atomic.Int32
	l := wsaccept.New(inner, wsaccept.Config{
		Path: "/v1/ws",
		Upgrade: func(c net.Conn, _ *bufio.Reader, _ *http.Request) bool {
			upgrades.Add(1)
			fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\n\r\n")
			_ = c.Close()
			return true
		},
	})
	defer l.Close()
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /v1/ws?user_id=a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	testwait.NothingWithin(100*time.Millisecond, "an upgrade handed over before the server serves")
	if n := upgrades.Load(); n != 0 {
		t.Fatalf("%d upgrades handed over before the server served", n)
	}
	srv := &http.Server{Handler: http.NotFoundHandler()}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(got), "HTTP/1.1 101") || upgrades.Load() != 1 {
		t.Errorf("once served, the waiting upgrade got %q (%d upgrades), want it taken", got, upgrades.Load())
	}
}

// A listener closed before it served closes cleanly.
func TestCloseBeforeServing(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := wsaccept.New(inner, wsaccept.Config{Path: "/v1/ws"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(); err == nil {
		t.Error("Accept after Close succeeded")
	}
}

// TestOneHeadDeadline: under a connection budget with a header timeout, a
// first request that is no upgrade has that long from the accept for its
// whole head, not the peek's time and then net/http's (both an hour here):
// then it is closed (a head cut short within the peek is answered 400).
func TestOneHeadDeadline(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	budget := connbudget.New(inner, connbudget.Config{Max: 10, HeaderTimeout: 200 * time.Millisecond})
	l := wsaccept.New(budget, wsaccept.Config{Path: "/v1/ws", HeaderTimeout: time.Hour,
		Upgrade: func(c net.Conn, _ *bufio.Reader, _ *http.Request) bool { c.Close(); return false }})
	srv := &http.Server{ReadHeaderTimeout: time.Hour, ConnState: budget.ConnState,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	for _, sent := range []string{"G", "GET /healthz HTTP/1.1\r\n"} { // in the peek, then past it
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, sent)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%q: the connection is open 10 s after its accept, with a header timeout of 200ms", sent)
		}
		if len(b) > 0 && !strings.Contains(string(b), " 400 ") {
			t.Errorf("%q: %q, want nothing or a 400", sent, b)
		}
	}
	if s := budget.Stats(); s.Open != 0 {
		t.Errorf("stats %+v, want every place back", s)
	}
}

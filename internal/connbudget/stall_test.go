package connbudget

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
)

// readResponse reads one answer from br, body included.
func readResponse(t *testing.T, c net.Conn, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// awaitClosed waits until the server closed c (EOF or a reset), failing
// the test if it has not within waitTimeout.
func awaitClosed(t *testing.T, what string, c net.Conn, br *bufio.Reader) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	_, err := br.ReadByte()
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s: the server did not close the connection within %s", what, waitTimeout)
	}
	if err == nil {
		t.Fatalf("%s: read a byte, want the connection closed", what)
	}
}

// TestAnswerBeforeTheBody: a request refused before its body was read is
// answered at once with Connection: close, though its body never comes,
// and the connection closed without waiting for it (net/http alone would
// read the body first, until its ReadTimeout).
func TestAnswerBeforeTheBody(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, Config{Max: 10})
	serveOn(t, bl, bl, &http.Server{ReadTimeout: time.Hour, WriteTimeout: time.Hour})
	c := dialFrom(t, "127.0.0.1", ln.Addr().String())
	br := bufio.NewReader(c)
	io.WriteString(c, "POST /auth HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
	resp, _ := readResponse(t, c, br)
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("answer %d, Connection %q: want 401 closing the connection", resp.StatusCode, resp.Header.Get("Connection"))
	}
	awaitClosed(t, "after the 401", c, br)
	testwait.For(t, "its place back", func() bool { return bl.Stats().Open == 0 })
}

// TestBodyReadKeepsTheConnection: a request whose body its handler reads
// to its end keeps its connection (no Connection: close), and is not
// pending once read; a chunked one is answered and its connection closed.
func TestBodyReadKeepsTheConnection(t *testing.T) {
	bl, addr := serve(t, Config{Max: 10})
	c := dialFrom(t, "127.0.0.1", addr)
	br := bufio.NewReader(c)
	for i := range 2 {
		fmt.Fprintf(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
		resp, body := readResponse(t, c, br)
		if resp.StatusCode != 200 || body != "hello" || resp.Close {
			t.Fatalf("request %d: %d %q, close %v: want 200 hello on a kept connection", i, resp.StatusCode, body, resp.Close)
		}
	}
	testwait.For(t, "idle", func() bool { s := bl.Stats(); return s.Idle == 1 && s.Pending == 0 })
	io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := readResponse(t, c, br)
	if resp.StatusCode != 200 || body != "hello" || !resp.Close {
		t.Fatalf("chunked: %d %q, close %v: want 200 hello closing the connection", resp.StatusCode, body, resp.Close)
	}
	awaitClosed(t, "after a chunked request (the request behind it unanswered)", c, br)
}

// TestStalledBodiesGiveWay: connections whose request body never comes,
// from four addresses each at its cap, fill the node; once they stalled, a
// client from another address takes the place of one of them.
func TestStalledBodiesGiveWay(t *testing.T) {
	bl, addr := serve(t, Config{Max: 8, PerAddr: 2, Stall: 50 * time.Millisecond})
	var held []net.Conn
	for a := 2; a <= 5; a++ {
		for range 2 {
			c := dialFrom(t, fmt.Sprintf("127.0.0.%d", a), addr)
			io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
			held = append(held, c)
			// In its body before the next begins: the ring's order.
			testwait.For(t, "waiting for the body", func() bool { return inBody(bl) == len(held) })
		}
	}
	testwait.For(t, "8 stalled in their bodies", func() bool { return stalledCount(bl) == 8 })
	if code, body := get(t, dialFrom(t, "127.0.0.6", addr), "/ok"); code != 200 {
		t.Fatalf("a client of another address: %d %s", code, body)
	}
	if s := bl.Stats(); s.Evicted != 1 || s.Refused != 0 {
		t.Fatalf("stats %+v, want one evicted, none refused", s)
	}
	if !closedByServer(held[0]) {
		t.Error("the oldest stalled connection is open")
	}
}

// inBody counts the connections whose body a handler waits for.
func inBody(bl *Listener) int {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	n := 0
	for c := bl.pending.head; c != nil; c = c.links[global].next {
		if c.st == stateBody {
			n++
		}
	}
	return n
}

// stalled reports whether c has stalled, checked now (no scan's bounds).
func (l *Listener) stalled(c *Conn, now int64) bool {
	return l.waitedOut(c, now) && !readable(c.Conn)
}

// TestStormIsNotEvicted: connections whose clients sent their whole
// request are never closed for others, however long the node takes to
// read them (a reconnect storm: the node is behind, not its clients), and
// each is served; beyond the pending cap they are all admitted.
func TestStormIsNotEvicted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, Config{Max: 100, Pending: 4, Stall: 50 * time.Millisecond})
	const n = 30
	var clients []net.Conn
	for range n {
		c := dialFrom(t, "127.0.0.1", ln.Addr().String())
		io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		clients = append(clients, c)
	}
	// Accepted (admitted), none read yet.
	held := make(chan net.Conn, n)
	for range n {
		c, err := bl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		held <- c
	}
	if s := bl.Stats(); s.Pending != n || s.Evicted != 0 {
		t.Fatalf("stats %+v, want all %d pending, none evicted", s, n)
	}
	serveOn(t, bl, &chanListener{Listener: bl, conns: held}, &http.Server{})
	for i, c := range clients {
		if code, _ := readStatus(t, c); code != http.StatusSwitchingProtocols {
			t.Fatalf("client %d: %d, want its upgrade", i, code)
		}
	}
	if s := bl.Stats(); s.Evicted != 0 || s.Refused != 0 {
		t.Fatalf("stats %+v, want none evicted or refused", s)
	}
}

// TestTLSStormIsNotEvicted: the same with TLS handshakes the node has not
// begun yet.
func TestTLSStormIsNotEvicted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg, ca := tlsConfig(t)
	bl := New(ln, Config{Max: 100, Pending: 4, Stall: 50 * time.Millisecond, TLS: cfg})
	tl := tls.NewListener(bl, cfg)
	const n = 12
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for range n {
		wg.Go(func() {
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: waitTimeout}, "tcp", ln.Addr().String(), ca.ClientConfig())
			if err != nil {
				t.Errorf("handshake: %v", err)
				return
			}
			defer c.Close()
			io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
			code, _ := readStatus(t, c)
			codes <- code
		})
	}
	held := make(chan net.Conn, n)
	for range n {
		c, err := tl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		held <- c
	}
	// Every ClientHello waits unread until the handshakes begin.
	testwait.For(t, "the client hellos in", func() bool {
		bl.mu.Lock()
		defer bl.mu.Unlock()
		k := 0
		for c := bl.pending.head; c != nil; c = c.links[global].next {
			if readable(c.Conn) {
				k++
			}
		}
		return k == n
	})
	serveOn(t, bl, &chanListener{Listener: tl, conns: held}, &http.Server{})
	wg.Wait()
	close(codes)
	k := 0
	for code := range codes {
		if code != http.StatusSwitchingProtocols {
			t.Errorf("a client got %d, want its upgrade", code)
		}
		k++
	}
	if s := bl.Stats(); k != n || s.Evicted != 0 || s.Refused != 0 {
		t.Fatalf("%d answered, stats %+v: want %d answered, none evicted or refused", k, s, n)
	}
}

// TestStalledNeedsSilence: a connection the node waited on for long is
// not stalled while bytes its client sent wait to be read.
func TestStalledNeedsSilence(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, Config{Max: 10, Stall: time.Second})
	cl := dialFrom(t, "127.0.0.1", ln.Addr().String())
	nc, err := bl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := nc.(*Conn)
	c.readSince.Store(mono() - int64(time.Hour)) // a read parked for an hour
	if !bl.stalled(c, mono()) {
		t.Fatal("a connection silent for an hour is not stalled")
	}
	io.WriteString(cl, "GET /")
	testwait.For(t, "the bytes in", func() bool { return readable(c.Conn) })
	if bl.stalled(c, mono()) {
		t.Fatal("stalled with the client's bytes unread: the node is behind, not the client")
	}
}

// TestHeadDeadlineIsAbsolute: the first request's head must arrive within
// HeaderTimeout of the accept, whatever deadlines the layers above set
// meanwhile (here an hour); once it is read, theirs hold again.
func TestHeadDeadlineIsAbsolute(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, Config{Max: 10, HeaderTimeout: 200 * time.Millisecond})
	serveOn(t, bl, bl, &http.Server{ReadHeaderTimeout: time.Hour, ReadTimeout: time.Hour})
	c := dialFrom(t, "127.0.0.1", ln.Addr().String())
	io.WriteString(c, "GET /ok HTTP/1.1\r\n") // and no more
	awaitClosed(t, "half a head", c, bufio.NewReader(c))

	// A head in time: its body may come after the head's deadline.
	c = dialFrom(t, "127.0.0.1", ln.Addr().String())
	io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
	time.Sleep(400 * time.Millisecond) // the scenario: the body comes past the head's 200 ms deadline
	io.WriteString(c, "hello")
	if resp, body := readResponse(t, c, bufio.NewReader(c)); resp.StatusCode != 200 || body != "hello" {
		t.Fatalf("a body after the head's deadline: %d %q", resp.StatusCode, body)
	}
}

// TestTLSHeadDeadlineIsAbsolute: over TLS the handshake and the head share
// the one deadline.
func TestTLSHeadDeadlineIsAbsolute(t *testing.T) {
	bl, addr, ca := serveTLS(t, Config{Max: 10, HeaderTimeout: 200 * time.Millisecond}, time.Hour)
	c := dialTLS(t, ca, addr)
	io.WriteString(c, "GET /ok HTTP/1.1\r\n")
	awaitClosed(t, "half a head after a handshake", c, bufio.NewReader(c))
	testwait.For(t, "its place back", func() bool { return bl.Stats().Open == 0 })
}

// readStatus reads the status line and headers of an answer on c.
func readStatus(t *testing.T, c net.Conn) (int, http.Header) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Errorf("reading an answer: %v", err)
		return 0, nil
	}
	return resp.StatusCode, resp.Header
}

// chanListener hands out the connections of conns, then blocks.
type chanListener struct {
	net.Listener
	conns chan net.Conn
}

func (l *chanListener) Accept() (net.Conn, error) {
	c, ok := <-l.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}

func (l *chanListener) Close() error {
	defer func() { recover() }() // closed twice
	close(l.conns)
	return nil
}

// TestRefusalAnswersTheRequest: a refused client reads the refusal — 503
// with Retry-After — as the answer to its request (an answer written
// before the request is dropped by HTTP clients: Go's reports an
// unsolicited response).
func TestRefusalAnswersTheRequest(t *testing.T) {
	bl, addr := serve(t, Config{Max: 1})
	if code, _ := get(t, dialFrom(t, "127.0.0.1", addr), "/hold"); code != 101 {
		t.Fatal("hold")
	}
	// The client's connections reach it once the listener refused them,
	// and what it wrote at once, if anything, is in.
	var refused uint64
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		refused++
		testwait.For(t, "refused", func() bool { return bl.Stats().Refused == refused })
		testwait.NothingWithin(200*time.Millisecond, "a refusal written before the request")
		return c, nil
	}
	client := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{DialContext: dial}}
	defer client.CloseIdleConnections()
	for i := range 3 {
		resp, err := client.Get("http://" + addr + "/ok")
		if err != nil {
			t.Fatalf("refusal %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if code, _ := jsonError(t, string(b)); resp.StatusCode != http.StatusServiceUnavailable || code != "too_many_connections" || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("refusal %d: %d %s, Retry-After %q", i, resp.StatusCode, b, resp.Header.Get("Retry-After"))
		}
	}
	if s := bl.Stats(); s.Refused != 3 {
		t.Fatalf("stats %+v, want 3 refused", s)
	}
}

// TestSilentStallsSooner: a client that has sent nothing since it
// connected has stalled after a fifth of Stall; one that began its
// request, only after Stall.
func TestSilentStallsSooner(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, Config{Max: 10, Stall: time.Hour})
	var conns [2]*Conn
	for i := range conns {
		cl := dialFrom(t, "127.0.0.1", ln.Addr().String())
		nc, err := bl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		conns[i] = nc.(*Conn)
		if i == 1 {
			io.WriteString(cl, "G")
			var b [1]byte
			if _, err := conns[i].Read(b[:]); err != nil {
				t.Fatal(err)
			}
		}
		conns[i].readSince.Store(mono() - int64(30*time.Minute)) // a read parked for half of Stall
	}
	if !bl.stalled(conns[0], mono()) {
		t.Error("a client silent since it connected, waited on for half of Stall, has not stalled")
	}
	if bl.stalled(conns[1], mono()) {
		t.Error("a client that began its request, waited on for half of Stall, has stalled")
	}
}

// TestAdmitChecksAreBounded: behind a storm of connections whose requests
// wait unread, an accept at the cap makes at most probeLimit readable
// checks, and none once it knows them all; a connection read since it was
// checked (its bytes may be gone) is checked again, and gives way if it
// stalled.
func TestAdmitChecksAreBounded(t *testing.T) {
	const n = 20
	bl, conns := behindListener(t, n, Config{Max: n})
	newcomer := fakeConn{addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)}}
	for i := 0; ; i++ {
		before := checks(bl)
		if _, _, r := bl.admit(newcomer); r == nil {
			t.Fatalf("accept %d: admitted beyond the cap, none stalled", i)
		}
		made := checks(bl) - before
		if made > probeLimit {
			t.Fatalf("accept %d made %d readable checks, want at most %d", i, made, probeLimit)
		}
		if made == 0 {
			break
		}
		if i > n {
			t.Fatalf("accept %d still made %d checks: the connections found readable are checked again", i, made)
		}
	}
	// The node reads one request (the connection is checked again) and
	// then waits on its client for an hour: it stalled.
	c := conns[n/2]
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	var buf [512]byte
	if _, err := c.Read(buf[:]); err != nil {
		t.Fatal(err)
	}
	c.readSince.Store(mono() - int64(time.Hour))
	before := checks(bl)
	_, victims, r := bl.admit(newcomer)
	if r != nil || len(victims) != 1 || victims[0] != c {
		t.Fatalf("refused %v, victims %d: want the stalled connection to give way", r, len(victims))
	}
	if made := checks(bl) - before; made != 1 {
		t.Fatalf("%d readable checks, want 1: the one read since", made)
	}
}

// TestCheckedAgainWhenIdle: a connection found with its request unread
// while pending is checked again once idle: the read that took the
// request may have begun before the check (here the inner connection's,
// which the listener does not count), and then no read begins before it
// is idle.
func TestCheckedAgainWhenIdle(t *testing.T) {
	bl, conns := behindListener(t, 1, Config{Max: 1})
	c := conns[0]
	newcomer := fakeConn{addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)}}
	if _, _, r := bl.admit(newcomer); r == nil {
		t.Fatal("admitted beyond the cap, the request unread")
	}
	c.Conn.SetReadDeadline(time.Now().Add(waitTimeout))
	var buf [512]byte
	if _, err := c.Conn.Read(buf[:]); err != nil {
		t.Fatal(err)
	}
	bl.ConnState(c, http.StateActive)
	bl.ConnState(c, http.StateIdle)
	if _, victims, r := bl.admit(newcomer); r != nil || len(victims) != 1 || victims[0] != c {
		t.Fatalf("refused %v, victims %d: want the idle connection to give way", r, len(victims))
	}
}

// TestFloodedRefusalsGiveWay: refused connections of a flood hold every
// goroutine that answers refusals — silent ones (waiting for a request)
// or answered ones their clients keep open (lingering) — and a client
// refused after them is still answered after its request, not before it
// (HTTP clients drop an answer that comes first): the flood's
// connection that held its place longest gives it up.
func TestFloodedRefusalsGiveWay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		request bool
	}{{"silent", false}, {"answered and kept open", true}} {
		t.Run(tc.name, func(t *testing.T) {
			bl, addr := serve(t, Config{Max: 1})
			if code, _ := get(t, dialFrom(t, "127.0.0.1", addr), "/hold"); code != 101 {
				t.Fatal("hold")
			}
			flood := 2 * cap(bl.answering)
			for i := range flood {
				c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i%8), addr)
				if tc.request {
					fmt.Fprintf(c, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
				}
			}
			testwait.For(t, "the flood refused", func() bool { return bl.Stats().Refused == uint64(flood) })
			c := dialFrom(t, "127.0.0.1", addr)
			testwait.For(t, "the client refused", func() bool { return bl.Stats().Refused == uint64(flood)+1 })
			testwait.NothingWithin(100*time.Millisecond, "a refusal written before the request")
			if readable(c) {
				t.Fatalf("the refusal was written before the request, behind %d connections of a flood", flood)
			}
			fmt.Fprintf(c, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, b := readResponse(t, c, bufio.NewReader(c))
			if code, _ := jsonError(t, b); resp.StatusCode != http.StatusServiceUnavailable || code != "too_many_connections" || resp.Header.Get("Retry-After") != "1" {
				t.Fatalf("%d %s, Retry-After %q", resp.StatusCode, b, resp.Header.Get("Retry-After"))
			}
		})
	}
}

package app_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/testwait"
)

// dialFrom connects to addr from the loopback source address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBodiesThatNeverCome: a request refused before its body was read is
// answered at once and its connection closed, though the body never
// comes; connections whose body never comes, from four addresses each at
// its cap, fill the node, and a client of another address still gets
// through.
func TestBodiesThatNeverCome(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		MaxConns: 8, MaxConnsPerAddr: 2, HeaderTimeout: 400 * time.Millisecond})

	c := dialFrom(t, "127.0.0.2", addr)
	fmt.Fprintf(c, "POST /v1/heartbeat HTTP/1.1\r\nHost: %s\r\nContent-Length: 100000\r\n\r\n{", addr)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a request without credentials whose body never comes: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("%d, Connection %q: want 401 closing the connection", resp.StatusCode, resp.Header.Get("Connection"))
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection is open after the 401")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the connection was not closed after the 401")
	}

	// With the API key, the handler waits for the body.
	for a := 2; a <= 5; a++ {
		for range 2 {
			c := dialFrom(t, fmt.Sprintf("127.0.0.%d", a), addr)
			fmt.Fprintf(c, "POST /v1/heartbeat HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: 100000\r\n\r\n{", addr, testKey)
		}
	}
	// Until they stalled, a newcomer is answered 503 with Retry-After
	// (call checks it); then it takes the place of one of them.
	testwait.For(t, "a client of another address answered", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz") // from 127.0.0.1
		if err != nil {
			t.Fatalf("GET /healthz under the flood: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
		return resp.StatusCode == http.StatusOK
	})
}

// TestSmugglingRefused: a request with both Content-Length and
// Transfer-Encoding, hiding another in its body, is answered 400 and its
// connection closed: the hidden request is never answered.
func TestSmugglingRefused(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1})
	c := dialFrom(t, "127.0.0.1", addr)
	fmt.Fprintf(c, "POST /v1/heartbeat HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", addr, testKey)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c) // to the close
	if err != nil {
		t.Fatalf("reading to the close: %v (%q)", err, b)
	}
	if !strings.HasPrefix(string(b), "HTTP/1.1 400 ") || !strings.Contains(string(b), `"bad_request"`) || strings.Count(string(b), "HTTP/1.1 ") != 1 {
		t.Fatalf("got %q, want one answer: 400 bad_request", b)
	}
}

// TestReconnectStorm: WebSockets opened all at once, far more than the
// pending cap (an eighth of MaxConns: 50) but below the other caps — the
// clients of a dead node reconnecting — all get through, and none is
// evicted: their clients sent their requests, the node was only behind.
func TestReconnectStorm(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		MaxConns: 400})
	const addrs, each = 6, 50
	var wg sync.WaitGroup
	errs := make(chan error, addrs*each)
	start := make(chan struct{})
	for a := range addrs {
		src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+a))}
		for i := range each {
			wg.Go(func() {
				tok, err := auth.Sign(testSecret, fmt.Sprintf("u%d-%d", a, i), "", time.Now(), time.Hour)
				if err != nil {
					errs <- err
					return
				}
				d := ws.Dialer{Timeout: 30 * time.Second, NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return (&net.Dialer{LocalAddr: src}).DialContext(ctx, network, addr)
				}}
				<-start
				nc, _, _, err := d.Dial(context.Background(), "ws://"+addr+"/v1/ws?token="+tok)
				if err != nil {
					errs <- err
					return
				}
				t.Cleanup(func() { nc.Close() })
			})
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a reconnect failed: %v", err)
	}
	_, metrics := call(t, addr, "GET", "/metrics", "")
	if !strings.Contains(metrics, "\npresenced_connections_evicted_total 0\n") {
		t.Errorf("connections evicted:\n%s", grepLines(metrics, "presenced_connections"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

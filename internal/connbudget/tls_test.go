package connbudget

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tlscert"
	"github.com/presenced/presenced/internal/tlscert/tlstest"
)

// serveTLS is serve with the TLS listener around the budgeted one, as the
// node serves HTTPS. handshakeTimeout is the server's ReadHeaderTimeout,
// which bounds the handshake.
func serveTLS(t *testing.T, cfg Config, handshakeTimeout time.Duration) (*Listener, string, *tlstest.CA) {
	t.Helper()
	var ca *tlstest.CA
	cfg.TLS, ca = tlsConfig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, cfg)
	serveOn(t, bl, tls.NewListener(bl, cfg.TLS), &http.Server{ReadHeaderTimeout: handshakeTimeout})
	return bl, ln.Addr().String(), ca
}

// tlsConfig is the server side of a certificate of a new CA.
func tlsConfig(t *testing.T) (*tls.Config, *tlstest.CA) {
	t.Helper()
	ca := tlstest.NewCA(t)
	certFile, keyFile := ca.Issue(t, t.TempDir(), "node", 2)
	store, err := tlscert.Load(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	return store.Config(), ca
}

func dialTLS(t *testing.T, ca *tlstest.CA, addr string) *tls.Conn {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: waitTimeout}, "tcp", addr, ca.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestTLSStates: through the TLS listener the budget still learns each
// connection's state from net/http: idle after a request, out of the
// pending and idle counts once hijacked (a WebSocket).
func TestTLSStates(t *testing.T) {
	bl, addr, ca := serveTLS(t, Config{Max: 10}, time.Minute)
	c := dialTLS(t, ca, addr)
	if code, body := get(t, c, "/ok"); code != 200 || body != "ok" {
		t.Fatalf("GET /ok over TLS: %d %q", code, body)
	}
	testwait.For(t, "the connection idle", func() bool { s := bl.Stats(); return s.Idle == 1 && s.Pending == 0 })
	h := dialTLS(t, ca, addr)
	if code, _ := get(t, h, "/hold"); code != 101 {
		t.Fatalf("hold: %d", code)
	}
	testwait.For(t, "the held connection neither pending nor idle", func() bool {
		s := bl.Stats()
		return s.Open == 2 && s.Idle == 1 && s.Pending == 0
	})
	// Its next request makes the idle one pending, then idle again.
	if code, _ := get(t, c, "/ok"); code != 200 {
		t.Fatalf("second GET: %d", code)
	}
	testwait.For(t, "idle again", func() bool { return bl.Stats().Idle == 1 })
}

// TestTLSHandshakesArePending: TCP connections that never finish a TLS
// handshake are pending, counted before any handshake: at the cap the
// oldest make room, and a client that handshakes gets through.
func TestTLSHandshakesArePending(t *testing.T) {
	bl, addr, ca := serveTLS(t, Config{Pending: 3, Stall: 50 * time.Millisecond}, time.Minute)
	var silent []net.Conn
	for range 3 {
		silent = append(silent, dialFrom(t, "127.0.0.1", addr))
	}
	testwait.For(t, "3 stalled", func() bool { return stalledCount(bl) == 3 })
	for range 2 {
		silent = append(silent, dialFrom(t, "127.0.0.1", addr))
	}
	testwait.For(t, "5 accepted", func() bool { s := bl.Stats(); return s.Pending+int(s.Evicted) == 5 })
	if s := bl.Stats(); s.Pending != 3 || s.Evicted != 2 {
		t.Fatalf("stats %+v, want 3 pending, 2 evicted", s)
	}
	for i, c := range silent {
		if got, want := closedByServer(c), i < 2; got != want {
			t.Errorf("silent connection %d closed: %v, want %v", i, got, want)
		}
	}
	if code, _ := get(t, dialTLS(t, ca, addr), "/ok"); code != 200 {
		t.Fatalf("a well-behaved TLS client: %d", code)
	}
}

// TestTLSHandshakeTimeout: a connection that starts no handshake is closed
// after the server's handshake limit, giving its place back.
func TestTLSHandshakeTimeout(t *testing.T) {
	bl, addr, _ := serveTLS(t, Config{Max: 10}, 100*time.Millisecond)
	c := dialFrom(t, "127.0.0.1", addr)
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	var b [1]byte
	if _, err := c.Read(b[:]); err == nil {
		t.Fatal("read a byte from a connection that sent nothing")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server did not close a connection without a handshake within %s", waitTimeout)
	}
	testwait.For(t, "its place back", func() bool { return bl.Stats().Open == 0 })
}

// TestTLSRefusalOverTLS: a connection refused at the cap gets the JSON 503
// over TLS, which its client can read.
func TestTLSRefusalOverTLS(t *testing.T) {
	bl, addr, ca := serveTLS(t, Config{Max: 1}, time.Minute)
	if code, _ := get(t, dialTLS(t, ca, addr), "/hold"); code != 101 {
		t.Fatal("hold")
	}
	c := dialTLS(t, ca, addr) // the handshake is the refusal's
	c.SetDeadline(time.Now().Add(waitTimeout))
	fmt.Fprintf(c, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the refusal over TLS: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if code, _ := jsonError(t, string(b)); resp.StatusCode != http.StatusServiceUnavailable || code != "too_many_connections" {
		t.Fatalf("refusal: %d %s", resp.StatusCode, b)
	}
	if s := bl.Stats(); s.Refused != 1 {
		t.Errorf("refused %d, want 1", s.Refused)
	}
}

// TestPlainRequestToTLS: a plain HTTP request on the TLS port gets a JSON
// 400 https_required, not net/http's plain text.
func TestPlainRequestToTLS(t *testing.T) {
	_, addr, _ := serveTLS(t, Config{Max: 10}, time.Minute)
	code, body := get(t, dialFrom(t, "127.0.0.1", addr), "/ok")
	if code != http.StatusBadRequest {
		t.Fatalf("plain request: %d %q", code, body)
	}
	if c, msg := jsonError(t, body); c != "https_required" {
		t.Errorf("code %q (%s), want https_required", c, msg)
	}
}

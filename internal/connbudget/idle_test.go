package connbudget

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/presenced/presenced/internal/testwait"
)

// heldConn is a connection of the Listener whose server can be held back
// from reading it: once it goes idle after a /pause request, the server's
// next read waits for resume (the node is behind on it).
type heldConn struct {
	net.Conn
	pause  atomic.Bool // hold the reads once idle
	held   atomic.Bool
	resume chan struct{}
	once   sync.Once
}

func (h *heldConn) NetConn() net.Conn { return h.Conn }

func (h *heldConn) Read(b []byte) (int, error) {
	if h.held.Load() {
		<-h.resume
	}
	return h.Conn.Read(b)
}

func (h *heldConn) release() { h.once.Do(func() { close(h.resume) }) }

// heldListener wraps each connection of a Listener in a heldConn.
type heldListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*heldConn
}

func (l *heldListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	h := &heldConn{Conn: nc, resume: make(chan struct{})}
	l.mu.Lock()
	l.conns = append(l.conns, h)
	l.mu.Unlock()
	return h, nil
}

type heldKey struct{}

// serveHeld runs an HTTP server on bl whose connections can be held back:
// /ok answers ok, /pause answers paused and holds back the server's reads
// of its connection once it is idle, until the connection's release.
func serveHeld(t *testing.T, bl *Listener) *heldListener {
	t.Helper()
	hl := &heldListener{Listener: bl}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("GET /pause", func(w http.ResponseWriter, r *http.Request) {
		r.Context().Value(heldKey{}).(*heldConn).pause.Store(true)
		io.WriteString(w, "paused")
	})
	srv := &http.Server{
		Handler: bl.Handler(mux),
		ConnContext: func(ctx context.Context, nc net.Conn) context.Context {
			return context.WithValue(bl.ConnContext(ctx, nc), heldKey{}, nc)
		},
		ConnState: func(nc net.Conn, s http.ConnState) {
			bl.ConnState(nc, s)
			// Idle, the server's read of the next request is about to
			// begin: held from here on (a background read of the
			// request before would wait with it, and the request
			// would not end).
			if h := nc.(*heldConn); s == http.StateIdle && h.pause.Load() {
				h.held.Store(true)
			}
		},
	}
	go srv.Serve(hl)
	t.Cleanup(func() {
		hl.mu.Lock()
		for _, h := range hl.conns {
			h.release()
		}
		hl.mu.Unlock()
		srv.Close()
	})
	return hl
}

// idleReadable counts the idle connections whose clients' bytes wait
// unread.
func idleReadable(bl *Listener) int {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	n := 0
	for c := bl.idle.head; c != nil; c = c.links[global].next {
		if readable(c.Conn) {
			n++
		}
	}
	return n
}

// TestIdleWithARequestIsNotEvicted: a keep-alive connection whose next
// request came, but which the node has not read yet (it is behind), is
// never closed for a newcomer, though it is idle and the oldest: another
// idle connection gives way, and when there is none the newcomer is
// refused. Its request is then served.
func TestIdleWithARequestIsNotEvicted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		src, from string // the idle connections' address, the newcomer's
		others    int    // idle connections without a request
		want      int    // the newcomer's answer
	}{
		{"node: another gives way", Config{Max: 2}, "127.0.0.1", "127.0.0.2", 1, http.StatusOK},
		{"address: another gives way", Config{PerAddr: 2}, "127.0.0.3", "127.0.0.3", 1, http.StatusOK},
		{"node: refused", Config{Max: 1}, "127.0.0.1", "127.0.0.2", 0, http.StatusServiceUnavailable},
		{"address: refused", Config{PerAddr: 1}, "127.0.0.3", "127.0.0.3", 0, http.StatusTooManyRequests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			bl := New(ln, tc.cfg)
			hl := serveHeld(t, bl)
			addr := ln.Addr().String()
			behind := dialFrom(t, tc.src, addr)
			if code, body := get(t, behind, "/pause"); code != 200 || body != "paused" {
				t.Fatalf("pause: %d %q", code, body)
			}
			testwait.For(t, "idle, the oldest", func() bool { return bl.Stats().Idle == 1 })
			var others []net.Conn
			for range tc.others {
				c := dialFrom(t, tc.src, addr)
				if code, _ := get(t, c, "/ok"); code != 200 {
					t.Fatalf("ok: %d", code)
				}
				others = append(others, c)
			}
			testwait.For(t, "idle", func() bool { return bl.Stats().Idle == 1+tc.others })
			// Its next request is in; the node does not read it.
			fmt.Fprintf(behind, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
			testwait.For(t, "the request in, unread", func() bool { return idleReadable(bl) == 1 })

			code, body := get(t, dialFrom(t, tc.from, addr), "/ok")
			if code != tc.want {
				t.Fatalf("the newcomer: %d %s, want %d", code, body, tc.want)
			}
			if s := bl.Stats(); s.Evicted != uint64(tc.others) {
				t.Fatalf("stats %+v, want %d evicted", s, tc.others)
			}
			for i, c := range others {
				if !closedByServer(c) {
					t.Errorf("idle connection %d without a request is open, want it closed for the newcomer", i)
				}
			}
			hl.mu.Lock()
			hl.conns[0].release()
			hl.mu.Unlock()
			if resp, body := readResponse(t, behind, bufio.NewReader(behind)); resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("the request the node was behind on: %d %q", resp.StatusCode, body)
			}
		})
	}
}

// Package wsaccept takes WebSocket upgrades off net/http. The clients'
// listener reads the head of each new connection's first request itself,
// into a pooled buffer: a GET of the WebSocket path goes straight to the
// gateway, anything else to net/http with the bytes already read in front.
//
// Why: net/http gives every connection a 4 KiB reader and a 4 KiB writer
// from its pools, and a Hijack hands both to the hijacker for good, so each
// WebSocket opened through it left ~10 KiB of garbage (reader, writer,
// response, server conn) — at 15,000 sockets the heap the runtime kept
// after the ramp was most of the node's memory per idle socket. Here the
// head is read with a reader that goes back to a pool once the gateway has
// the socket. TLS connections are left to net/http whole (see loop).
package wsaccept

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Listener.
type Config struct {
	// Path is the WebSocket path ("/v1/ws"): a first request "GET Path"
	// or "GET Path?…" is an upgrade.
	Path string
	// HeaderTimeout bounds the wait for a new connection's first request
	// head (a TLS handshake included). Default 5 s. A first request that
	// is no upgrade goes on to net/http, whose ReadHeaderTimeout starts
	// anew: over a connbudget.Listener, whose HeaderTimeout cuts every
	// read deadline of the first head, the two share one deadline.
	HeaderTimeout time.Duration
	// MaxHeaderBytes bounds an upgrade request's head. Default 32 KiB.
	MaxHeaderBytes int
	// Upgrade serves a WebSocket request read off conn. br holds what the
	// client sent after the head; it is valid until Upgrade returns.
	// Upgrade owns conn, and reports whether the upgrade took it (else it
	// answered and closed it).
	Upgrade func(conn net.Conn, br *bufio.Reader, r *http.Request) bool
	// State, if set, is told what net/http would tell its ConnState hook
	// of a connection it never sees: StateActive once an upgrade's head was
	// read, StateHijacked once Upgrade took the connection.
	State func(net.Conn, http.ConnState)
	// Refuse writes the answer to an upgrade request whose head cannot be
	// read (status 400 or 431, with a code and a message) on w; the
	// connection is closed after it.
	Refuse func(w io.Writer, status int, code, message string)
	Logger *slog.Logger
}

// Stats counts the connections a Listener sorted.
type Stats struct {
	Upgrades uint64 // first requests taken as WebSocket upgrades
	Passed   uint64 // connections handed to net/http
}

// Listener is a net.Listener for an http.Server that takes WebSocket
// upgrades off it.
type Listener struct {
	inner net.Listener
	cfg   Config
	conns chan net.Conn
	errs  chan error
	done  chan struct{}
	once  sync.Once
	start sync.Once // the accept loop, at the first Accept
	wg    sync.WaitGroup

	mu      sync.Mutex
	reading map[net.Conn]struct{} // connections whose first head is being read
	closed  bool                  // Close was called: no loop starts

	upgrades, passed atomic.Uint64
}

// readers are the buffers heads are read into.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// New returns a Listener over inner and starts accepting from it.
func New(inner net.Listener, cfg Config) *Listener {
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = 5 * time.Second
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = 32 << 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Listener{
		inner:   inner,
		cfg:     cfg,
		conns:   make(chan net.Conn),
		errs:    make(chan error, 1),
		done:    make(chan struct{}),
		reading: make(map[net.Conn]struct{}),
	}
	return l
}

// Accept returns the next connection for net/http. The first call starts
// taking connections off the inner listener: none is taken, and so no
// upgrade handed to Config.Upgrade, before the server serves (a node
// whose gateway does not run yet would refuse it).
func (l *Listener) Accept() (net.Conn, error) {
	l.start.Do(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.closed {
			l.wg.Add(1)
			go l.loop()
		}
	})
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, closes the connections whose first head is
// still being read and waits for their readers.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.done)
		err = l.inner.Close()
		l.mu.Lock()
		for c := range l.reading {
			_ = c.Close()
		}
		l.mu.Unlock()
	})
	l.wg.Wait()
	return err
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Stats returns the counts so far.
func (l *Listener) Stats() Stats {
	return Stats{Upgrades: l.upgrades.Load(), Passed: l.passed.Load()}
}

func (l *Listener) loop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		c, err := l.inner.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// What net/http does with a temporary failure (out of
				// files): wait a little and go on.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(delay):
					continue
				case <-l.done:
					return
				}
			}
			select {
			case l.errs <- err:
			case <-l.done:
			}
			return
		}
		delay = 0
		if _, ok := c.(*tls.Conn); ok {
			// net/http must see a *tls.Conn itself to do the handshake
			// and fill Request.TLS (the origin rules read it), which no
			// replayed connection can be; and a TLS socket is read by a
			// goroutine of its own anyway. So TLS connections go to
			// net/http untouched, their upgrades through it.
			l.passed.Add(1)
			select {
			case l.conns <- c:
				continue
			case <-l.done:
				_ = c.Close()
				return
			}
		}
		l.mu.Lock()
		select {
		case <-l.done:
			l.mu.Unlock()
			_ = c.Close()
			return
		default:
		}
		l.reading[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.sort(c)
	}
}

// limited reads at most n bytes more from r.
type limited struct {
	r io.Reader
	n int
}

func (lr *limited) Read(p []byte) (int, error) {
	if lr.n <= 0 {
		return 0, errHeadTooLarge
	}
	if len(p) > lr.n {
		p = p[:lr.n]
	}
	n, err := lr.r.Read(p)
	lr.n -= n
	return n, err
}

var errHeadTooLarge = errors.New("request head too large")

// sort reads the head of c's first request and hands c to the gateway or
// to net/http.
func (l *Listener) sort(c net.Conn) {
	defer l.wg.Done()
	done := func() {
		l.mu.Lock()
		delete(l.reading, c)
		l.mu.Unlock()
	}
	_ = c.SetReadDeadline(time.Now().Add(l.cfg.HeaderTimeout))
	lr := &limited{r: c, n: l.cfg.MaxHeaderBytes}
	br := readers.Get().(*bufio.Reader)
	br.Reset(lr)
	defer func() {
		br.Reset(nil)
		readers.Put(br)
	}()
	prefix := "GET " + l.cfg.Path
	head, err := br.Peek(len(prefix) + 1)
	if err != nil || !bytes.HasPrefix(head, []byte(prefix)) || (head[len(prefix)] != ' ' && head[len(prefix)] != '?') {
		if br.Buffered() == 0 {
			// Nothing came within the header timeout (or the handshake
			// failed): what net/http would do, close.
			done()
			_ = c.Close()
			return
		}
		pre := make([]byte, br.Buffered())
		_, _ = io.ReadFull(br, pre)
		_ = c.SetReadDeadline(time.Time{})
		done()
		l.passed.Add(1)
		select {
		case l.conns <- &replay{Conn: c, pre: pre}:
		case <-l.done:
			_ = c.Close()
		}
		return
	}
	r, err := http.ReadRequest(br)
	done()
	if err != nil {
		status, code, msg := http.StatusBadRequest, "bad_request", "malformed request: "+err.Error()
		if errors.Is(err, errHeadTooLarge) || lr.n <= 0 {
			status, code, msg = http.StatusRequestHeaderFieldsTooLarge, "headers_too_large", "the request line and headers exceed the limit of the node"
		}
		if l.cfg.Refuse != nil {
			_ = c.SetWriteDeadline(time.Now().Add(l.cfg.HeaderTimeout))
			l.cfg.Refuse(c, status, code, msg)
		}
		_ = c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	lr.n = 1 << 62 // what follows the head is the WebSocket's, unlimited
	r.RemoteAddr = c.RemoteAddr().String()
	if tc, ok := c.(*tls.Conn); ok {
		st := tc.ConnectionState()
		r.TLS = &st
	}
	if l.cfg.State != nil {
		l.cfg.State(c, http.StateActive)
	}
	l.upgrades.Add(1)
	if l.cfg.Upgrade(c, br, r) && l.cfg.State != nil {
		l.cfg.State(c, http.StateHijacked)
	}
}

// replay is a connection whose first bytes were read already: its reads
// return them first.
type replay struct {
	net.Conn
	pre []byte
}

func (c *replay) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		if len(c.pre) == 0 {
			c.pre = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// NetConn returns the connection under c (connbudget finds its own
// through it; crypto/tls names the same method).
func (c *replay) NetConn() net.Conn { return c.Conn }

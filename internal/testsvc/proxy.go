package testsvc

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a fault-injecting TCP proxy on 127.0.0.1 in front of one
// server, for partition tests: point a node at Addr instead of the server,
// then Stall the link (bytes stop flowing both ways and connections stay
// open, as when a network drops packets silently), Cut it (every
// connection is reset and new ones are refused, as when a route is gone)
// and Restore it. Safe for concurrent use.
type Proxy struct {
	Addr   string // "127.0.0.1:port" to dial instead of the server
	target string
	ln     net.Listener

	mu      sync.Mutex // guards the fields below
	stalled bool
	cut     bool
	resume  chan struct{} // closed by Restore: stalled copies go on
	conns   map[net.Conn]struct{}
	closed  bool

	wg sync.WaitGroup // the accept loop and every copy
}

// NewProxy starts a proxy to target ("host:port") for tb, closed at tb's
// cleanup.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := StartProxy(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// StartProxy starts a proxy to target; Close stops it.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln,
		resume: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			resetClose(c)
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			resetClose(c)
			continue
		}
		if !p.track(c, up) {
			resetClose(c)
			resetClose(up)
			continue
		}
		p.wg.Add(2)
		go p.copy(up, c)
		go p.copy(c, up)
	}
}

// track registers a pair of connections unless the proxy is cut or closed.
func (p *Proxy) track(a, b net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		return false
	}
	p.conns[a], p.conns[b] = struct{}{}, struct{}{}
	return true
}

// copy moves bytes from src to dst until either ends, holding them back
// while the proxy is stalled.
func (p *Proxy) copy(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
		resetClose(dst)
		resetClose(src)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitFlowing() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// waitFlowing waits while the proxy is stalled; it reports false if the
// proxy was cut or closed meanwhile.
func (p *Proxy) waitFlowing() bool {
	for {
		p.mu.Lock()
		stalled, dead, resume := p.stalled, p.cut || p.closed, p.resume
		p.mu.Unlock()
		if dead {
			return false
		}
		if !stalled {
			return true
		}
		<-resume
	}
}

// Stall stops every byte in both directions; connections stay open and new
// ones are accepted (and stall too) until Restore.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = true
}

// Cut resets every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = make(map[net.Conn]struct{})
	resume := p.resume
	p.resume = make(chan struct{})
	p.mu.Unlock()
	close(resume) // stalled copies notice the cut
	for c := range conns {
		resetClose(c)
	}
}

// Restore ends a stall or a cut: held bytes flow on (after a stall) and
// new connections are accepted.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.stalled, p.cut = false, false
	resume := p.resume
	p.resume = make(chan struct{})
	p.mu.Unlock()
	close(resume)
}

// Close stops the proxy and closes every connection. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	conns := p.conns
	p.conns = make(map[net.Conn]struct{})
	resume := p.resume
	p.resume = make(chan struct{})
	p.mu.Unlock()
	close(resume)
	_ = p.ln.Close()
	for c := range conns {
		resetClose(c)
	}
	p.wg.Wait()
}

// resetClose closes c with a reset (no orderly shutdown), as a failed
// route does.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// Package connbudget keeps clients from using up a node's connections: a
// net.Listener that caps the open connections overall, per source address
// and, among them, those the node waits on to send a request (pending: its
// head, its TLS handshake, or a body a handler reads), so that a flood of
// idle or slow connections can neither exhaust the file limit nor hold the
// node's memory, nor lock other clients out.
//
// At a cap, a new connection takes the place of the cheapest one to lose:
// the oldest that stalled (the node waited on its client for Config.Stall
// and nothing it sent waits unread), then the oldest idle keep-alive
// connection whose next request has not come. A client that sent its
// request is never closed for another. Only when there is neither is the
// newcomer refused, with JSON and Retry-After (429, or 503 at the node's
// cap); the pending cap never refuses. The first request's head must
// arrive within Config.HeaderTimeout of the accept, over every layer.
//
// The listener learns each connection's state from net/http (ConnState)
// and of a body through Handler and ConnContext; Handler also answers a
// request refused before its body was read at once, and its connections
// turn net/http's own plain-text answers (400, 431, 501, 505) into JSON.
// Under TLS
// (tls.NewListener around it, Config.TLS) the caps count TCP connections
// from their accept. The limits and their defaults are in
// docs/configuration.md ("Limits"); the layers, in docs/operations.md
// ("TLS and browser origins").
package connbudget

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config sets the caps. A cap of 0 is no cap.
type Config struct {
	// Max caps the open connections: HTTP and WebSocket.
	Max int
	// PerAddr caps the open connections of one source address (an IPv4
	// address, an IPv6 /64).
	PerAddr int
	// Pending caps the connections the node waits on to send a request:
	// new ones, idle ones that began the next, and those whose body a
	// handler reads. Beyond it, a new connection closes the oldest
	// stalled one, if any (it is never refused for it).
	Pending int
	// HeaderTimeout bounds the time from a connection's accept to the end
	// of its first request's head, a TLS handshake included. 0: no bound
	// of the listener's own.
	HeaderTimeout time.Duration
	// Stall is how long the node must have waited on a pending
	// connection's client, in all, before the connection may be closed
	// for another; a fifth of it, for one whose client has sent nothing
	// since its accept (an honest client sends its request, or its TLS
	// hello, as it connects). Default: half of HeaderTimeout, or 1 s
	// without one.
	Stall time.Duration
	// MaxHeaderBytes is the server's header limit, named by the 431.
	MaxHeaderBytes int
	Logger         *slog.Logger
	// TLS is the configuration of the TLS listener around this one, if
	// any: refusals are then written over TLS, after a handshake (when
	// the goroutines that answer refusals are all busy, a refused TLS
	// connection is closed without a word).
	TLS *tls.Config
}

// Defaults derives the caps from the process's file limit: a reserve of
// one sixteenth (at least 100) stays for the node's own files and backend
// connections, the rest is Max, and the other caps follow from it
// (ForMax).
func Defaults(fileLimit uint64) Config {
	limit := int(min(fileLimit, 1<<30))
	reserve := max(100, limit/16)
	return ForMax(max(64, limit-reserve))
}

// ForMax derives the caps from a cap of n open connections: one source
// address may hold a quarter of them, and pending connections an eighth
// (at most 1,024); both at least 16, and never more than n.
func ForMax(n int) Config {
	return Config{
		Max:     n,
		PerAddr: min(n, max(16, n/4)),
		Pending: min(n, 1024, max(16, n/8)),
	}
}

// FileLimit is the process's limit of open files (RLIMIT_NOFILE, which the
// Go runtime raised to the hard limit at start), or 1,024 if it cannot be
// read.
func FileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	return rl.Cur
}

// Stats are the listener's counters.
type Stats struct {
	Open    int // connections open now
	Pending int // of them, waited on to send a request (head, TLS handshake, body)
	Idle    int // of them, idle keep-alive connections
	Refused uint64
	Evicted uint64 // closed to make room for a new connection
}

// Listener is a net.Listener with the caps of Config.
type Listener struct {
	net.Listener
	cfg   Config
	log   *slog.Logger
	stall int64 // cfg.Stall in nanoseconds
	quiet int64 // a fifth of it: for a connection silent since its accept

	mu      sync.Mutex
	open    int
	addrs   map[netip.Prefix]*addr
	pending ring   // all pending connections, oldest first
	idle    ring   // all idle connections, oldest first
	probes  uint64 // readable checks made

	refused atomic.Uint64
	evicted atomic.Uint64
	// answering bounds the goroutines that answer refused connections
	// and let closed ones linger.
	answering chan struct{}
	// placesMu guards places: the connections that hold an answering
	// goroutine (refused ones waiting for their request or answered,
	// closed ones lingering), oldest first.
	placesMu sync.Mutex
	places   []*place
}

// place is a connection an answering goroutine holds.
type place struct {
	nc    net.Conn
	state atomic.Int32 // placeWaiting, placeAnswering, placeDraining, placeTaken
}

const (
	placeWaiting   = iota // refused, waiting for its request
	placeAnswering        // its request came (or the wait ended): being answered
	placeDraining         // answered: reading what its client still sends
	placeTaken            // closed for a newer connection, which took its place
)

// addr is what one source address holds.
type addr struct {
	l       *Listener
	key     netip.Prefix
	n       int
	pending ring
	idle    ring
}

// New wraps ln.
func New(ln net.Listener, cfg Config) *Listener {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Stall <= 0 {
		cfg.Stall = time.Second
		if cfg.HeaderTimeout > 0 {
			cfg.Stall = cfg.HeaderTimeout / 2
		}
	}
	return &Listener{
		Listener:  ln,
		cfg:       cfg,
		log:       log,
		stall:     int64(cfg.Stall),
		quiet:     int64(cfg.Stall) / 5,
		addrs:     make(map[netip.Prefix]*addr),
		answering: make(chan struct{}, 32),
	}
}

// Stats returns the counters.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Open: l.open, Pending: l.pending.n, Idle: l.idle.n,
		Refused: l.refused.Load(), Evicted: l.evicted.Load()}
}

// Accept returns the next connection the caps admit; connections refused
// meanwhile are answered and closed.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c, victims, refusal := l.admit(nc)
		for _, v := range victims {
			l.evicted.Add(1)
			_ = v.Conn.Close() // at once: its client stalled
		}
		if refusal != nil {
			l.refused.Add(1)
			l.answer(nc, refusal)
			continue
		}
		return c, nil
	}
}

// refusal is the answer to a connection the caps leave no room for.
type refusal struct {
	status  int
	message string
}

// scanLimit bounds the connections looked at, oldest first, when a cap is
// reached: pending ones for a stalled one, idle ones for one without a
// request.
const scanLimit = 64

// probeLimit bounds the readable checks (a system call each, under l.mu)
// of one admit. A connection found with bytes unread is not checked again
// until its next read begins or it changes state (the bytes wait until
// then), so an accept at a cap while the node is behind on a storm does
// a small, constant amount of work, and each connection is checked about
// once a read. A connection the checks left cannot reach is not closed:
// when none is found, the newcomer is refused with Retry-After, and the
// next accept looks further.
const probeLimit = 8

// scan is what one admit may still do: the time it looks at, and the
// readable checks it has left.
type scan struct {
	now    int64
	probes int
}

// admit registers nc as a pending connection, choosing the connections to
// close to make room for it, or refuses it.
func (l *Listener) admit(nc net.Conn) (*Conn, []*Conn, *refusal) {
	key := prefixOf(nc.RemoteAddr())
	sc := scan{now: mono(), probes: probeLimit}
	c := &Conn{Conn: nc, l: l, key: key}
	if l.cfg.HeaderTimeout > 0 {
		c.headEnd.Store(time.Now().Add(l.cfg.HeaderTimeout).UnixNano())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.addrs[key]
	if a == nil {
		a = &addr{l: l, key: key}
	}
	var victims []*Conn
	if l.cfg.PerAddr > 0 && a.n >= l.cfg.PerAddr {
		v := l.stalledLocked(&a.pending, local, &sc)
		if v == nil {
			v = l.idleLocked(&a.idle, local, &sc)
		}
		if v == nil {
			return nil, nil, &refusal{http.StatusTooManyRequests,
				fmt.Sprintf("this address holds %d connections, the most one address may hold; close one first", a.n)}
		}
		victims = append(victims, l.releaseLocked(v))
	}
	if l.cfg.Max > 0 && l.open >= l.cfg.Max {
		v := l.stalledLocked(&l.pending, global, &sc)
		if v == nil {
			v = l.idleLocked(&l.idle, global, &sc)
		}
		if v == nil {
			return nil, nil, &refusal{http.StatusServiceUnavailable,
				fmt.Sprintf("the node holds %d connections, the most it takes; retry later", l.open)}
		}
		victims = append(victims, l.releaseLocked(v))
	}
	if l.cfg.Pending > 0 && l.pending.n >= l.cfg.Pending {
		if v := l.stalledLocked(&l.pending, global, &sc); v != nil {
			victims = append(victims, l.releaseLocked(v))
		}
	}
	if a.n == 0 {
		l.addrs[key] = a
	}
	c.a = a
	l.open++
	a.n++
	l.setLocked(c, statePending)
	return c, victims, nil
}

// stalledLocked returns the oldest connection of r (of the node's rings
// or an address's: which) that stalled, looking at the scanLimit oldest;
// nil if none did, as far as sc's checks tell.
func (l *Listener) stalledLocked(r *ring, which int, sc *scan) *Conn {
	n := 0
	for c := r.head; c != nil && n < scanLimit; c = c.links[which].next {
		if l.waitedOut(c, sc.now) && l.drainedLocked(c, sc) {
			return c
		}
		n++
	}
	return nil
}

// idleLocked returns the oldest connection of r (idle, of the node's
// rings or an address's: which) whose client has not begun its next
// request, looking at the scanLimit oldest; nil if none. One whose next
// request came, though the node has not read it yet (it is behind), is
// never closed for another: most clients would not send it again.
func (l *Listener) idleLocked(r *ring, which int, sc *scan) *Conn {
	n := 0
	for c := r.head; c != nil && n < scanLimit; c = c.links[which].next {
		if l.drainedLocked(c, sc) {
			return c
		}
		n++
	}
	return nil
}

// drainedLocked reports whether nothing c's client sent waits unread,
// with one of sc's checks; false when c was found with bytes unread since
// its last read began, in this state, or when sc has no check left.
func (l *Listener) drainedLocked(c *Conn, sc *scan) bool {
	reads := c.reads.Load() // before the check: a read begun after it makes it stale
	if c.unread && c.unreadAt == reads {
		return false
	}
	if sc.probes == 0 {
		return false
	}
	sc.probes--
	l.probes++
	if readable(c.Conn) {
		c.unread, c.unreadAt = true, reads
		return false
	}
	return true
}

// answer writes r to a refused connection and closes it. One of a
// bounded number of goroutines waits for the client's request (its first
// bytes: an answer that comes before the request is no answer to it, and
// HTTP clients drop it), writes the answer after it and lingers (drain);
// over TLS it first does the handshake. The whole takes at most a second.
// When those goroutines are all busy, one of them is taken (hold); only
// when none can be is a plain answer written at once and the connection
// closed.
func (l *Listener) answer(nc net.Conn, r *refusal) {
	msg := jsonResponse(r.status, "too_many_connections", r.message, "Retry-After: 1\r\n")
	p := l.hold(nc, placeWaiting)
	if p == nil {
		if l.cfg.TLS == nil {
			_ = nc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			_, _ = nc.Write(msg)
		}
		_ = nc.Close()
		return
	}
	go func() {
		defer l.free(p)
		_ = nc.SetDeadline(time.Now().Add(time.Second))
		conn := nc
		if l.cfg.TLS != nil {
			tc := tls.Server(nc, l.cfg.TLS)
			if err := tc.Handshake(); err != nil {
				_ = nc.Close()
				return
			}
			conn = tc
		}
		var buf [4096]byte
		_, _ = conn.Read(buf[:]) // nothing within the second: answered all the same
		if !p.state.CompareAndSwap(placeWaiting, placeAnswering) {
			return // taken: closed
		}
		if _, err := conn.Write(msg); err != nil {
			_ = nc.Close()
			return
		}
		if p.state.CompareAndSwap(placeAnswering, placeDraining) {
			drain(nc, buf[:])
		}
	}()
}

// linger closes nc, whose answer was written, so that the answer is not
// lost to a reset (which closing a socket with unread bytes sends): one of
// the answering goroutines lingers (drain) for up to a second. When none
// is free or can be taken, nc is closed at once.
func (l *Listener) linger(nc net.Conn) {
	p := l.hold(nc, placeDraining)
	if p == nil {
		_ = nc.Close()
		return
	}
	go func() {
		defer l.free(p)
		_ = nc.SetReadDeadline(time.Now().Add(time.Second))
		var buf [4096]byte
		drain(nc, buf[:])
	}()
}

// hold gives nc one of the answering goroutines' places, in state, or
// returns nil when all are held and none can be taken: the refused
// connection that has waited longest without sending a byte — a flood's
// silent connection, which no answer would reach anyway — or else the
// longest draining one with nothing unread (closing it loses nothing: its
// answer is out, and only unread bytes make a close a reset). So a flood
// that holds every place cannot keep a newcomer from its answer.
func (l *Listener) hold(nc net.Conn, state int32) *place {
	select {
	case l.answering <- struct{}{}:
	default:
		if !l.take() {
			return nil
		}
	}
	p := &place{nc: nc}
	p.state.Store(state)
	l.placesMu.Lock()
	l.places = append(l.places, p)
	l.placesMu.Unlock()
	return p
}

// take closes a held connection that can give its place up (hold), whose
// place the caller then holds; it reports whether there was one.
func (l *Listener) take() bool {
	l.placesMu.Lock()
	defer l.placesMu.Unlock()
	for _, from := range [...]int32{placeWaiting, placeDraining} {
		for i, p := range l.places {
			if p.state.Load() != from || from == placeDraining && readable(p.nc) {
				continue
			}
			if p.state.CompareAndSwap(from, placeTaken) {
				l.places = slices.Delete(l.places, i, i+1)
				_ = p.nc.Close()
				return true
			}
		}
	}
	return false
}

// free ends p's hold of its place, unless it was taken (its taker holds
// the place now).
func (l *Listener) free(p *place) {
	l.placesMu.Lock()
	defer l.placesMu.Unlock()
	if p.state.Swap(placeTaken) == placeTaken {
		return
	}
	if i := slices.Index(l.places, p); i >= 0 {
		l.places = slices.Delete(l.places, i, i+1)
	}
	<-l.answering
}

// drain closes nc's writing half, reads what its client still sends (up to
// 64 KiB, until its read deadline), and closes it.
func drain(nc net.Conn, buf []byte) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	for range 16 {
		if _, err := nc.Read(buf); err != nil {
			break
		}
	}
	_ = nc.Close()
}

// ConnState is the http.Server's ConnState hook: it moves a connection
// between pending, busy and idle as net/http serves it.
func (l *Listener) ConnState(nc net.Conn, s http.ConnState) {
	c := l.own(nc)
	if c == nil {
		return
	}
	switch s {
	case http.StateActive:
		l.set(c, stateBusy)
		c.endHead()
	case http.StateIdle:
		l.set(c, stateIdle)
	case http.StateHijacked:
		l.set(c, stateHijacked)
		c.endHead()
	}
}

// own returns the connection of l under nc, or nil.
func (l *Listener) own(nc net.Conn) *Conn {
	c, ok := nc.(*Conn)
	for !ok {
		// A *tls.Conn (or a connection whose first bytes were read
		// already, wsaccept) around one of ours.
		u, wrapped := nc.(interface{ NetConn() net.Conn })
		if !wrapped {
			break
		}
		nc = u.NetConn()
		c, ok = nc.(*Conn)
	}
	if !ok || c.l != l {
		return nil
	}
	return c
}

func (l *Listener) set(c *Conn, st state) {
	l.mu.Lock()
	l.setLocked(c, st)
	l.mu.Unlock()
}

// setLocked moves c to st (a closed connection stays closed).
func (l *Listener) setLocked(c *Conn, st state) {
	if c.st == stateClosed || c.st == st {
		return
	}
	switch c.st {
	case statePending, stateBody:
		l.pending.remove(c, global)
		c.a.pending.remove(c, local)
	case stateIdle:
		l.idle.remove(c, global)
		c.a.idle.remove(c, local)
	}
	if c.st != stateBody && st == statePending {
		// A new request: the node has not waited on it yet, nor read
		// its head.
		if c.waited.Load() != 0 {
			c.waited.Store(0)
		}
		if c.readSince.Load() != 0 {
			c.readSince.Store(0)
		}
		c.head = headScan{}
		if c.mixed.Load() {
			c.mixed.Store(false)
		}
	}
	c.st = st
	c.unread = false
	if r := st == stateIdle; c.reading.Load() != r {
		c.reading.Store(r)
	}
	if w := st == statePending || st == stateBody; c.watch.Load() != w {
		c.watch.Store(w)
	}
	switch st {
	case statePending, stateBody:
		l.pending.push(c, global)
		c.a.pending.push(c, local)
	case stateIdle:
		l.idle.push(c, global)
		c.a.idle.push(c, local)
	}
}

// releaseLocked takes c out of the counts (once) and returns it, to be
// closed outside the lock.
func (l *Listener) releaseLocked(c *Conn) *Conn {
	if c.st == stateClosed {
		return c
	}
	l.setLocked(c, stateClosed)
	l.open--
	c.a.n--
	if c.a.n == 0 {
		delete(l.addrs, c.key)
	}
	return c
}

// prefixOf is the source address a connection counts against: the IPv4
// address, or the /64 of an IPv6 address (one host's share of a network).
func prefixOf(a net.Addr) netip.Prefix {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			ip = ap.Addr()
		}
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

type state uint8

const (
	stateNone     state = iota // not yet admitted
	statePending               // accepted, or idle and sending the next request
	stateBusy                  // a request in flight
	stateBody                  // a request in flight whose body a handler waits for
	stateIdle                  // keep-alive, between two requests
	stateHijacked              // a WebSocket
	stateClosed
)

// Conn is a connection the Listener admitted. Closing it gives its place
// back.
type Conn struct {
	net.Conn
	l   *Listener
	key netip.Prefix
	a   *addr
	st  state // guarded by l.mu
	// reading is set while the connection is idle: its next read with
	// bytes makes it pending again (a request begun).
	reading atomic.Bool
	// watch is set while the connection is pending: its reads are waits
	// on its client, counted in waited (nanoseconds, this request) and,
	// while one lasts, readSince (mono when it began; 0: none).
	watch     atomic.Bool
	waited    atomic.Int64
	readSince atomic.Int64
	// heard: the client has sent a byte since the accept.
	heard atomic.Bool
	// reads counts the reads begun while pending. unread (guarded by
	// l.mu): the connection was found, in its state, with bytes its
	// client sent waiting unread when reads was unreadAt; they wait
	// until the next read begins.
	reads    atomic.Uint32
	unread   bool
	unreadAt uint32
	// headEnd is the deadline of the first request's head (Unix
	// nanoseconds; 0: none, or the head is read): read deadlines set
	// before it are cut to it, and wantRead (likewise) is the one the
	// layers above asked for, set when the head is read.
	headEnd  atomic.Int64
	wantRead atomic.Int64
	// linger: the connection is closed with bytes of a request unread
	// (Handler): its close lingers (Listener.linger).
	linger atomic.Bool
	// head scans the head of the request being read (plain connections:
	// the reads are the head's bytes), set to the start of a head with
	// the pending state, by the goroutine that reads it; mixed tells
	// that it has both Content-Length and Transfer-Encoding (Handler).
	head   headScan
	mixed  atomic.Bool
	links  [2]link // in the Listener's ring of its state, and its address's
	closed atomic.Bool
}

// epoch is the origin of mono.
var epoch = time.Now()

// mono is a monotonic clock in nanoseconds, never 0.
func mono() int64 { return int64(time.Since(epoch)) + 1 }

// Read reads from the connection; bytes of a new request on an idle
// connection make it pending until its headers are read.
func (c *Conn) Read(b []byte) (int, error) {
	if !c.watch.Load() {
		n, err := c.Conn.Read(b)
		if n > 0 && c.reading.Load() {
			c.l.set(c, statePending)
			c.scan(b[:n])
		}
		return n, err
	}
	c.reads.Add(1)
	t0 := mono()
	c.readSince.Store(t0)
	n, err := c.Conn.Read(b)
	c.readSince.Store(0)
	c.waited.Add(mono() - t0)
	if n > 0 {
		if !c.heard.Load() {
			c.heard.Store(true)
		}
		c.scan(b[:n])
	}
	return n, err
}

// scan reads b, bytes of a plain connection's request head, for the
// fields that say its length.
func (c *Conn) scan(b []byte) {
	if c.l.cfg.TLS != nil || c.head.done {
		return
	}
	if c.head.feed(b) {
		c.mixed.Store(true)
	}
}

// waitedOut reports whether the node has waited on c's client for Stall
// in all, this request (a fifth of it if the client has sent nothing
// since the accept). c has stalled if, besides, nothing the client sent
// waits to be read (else the node is behind, not the client).
func (l *Listener) waitedOut(c *Conn, now int64) bool {
	w := c.waited.Load()
	if s := c.readSince.Load(); s != 0 {
		w += now - s
	}
	limit := l.stall
	if !c.heard.Load() {
		limit = l.quiet
	}
	return w >= limit
}

// SetReadDeadline sets the read deadline, cut to the deadline of the first
// request's head while it is read.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if end := c.headEnd.Load(); end != 0 {
		var want int64
		if !t.IsZero() {
			want = t.UnixNano()
		}
		c.wantRead.Store(want)
		if want == 0 || want > end {
			t = time.Unix(0, end)
		}
	}
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets both deadlines, the read one as SetReadDeadline does.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// endHead lifts the deadline of the first request's head, once it is
// read, for the one the layers above set.
func (c *Conn) endHead() {
	if c.headEnd.Load() == 0 || c.headEnd.Swap(0) == 0 {
		return
	}
	var t time.Time
	if want := c.wantRead.Load(); want != 0 {
		t = time.Unix(0, want)
	}
	_ = c.Conn.SetReadDeadline(t)
}

// Write writes to the connection, turning net/http's plain-text answer to
// an unreadable request into JSON.
func (c *Conn) Write(b []byte) (int, error) {
	if len(b) > 12 && b[0] == 'H' && (b[9] == '4' || b[9] == '5') {
		if j, ok := rewrite(b, c.l.cfg.MaxHeaderBytes); ok {
			if _, err := c.Conn.Write(j); err != nil {
				return 0, err
			}
			return len(b), nil
		}
	}
	return c.Conn.Write(b)
}

// Close closes the connection and gives its place back.
func (c *Conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.mu.Lock()
		c.l.releaseLocked(c)
		c.l.mu.Unlock()
		if c.linger.Load() {
			c.l.linger(c.Conn)
			return nil
		}
	}
	return c.Conn.Close()
}

// Detach hands c's place to the caller, which took c's file descriptor
// (a copy of it: the WebSocket gateway reads and writes an idle socket
// itself, without the net.Conn, its netFD, addresses and poll
// descriptor, ~0.5 KiB a socket). From then on Close closes c without
// giving the place back; the caller calls release once, when it closes
// its descriptor, and until then the socket counts as open. It reports
// false, and returns nil, when c is closed already.
func (c *Conn) Detach() (release func(), ok bool) {
	if !c.closed.CompareAndSwap(false, true) {
		return nil, false
	}
	l := c.l
	l.mu.Lock()
	if c.st == stateClosed {
		l.mu.Unlock()
		return nil, false
	}
	// Out of every ring, still counted in open and in its address's n.
	l.setLocked(c, stateClosed)
	l.mu.Unlock()
	return c.a.release, true // 16 bytes: the socket's address holds the rest
}

// release gives back the place of one of a's connections.
func (a *addr) release() {
	a.l.mu.Lock()
	a.l.open--
	a.n--
	if a.n == 0 {
		delete(a.l.addrs, a.key)
	}
	a.l.mu.Unlock()
}

// SyscallConn lets the WebSocket gateway poll the socket itself.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.New("connbudget: the connection has no file descriptor")
}

// CloseWrite half-closes a TCP connection (net/http uses it after a 431).
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// A ring is an intrusive doubly linked list of connections, oldest first;
// a connection is in at most one global and one local ring at a time.
type ring struct {
	head, tail *Conn
	n          int
}

type link struct{ prev, next *Conn }

const (
	global = 0 // the Listener's ring
	local  = 1 // the address's ring
)

func (r *ring) push(c *Conn, which int) {
	c.links[which] = link{prev: r.tail}
	if r.tail != nil {
		r.tail.links[which].next = c
	} else {
		r.head = c
	}
	r.tail = c
	r.n++
}

func (r *ring) remove(c *Conn, which int) {
	lk := c.links[which]
	if lk.prev != nil {
		lk.prev.links[which].next = lk.next
	} else {
		r.head = lk.next
	}
	if lk.next != nil {
		lk.next.links[which].prev = lk.prev
	} else {
		r.tail = lk.prev
	}
	c.links[which] = link{}
	r.n--
}

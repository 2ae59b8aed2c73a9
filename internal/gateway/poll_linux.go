//go:build linux

package gateway

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"
)

// poller hands readable connections to workers.
type poller interface {
	start()
	stop()
	add(c *conn) error
	remove(c *conn)
}

// epoller is one epoll instance and a bounded pool of reading workers. A
// connection is registered edge-triggered: each arrival of bytes is one
// event, and the connection's read state (conn.rstate) hands it to one
// worker at a time, which reads what is there without ever waiting; bytes
// that arrive while a worker has it make that worker read again. No
// system call re-arms a connection after a read. An idle connection costs
// an epoll entry and nothing else.
//
// A second epoll instance (wepfd, its own loop) serves the rare waits of
// a writer: a socket whose send buffer is full (a client slow to read)
// and a closing socket lingering for its client's FIN. The connection's
// descriptor is its own (detach), not the runtime's, so the runtime's
// poller cannot wait for it.
//
// The loops wait for their epoll instances through the runtime's poller
// (an epoll descriptor is readable while it has events), so a waiting
// loop holds a goroutine, not an OS thread.
type epoller struct {
	g       *Gateway
	epfd    int
	epf     *os.File // epfd, for the runtime's poller
	wepfd   int      // the writers' waits; -1 once closed (guarded by wepMu)
	wepf    *os.File // wepfd, for the runtime's poller
	wepMu   sync.RWMutex
	wakefd  int // eventfd: wakes the loops to stop
	work    chan readable
	stopped atomic.Bool
	done    chan struct{} // closed when the loops and the workers are gone

	wmu     sync.Mutex               // guards waiters
	waiters map[uint64]chan struct{} // connection id → its waiting writer
}

const connEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET

// Read states of a connection under epoll (conn.rstate).
const (
	readIdle   = iota // no worker has it: the next event hands it to one
	readQueued        // a worker has it, or it is queued for one
	readAgain         // a worker has it, and bytes came after its last read
)

// claimRead reports whether an event hands c to a worker: false when a
// worker has it already, which is then told to read again.
func (c *conn) claimRead() bool {
	for {
		switch s := c.rstate.Load(); s {
		case readIdle:
			if c.rstate.CompareAndSwap(readIdle, readQueued) {
				return true
			}
		case readQueued:
			if c.rstate.CompareAndSwap(readQueued, readAgain) {
				return false
			}
		default:
			return false
		}
	}
}

// releaseRead gives c back after a read that left its socket empty:
// false when bytes came meanwhile, and the worker must read again.
func (c *conn) releaseRead() bool {
	if c.rstate.CompareAndSwap(readQueued, readIdle) {
		return true
	}
	c.rstate.Store(readQueued)
	return false
}

func newPoller(g *Gateway) (poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	wepfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return nil, err
	}
	// Connection ids start at 1; 0 is the wake-up.
	for _, fd := range []int{epfd, wepfd} {
		if err := unix.EpollCtl(fd, unix.EPOLL_CTL_ADD, wakefd, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
			unix.Close(epfd)
			unix.Close(wepfd)
			unix.Close(wakefd)
			return nil, err
		}
	}
	// Non-blocking, os.NewFile registers them with the runtime's poller.
	for _, fd := range []int{epfd, wepfd} {
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(epfd)
			unix.Close(wepfd)
			unix.Close(wakefd)
			return nil, err
		}
	}
	return &epoller{
		g:       g,
		epfd:    epfd,
		epf:     os.NewFile(uintptr(epfd), "epoll"),
		wepfd:   wepfd,
		wepf:    os.NewFile(uintptr(wepfd), "epoll-writers"),
		wakefd:  wakefd,
		work:    make(chan readable, g.cfg.Workers*64),
		done:    make(chan struct{}),
		waiters: make(map[uint64]chan struct{}),
	}, nil
}

func event(events uint32, id uint64) *unix.EpollEvent {
	return &unix.EpollEvent{Events: events, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
}

func (p *epoller) start() {
	var workers sync.WaitGroup
	for range p.g.cfg.Workers {
		workers.Add(1)
		p.g.wg.Add(1)
		go func() {
			defer p.g.wg.Done()
			defer workers.Done()
			for r := range p.work {
				r.c.readReady(p, r.unfed)
			}
		}()
	}
	var waits sync.WaitGroup
	waits.Add(1)
	p.g.wg.Add(1)
	go func() {
		defer p.g.wg.Done()
		defer waits.Done()
		p.waitLoop()
	}()
	p.g.wg.Add(1)
	go func() {
		defer p.g.wg.Done()
		p.loop()
		close(p.work)
		workers.Wait()
		waits.Wait()
		_ = p.epf.Close()
		// A writer still lingering (spawned, it outlives the loops) must
		// not use the number once it may name another file.
		p.wepMu.Lock()
		_ = p.wepf.Close()
		p.wepfd = -1
		p.wepMu.Unlock()
		unix.Close(p.wakefd)
		close(p.done)
	}()
}

// epollWait waits for the events of one epoll instance through the
// runtime's poller. One loop owns it; it is made once, so a wait
// allocates nothing.
type epollWait struct {
	rc     syscall.RawConn
	events []unix.EpollEvent
	n      int
	err    error
	try    func(fd uintptr) bool // rc.Read's callback: the events now, if any
}

func newEpollWait(f *os.File, size int) (*epollWait, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	w := &epollWait{rc: rc, events: make([]unix.EpollEvent, size)}
	w.try = func(fd uintptr) bool {
		for {
			w.n, w.err = unix.EpollWait(int(fd), w.events, 0)
			if w.err != unix.EINTR {
				// No events yet: the runtime's poller says when.
				return w.n > 0 || w.err != nil
			}
		}
	}
	return w, nil
}

// waitEvents waits for events of w's epoll instance and returns them;
// false, logged with what it means, when epoll_wait fails.
func (p *epoller) waitEvents(w *epollWait, means string) ([]unix.EpollEvent, bool) {
	err := w.rc.Read(w.try)
	if err == nil {
		err = w.err
	}
	if err != nil {
		p.g.log.Error("epoll_wait failed; "+means, "err", err)
		return nil, false
	}
	return w.events[:w.n], true
}

// eventID is the connection id an event carries (0: the wake-up).
func eventID(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// waitLoop wakes the writers whose sockets became ready.
func (p *epoller) waitLoop() {
	const means = "slow WebSocket writes time out"
	w, err := newEpollWait(p.wepf, 64)
	if err != nil {
		p.g.log.Error("epoll descriptor unusable; "+means, "err", err)
		return
	}
	for {
		events, ok := p.waitEvents(w, means)
		if !ok {
			return
		}
		for i := range events {
			id := eventID(&events[i])
			if id == 0 {
				if p.stopped.Load() {
					return
				}
				continue
			}
			p.wake(id)
		}
	}
}

// wake wakes the writer of connection id, if one waits.
func (p *epoller) wake(id uint64) {
	p.wmu.Lock()
	ch := p.waiters[id]
	p.wmu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// wait waits until c's socket is ready for events (EPOLLOUT: room to
// write; EPOLLIN: bytes or the client's FIN), c is closed, or deadline
// passes (os.ErrDeadlineExceeded, a net.Error whose Timeout is true). One
// goroutine at a time waits for a connection: its writer.
func (p *epoller) wait(c *conn, events uint32, deadline time.Time) error {
	d := time.Until(deadline)
	if d <= 0 {
		return os.ErrDeadlineExceeded
	}
	ch := make(chan struct{}, 1)
	p.wmu.Lock()
	p.waiters[c.id] = ch
	p.wmu.Unlock()
	defer func() {
		p.wmu.Lock()
		delete(p.waiters, c.id)
		p.wmu.Unlock()
	}()
	ev := event(events|unix.EPOLLRDHUP|unix.EPOLLONESHOT, c.id)
	err := c.withFD(func(fd int) error {
		p.wepMu.RLock()
		defer p.wepMu.RUnlock()
		if p.wepfd < 0 {
			return net.ErrClosed
		}
		err := unix.EpollCtl(p.wepfd, unix.EPOLL_CTL_ADD, fd, ev)
		if errors.Is(err, unix.EEXIST) {
			err = unix.EpollCtl(p.wepfd, unix.EPOLL_CTL_MOD, fd, ev)
		}
		return err
	})
	if err != nil {
		return err
	}
	t := time.NewTimer(d)
	select {
	case <-ch:
	case <-t.C:
		err = os.ErrDeadlineExceeded
	}
	t.Stop()
	_ = c.withFD(func(fd int) error {
		p.wepMu.RLock()
		defer p.wepMu.RUnlock()
		if p.wepfd < 0 {
			return net.ErrClosed
		}
		return unix.EpollCtl(p.wepfd, unix.EPOLL_CTL_DEL, fd, nil)
	})
	return err
}

func (p *epoller) loop() {
	const means, size = "WebSocket reads stop", 256
	w, err := newEpollWait(p.epf, size)
	if err != nil {
		p.g.log.Error("epoll descriptor unusable; "+means, "err", err)
		return
	}
	ready := make([]*conn, 0, size)
	var small [inlineRead]byte
	for {
		events, ok := p.waitEvents(w, means)
		if !ok {
			return
		}
		// Bytes arrived: each of these clients spoke, even if every worker
		// is busy and its message is read later. The idle rule must not
		// close a client for the server's own backlog, so all of the batch
		// count as speaking before the first hand-off may block (sweepIdle
		// also checks for unread bytes).
		now := p.g.now()
		ready = ready[:0]
		for i := range events {
			id := eventID(&events[i])
			if id == 0 {
				if p.stopped.Load() {
					return
				}
				continue
			}
			p.g.mu.RLock()
			c := p.g.conns[id] // registered before it is added
			p.g.mu.RUnlock()
			if c != nil {
				c.idleAt.Store(now + p.g.ttlMs)
				if c.claimRead() {
					ready = append(ready, c)
				}
			}
		}
		// A few readable sockets at a time is an idle node's traffic: the
		// loop reads them itself. More are load, when the workers are
		// awake anyway and read them on every core.
		inline := !p.g.cfg.BeatsMayWait && len(ready) <= inlineBatch
		for _, c := range ready {
			r := readable{c: c}
			if inline && c.readInline(small[:], &r) {
				continue
			}
			p.work <- r
		}
		clear(ready)
	}
}

// stop ends the loop and the workers; the connections are already gone.
func (p *epoller) stop() {
	if p.stopped.Swap(true) {
		return
	}
	var one = [8]byte{1}
	_, _ = unix.Write(p.wakefd, one[:])
	<-p.done
}

// add registers c, which the gateway holds (register): the loop finds it
// by its id among the gateway's connections.
func (p *epoller) add(c *conn) error {
	return c.withFD(func(fd int) error {
		return rawEpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, event(connEvents, c.id))
	})
}

func (p *epoller) remove(c *conn) {
	_ = c.withFD(func(fd int) error {
		return rawEpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	})
}

// requeue makes the loop hand c to a worker again, while its socket holds
// bytes: an edge-triggered entry modified reports what is ready at once.
func (p *epoller) requeue(c *conn) {
	_ = c.withFD(func(fd int) error {
		return rawEpollCtl(p.epfd, unix.EPOLL_CTL_MOD, fd, event(connEvents, c.id))
	})
}

// readable is a connection handed to a worker, with the bytes the loop
// read of it and did not feed (nil: none).
type readable struct {
	c     *conn
	unfed []byte
}

// inlineRead is the most the loop reads of a connection itself: an idle
// socket's beat and ping are 30–40 bytes. inlineBatch is the most
// readable sockets one wait may return for the loop to read them itself.
const (
	inlineRead  = 256
	inlineBatch = 4
)

// readInline lets the loop read c itself and apply what it read when that
// is only heartbeats and pings — an idle socket's whole traffic — so that
// no worker is woken for it: handing each beat to a worker woke a second
// OS thread per beat, which cost an idle node more than the beat. It
// reports whether c is done with; false hands c to a worker (r), with
// the bytes read and not fed (anything else: a message that may wait on
// the store, a close, a partial frame). It never waits for the socket.
func (c *conn) readInline(buf []byte, r *readable) bool {
	if c.part != nil {
		return false // a frame or message in pieces: the worker's
	}
	var n int
	var rerr error
	if err := c.withFD(func(fd int) error {
		n, rerr = rawRead(fd, buf)
		return nil
	}); err != nil {
		return false
	}
	switch {
	case rerr == unix.EAGAIN:
		return c.releaseRead()
	case rerr != nil || n <= 0:
		return false // the worker reads again and tears it down (or retries EINTR)
	}
	if n == len(buf) || !onlyBeats(buf[:n]) {
		r.unfed = append([]byte(nil), buf[:n]...)
		return false
	}
	c.g.stats.loopReads.Add(1)
	if !c.feed(buf[:n]) {
		return true // closing: the writer tears the connection down
	}
	return c.releaseRead()
}

// onlyBeats reports whether b is whole frames only, each a heartbeat
// text message the clients we ship send (beatKind), a ping or a pong.
// It does not modify b.
func onlyBeats(b []byte) bool {
	var plain [125]byte
	for len(b) > 0 {
		h, hn, ok, err := parseHeader(b)
		if err != nil || !ok || !h.Fin || h.Length > 125 {
			return false
		}
		end := hn + int(h.Length)
		if len(b) < end {
			return false
		}
		switch h.OpCode {
		case ws.OpPing, ws.OpPong:
		case ws.OpText:
			p := plain[:h.Length]
			copy(p, b[hn:end])
			ws.Cipher(p, h.Mask, 0)
			if beatKind(p) == 0 {
				return false
			}
		default:
			return false
		}
		b = b[end:]
	}
	return true
}

// readBufs are shared by the workers: an idle connection holds no buffer.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// readReady reads what a readable connection has without waiting and
// feeds it, until its socket is empty and no bytes came meanwhile. A
// connection that keeps a worker for four full buffers in a row goes back
// to the end of the queue instead, so that one client cannot hold a
// worker.
func (c *conn) readReady(p *epoller, unfed []byte) {
	if unfed != nil && !c.feed(unfed) {
		return // closing: the writer tears the connection down
	}
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	for full := 0; ; {
		var n int
		var rerr error
		err := c.withFD(func(fd int) error {
			n, rerr = rawRead(fd, buf) // never waits: epoll says when to come back
			return nil
		})
		if err != nil {
			c.teardown()
			return
		}
		switch {
		case rerr == unix.EAGAIN:
			if c.releaseRead() {
				return
			}
			full = 0
			continue
		case rerr == unix.EINTR:
			continue
		case rerr != nil || n <= 0:
			c.teardown()
			return
		}
		if !c.feed(buf[:n]) {
			return // closing: the writer tears the connection down
		}
		if n < len(buf) {
			// Empty at the read: bytes that came after it were an edge,
			// and their event found the connection taken (readAgain).
			if c.releaseRead() {
				return
			}
			full = 0
			continue
		}
		if full++; full == 4 {
			c.rstate.Store(readIdle)
			p.requeue(c)
			return
		}
	}
}

// unread reports whether c's socket holds bytes the server has not read
// yet: the client spoke, whatever the server's backlog.
func unread(c *conn) bool {
	if !c.hasFD {
		return false
	}
	n := 0
	_ = c.withFD(func(fd int) error {
		n, _ = unix.IoctlGetInt(fd, unix.SIOCINQ)
		return nil
	})
	return n > 0
}

// detach takes nc's socket for c: c keeps a copy of its descriptor and
// closes nc (its netFD, addresses and runtime poll descriptor go), and
// takes over nc's place in the connection budget (connbudget.Conn), given
// back when c closes the descriptor. The socket stays open: the copy
// holds it. When nc has no descriptor c is left reading through nc.
func (c *conn) detach(nc net.Conn) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || derr != nil {
		return
	}
	// The copy shares the socket's open file description, and so its
	// O_NONBLOCK: reads and writes on it never wait.
	var release func()
	if b, ok := nc.(interface{ Detach() (func(), bool) }); ok {
		if release, ok = b.Detach(); !ok {
			unix.Close(fd) // closed meanwhile: nc says so to whoever reads it
			return
		}
	}
	_ = nc.Close()
	c.nc, c.fd, c.hasFD, c.release = nil, int32(fd), true, release
}

// withFD runs fn on c's descriptor, holding it open: net.ErrClosed once
// c closed it.
func (c *conn) withFD(fn func(fd int) error) error {
	c.fdMu.Lock()
	defer c.fdMu.Unlock()
	if c.fd < 0 {
		return net.ErrClosed
	}
	return fn(int(c.fd))
}

// sockWrite writes b to c's socket, waiting (wait) while its send buffer
// is full, until deadline.
func (c *conn) sockWrite(b []byte, deadline time.Time) (int, error) {
	n := 0
	for n < len(b) {
		var m int
		var werr error
		if err := c.withFD(func(fd int) error {
			m, werr = rawSend(fd, b[n:])
			return nil
		}); err != nil {
			return n, err
		}
		if m > 0 {
			n += m
		}
		switch {
		case werr == nil, errors.Is(werr, unix.EINTR):
		case errors.Is(werr, unix.EAGAIN):
			p, ok := c.g.poll.(*epoller)
			if !ok {
				return n, werr
			}
			if err := p.wait(c, unix.EPOLLOUT, deadline); err != nil {
				return n, err
			}
		default:
			return n, werr
		}
	}
	return n, nil
}

// sockLinger is linger on c's own descriptor: FIN, then read and drop
// until the client's FIN or lingerTime, then close.
func (c *conn) sockLinger() {
	defer c.sockClose()
	p, ok := c.g.poll.(*epoller)
	if !ok || c.withFD(func(fd int) error { return unix.Shutdown(fd, unix.SHUT_WR) }) != nil {
		return
	}
	deadline := time.Now().Add(lingerTime)
	var buf [512]byte
	for {
		var n int
		var rerr error
		if c.withFD(func(fd int) error { n, rerr = rawRead(fd, buf[:]); return nil }) != nil {
			return
		}
		switch {
		case errors.Is(rerr, unix.EINTR):
		case errors.Is(rerr, unix.EAGAIN):
			if p.wait(c, unix.EPOLLIN, deadline) != nil {
				return
			}
		case rerr != nil || n == 0:
			return
		}
	}
}

// sockClose closes c's descriptor, wakes its writer if one waits, and
// gives its place back to the connection budget. It is idempotent.
func (c *conn) sockClose() {
	c.fdMu.Lock()
	fd, release := c.fd, c.release
	c.fd, c.release = -1, nil
	c.fdMu.Unlock()
	if fd < 0 {
		return
	}
	_ = unix.Close(int(fd))
	if p, ok := c.g.poll.(*epoller); ok {
		p.wake(c.id)
	}
	if release != nil {
		release()
	}
}

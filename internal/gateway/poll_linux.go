//go:build linux

package gateway

import (
	"errors"
	"sync"
	"sync/atomic"

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
// connection is registered one-shot: it is handed to exactly one worker,
// which reads what is there without ever waiting, and re-arms it when done.
// An idle connection costs an epoll entry and nothing else.
type epoller struct {
	g       *Gateway
	epfd    int
	wakefd  int // eventfd: wakes the loop to stop
	work    chan *conn
	stopped atomic.Bool
	done    chan struct{} // closed when the loop and the workers are gone

	mu   sync.RWMutex // guards byID
	byID map[uint64]*conn
}

const connEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

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
	// Connection ids start at 1; 0 is the wake-up.
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return nil, err
	}
	return &epoller{
		g:      g,
		epfd:   epfd,
		wakefd: wakefd,
		work:   make(chan *conn, g.cfg.Workers*64),
		done:   make(chan struct{}),
		byID:   make(map[uint64]*conn),
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
			for c := range p.work {
				c.readReady(p)
			}
		}()
	}
	p.g.wg.Add(1)
	go func() {
		defer p.g.wg.Done()
		p.loop()
		close(p.work)
		workers.Wait()
		unix.Close(p.epfd)
		unix.Close(p.wakefd)
		close(p.done)
	}()
}

func (p *epoller) loop() {
	events := make([]unix.EpollEvent, 256)
	ready := make([]*conn, 0, len(events))
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			p.g.log.Error("epoll_wait failed; WebSocket reads stop", "err", err)
			return
		}
		// Bytes arrived: each of these clients spoke, even if every worker
		// is busy and its message is read later. The idle rule must not
		// close a client for the server's own backlog, so all of the batch
		// count as speaking before the first hand-off may block (sweepIdle
		// also checks for unread bytes).
		now := p.g.now()
		ready = ready[:0]
		for i := range events[:n] {
			id := uint64(uint32(events[i].Fd)) | uint64(uint32(events[i].Pad))<<32
			if id == 0 {
				if p.stopped.Load() {
					return
				}
				continue
			}
			p.mu.RLock()
			c := p.byID[id]
			p.mu.RUnlock()
			if c != nil {
				c.idleAt.Store(now + p.g.ttlMs)
				ready = append(ready, c)
			}
		}
		for _, c := range ready {
			p.work <- c
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

func (p *epoller) add(c *conn) error {
	p.mu.Lock()
	p.byID[c.id] = c
	p.mu.Unlock()
	var err error
	cerr := c.raw.Control(func(fd uintptr) {
		err = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, int(fd), event(connEvents, c.id))
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		p.mu.Lock()
		delete(p.byID, c.id)
		p.mu.Unlock()
	}
	return err
}

func (p *epoller) remove(c *conn) {
	p.mu.Lock()
	delete(p.byID, c.id)
	p.mu.Unlock()
	_ = c.raw.Control(func(fd uintptr) {
		_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
	})
}

func (p *epoller) rearm(c *conn) {
	_ = c.raw.Control(func(fd uintptr) {
		_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, int(fd), event(connEvents, c.id))
	})
}

// readBufs are shared by the workers: an idle connection holds no buffer.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// readReady reads what a readable connection has without waiting, feeds
// it, and re-arms the connection.
func (c *conn) readReady(p *epoller) {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	for round := 0; round < 4; round++ {
		var n int
		var rerr error
		err := c.raw.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), buf)
			return true // never park: epoll says when to come back
		})
		if err != nil {
			c.teardown()
			return
		}
		switch {
		case rerr == unix.EAGAIN:
			p.rearm(c)
			return
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
			break
		}
	}
	p.rearm(c)
}

// unread reports whether c's socket holds bytes the server has not read
// yet: the client spoke, whatever the server's backlog.
func unread(c *conn) bool {
	if c.raw == nil {
		return false
	}
	n := 0
	_ = c.raw.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	})
	return n > 0
}

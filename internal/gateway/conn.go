package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/ratelimit"
)

// Close codes of the protocol.
const (
	closeNormal      ws.StatusCode = 1000
	closeGoingAway   ws.StatusCode = 1001
	closeProtocol    ws.StatusCode = 1002
	closeUnsupported ws.StatusCode = 1003
	closeInvalidUTF8 ws.StatusCode = 1007
	closePolicy      ws.StatusCode = 1008
	closeTooBig      ws.StatusCode = 1009
	closeIdle        ws.StatusCode = 4001
	closeSlow        ws.StatusCode = 4002
	closeExpired     ws.StatusCode = 4003
)

// conn is one WebSocket connection. Its read side (in, msg, rate, strikes)
// is touched by one goroutine at a time: the epoll loop hands a connection
// to one worker, and to none other until that worker gives it back
// (rstate). Its write side is guarded by mu.
type conn struct {
	g  *Gateway
	nc net.Conn // nil once the gateway took its socket (fd)
	// fd is the socket's own descriptor once the gateway took it from nc
	// (detach: Linux, plain connections under epoll), -1 once closed;
	// hasFD tells it apart from a connection read through nc. fdMu is
	// held around every system call on fd and its close, so that no
	// descriptor number is used after it was closed (and perhaps given to
	// another socket).
	fd      int32
	subs    int32 // subscriptions counted for the user; guarded by g.mu
	heapIdx int32 // position in the gateway's idle heap, -1: none; guarded by idle.mu
	hasFD   bool
	fedBeat uint8 // read side: the kind of heartbeat the current read applied (beatKind), 0 none
	setUp   bool  // read side: a subscribe took its turn at the setup gate (the later ones do not)
	// rstate hands the connection to one epoll worker at a time
	// (readIdle, readQueued, readAgain).
	rstate  atomic.Uint32
	fdMu    sync.Mutex
	release func() // gives the socket's place back to the connection budget, once, when fd is closed
	id      uint64
	user    string
	device  string
	// expAt is when the connection's client token expires (Unix ms), 0:
	// never (dev mode). The connection is closed 4003 then.
	expAt int64
	// rooms are the rooms the connection may join and watch: its token's
	// claim (nil: none), every room under -dev without a token.
	rooms *auth.Rooms

	// read side
	part    *partial         // an incomplete frame or message between reads; nil: none (an idle connection)
	rate    ratelimit.Bucket // messages (Gateway.msgLimit)
	strikes ratelimit.Bucket // refused messages (Gateway.strikeLimit): when it runs dry, close 1008
	// pingRate bounds pings, apart from messages: a keepalive ping is
	// answered even when the client just spent its message burst.
	pingRate ratelimit.Bucket

	idleAt atomic.Int64 // Unix ms: closed 4001 at this time unless a message comes
	// lastBeat is when the last heartbeat through this connection was
	// applied (Unix ms, read after the tracker returned); -1 after a bye.
	// A connection that ends otherwise tells the tracker (Disconnect).
	lastBeat atomic.Int64

	mu       sync.Mutex // guards the fields below
	queue    []outFrame
	byUser   map[string]int // index of users' frames in queue, only while it is long
	flushing bool           // a writer goroutine is running
	closing  bool           // a close frame is queued: nothing else is accepted
	closed   bool           // torn down
	// joined are the rooms this connection joined and did not leave (nil
	// until its first join): joined again if the state store lost them
	// (Gateway.RejoinRooms).
	joined map[string]struct{}
}

// partial is what a connection holds between two reads while a frame
// or a fragmented message is incomplete, apart from the conn so that the
// many connections that hold none do not pay for it.
type partial struct {
	in    []byte    // an incomplete frame carried over to the next read
	msg   []byte    // a fragmented message being assembled
	msgOp ws.OpCode // opcode of the message in msg; 0: none
	msgAt int64     // Unix ms of the message's first fragment
	frags int       // fragments of the message so far
}

// partial returns c's partial, made if c has none.
func (c *conn) partial() *partial {
	if c.part == nil {
		c.part = &partial{}
	}
	return c.part
}

// msgOp is the opcode of the fragmented message c is assembling; 0: none.
func (c *conn) msgOp() ws.OpCode {
	if c.part == nil {
		return 0
	}
	return c.part.msgOp
}

// dropPartial forgets c's partial once it holds nothing.
func (c *conn) dropPartial() {
	if p := c.part; p != nil && len(p.in) == 0 && p.msgOp == 0 {
		c.part = nil
	}
}

// outFrame is one queued frame. Frames of a user (presence changes) carry
// the user and its version so a newer change replaces a queued one.
type outFrame struct {
	user    string
	version uint64
	op      ws.OpCode
	data    []byte // shared, never modified
}

// Viewer is the user this connection watches as (fanout.Sink).
func (c *conn) Viewer() string { return c.user }

// Deliver queues a presence frame of user (fanout.Sink). It never blocks: a
// queued frame of the same user is replaced by a newer one, and a
// connection whose queue is full is closed 4002.
func (c *conn) Deliver(user string, version uint64, frame []byte) {
	c.enqueue(outFrame{user: user, version: version, op: ws.OpText, data: frame})
}

// enqueue queues f and starts the writer if none is running.
func (c *conn) enqueue(f outFrame) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	if f.user != "" {
		if i := c.findLocked(f.user); i >= 0 {
			if q := &c.queue[i]; f.version > q.version {
				*q = f
			}
			c.mu.Unlock()
			return
		}
	}
	if len(c.queue) >= c.g.cfg.QueueLen {
		c.g.stats.closedSlow.Add(1)
		c.queue, c.byUser = c.queue[:0], nil
		c.closeLocked(closeSlow, "slow consumer")
		c.mu.Unlock()
		return
	}
	c.queue = append(c.queue, f)
	if f.user != "" {
		if c.byUser != nil {
			c.byUser[f.user] = len(c.queue) - 1
		} else if len(c.queue) > indexAbove {
			c.byUser = make(map[string]int, 2*len(c.queue))
			for i := range c.queue {
				if u := c.queue[i].user; u != "" {
					c.byUser[u] = i
				}
			}
		}
	}
	c.startWriterLocked()
	c.mu.Unlock()
}

// indexAbove is the queue length above which users' frames are found by
// a map instead of a scan (a backlog during a mass change).
const indexAbove = 32

// findLocked returns the index of the queued frame of user, or -1.
func (c *conn) findLocked(user string) int {
	if c.byUser != nil {
		if i, ok := c.byUser[user]; ok {
			return i
		}
		return -1
	}
	for i := range c.queue {
		if c.queue[i].user == user {
			return i
		}
	}
	return -1
}

// close queues a close frame: frames queued before it are still written,
// then the connection is torn down.
func (c *conn) close(code ws.StatusCode, reason string) {
	c.mu.Lock()
	c.closeLocked(code, reason)
	c.mu.Unlock()
}

func (c *conn) closeLocked(code ws.StatusCode, reason string) {
	if c.closing {
		return
	}
	c.closing = true
	c.queue = append(c.queue, outFrame{op: ws.OpClose, data: ws.NewCloseFrameBody(code, reason)})
	c.startWriterLocked()
	if code != closeNormal && code != closeGoingAway && c.g.log.Enabled(context.Background(), slog.LevelDebug) {
		c.g.log.Debug("closing a WebSocket", "user_id", c.user, "device_id", c.device, "code", int(code), "reason", reason)
	}
}

func (c *conn) startWriterLocked() {
	if c.flushing || c.closed {
		return
	}
	c.flushing = true
	if !c.g.spawn(c.writeLoop) {
		c.flushing = false
	}
}

var writeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// writeLoop writes queued frames until the queue is empty, then ends: an
// idle connection has no writer.
func (c *conn) writeLoop() {
	bp := writeBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 256<<10 {
			*bp = (*bp)[:0]
			writeBufs.Put(bp)
		}
	}()
	var batch []outFrame
	for {
		c.mu.Lock()
		if len(c.queue) == 0 || c.closed {
			c.flushing = false
			c.mu.Unlock()
			return
		}
		batch, c.queue, c.byUser = c.queue, batch[:0], nil
		c.mu.Unlock()

		b := (*bp)[:0]
		last := false
		for i := range batch {
			b = appendFrame(b, batch[i].op, batch[i].data)
			if batch[i].op == ws.OpClose {
				last = true
				break
			}
		}
		clear(batch)
		*bp = b
		n, err := c.write(b)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.behind(b[n:], last)
			}
			c.teardown()
			return
		}
		if last {
			c.forget()
			c.linger()
			return
		}
	}
}

// behind handles a connection that did not take its frames within the
// write timeout: it is closed 4002. The rest of the frame in flight and the
// close frame get one more write timeout, so a client that resumes reading
// learns why it was closed.
func (c *conn) behind(rest []byte, closeQueued bool) {
	c.mu.Lock()
	already := c.closing
	c.closing = true
	c.queue, c.byUser = nil, nil
	c.mu.Unlock()
	if !already {
		c.g.stats.closedSlow.Add(1)
	}
	tail := append([]byte(nil), rest...)
	if !closeQueued {
		tail = appendFrame(tail, ws.OpClose, ws.NewCloseFrameBody(closeSlow, "slow consumer"))
	}
	_, _ = c.write(tail)
}

// write writes b within the write timeout. A timeout is a net.Error whose
// Timeout is true.
func (c *conn) write(b []byte) (int, error) {
	deadline := time.Now().Add(c.g.cfg.WriteTimeout)
	if c.hasFD {
		return c.sockWrite(b, deadline)
	}
	_ = c.nc.SetWriteDeadline(deadline)
	return c.nc.Write(b)
}

// teardown closes the socket and forgets the connection. It is idempotent.
func (c *conn) teardown() {
	c.forget()
	c.closeSocket()
}

// closeSocket closes the socket. It is idempotent.
func (c *conn) closeSocket() {
	if c.hasFD {
		c.sockClose()
		return
	}
	_ = c.nc.Close()
}

// forget removes the connection from the hub, the poller and the gateway
// and marks it closed; the socket stays open. It is idempotent.
func (c *conn) forget() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed, c.closing = true, true
	c.queue, c.byUser = nil, nil
	c.mu.Unlock()
	if c.g.hub != nil {
		c.g.hub.Remove(c)
	}
	if c.g.roomHub != nil {
		c.g.roomHub.Remove(c)
	}
	if c.g.poll != nil && c.hasFD {
		c.g.poll.remove(c)
	}
	c.g.idle.remove(c)
	c.disconnect() // before unregister: once the connection is gone, the tracker knows
	c.g.unregister(c)
}

// disconnect tells the tracker that the connection ended without a bye,
// so its device dies within the close grace unless it reconnects. Not
// while the gateway shuts down: the node is going away, not the client,
// which reconnects (perhaps to another node) and keeps its whole ttl.
func (c *conn) disconnect() {
	since := c.lastBeat.Load()
	if since <= 0 || c.g.stopping() {
		return
	}
	ctx, cancel := c.opContext()
	defer cancel()
	if err := c.g.tracker.Disconnect(ctx, c.user, c.device, since); err != nil {
		c.g.log.Warn("recording a closed connection failed; its device lives its whole ttl", "user_id", c.user, "err", err)
	}
}

// lingerTime bounds how long a closed connection's last incoming bytes are
// read and dropped.
const lingerTime = time.Second

// linger ends a connection whose close frame is written: it sends FIN and
// reads until the client closes too (or lingerTime passes) before the
// socket is closed, so unread client data does not turn the close into a
// reset that destroys the close frame in flight.
func (c *conn) linger() {
	if c.hasFD {
		c.sockLinger()
		return
	}
	tc, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || tc.CloseWrite() != nil {
		_ = c.nc.Close()
		return
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(lingerTime))
	var buf [512]byte
	for {
		if _, err := c.nc.Read(buf[:]); err != nil {
			break
		}
	}
	_ = c.nc.Close()
}

// appendFrame appends one unmasked server frame.
func appendFrame(b []byte, op ws.OpCode, p []byte) []byte {
	b = append(b, 0x80|byte(op))
	switch n := len(p); {
	case n <= 125:
		b = append(b, byte(n))
	case n <= 0xffff:
		b = append(b, 126, byte(n>>8), byte(n))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, p...)
}

// feed consumes bytes read from the socket. It returns false once the
// connection is closing and reading should stop.
func (c *conn) feed(data []byte) bool {
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	if closing {
		return false
	}
	if p := c.part; p != nil && len(p.in) > 0 {
		p.in = append(p.in, data...)
		data = p.in
	}
	c.fedBeat = 0
	for {
		h, hn, ok, err := parseHeader(data)
		if err != nil {
			c.close(closeProtocol, err.Error())
			return false
		}
		if !ok {
			break
		}
		if h.OpCode.IsControl() && (h.Length > 125 || !h.Fin) {
			c.close(closeProtocol, "invalid control frame")
			return false
		}
		if h.Length > int64(c.g.cfg.MaxMessage) {
			c.g.stats.closedSize.Add(1)
			c.close(closeTooBig, "message too big")
			return false
		}
		end := hn + int(h.Length)
		if len(data) < end {
			break
		}
		payload := data[hn:end]
		ws.Cipher(payload, h.Mask, 0)
		if !c.frame(h, payload) {
			return false
		}
		data = data[end:]
	}
	// Keep what is left of an incomplete frame (copy() inside append
	// handles data being the tail of c.part.in).
	if len(data) == 0 {
		if c.part != nil {
			c.part.in = nil
			c.dropPartial()
		}
	} else {
		p := c.partial()
		p.in = append(p.in[:0], data...)
	}
	return true
}

var (
	errUnmasked = errors.New("client frames must be masked")
	errRsv      = errors.New("no extension was negotiated")
	errOpcode   = errors.New("unknown opcode")
)

// parseHeader parses a client frame header from the start of b. ok is false
// while b holds less than a whole header.
func parseHeader(b []byte) (h ws.Header, n int, ok bool, err error) {
	if len(b) < 2 {
		return h, 0, false, nil
	}
	h.Fin = b[0]&0x80 != 0
	h.Rsv = (b[0] >> 4) & 0x7
	h.OpCode = ws.OpCode(b[0] & 0x0f)
	h.Masked = b[1]&0x80 != 0
	if h.Rsv != 0 {
		return h, 0, false, errRsv
	}
	switch h.OpCode {
	case ws.OpContinuation, ws.OpText, ws.OpBinary, ws.OpClose, ws.OpPing, ws.OpPong:
	default:
		return h, 0, false, errOpcode
	}
	if !h.Masked {
		return h, 0, false, errUnmasked
	}
	n = 2
	switch l := b[1] & 0x7f; l {
	case 126:
		if len(b) < 4 {
			return h, 0, false, nil
		}
		h.Length = int64(binary.BigEndian.Uint16(b[2:]))
		n = 4
	case 127:
		if len(b) < 10 {
			return h, 0, false, nil
		}
		u := binary.BigEndian.Uint64(b[2:])
		if u > 1<<62 {
			u = 1 << 62
		}
		h.Length = int64(u)
		n = 10
	default:
		h.Length = int64(l)
	}
	if len(b) < n+4 {
		return h, 0, false, nil
	}
	copy(h.Mask[:], b[n:n+4])
	return h, n + 4, true, nil
}

// frame handles one whole, unmasked frame. It returns false once the
// connection is closing.
func (c *conn) frame(h ws.Header, p []byte) bool {
	switch h.OpCode {
	case ws.OpClose:
		code, _ := ws.ParseCloseFrameData(p)
		if len(p) == 1 || (len(p) >= 2 && !validCloseCode(code)) {
			c.close(closeProtocol, "invalid close frame")
			return false
		}
		if len(p) == 0 {
			code = closeNormal
		}
		c.close(code, "")
		return false
	case ws.OpPing:
		if !h.Fin {
			c.close(closeProtocol, "fragmented control frame")
			return false
		}
		now := c.g.now()
		if ok, _ := c.pingRate.Take(now, pingLimit); !ok {
			// A flood of pings gets no pongs and, if it goes on, is
			// closed like a flood of messages.
			c.g.stats.rateLimited.Add(1)
			if ok, _ := c.strikes.Take(now, c.g.strikeLimit); !ok {
				c.g.stats.closedRate.Add(1)
				c.close(closePolicy, "too many pings")
				return false
			}
			return true
		}
		c.enqueue(outFrame{op: ws.OpPong, data: append([]byte(nil), p...)})
		return true
	case ws.OpPong:
		return true
	case ws.OpContinuation:
		if c.msgOp() == 0 {
			c.close(closeProtocol, "continuation without a message")
			return false
		}
		part := c.part
		if len(part.msg)+len(p) > c.g.cfg.MaxMessage {
			c.g.stats.closedSize.Add(1)
			c.close(closeTooBig, "message too big")
			return false
		}
		// Only a complete message is speaking: fragments (empty ones
		// too) that never end a message do not keep a socket alive past
		// one ttl, and a message has at most maxFragments of them.
		if part.frags++; part.frags > maxFragments {
			c.g.stats.closedSize.Add(1)
			c.close(closeTooBig, fmt.Sprintf("a message of more than %d fragments", maxFragments))
			return false
		}
		if c.g.now() >= part.msgAt+c.g.ttlMs {
			c.g.stats.closedIdle.Add(1)
			c.close(closeIdle, "a fragmented message unfinished for a ttl")
			return false
		}
		part.msg = append(part.msg, p...)
		if !h.Fin {
			return true
		}
		op, m := part.msgOp, part.msg
		part.msgOp, part.msg = 0, nil
		c.dropPartial()
		return c.message(op, m)
	}
	// Text or binary.
	if c.msgOp() != 0 {
		c.close(closeProtocol, "a new message inside a fragmented one")
		return false
	}
	if !h.Fin {
		part := c.partial()
		part.msgOp, part.msgAt, part.frags = h.OpCode, c.g.now(), 1
		part.msg = append([]byte(nil), p...)
		return true
	}
	return c.message(h.OpCode, p)
}

// maxFragments bounds the frames of one fragmented message.
const maxFragments = 64

func validCloseCode(code ws.StatusCode) bool {
	switch {
	case code >= 1000 && code <= 1003, code >= 1007 && code <= 1011, code >= 3000 && code <= 4999:
		return true
	}
	return false
}

// message handles one client message. It returns false once the
// connection is closing.
func (c *conn) message(op ws.OpCode, p []byte) bool {
	now := c.g.now()
	if c.expired(now) {
		// Not one message acts on an expired token, even before the
		// sweep closes the connection.
		c.g.stats.closedExpired.Add(1)
		c.close(closeExpired, "token expired")
		return false
	}
	c.idleAt.Store(now + c.g.ttlMs)
	// Heartbeats that arrive together in one read say the same thing: the
	// server was behind, not the client too fast. The first is applied;
	// the others cost nothing and count against no limit.
	k := beatKind(p)
	if k != 0 && op == ws.OpText {
		if c.fedBeat == k {
			c.g.stats.coalescedBeats.Add(1)
			return true
		}
		c.fedBeat = k
	}
	if ok, _ := c.rate.Take(now, c.g.msgLimit); !ok {
		c.g.stats.rateLimited.Add(1)
		// Refused messages drain a second bucket that refills at half the
		// rate: a client that keeps pushing past the limit is closed.
		if ok, _ := c.strikes.Take(now, c.g.strikeLimit); !ok {
			c.g.stats.closedRate.Add(1)
			c.close(closePolicy, "rate limit exceeded")
			return false
		}
		// A refused room message names its type and room, like every
		// error of one: the client sends that message again.
		req, room := roomOf(op, p)
		c.sendRoomError(req, room, "rate_limited", "too many messages: at most %d per second, bursts of %d", c.g.cfg.Rate, c.g.cfg.Burst)
		return true
	}
	if op == ws.OpBinary {
		c.sendError("invalid_json", "binary frames are not accepted: send JSON in text frames")
		return true
	}
	if !utf8.Valid(p) {
		c.close(closeInvalidUTF8, "text is not valid UTF-8")
		return false
	}
	var m clientMsg
	var perr *protoError
	if k != 0 {
		m = beatMessage(k) // recognised above: no second look
	} else {
		m, perr = decodeJSONMessage(p)
	}
	if perr != nil {
		c.sendRoomError(perr.request, perr.room, perr.code, "%s", perr.message)
		return true
	}
	return c.handle(&m)
}

// expired reports whether the connection's token has expired at now.
func (c *conn) expired(now int64) bool { return c.expAt != 0 && now >= c.expAt }

// deadline is when the connection is next due in the idle index: at its
// idle deadline, or when its token expires if that comes first.
func (c *conn) deadline() int64 {
	at := c.idleAt.Load()
	if c.expAt != 0 && c.expAt < at {
		return c.expAt
	}
	return at
}

// opTimeout bounds the tracker and hub calls of one message.
const opTimeout = 10 * time.Second

func (c *conn) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.g.ctx, opTimeout)
}

// pingLimit bounds a connection's pings, apart from its messages.
var pingLimit = ratelimit.PerSecond(2, 5)

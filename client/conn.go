package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// conn is one WebSocket connection. Writes come from the heartbeat
// goroutine, from the application's calls and from the reader (pongs, the
// close handshake), serialized by wmu; reads come from the run loop only.
type conn struct {
	nc           net.Conn
	src          io.Reader // the handshake's buffered reader, or nc
	welcome      Welcome
	known        bool // the server takes the versions a subscribe knows (subscribe_known)
	writeTimeout time.Duration
	readTimeout  time.Duration // a silent server is dead after this long
	ctrl         wsutil.FrameHandlerFunc

	wmu       sync.Mutex // guards writes to nc
	closeOnce sync.Once

	retries *roomRetries // the refused room messages to send again
}

// maxMessage bounds one server message (a snapshot of 500 users is ~80 KiB).
const maxMessage = 4 << 20

// connect opens one connection and reads its welcome.
func (c *Client) connect(ctx context.Context) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()

	h := make(http.Header, len(c.cfg.Header)+1)
	for k, v := range c.cfg.Header {
		h[k] = slices.Clone(v)
	}
	token := c.cfg.Token
	if c.cfg.TokenFunc != nil {
		var err error
		if token, err = c.cfg.TokenFunc(ctx); err != nil {
			return nil, fmt.Errorf("client: token: %w", err)
		}
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	q := url.Values{}
	if d := c.Welcome().DeviceID; d != "" {
		q.Set("device_id", d)
	}
	if c.cfg.DevUserID != "" {
		q.Set("user_id", c.cfg.DevUserID)
	}
	u := *c.endpoint
	u.RawQuery = q.Encode()

	var refusal *HandshakeError
	d := ws.Dialer{
		Header:    ws.HandshakeHeaderHTTP(h),
		NetDial:   c.cfg.NetDial,
		TLSConfig: c.cfg.TLSConfig,
		OnStatusError: func(status int, _ []byte, resp io.Reader) {
			refusal = readRefusal(status, resp)
		},
	}
	nc, br, _, err := d.Dial(ctx, u.String())
	if err != nil {
		if refusal != nil {
			return nil, refusal
		}
		return nil, fmt.Errorf("client: connect to %s: %w", c.endpoint, err)
	}
	cn := &conn{nc: nc, src: nc, writeTimeout: c.cfg.WriteTimeout, retries: newRoomRetries()}
	if br != nil {
		cn.src = br
	}
	cn.ctrl = wsutil.ControlFrameHandler(controlWriter{cn}, ws.StateClientSide)

	// The welcome: bounded by ctx (DialTimeout, the caller, Close).
	stop := context.AfterFunc(ctx, func() { nc.SetReadDeadline(time.Now()) })
	data, err := cn.read()
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		cn.close()
		return nil, fmt.Errorf("client: reading the welcome: %w", closeError(err))
	}
	m, err := decode(data)
	if err == nil && m.Type != "welcome" {
		err = fmt.Errorf("first message is %q, want welcome", m.Type)
	}
	if err != nil {
		cn.close()
		return nil, fmt.Errorf("client: %w", err)
	}
	cn.welcome = Welcome{
		UserID:            m.UserID,
		DeviceID:          m.DeviceID,
		HeartbeatInterval: time.Duration(m.HeartbeatIntervalMS) * time.Millisecond,
		TTL:               time.Duration(m.TTLMS) * time.Millisecond,
	}
	cn.known = m.SubscribeKnown
	if cn.welcome.HeartbeatInterval <= 0 {
		cn.welcome.HeartbeatInterval = defaultHeartbeat
	}
	// Heartbeats carry a ping; a server silent for two of them is gone.
	cn.readTimeout = 2*cn.welcome.HeartbeatInterval + 5*time.Second
	return cn, nil
}

// defaultHeartbeat stands in for a welcome without an interval: a quarter
// of the server's default ttl.
const defaultHeartbeat = 7500 * time.Millisecond

// read returns the payload of the next text message, answering control
// frames on the way. A close frame ends it with wsutil.ClosedError.
func (cn *conn) read() ([]byte, error) {
	rd := wsutil.Reader{
		Source:         cn.src,
		State:          ws.StateClientSide,
		CheckUTF8:      true,
		OnIntermediate: cn.ctrl,
		MaxMessageSize: maxMessage,
	}
	for {
		if cn.readTimeout > 0 {
			cn.nc.SetReadDeadline(time.Now().Add(cn.readTimeout))
		}
		hdr, err := rd.NextFrame()
		if err != nil {
			return nil, err
		}
		if hdr.OpCode.IsControl() {
			if err := cn.ctrl(hdr, &rd); err != nil {
				return nil, err
			}
			continue
		}
		if hdr.OpCode != ws.OpText {
			if err := rd.Discard(); err != nil {
				return nil, err
			}
			continue
		}
		return io.ReadAll(&rd)
	}
}

// write sends one complete frame in one Write, so frames of concurrent
// writers never interleave.
func (cn *conn) write(ctx context.Context, frame []byte) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	deadline := time.Now().Add(cn.writeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	cn.nc.SetWriteDeadline(deadline)
	_, err := cn.nc.Write(frame)
	return err
}

func (cn *conn) sendJSON(ctx context.Context, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return cn.sendFrame(ctx, ws.OpText, p)
}

func (cn *conn) sendFrame(ctx context.Context, op ws.OpCode, p []byte) error {
	var buf bytes.Buffer
	if err := wsutil.WriteClientMessage(&buf, op, p); err != nil {
		return err
	}
	if err := cn.write(ctx, buf.Bytes()); err != nil {
		return fmt.Errorf("client: send: %w", err)
	}
	return nil
}

// controlWriter lets the reader answer pings and close frames under the
// write lock. The control handler writes each frame with one Write.
type controlWriter struct{ cn *conn }

func (w controlWriter) Write(p []byte) (int, error) {
	if err := w.cn.write(context.Background(), p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (cn *conn) close() { cn.closeOnce.Do(func() { cn.nc.Close() }) }

// closeGracefully says goodbye to the socket (close 1000), not to the
// device: the server treats it like a lost connection.
func (cn *conn) closeGracefully() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	frame := ws.MustCompileFrame(ws.MaskFrame(ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))))
	cn.write(ctx, frame)
	cn.close()
}

// run keeps the device connected until Close, Bye or a permanent refusal.
func (c *Client) run(cn *conn) {
	defer c.wg.Done()
	for {
		err := c.serve(cn)
		c.mu.Lock()
		bye := c.bye
		c.mu.Unlock()
		if c.ctx.Err() != nil || bye {
			c.finish(nil)
			return
		}
		var ce *CloseError
		expired := errors.As(err, &ce) && ce.Code == CloseTokenExpired
		switch {
		case expired && c.cfg.TokenFunc == nil:
			// The same token would be refused: nothing can renew it.
			c.log.Error("presence token expired and no TokenFunc renews it; stopping", "err", err)
			c.finish(err)
			return
		case expired:
			c.log.Info("presence token expired, reconnecting with a fresh one")
		default:
			c.log.Warn("presence connection lost, reconnecting", "err", err)
		}
		c.setDisconnected(err)
		if cn, err = c.reconnect(); cn == nil {
			c.finish(err)
			return
		}
		c.setConnected(cn, true)
	}
}

// reconnect dials with backoff until it succeeds (the connection), the
// client closes (nil, nil) or the server refuses for good (nil, the error).
// The first wait, MinBackoff/2 to MinBackoff, also spreads the renewals of
// many tokens that expire at once.
func (c *Client) reconnect() (*conn, error) {
	for attempt := 0; ; attempt++ {
		t := time.NewTimer(backoff(attempt, c.cfg.MinBackoff, c.cfg.MaxBackoff, rand.Float64()))
		select {
		case <-c.ctx.Done():
			t.Stop()
			return nil, nil
		case <-t.C:
		}
		cn, err := c.connect(c.ctx)
		switch {
		case err == nil:
			return cn, nil
		case c.ctx.Err() != nil:
			return nil, nil
		case permanent(err):
			c.log.Error("presence connection refused, giving up", "err", err)
			return nil, err
		}
		c.log.Warn("presence reconnect failed", "attempt", attempt+1, "err", err)
	}
}

// finish marks the client closed and announces it last.
func (c *Client) finish(err error) {
	c.mu.Lock()
	c.cur = nil
	c.state = Closed
	c.err = err
	c.mu.Unlock()
	c.q.push(StateChange{State: Closed, Err: err})
	close(c.runDone)
}

// serve runs one connection: heartbeats, the rooms it joins and watches
// again and the retries of refused ones in their own goroutines, reads
// here.
func (c *Client) serve(cn *conn) error {
	ctx, cancel := context.WithCancel(c.ctx)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		c.heartbeat(ctx, cn)
	}()
	go func() {
		defer wg.Done()
		c.resendRooms(ctx, cn)
	}()
	go func() {
		defer wg.Done()
		c.retryRooms(ctx, cn)
	}()
	var err error
	for {
		var data []byte
		if data, err = cn.read(); err != nil {
			break
		}
		c.handle(cn, data)
	}
	cancel()
	cn.close()
	wg.Wait()
	return closeError(err)
}

// heartbeat beats on the server's interval with ±10% jitter, at once when
// the person becomes active again, and closes the connection gracefully
// when the client closes.
func (c *Client) heartbeat(ctx context.Context, cn *conn) {
	interval := cn.welcome.HeartbeatInterval
	t := time.NewTimer(jitter(interval, rand.Float64()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if c.ctx.Err() != nil {
				cn.closeGracefully()
			}
			return
		case <-c.wake:
		case <-t.C:
		}
		msg := heartbeatMsg{Type: "heartbeat"}
		if !c.active.Load() {
			msg.Active = new(false)
		}
		err := cn.sendJSON(ctx, msg)
		if err == nil {
			err = cn.sendFrame(ctx, ws.OpPing, nil)
		}
		if err != nil {
			c.log.Debug("presence heartbeat failed", "err", err)
			cn.close() // the read loop notices
			return
		}
		t.Reset(jitter(interval, rand.Float64()))
	}
}

// handle applies one server message of cn.
func (c *Client) handle(cn *conn, data []byte) {
	m, err := decode(data)
	if err != nil {
		c.log.Warn("presence: undecodable server message", "err", err)
		return
	}
	switch m.Type {
	case "snapshot":
		ids := make([]string, 0, len(m.Users))
		for id := range m.Users {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			c.deliver(m.Users[id].event(id, true))
		}
	case "presence":
		c.deliver(m.wirePresence.event(m.UserID, false))
	case "room":
		c.handleRoom(m)
	case "room_change":
		c.handleRoomChange(m)
	case "room_interval":
		c.handleRoomInterval(m)
	case "error":
		se := &ServerError{Code: m.Code, Message: m.Message, Room: m.Room}
		if se.Room != "" {
			se.Request = m.Request
		}
		if se.Room != "" {
			c.roomRefused(cn, se)
			return
		}
		c.q.push(se)
	default:
		c.log.Debug("presence: ignoring server message", "type", m.Type)
	}
}

// deliver passes on presence of a watched user whose version is above the
// last one delivered.
func (c *Client) deliver(ev Event) {
	c.mu.Lock()
	_, watched := c.subs[ev.UserID]
	last, seen := c.versions[ev.UserID]
	fresh := watched && (!seen || ev.Version > last)
	if fresh {
		c.versions[ev.UserID] = ev.Version
	}
	c.mu.Unlock()
	if fresh {
		c.q.push(ev)
	}
}

// backoff is the delay before reconnect attempt n (from 0): a random
// duration in [d/2, d], d = min(lo·2ⁿ, hi); r is uniform in [0, 1).
func backoff(n int, lo, hi time.Duration, r float64) time.Duration {
	d := hi
	if n < 32 && lo<<n < hi && lo<<n > 0 {
		d = lo << n
	}
	return d/2 + time.Duration(r*float64(d/2))
}

// jitter spreads d by ±10%; r is uniform in [0, 1).
func jitter(d time.Duration, r float64) time.Duration {
	return d*9/10 + time.Duration(r*float64(d)/5)
}

// readRefusal reads the JSON error of a refused upgrade.
func readRefusal(status int, r io.Reader) *HandshakeError {
	he := &HandshakeError{StatusCode: status}
	resp, err := http.ReadResponse(bufio.NewReader(io.LimitReader(r, 64<<10)), nil)
	if err != nil {
		return he
	}
	defer resp.Body.Close()
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 16<<10)).Decode(&body) == nil {
		he.Code, he.Message = body.Error.Code, body.Error.Message
	}
	return he
}

// permanent reports whether reconnecting cannot cure err: the server
// refused the credentials, the device or the URL.
func permanent(err error) bool {
	var he *HandshakeError
	if !errors.As(err, &he) {
		return false
	}
	switch he.StatusCode {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return true
	}
	return false
}

// closeError turns the library's close error into ours.
func closeError(err error) error {
	var ce wsutil.ClosedError
	if errors.As(err, &ce) {
		return &CloseError{Code: int(ce.Code), Reason: ce.Reason}
	}
	return err
}

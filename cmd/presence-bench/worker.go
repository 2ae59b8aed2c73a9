package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/presenced/presenced/internal/auth"
)

// workerStatus is one line a worker writes to its stdout (JSON).
type workerStatus struct {
	Connected  int64  `json:"connected"`  // welcome received
	Failed     int64  `json:"failed"`     // dial, handshake or welcome failed
	Dropped    int64  `json:"dropped"`    // closed by the server or broken while held
	Beats      int64  `json:"beats"`      // heartbeats sent
	Unexpected int64  `json:"unexpected"` // reads that returned data after the welcome
	FirstError string `json:"first_error,omitempty"`
	Ready      bool   `json:"ready,omitempty"` // every connection was tried
	Done       bool   `json:"done,omitempty"`  // all closed; the last line
}

// counters are a worker's live counts.
type counters struct {
	connected, failed, dropped, beats, unexpected atomic.Int64

	errMu    sync.Mutex
	firstErr string
}

func (c *counters) fail(err error) {
	c.failed.Add(1)
	c.errMu.Lock()
	if c.firstErr == "" {
		c.firstErr = err.Error()
	}
	c.errMu.Unlock()
}

func (c *counters) status() workerStatus {
	c.errMu.Lock()
	e := c.firstErr
	c.errMu.Unlock()
	return workerStatus{
		Connected: c.connected.Load(), Failed: c.failed.Load(), Dropped: c.dropped.Load(),
		Beats: c.beats.Load(), Unexpected: c.unexpected.Load(), FirstError: e,
	}
}

var heartbeatMsg = []byte(`{"type":"heartbeat"}`)

// runWorker opens connections [first, first+count), reports its counts on
// out every half second, and holds the connections until stop (its stdin)
// ends or its own time bound runs out.
func runWorker(cfg *connConfig, stop io.Reader, out io.Writer) error {
	var (
		cnt    counters
		outMu  sync.Mutex
		enc    = json.NewEncoder(out)
		mu     sync.Mutex
		conns  = make(map[net.Conn]struct{}, cfg.count)
		ending atomic.Bool
		held   sync.WaitGroup // every connection's goroutine
	)
	report := func(s workerStatus) {
		outMu.Lock()
		_ = enc.Encode(s)
		outMu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.rampTimeout+cfg.hold+time.Minute)
	defer cancel()
	go func() { // the parent closes our stdin to end the run (or dies)
		_, _ = io.Copy(io.Discard, stop)
		cancel()
	}()
	ticker := time.NewTicker(500 * time.Millisecond)
	defer ticker.Stop()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				report(cnt.status())
			}
		}
	}()

	rampCtx, rampCancel := context.WithTimeout(ctx, cfg.rampTimeout)
	defer rampCancel()
	sem := make(chan struct{}, cfg.concurrency)
	var dials sync.WaitGroup
	for i := cfg.first; i < cfg.first+cfg.count; i++ {
		select {
		case sem <- struct{}{}:
		case <-rampCtx.Done():
			cnt.fail(fmt.Errorf("ramp: %w", rampCtx.Err()))
			continue
		}
		dials.Add(1)
		held.Add(1)
		go func() {
			defer held.Done()
			nc, rd, err := dialOne(rampCtx, cfg, i)
			<-sem
			if err != nil {
				dials.Done()
				cnt.fail(err)
				return
			}
			mu.Lock()
			if ending.Load() {
				mu.Unlock()
				nc.Close()
				dials.Done()
				return
			}
			conns[nc] = struct{}{}
			mu.Unlock()
			cnt.connected.Add(1)
			dials.Done()
			holdOne(nc, rd, cfg.heartbeat, &cnt, &ending)
			mu.Lock()
			delete(conns, nc)
			mu.Unlock()
		}()
	}
	dials.Wait()
	s := cnt.status()
	s.Ready = true
	report(s)

	<-ctx.Done()
	mu.Lock()
	ending.Store(true)
	for nc := range conns {
		nc.Close()
	}
	mu.Unlock()
	held.Wait()
	s = cnt.status()
	s.Done = true
	report(s)
	return nil
}

// dialOne opens connection i from its source address and reads the
// welcome. The reader it returns holds what the handshake buffered.
func dialOne(ctx context.Context, cfg *connConfig, i int) (net.Conn, io.Reader, error) {
	nc, br, err := dialFrom(ctx, cfg.wsURL, "bench-"+strconv.Itoa(i), cfg.dev, cfg.jwtSecret,
		cfg.rampTimeout+cfg.hold+time.Hour, sourceAddr(i, cfg.perSource))
	if err != nil {
		return nil, nil, fmt.Errorf("connection %d: %w", i, err)
	}
	if br == nil {
		return nc, nc, nil
	}
	if br.Buffered() == 0 {
		ws.PutReader(br) // nothing more buffered: read the socket directly
		return nc, nc, nil
	}
	return nc, br, nil
}

// dialFrom opens a WebSocket to base as device "d" of user from source
// address src — with a bare user_id under -dev, else with a token minted
// for ttl — and reads the welcome. It returns the reader that holds what
// the handshake buffered, or nil.
func dialFrom(ctx context.Context, base *url.URL, user string, dev bool, secret string, ttl time.Duration, src net.IP) (net.Conn, *bufio.Reader, error) {
	u := *base
	q := url.Values{}
	if dev {
		q.Set("user_id", user)
	} else {
		tok, err := auth.Sign([]byte(secret), user, "", time.Now(), ttl)
		if err != nil {
			return nil, nil, err
		}
		q.Set("token", tok)
	}
	q.Set("device_id", "d")
	u.RawQuery = q.Encode()
	d := ws.Dialer{
		Timeout: 10 * time.Second,
		NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Control: bindNoPort}
			return nd.DialContext(ctx, network, addr)
		},
	}
	nc, br, _, err := d.Dial(ctx, u.String())
	if err != nil {
		return nil, nil, err
	}
	var rd io.Reader = nc
	if br != nil {
		rd = br
	}
	if err := readWelcome(nc, rd); err != nil {
		nc.Close()
		if br != nil {
			ws.PutReader(br)
		}
		return nil, nil, fmt.Errorf("welcome: %w", err)
	}
	return nc, br, nil
}

// holdOne heartbeats on nc every interval (±10%, the first beat at a random
// point of the first interval) until the connection ends. Anything the
// server sends is counted, not parsed: an idle connection without
// subscriptions receives nothing.
func holdOne(nc net.Conn, rd io.Reader, interval time.Duration, cnt *counters, ending *atomic.Bool) {
	defer nc.Close()
	next := time.Now().Add(rand.N(interval))
	var buf [256]byte
	for {
		_ = nc.SetReadDeadline(next)
		n, err := rd.Read(buf[:])
		if n > 0 {
			cnt.unexpected.Add(1)
		}
		if err == nil {
			continue
		}
		if ending.Load() {
			return
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			cnt.dropped.Add(1)
			return
		}
		_ = nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if err := ws.WriteFrame(nc, ws.MaskFrame(ws.NewTextFrame(heartbeatMsg))); err != nil {
			if !ending.Load() {
				cnt.dropped.Add(1)
			}
			return
		}
		cnt.beats.Add(1)
		jitter := time.Duration(rand.Int64N(int64(interval)/5+1)) - interval/10
		next = time.Now().Add(interval + jitter)
	}
}

// workerProcess is a running worker as the parent sees it.
type workerProcess struct {
	mu   sync.Mutex
	last workerStatus
}

func (w *workerProcess) get() workerStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// readStatus follows a worker's stdout until it ends.
func (w *workerProcess) readStatus(r io.Reader, ready, done chan<- struct{}) {
	sc := bufio.NewScanner(r)
	sentReady := false
	for sc.Scan() {
		var s workerStatus
		if json.Unmarshal(sc.Bytes(), &s) != nil {
			continue
		}
		w.mu.Lock()
		w.last = s
		w.mu.Unlock()
		if (s.Ready || s.Done) && !sentReady {
			sentReady = true
			ready <- struct{}{}
		}
	}
	if !sentReady {
		ready <- struct{}{}
	}
	done <- struct{}{}
}

// executable is the binary the workers run (this one).
func executable() (string, error) { return os.Executable() }

// readWelcome reads the server's first message from rd (nc, or the reader
// the handshake left buffered bytes in) within 10 s and checks that it is
// the welcome; it clears the read deadline after.
func readWelcome(nc net.Conn, rd io.Reader) error {
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	data, op, err := wsutil.ReadServerData(struct {
		io.Reader
		io.Writer
	}{rd, nc})
	if err != nil {
		return err
	}
	var m struct {
		Type string `json:"type"`
	}
	if op != ws.OpText || json.Unmarshal(data, &m) != nil || m.Type != "welcome" {
		return fmt.Errorf("first message %.80q is not a welcome", data)
	}
	_ = nc.SetReadDeadline(time.Time{})
	return nil
}

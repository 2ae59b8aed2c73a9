package main

// The Redis baseline of the fanout scenario: the same shape (T channels, W
// subscriber connections each on every channel, one PUBLISH per change at
// the same interval) over plain Redis pub/sub, spoken in RESP directly (a
// few lines, and nothing between the socket and the clock).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// pubsubAddr returns host:port of a redis:// URL on a loopback address.
func pubsubAddr(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "redis" {
		return "", fmt.Errorf("-baseline-redis %q: want redis://127.0.0.1:6379", raw)
	}
	if u.User != nil || u.RawQuery != "" {
		return "", fmt.Errorf("-baseline-redis %q: no credentials or options please", raw)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "6379"
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("-baseline-redis %q: bad port", raw)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("-baseline-redis %q: refusing a non-loopback server", raw)
	}
	return net.JoinHostPort(host, port), nil
}

// pubsubCmd encodes a command as a RESP array of bulk strings.
func pubsubCmd(args ...string) []byte {
	b := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, "\r\n"...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	return b
}

// readPubSub reads one RESP value: string (simple or bulk; nil bulk is ""),
// int64, []any, or an error reply as error (second result nil).
func readPubSub(br *bufio.Reader) (any, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("redis: bad line %.40q", line)
	}
	body := string(line[1 : len(line)-2])
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return errors.New("redis: " + body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n > 1<<20 {
			return nil, fmt.Errorf("redis: bad bulk length %q", body)
		}
		if n < 0 {
			return "", nil
		}
		p := make([]byte, n+2)
		if _, err := io.ReadFull(br, p); err != nil {
			return nil, err
		}
		return string(p[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n > 1<<16 {
			return nil, fmt.Errorf("redis: bad array length %q", body)
		}
		out := make([]any, 0, max(n, 0))
		for range n {
			v, err := readPubSub(br)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("redis: unexpected reply %.40q", line)
}

// pubsubConn is one connection to Redis.
type pubsubConn struct {
	nc net.Conn
	br *bufio.Reader
}

func dialPubSub(ctx context.Context, addr string) (*pubsubConn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("redis %s: %w", addr, err)
	}
	return &pubsubConn{nc: nc, br: bufio.NewReader(nc)}, nil
}

// redisRecv is one message a subscriber read.
type redisRecv struct {
	target int
	seq    int
	at     time.Time
}

func runRedisBaseline(ctx context.Context, cfg *fanoutConfig, stderr io.Writer) (*fanoutBaseline, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup // subscribers' readers
		pubs     sync.WaitGroup // publishers
		mu       sync.Mutex     // guards conns
		conns    []*pubsubConn
		received atomic.Int64
		errs     errCounter
	)
	keep := func(c *pubsubConn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	closeAll := func() {
		cancel()
		mu.Lock()
		for _, c := range conns {
			c.nc.Close()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
		pubs.Wait()
	}
	defer closeAll()

	channels := make([]string, cfg.targets)
	index := make(map[string]int, cfg.targets)
	for t := range channels {
		channels[t] = "pb" + cfg.tag + ":t" + strconv.Itoa(t)
		index[channels[t]] = t
	}
	subs := make([][]redisRecv, cfg.watchers)
	if err := dialAll(ctx, cfg.watchers, "redis subscribers", stderr, func(i int) error {
		c, err := dialPubSub(ctx, cfg.redisAddr)
		if err != nil {
			return err
		}
		keep(c)
		_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.nc.Write(pubsubCmd(append([]string{"SUBSCRIBE"}, channels...)...)); err != nil {
			return err
		}
		for range channels {
			v, err := readPubSub(c.br)
			if err != nil {
				return err
			}
			if a, ok := v.([]any); !ok || len(a) != 3 || a[0] != "subscribe" {
				return fmt.Errorf("redis SUBSCRIBE answered %v", v)
			}
		}
		_ = c.nc.SetDeadline(time.Time{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				v, err := readPubSub(c.br)
				if err != nil {
					if ctx.Err() == nil {
						errs.add(err)
					}
					return
				}
				at := time.Now()
				a, ok := v.([]any)
				if !ok || len(a) != 3 || a[0] != "message" {
					continue
				}
				ch, _ := a[1].(string)
				p, _ := a[2].(string)
				t, ok := index[ch]
				seq, err := strconv.Atoi(p)
				if !ok || err != nil {
					continue
				}
				received.Add(1)
				subs[i] = append(subs[i], redisRecv{target: t, seq: seq, at: at})
			}
		}()
		return nil
	}); err != nil {
		return nil, err
	}

	sends := make([][]time.Time, cfg.targets)
	var sent atomic.Int64
	start := time.Now()
	end := start.Add(cfg.duration)
	for t := range cfg.targets {
		c, err := dialPubSub(ctx, cfg.redisAddr)
		if err != nil {
			return nil, err
		}
		keep(c)
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			next := start.Add(cfg.interval * time.Duration(t) / time.Duration(cfg.targets))
			for k := 0; ; k++ {
				if !sleepUntil(ctx, next) || !time.Now().Before(end) {
					return
				}
				if n := sent.Add(1); cfg.changes > 0 && n > int64(cfg.changes) {
					return
				}
				_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
				// Stamped before the write, as presenced's sends are: a
				// subscriber may read the message before this goroutine
				// runs again.
				sends[t] = append(sends[t], time.Now())
				if _, err := c.nc.Write(pubsubCmd("PUBLISH", channels[t], strconv.Itoa(k))); err != nil {
					sends[t] = sends[t][:k]
					errs.add(err)
					return
				}
				if v, err := readPubSub(c.br); err != nil {
					errs.add(err)
					return
				} else if e, ok := v.(error); ok {
					errs.add(e)
					return
				}
				next = next.Add(cfg.interval)
			}
		}()
	}
	waitProgress(&pubs, func(time.Time) {
		fmt.Fprintf(stderr, "redis  %6.1fs: %d messages read, %d errors\n", time.Since(start).Seconds(), received.Load(), errs.n.Load())
	})
	publishes := 0
	for _, s := range sends {
		publishes += len(s)
	}
	expected := int64(publishes) * int64(cfg.watchers)
	drainEnd := time.Now().Add(cfg.drain)
	for received.Load() < expected && time.Now().Before(drainEnd) {
		if !sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) {
			return nil, ctx.Err()
		}
	}
	closeAll()
	if e := errs.firstErr(); e != "" {
		fmt.Fprintf(stderr, "redis baseline: %d errors, the first: %s\n", errs.n.Load(), e)
	}

	var lat latSet
	var lastAt time.Time
	for _, rs := range subs {
		for _, r := range rs {
			if r.seq < 0 || r.seq >= len(sends[r.target]) {
				continue
			}
			lat.add(r.at.Sub(sends[r.target][r.seq]))
			if r.at.After(lastAt) {
				lastAt = r.at
			}
		}
	}
	b := &fanoutBaseline{
		RedisURL: cfg.redisURL, Publishes: publishes, Expected: expected,
		Deliveries: int64(lat.n()), Missing: expected - int64(lat.n()), Latency: lat.summary(),
	}
	if d := lastAt.Sub(start).Seconds(); d > 0 {
		b.DeliveriesPerSec = float64(b.Deliveries) / d
	}
	return b, nil
}

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/gobwas/ws"
)

// Bounds of the heartbeats scenario.
const (
	maxWSDevices = maxPerWorker // sockets of the one generating process
	minInterval  = 60 * time.Millisecond
	metricBeats  = "presenced_heartbeats_total"
	metricRateWS = "presenced_ws_rate_limited_total"
)

// hbConfig is the configuration of the heartbeats scenario.
type hbConfig struct {
	benchFlags
	transport   string
	n           int
	interval    time.Duration
	warmup      time.Duration
	prefix      string
	senders     int
	concurrency int
	perSource   int
	dialConc    int
	baseline    string
	baseConns   int
	baseTTL     time.Duration

	redis redisTarget // parsed -baseline-redis
}

func parseHeartbeats(args []string, stderr io.Writer) (*hbConfig, error) {
	c := &hbConfig{}
	fs := flag.NewFlagSet("presence-bench heartbeats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs, 20*time.Second)
	fs.StringVar(&c.transport, "transport", "ws", "ws (one WebSocket per device) or http (POST /v1/heartbeat with -api-key)")
	fs.IntVar(&c.n, "n", 10_000, "simulated devices, users <prefix>0… (ws: at most "+strconv.Itoa(maxWSDevices)+")")
	fs.DurationVar(&c.interval, "interval", time.Second, "heartbeat interval of each device (±10% jitter; the server allows 20 messages/s per socket)")
	fs.DurationVar(&c.warmup, "warmup", 3*time.Second, "beat this long before measuring")
	fs.StringVar(&c.prefix, "prefix", "u", "user id prefix")
	fs.IntVar(&c.senders, "senders", 0, "ws: goroutines writing the beats, each owning a share of the sockets (0: 2×GOMAXPROCS)")
	fs.IntVar(&c.concurrency, "concurrency", 64, "http: requests in flight (keep-alive connections)")
	fs.IntVar(&c.perSource, "per-source", 10_000, "ws: sockets per source address 127.0.0.2, 127.0.0.3, …")
	fs.IntVar(&c.dialConc, "dial-concurrency", 64, "ws: handshakes in flight while connecting")
	fs.StringVar(&c.baseline, "baseline-redis", "", "after the run, play the same load as one SETEX per beat against this Redis (redis://127.0.0.1:6379/0)")
	fs.IntVar(&c.baseConns, "baseline-conns", 1000, "baseline: Redis connections, one goroutine each, one round trip per beat")
	fs.DurationVar(&c.baseTTL, "baseline-ttl", 30*time.Second, "baseline: SETEX ttl")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, c.validate()
}

func (c *hbConfig) validate() error {
	if err := c.check(c.transport == "ws"); err != nil {
		return err
	}
	switch c.transport {
	case "ws":
		if c.n < 1 || c.n > maxWSDevices {
			return fmt.Errorf("-n %d: must be between 1 and %d over WebSocket (one process, one socket per device; raise the rate with a shorter -interval)", c.n, maxWSDevices)
		}
		if last := firstSourceHost + (c.n-1)/max(c.perSource, 1); c.perSource < 1 || c.perSource > maxPerSource || last > 254 {
			return fmt.Errorf("-per-source %d: must be between 1 and %d, and -n/-per-source fit 127.0.0.2…254", c.perSource, maxPerSource)
		}
	case "http":
		if c.n < 1 || c.n > maxDevices {
			return fmt.Errorf("-n %d: must be between 1 and %d", c.n, maxDevices)
		}
	default:
		return fmt.Errorf("-transport %q: ws or http", c.transport)
	}
	if c.interval < minInterval || c.interval > maxHeartbeat {
		return fmt.Errorf("-interval %v: must be between %v and %v", c.interval, minInterval, maxHeartbeat)
	}
	if c.warmup < 0 || c.warmup > maxDuration {
		return fmt.Errorf("-warmup %v: must be between 0 and %v", c.warmup, maxDuration)
	}
	if c.senders == 0 {
		c.senders = 2 * runtime.GOMAXPROCS(0)
	}
	if c.senders < 1 || c.senders > 1024 || c.concurrency < 1 || c.concurrency > 1024 || c.dialConc < 1 || c.dialConc > 1024 {
		return errors.New("-senders, -concurrency and -dial-concurrency must be between 1 and 1024")
	}
	if c.prefix == "" || len(c.prefix) > 32 {
		return fmt.Errorf("-prefix %q: 1 to 32 characters", c.prefix)
	}
	if c.baseline != "" {
		t, err := parseRedisURL(c.baseline)
		if err != nil {
			return fmt.Errorf("-baseline-redis: %w", err)
		}
		c.redis = t
		if c.baseConns < 1 || c.baseConns > 10_000 {
			return fmt.Errorf("-baseline-conns %d: must be between 1 and 10000", c.baseConns)
		}
		if c.baseTTL < time.Second {
			return fmt.Errorf("-baseline-ttl %v: at least 1s", c.baseTTL)
		}
	}
	return nil
}

// hbResult is the outcome of the heartbeats scenario (the -json object).
type hbResult struct {
	Scenario     string  `json:"scenario"` // "heartbeats"
	URL          string  `json:"url"`
	Transport    string  `json:"transport"` // ws or http
	Devices      int     `json:"devices"`
	Interval     string  `json:"interval"`
	TargetPerSec float64 `json:"target_beats_per_sec"` // devices / interval
	Warmup       string  `json:"warmup"`
	Duration     string  `json:"duration"`
	ServerPID    int     `json:"server_pid"`

	Connected     int64   `json:"connected"`      // ws: sockets that got their welcome
	ConnectFailed int64   `json:"connect_failed"` // ws: dials or handshakes that failed
	ConnectSecs   float64 `json:"connect_seconds"`

	// Over the measured window (after the warm-up).
	Sent           int64   `json:"sent"`
	Accepted       int64   `json:"accepted"` // delta of presenced_heartbeats_total
	SentPerSec     float64 `json:"sent_per_sec"`
	AcceptedPerSec float64 `json:"accepted_per_sec"`
	ServerCores    float64 `json:"server_cpu_cores"`    // utime+stime of the server ÷ wall time
	GeneratorCores float64 `json:"generator_cpu_cores"` // the same for this process

	// Over the whole run (warm-up included, connect beats excluded), once
	// the server has applied everything in flight: accepted ≤ sent.
	SentTotal     int64  `json:"sent_total"`
	AcceptedTotal int64  `json:"accepted_total"`
	Errors        int64  `json:"errors"`       // failed writes or requests, non-200 answers
	RateLimited   int64  `json:"rate_limited"` // ws: presenced_ws_rate_limited_total delta
	FirstError    string `json:"first_error,omitempty"`

	Baseline *hbBaseline `json:"baseline,omitempty"`
}

// hbBaseline is the same load as one SETEX per beat against Redis.
type hbBaseline struct {
	Redis          string  `json:"redis"`
	Conns          int     `json:"conns"`
	Sent           int64   `json:"sent"`
	Accepted       int64   `json:"accepted"` // +OK replies
	SentPerSec     float64 `json:"sent_per_sec"`
	AcceptedPerSec float64 `json:"accepted_per_sec"`
	Errors         int64   `json:"errors"`
	FirstError     string  `json:"first_error,omitempty"`
	RedisPID       int     `json:"redis_pid,omitempty"`
	RedisCores     float64 `json:"redis_cpu_cores"` // 0 when its process is not visible
	GeneratorCores float64 `json:"generator_cpu_cores"`
	KeysDeleted    int64   `json:"keys_deleted"`
	// Ratio is presenced's accepted beats/s ÷ Redis's.
	Ratio float64 `json:"ratio"`
}

func runHeartbeatsCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseHeartbeats, func(c *hbConfig) bool { return c.json }, runHeartbeats, printHeartbeats)
}

// errLog counts errors and keeps the first.
type errLog struct {
	n     atomic.Int64
	mu    sync.Mutex
	first string
}

func (e *errLog) add(err error) {
	if e.n.Add(1) == 1 {
		e.mu.Lock()
		e.first = err.Error()
		e.mu.Unlock()
	}
}

func (e *errLog) firstErr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.first
}

// beatGen runs the schedule of a set of devices over several goroutines
// and counts the beats they send.
type beatGen struct {
	sent []padded // one per goroutine
	errs errLog
}

func (g *beatGen) total() int64 {
	var t int64
	for i := range g.sent {
		t += g.sent[i].n.Load()
	}
	return t
}

// due is one device's next beat, in nanoseconds since the schedule's start.
type due struct {
	at  int64
	dev int32
}

// outcome is what became of one beat.
type outcome int

const (
	beatSent outcome = iota // sent (counted), the device goes on
	beatSkip                // not sent and not counted (cut by the end of the run)
	beatDrop                // the device's connection broke: no more beats
)

// schedule beats every device of devs every interval (±10%), the first
// beat at a random point of the first interval, until ctx ends or no device
// is left. A schedule that falls behind sends as fast as it can but never
// owes more than one interval of beats. It allocates nothing per beat.
func (g *beatGen) schedule(ctx context.Context, slot int, devs []int32, interval time.Duration, send func(dev int32) outcome) {
	iv := int64(interval)
	h := make([]due, 0, len(devs))
	for _, d := range devs {
		h = append(h, due{at: rand.Int64N(iv), dev: d})
	}
	// heapify
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
	start := time.Now()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for len(h) > 0 && ctx.Err() == nil {
		now := int64(time.Since(start))
		if wait := h[0].at - now; wait > 0 {
			timer.Reset(time.Duration(wait))
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			continue
		}
		switch send(h[0].dev) {
		case beatDrop:
			h[0] = h[len(h)-1]
			h = h[:len(h)-1]
			if len(h) > 0 {
				siftDown(h, 0)
			}
			continue
		case beatSent:
			g.sent[slot].n.Add(1)
		}
		next := h[0].at + iv + rand.Int64N(iv/5+1) - iv/10
		h[0].at = max(next, now-iv)
		siftDown(h, 0)
	}
}

func siftDown(h []due, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].at < h[l].at {
			m = r
		}
		if h[i].at <= h[m].at {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// shares splits devices 0..n-1 over k owners (device i to owner i mod k).
func shares(n, k int) [][]int32 {
	k = min(k, n)
	out := make([][]int32, k)
	for i := range n {
		out[i%k] = append(out[i%k], int32(i))
	}
	return out
}

// heartbeatFrame is {"type":"heartbeat"} as one masked client text frame,
// encoded once: every socket writes the same bytes.
func heartbeatFrame() []byte {
	var b bytes.Buffer
	f := ws.MaskFrameWith(ws.NewTextFrame(heartbeatMsg), [4]byte{0x5a, 0xc3, 0x17, 0x9e})
	if err := ws.WriteFrame(&b, f); err != nil {
		panic(err) // a bytes.Buffer does not fail
	}
	return b.Bytes()
}

// load is a running generator: the transport-specific part of a run.
type load interface {
	// start begins beating; wait returns once every goroutine has stopped
	// after ctx ends.
	start(ctx context.Context, g *beatGen)
	wait()
	close()
}

func runHeartbeats(ctx context.Context, cfg *hbConfig, stderr io.Writer) (*hbResult, error) {
	pid, err := cfg.resolvePID()
	if err != nil {
		return nil, err
	}
	srv := cfg.metricsReader()
	res := &hbResult{
		Scenario: "heartbeats", URL: cfg.wsURL.String(), Transport: cfg.transport, Devices: cfg.n,
		Interval: cfg.interval.String(), TargetPerSec: float64(cfg.n) / cfg.interval.Seconds(),
		Warmup: cfg.warmup.String(), Duration: cfg.duration.String(), ServerPID: pid,
	}
	if cfg.transport == "http" {
		res.URL = cfg.httpBase
	}
	beats0, err := metricValue(srv, metricBeats)
	if err != nil {
		return nil, fmt.Errorf("accepted beats are read from /metrics: %w", err)
	}
	rl0, _ := metricValue(srv, metricRateWS)

	var ld load
	var connected int64
	if cfg.transport == "ws" {
		w, err := connectWS(ctx, cfg, res, stderr)
		if err != nil {
			return nil, err
		}
		ld, connected = w, res.Connected
	} else {
		ld = newHTTPLoad(cfg)
	}
	defer ld.close()

	fmt.Fprintf(stderr, "beating: %d devices every %v over %s (target %.0f/s); warm-up %v, then %v measured\n",
		cfg.n, cfg.interval, cfg.transport, res.TargetPerSec, cfg.warmup, cfg.duration)
	g := &beatGen{}
	runCtx, stop := context.WithCancel(ctx)
	ld.start(runCtx, g)
	defer func() { // on every path: no sender outlives the run
		stop()
		ld.wait()
	}()
	progress := func(phase string, from time.Time, sent0 int64, acc0 float64) {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		lastAt, lastSent, lastAcc := from, sent0, acc0
		end := from.Add(cfg.duration)
		if phase == "warm-up" {
			end = from.Add(cfg.warmup)
		}
		for time.Now().Before(end) {
			wait := min(time.Until(end), time.Until(lastAt.Add(time.Second)))
			if !sleepCtx(ctx, wait) {
				return
			}
			now := time.Now()
			s := g.total()
			a, _ := metricValue(srv, metricBeats)
			secs := now.Sub(lastAt).Seconds()
			fmt.Fprintf(stderr, "%s %5.1fs  sent %8.0f/s  accepted %8.0f/s  errors %d\n",
				phase, now.Sub(from).Seconds(), float64(s-lastSent)/secs, (a-lastAcc)/secs, g.errs.n.Load())
			lastAt, lastSent, lastAcc = now, s, a
		}
	}
	a, _ := metricValue(srv, metricBeats)
	progress("warm-up", time.Now(), 0, a)

	// The measured window.
	sent0 := g.total()
	acc0, err := metricValue(srv, metricBeats)
	if err != nil {
		return nil, err
	}
	srvCPU, genCPU := startCPU(pid), startCPU(os.Getpid())
	t0 := time.Now()
	progress("measure", t0, sent0, acc0)
	acc1, err := metricValue(srv, metricBeats)
	if err != nil {
		return nil, err
	}
	sent1 := g.total()
	wall := time.Since(t0).Seconds()
	res.ServerCores, res.GeneratorCores = srvCPU.cores(), genCPU.cores()
	res.Sent, res.Accepted = sent1-sent0, int64(acc1-acc0)
	res.SentPerSec, res.AcceptedPerSec = float64(res.Sent)/wall, (acc1-acc0)/wall

	stop()
	ld.wait()
	// Let the server apply what is in flight: wait for its counter to settle.
	accEnd := acc1
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		v, err := metricValue(srv, metricBeats)
		if err != nil {
			return nil, err
		}
		if v == accEnd && g.total() == sent1 {
			break
		}
		accEnd, sent1 = v, g.total()
	}
	rl1, _ := metricValue(srv, metricRateWS)
	res.SentTotal = g.total()
	res.AcceptedTotal = int64(accEnd-beats0) - connected
	res.RateLimited = int64(rl1 - rl0)
	res.Errors, res.FirstError = g.errs.n.Load(), g.errs.firstErr()
	ld.close()
	fmt.Fprintf(stderr, "presenced: sent %.0f/s, accepted %.0f/s; server %.2f cores, generator %.2f cores\n",
		res.SentPerSec, res.AcceptedPerSec, res.ServerCores, res.GeneratorCores)

	if cfg.baseline != "" {
		b, err := redisHeartbeats(ctx, cfg, stderr)
		if err != nil {
			return nil, fmt.Errorf("baseline: %w", err)
		}
		b.Ratio = divide(res.AcceptedPerSec, b.AcceptedPerSec)
		res.Baseline = b
	}
	return res, nil
}

// wsLoad is one WebSocket per device, written by a few sender goroutines.
type wsLoad struct {
	cfg   *hbConfig
	conns []net.Conn // by device; nil if the device failed to connect
	frame []byte
	wg    sync.WaitGroup
	once  sync.Once
}

func connectWS(ctx context.Context, cfg *hbConfig, res *hbResult, stderr io.Writer) (*wsLoad, error) {
	w := &wsLoad{cfg: cfg, conns: make([]net.Conn, cfg.n), frame: heartbeatFrame()}
	var connected, failed atomic.Int64
	var errs errLog
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range cfg.dialConc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= cfg.n || dctx.Err() != nil {
					return
				}
				nc, err := dialDevice(dctx, cfg, i)
				if err != nil {
					failed.Add(1)
					errs.add(err)
					continue
				}
				w.conns[i] = nc
				connected.Add(1)
			}
		}()
	}
	waitProgress(&wg, func(time.Time) {
		fmt.Fprintf(stderr, "connect %5.1fs  %d/%d connected  %d failed\n", time.Since(start).Seconds(), connected.Load(), cfg.n, failed.Load())
	})
	res.Connected, res.ConnectFailed, res.ConnectSecs = connected.Load(), failed.Load(), time.Since(start).Seconds()
	fmt.Fprintf(stderr, "connected %d of %d in %.1fs\n", res.Connected, cfg.n, res.ConnectSecs)
	if res.Connected == 0 {
		w.close()
		return nil, fmt.Errorf("no connection: %s", errs.firstErr())
	}
	if res.ConnectFailed > 0 {
		fmt.Fprintf(stderr, "warning: %d connections failed; first: %s\n", res.ConnectFailed, errs.firstErr())
	}
	return w, nil
}

// dialDevice opens device i's socket from its source address and reads
// the welcome.
func dialDevice(ctx context.Context, cfg *hbConfig, i int) (net.Conn, error) {
	nc, br, err := dialFrom(ctx, cfg.wsURL, cfg.prefix+strconv.Itoa(i), cfg.dev, cfg.jwtSecret,
		cfg.warmup+cfg.duration+time.Hour, sourceAddr(i, cfg.perSource))
	if err != nil {
		return nil, fmt.Errorf("device %d: %w", i, err)
	}
	if br != nil {
		ws.PutReader(br) // the senders never read
	}
	return nc, nil
}

// start runs the senders. Nothing is read back: the server answers a
// heartbeat with nothing (a refused one with an error, counted by the
// server as rate_limited), and a broken socket shows as a failed write.
func (w *wsLoad) start(ctx context.Context, g *beatGen) {
	var devs []int32
	for i, c := range w.conns {
		if c != nil {
			devs = append(devs, int32(i))
		}
	}
	parts := make([][]int32, min(w.cfg.senders, len(devs)))
	for j, d := range devs {
		parts[j%len(parts)] = append(parts[j%len(parts)], d)
	}
	g.sent = make([]padded, len(parts))
	for slot, p := range parts {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			g.schedule(ctx, slot, p, w.cfg.interval, func(dev int32) outcome {
				if _, err := w.conns[dev].Write(w.frame); err != nil {
					if ctx.Err() == nil {
						g.errs.add(fmt.Errorf("device %d: %w", dev, err))
					}
					return beatDrop
				}
				return beatSent
			})
		}()
	}
}

// wait unblocks a write the server does not take (it stopped reading) and
// waits for the senders; call it once their context is done.
func (w *wsLoad) wait() {
	for _, c := range w.conns {
		if c != nil {
			_ = c.SetWriteDeadline(time.Now())
		}
	}
	w.wg.Wait()
}

func (w *wsLoad) close() {
	w.once.Do(func() {
		for _, c := range w.conns {
			if c != nil {
				c.Close()
			}
		}
	})
}

// httpLoad is POST /v1/heartbeat from -concurrency keep-alive clients.
type httpLoad struct {
	cfg *hbConfig
	hc  *http.Client
	wg  sync.WaitGroup
}

func newHTTPLoad(cfg *hbConfig) *httpLoad {
	tr := &http.Transport{
		MaxIdleConns: cfg.concurrency, MaxIdleConnsPerHost: cfg.concurrency, MaxConnsPerHost: cfg.concurrency,
		IdleConnTimeout: time.Minute, DisableCompression: true,
	}
	return &httpLoad{cfg: cfg, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

func (l *httpLoad) start(ctx context.Context, g *beatGen) {
	parts := shares(l.cfg.n, l.cfg.concurrency)
	g.sent = make([]padded, len(parts))
	for slot, p := range parts {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var body []byte
			rd := bytes.NewReader(nil)
			g.schedule(ctx, slot, p, l.cfg.interval, func(dev int32) outcome {
				body = append(body[:0], `{"user_id":"`...)
				body = append(body, l.cfg.prefix...)
				body = strconv.AppendInt(body, int64(dev), 10)
				body = append(body, `","device_id":"d"}`...)
				rd.Reset(body)
				// A request cut by the end of the run was sent and may have
				// been applied: it counts as sent (not as an error), so the
				// server never accepts more than was sent.
				if err := postBeat(ctx, l.hc, l.cfg.httpBase, l.cfg.apiKey, rd); err != nil && ctx.Err() == nil {
					g.errs.add(err)
				}
				return beatSent // a failed request is counted as sent and as an error
			})
		}()
	}
}

// postBeat sends one POST /v1/heartbeat and reads the answer.
func postBeat(ctx context.Context, hc *http.Client, base, apiKey string, body io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/heartbeat", body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("POST /v1/heartbeat: %s %s", resp.Status, bytes.TrimSpace(b))
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

func (l *httpLoad) wait() { l.wg.Wait() }

func (l *httpLoad) close() { l.hc.CloseIdleConnections() }

func printHeartbeats(w io.Writer, r *hbResult) {
	fmt.Fprintf(w, "heartbeats over %s: %d devices every %s (target %.0f/s), %s measured after %s warm-up\n",
		r.Transport, r.Devices, r.Interval, r.TargetPerSec, r.Duration, r.Warmup)
	if r.Transport == "ws" {
		fmt.Fprintf(w, "connected %d, failed %d, in %.1fs\n", r.Connected, r.ConnectFailed, r.ConnectSecs)
	}
	fmt.Fprintf(w, "whole run: sent %d, accepted %d, errors %d, rate-limited %d\n", r.SentTotal, r.AcceptedTotal, r.Errors, r.RateLimited)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if b := r.Baseline; b != nil {
		fmt.Fprintln(tw, "\tpresenced\tRedis SETEX per beat\tratio\t")
		fmt.Fprintf(tw, "sent/s\t%.0f\t%.0f\t%.2f×\t\n", r.SentPerSec, b.SentPerSec, divide(r.SentPerSec, b.SentPerSec))
		fmt.Fprintf(tw, "accepted/s\t%.0f\t%.0f\t%.2f×\t\n", r.AcceptedPerSec, b.AcceptedPerSec, b.Ratio)
		fmt.Fprintf(tw, "server CPU (cores)\t%.2f\t%.2f\t\t\n", r.ServerCores, b.RedisCores)
		fmt.Fprintf(tw, "generator CPU (cores)\t%.2f\t%.2f\t\t\n", r.GeneratorCores, b.GeneratorCores)
		fmt.Fprintf(tw, "errors\t%d\t%d\t\t\n", r.Errors, b.Errors)
	} else {
		fmt.Fprintln(tw, "\tpresenced\t")
		fmt.Fprintf(tw, "sent/s\t%.0f\t\n", r.SentPerSec)
		fmt.Fprintf(tw, "accepted/s\t%.0f\t\n", r.AcceptedPerSec)
		fmt.Fprintf(tw, "server CPU (cores)\t%.2f\t\n", r.ServerCores)
		fmt.Fprintf(tw, "generator CPU (cores)\t%.2f\t\n", r.GeneratorCores)
	}
	_ = tw.Flush()
	if b := r.Baseline; b != nil && b.FirstError != "" {
		fmt.Fprintf(w, "baseline first error: %s\n", b.FirstError)
	}
}

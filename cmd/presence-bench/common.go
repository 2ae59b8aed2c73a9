package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds shared by the heartbeats, batch and limits scenarios.
const (
	maxDuration = time.Hour // -duration, -warmup
	maxDevices  = 1_000_000 // -n of heartbeats, -users of batch
	maxUsers    = 10_000_000
	clockTicks  = 100 // USER_HZ of /proc/<pid>/stat on Linux
)

// benchFlags are the flags every load scenario shares.
type benchFlags struct {
	rawURL    string
	dev       bool
	jwtSecret string
	apiKey    string
	serverPID int
	json      bool
	duration  time.Duration

	wsURL    *url.URL // filled by check
	httpBase string

	// A scenario over several nodes (registerNodes): -url and
	// -server-pid repeat; rawURL, wsURL, httpBase and serverPID are the
	// first node's.
	multi bool
	urls  urlList
	pids  pidList
	nodes []node // filled by check
}

func (b *benchFlags) register(fs *flag.FlagSet, duration time.Duration) {
	fs.StringVar(&b.rawURL, "url", defaultURL, "presenced to measure, on a loopback address (ws:// or http://)")
	fs.IntVar(&b.serverPID, "server-pid", 0, "pid of the server, for its CPU (0: the process listening on the URL's port)")
	b.registerRest(fs, duration)
}

// registerRest registers the flags besides -url and -server-pid.
func (b *benchFlags) registerRest(fs *flag.FlagSet, duration time.Duration) {
	fs.BoolVar(&b.dev, "dev", false, "WebSocket clients connect with a bare user_id (the server runs with -dev)")
	fs.StringVar(&b.jwtSecret, "jwt-secret", "", "WebSocket clients carry a token minted with this secret (or $"+jwtSecretEnv+")")
	fs.StringVar(&b.apiKey, "api-key", "", "API key for the HTTP API and /metrics")
	fs.BoolVar(&b.json, "json", false, "print the result as one JSON object")
	fs.DurationVar(&b.duration, "duration", duration, "how long to measure (at most 1h)")
}

// check validates the shared flags; needAuth: WebSocket clients need -dev
// or -jwt-secret.
func (b *benchFlags) check(needAuth bool) error {
	if b.jwtSecret == "" {
		b.jwtSecret = os.Getenv(jwtSecretEnv)
	}
	if b.multi {
		if err := b.checkNodes(); err != nil {
			return err
		}
	}
	u, base, err := loopbackURL(b.rawURL)
	if err != nil {
		return err
	}
	b.wsURL, b.httpBase = u, base
	if needAuth && b.dev == (b.jwtSecret != "") {
		return errors.New("give exactly one of -dev (bare user_id) and -jwt-secret (signed tokens)")
	}
	if b.duration <= 0 || b.duration > maxDuration {
		return fmt.Errorf("-duration %v: must be between 0 and %v", b.duration, maxDuration)
	}
	if b.serverPID < 0 {
		return fmt.Errorf("-server-pid %d: not a pid", b.serverPID)
	}
	return nil
}

// resolvePID is -server-pid or the process listening on the URL's port.
func (b *benchFlags) resolvePID() (int, error) {
	if b.serverPID != 0 {
		return b.serverPID, nil
	}
	port, _ := strconv.Atoi(b.wsURL.Port())
	return listeningPID(port)
}

// metricsReader reads the server's /metrics.
func (b *benchFlags) metricsReader() *server {
	return &server{metrics: b.httpBase + "/metrics", apiKey: b.apiKey, hc: &http.Client{Timeout: 10 * time.Second}}
}

// parseStatus turns the outcome of a scenario's flag parsing into an exit status for the
// scenario's runXCmd: -1 means go on.
func parseStatus(err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return -1
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintf(stderr, "presence-bench: %v\n", err)
		return 2
	}
}

// scenario is every runXCmd: parse the flags, run, print the result as a
// table or, when asJSON says so, as JSON; it returns the exit status.
func scenario[C, R any](args []string, stdout, stderr io.Writer,
	parse func([]string, io.Writer) (C, error), asJSON func(C) bool,
	run func(context.Context, C, io.Writer) (R, error), print func(io.Writer, R)) int {
	cfg, err := parse(args, stderr)
	if st := parseStatus(err, stderr); st >= 0 {
		return st
	}
	res, err := run(context.Background(), cfg, stderr)
	if err != nil {
		return runStatus(err, stderr)
	}
	if asJSON(cfg) {
		return runStatus(writeJSON(stdout, res), stderr)
	}
	print(stdout, res)
	return 0
}

// runStatus prints a run's error and returns its exit status.
func runStatus(err error, stderr io.Writer) int {
	if err != nil {
		fmt.Fprintf(stderr, "presence-bench: %v\n", err)
		return 1
	}
	return 0
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// cpuTime is the CPU time (user + system) pid has used so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("CPU of pid %d: %w", pid, err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime + stime (fields 14 and 15) of a /proc/<pid>/stat
// line; the command name (field 2) may hold spaces and parentheses.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("odd /proc/<pid>/stat")
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, errors.New("short /proc/<pid>/stat")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("odd /proc/<pid>/stat: %q %q", f[11], f[12])
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// cpuMeter measures the cores a set of processes use over a window.
type cpuMeter struct {
	pids  []int
	start time.Time
	used  []time.Duration // each pid's at start
}

func startCPU(pids ...int) *cpuMeter {
	m := &cpuMeter{pids: pids, start: time.Now()}
	m.used = m.each()
	return m
}

// each is the CPU time each pid used so far (0 for one gone).
func (m *cpuMeter) each() []time.Duration {
	out := make([]time.Duration, len(m.pids))
	for i, p := range m.pids {
		if c, err := cpuTime(p); err == nil {
			out[i] = c
		}
	}
	return out
}

// cores is the CPU used since start divided by the wall time, summed
// over the pids.
func (m *cpuMeter) cores() float64 {
	var sum float64
	for _, c := range m.coresEach() {
		sum += c
	}
	return sum
}

// coresEach is cores for each pid.
func (m *cpuMeter) coresEach() []float64 {
	wall := time.Since(m.start)
	now := m.each()
	out := make([]float64, len(m.pids))
	if wall <= 0 {
		return out
	}
	for i := range now {
		out[i] = float64(now[i]-m.used[i]) / float64(wall)
	}
	return out
}

// metricValue reads one unlabelled sample from the server's /metrics.
func metricValue(s *server, name string) (float64, error) {
	m, err := s.readMetrics()
	if err != nil {
		return 0, err
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("/metrics has no %s", name)
	}
	return v, nil
}

// divide is a / b, 0 when b is 0.
func divide(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// waitProgress waits for wg, calling report every second meanwhile (the
// progress lines a scenario prints while it runs).
func waitProgress(wg *sync.WaitGroup, report func(now time.Time)) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			report(now)
		}
	}
}

// sleepCtx sleeps d or until ctx ends; it reports whether the sleep was
// whole.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// padded is a counter on its own cache line, one per goroutine, so the
// load generator's cores do not pass a shared line back and forth.
type padded struct {
	n atomic.Int64
	_ [56]byte
}

// liveConns are the sockets of a run open at the moment, to be dropped
// all at once when the run stops. The zero value is ready.
type liveConns struct {
	mu sync.Mutex
	m  map[*benchConn]struct{}
}

// track adds c to the sockets open (on) or takes it out.
func (l *liveConns) track(c *benchConn, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !on {
		delete(l.m, c)
		return
	}
	if l.m == nil {
		l.m = make(map[*benchConn]struct{})
	}
	l.m[c] = struct{}{}
}

// dropAll drops every socket open.
func (l *liveConns) dropAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.m {
		c.drop()
	}
}

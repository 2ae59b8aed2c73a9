package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"
)

// Bounds of the connections scenario: the tool is a measurement, not a
// stress test that runs until something breaks.
const (
	maxConns        = 200_000          // connections of one run
	maxPerWorker    = 15_000           // one process may open 20,000 files; keep room
	autoPerWorker   = 8_000            // -procs 0 spreads this many per process
	maxPerSource    = 20_000           // ephemeral ports of one source address (28k by default)
	maxHold         = time.Hour        // -hold
	maxRampTimeout  = 30 * time.Minute // -ramp-timeout
	minHeartbeat    = time.Second
	maxHeartbeat    = 10 * time.Minute
	jwtSecretEnv    = "PRESENCE_BENCH_JWT_SECRET" // how a worker gets the secret (not on its command line)
	defaultURL      = "ws://127.0.0.1:8080"
	defaultWSPath   = "/v1/ws"
	firstSourceHost = 2 // 127.0.0.2 is the first source address
)

// connConfig is the configuration of the connections scenario.
type connConfig struct {
	rawURL      string
	wsURL       *url.URL // ws://127.x.y.z:port/v1/ws
	httpBase    string   // http://127.x.y.z:port
	n           int
	procs       int
	hold        time.Duration
	heartbeat   time.Duration
	dev         bool
	jwtSecret   string
	apiKey      string
	serverPID   int
	json        bool
	perSource   int
	concurrency int
	rampTimeout time.Duration

	// worker process only
	worker bool
	first  int // index of the worker's first connection
	count  int // connections of the worker
}

func parseConnections(args []string, stderr io.Writer) (*connConfig, error) {
	c := &connConfig{}
	fs := flag.NewFlagSet("presence-bench connections", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.rawURL, "url", defaultURL, "presenced to measure, on a loopback address (ws:// or http://; the path defaults to "+defaultWSPath+")")
	fs.IntVar(&c.n, "n", 1000, "connections to open (at most "+strconv.Itoa(maxConns)+")")
	fs.IntVar(&c.procs, "procs", 0, "worker processes (0: one per "+strconv.Itoa(autoPerWorker)+" connections; at most "+strconv.Itoa(maxPerWorker)+" each)")
	fs.DurationVar(&c.hold, "hold", 0, "how long to hold the connections once all are open; the 'after' figures are read at its end (0: 2 heartbeats + 5s)")
	fs.DurationVar(&c.heartbeat, "heartbeat", 15*time.Second, "heartbeat interval of each connection (±10% jitter)")
	fs.BoolVar(&c.dev, "dev", false, "connect with a bare user_id (the server runs with -dev)")
	fs.StringVar(&c.jwtSecret, "jwt-secret", "", "mint a client token per connection with this secret (or $"+jwtSecretEnv+")")
	fs.StringVar(&c.apiKey, "api-key", "", "API key for the server's /metrics (Go heap figures); empty: only a -dev server answers")
	fs.IntVar(&c.serverPID, "server-pid", 0, "pid of the server, for its RSS (0: the process listening on the URL's port)")
	fs.BoolVar(&c.json, "json", false, "print the result as JSON")
	fs.IntVar(&c.perSource, "per-source", 10_000, "connections per source address 127.0.0.2, 127.0.0.3, …")
	fs.IntVar(&c.concurrency, "concurrency", 64, "handshakes in flight per worker process")
	fs.DurationVar(&c.rampTimeout, "ramp-timeout", 5*time.Minute, "give up opening connections after this long")
	fs.BoolVar(&c.worker, "worker", false, "internal: run as a worker process")
	fs.IntVar(&c.first, "first", 0, "internal: index of the worker's first connection")
	fs.IntVar(&c.count, "count", 0, "internal: connections of the worker")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.jwtSecret == "" {
		c.jwtSecret = os.Getenv(jwtSecretEnv)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return c, nil
}

// check validates c and fills in the derived fields.
func (c *connConfig) check() error {
	u, base, err := loopbackURL(c.rawURL)
	if err != nil {
		return err
	}
	c.wsURL, c.httpBase = u, base
	if c.dev == (c.jwtSecret != "") {
		return errors.New("give exactly one of -dev (bare user_id) and -jwt-secret (signed tokens)")
	}
	if c.heartbeat < minHeartbeat || c.heartbeat > maxHeartbeat {
		return fmt.Errorf("-heartbeat %v: must be between %v and %v", c.heartbeat, minHeartbeat, maxHeartbeat)
	}
	if c.hold == 0 {
		c.hold = 2*c.heartbeat + 5*time.Second
	}
	if c.hold < 0 || c.hold > maxHold {
		return fmt.Errorf("-hold %v: must be between 0 and %v", c.hold, maxHold)
	}
	if c.rampTimeout <= 0 || c.rampTimeout > maxRampTimeout {
		return fmt.Errorf("-ramp-timeout %v: must be between 0 and %v", c.rampTimeout, maxRampTimeout)
	}
	if c.concurrency < 1 || c.concurrency > 1024 {
		return fmt.Errorf("-concurrency %d: must be between 1 and 1024", c.concurrency)
	}
	if c.perSource < 1 || c.perSource > maxPerSource {
		return fmt.Errorf("-per-source %d: must be between 1 and %d", c.perSource, maxPerSource)
	}
	if c.worker {
		if c.count < 1 || c.count > maxPerWorker || c.first < 0 || c.first+c.count > maxConns {
			return fmt.Errorf("worker range %d+%d out of bounds", c.first, c.count)
		}
		return nil
	}
	if c.n < 1 || c.n > maxConns {
		return fmt.Errorf("-n %d: must be between 1 and %d", c.n, maxConns)
	}
	if c.procs < 0 {
		return fmt.Errorf("-procs %d: must not be negative", c.procs)
	}
	if c.procs == 0 {
		c.procs = (c.n + autoPerWorker - 1) / autoPerWorker
	}
	if c.procs > c.n {
		c.procs = c.n
	}
	if per := (c.n + c.procs - 1) / c.procs; per > maxPerWorker {
		return fmt.Errorf("-n %d over -procs %d is %d connections per process; at most %d fit under the open-file limit (raise -procs)", c.n, c.procs, per, maxPerWorker)
	}
	if last := firstSourceHost + (c.n-1)/c.perSource; last > 254 {
		return fmt.Errorf("-n %d at -per-source %d needs source addresses up to 127.0.0.%d (> 127.0.0.254)", c.n, c.perSource, last)
	}
	if c.serverPID < 0 {
		return fmt.Errorf("-server-pid %d: not a pid", c.serverPID)
	}
	return nil
}

// loopbackURL parses the server's URL and refuses anything that is not an
// IPv4 loopback address (localhost means 127.0.0.1; no name is resolved).
// It returns the WebSocket URL and the HTTP base for /metrics.
func loopbackURL(raw string) (*url.URL, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("-url %q: %v", raw, err)
	}
	switch u.Scheme {
	case "ws", "http":
	case "wss", "https":
		return nil, "", fmt.Errorf("-url %q: TLS is not supported (loopback only: use ws://)", raw)
	default:
		return nil, "", fmt.Errorf("-url %q: want ws://127.0.0.1:PORT", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, "", fmt.Errorf("-url %q: no credentials, query or fragment please", raw)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		return nil, "", fmt.Errorf("-url %q: give the port", raw)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return nil, "", fmt.Errorf("-url %q: bad port", raw)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return nil, "", fmt.Errorf("-url %q: refusing a non-loopback server (the load tool only talks to 127.0.0.0/8)", raw)
	}
	if ip.To4() == nil {
		return nil, "", fmt.Errorf("-url %q: IPv6 loopback is not supported (connections are spread over source addresses 127.0.0.2, …)", raw)
	}
	hp := net.JoinHostPort(ip.String(), port)
	path := u.Path
	if path == "" || path == "/" {
		path = defaultWSPath
	}
	return &url.URL{Scheme: "ws", Host: hp, Path: path}, "http://" + hp, nil
}

// sourceAddr is the local address of connection i: 127.0.0.2 for the first
// perSource connections, 127.0.0.3 for the next, … (each source address
// has its own ephemeral ports toward the server).
func sourceAddr(i, perSource int) net.IP {
	return net.IPv4(127, 0, 0, byte(firstSourceHost+i/perSource))
}

// split divides n connections over procs workers: the first index and count
// of each.
func split(n, procs int) [][2]int {
	out := make([][2]int, 0, procs)
	first := 0
	for w := range procs {
		cnt := n / procs
		if w < n%procs {
			cnt++
		}
		out = append(out, [2]int{first, cnt})
		first += cnt
	}
	return out
}

package main

// The storm scenario: one node of several dies, its clients reconnect to
// the others at once, and everyone else must not notice.
//
//	presence-bench storm -url ws://127.0.0.1:18181,ws://127.0.0.1:18182,ws://127.0.0.1:18183 -dev -api-key k
//
// The nodes share a store (Redis, with NATS between them). -per-node
// sockets connect to each node (socket i to node i mod nodes, user
// st<tag>-u<i>, device "d", spread over the source addresses 127.0.0.2,
// 127.0.0.3, … -per-source each), each heartbeats at the interval its
// welcome announces and watches -subs users of that population (socket
// i watches i + k·stride mod N for k = 1…subs). -probes more users, each
// with a socket on a survivor that keeps it alive, change status
// (busy ↔ online) every -interval through POST /v1/status with the API
// key, round-robin over the survivors; -probe-watchers of the survivors'
// sockets watch each probe instead of their last population user.
//
// After -before, the tool kills the node of -kill (SIGKILL to the process
// listening on its port, or -kill-pid): its sockets reconnect to the
// survivors (round-robin) with the Go client's backoff — attempt n waits
// a random time in [d/2, d], d = min(250ms·2ⁿ, 10s) — and subscribe to
// their users again. The run goes on for -storm and -after, then drains.
// The killed node's sockets live in a process of their own
// (stormkilled.go), so that their reconnecting does not hold the threads
// of the process that times the probes.
//
// It measures, in three windows by the time a change was sent (before the
// kill, the -storm after it, and after that): the latency from the POST's
// write to each probe watcher's read of the matching presence message
// (matched by the version the POST answered), and the POST's own
// latency; the reconnect time of each killed socket (kill to the snapshot
// of its subscribe on a survivor); and false offlines: once every socket
// is connected, any presence message or reconnect snapshot that shows a
// population user or probe offline (nobody of them ends).
//
// The -json object (stormResult) has these fields: scenario ("storm"),
// urls, killed_url, killed_pid, sockets, per_node, subs, probes,
// probe_watchers, interval, before, storm, after, setup_seconds,
// changes, changes_failed, expected_deliveries, deliveries,
// missing_deliveries, windows [{name, from_ms, to_ms (relative to the
// kill), changes, fanout {samples p50_ms p99_ms p999_ms max_ms}, write
// {…}}], reconnect {sockets, reconnected, failed, attempts, latency
// {…}}, false_offline, false_offline_in_snapshots, false_offline_users,
// false_offline_first (the first five: who, where, when),
// slowest_writes (the five slowest POSTs: how long, when, to which node),
// errors,
// first_error, goal
// {fanout_p99_ms, write_p99_ms, false_offline} and goal_met (every
// window within the goal, every socket back, nothing missing).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
)

// Bounds and goals of the storm scenario.
const (
	maxStormSockets      = 18_000 // the tool holds every socket: 20,000 files a process here
	maxStormSubs         = 500
	maxStormProbes       = 500
	stormMinBackoff      = 250 * time.Millisecond // the Go client's defaults
	stormMaxBackoff      = 10 * time.Second
	stormGoalP99         = 50 * time.Millisecond
	stormWriteProbeEvery = 50 * time.Millisecond
	stormStatusChange    = 2 // a probe alternates busy and online
)

type stormConfig struct {
	eps           []wsEndpoint
	urlStrings    []string
	apiKey        string
	perNode       int
	subs          int
	probes        int
	probeWatchers int
	interval      time.Duration
	before        time.Duration
	storm         time.Duration
	after         time.Duration
	drain         time.Duration
	kill          int // index into eps
	killPID       int
	perSource     int
	pprofURLs     []string // the survivors' -pprof-addr, profiled through the storm window
	profileDir    string
	json          bool
	args          []string // as given: the storm-killed process gets them too
	known         bool     // re-subscribe with the versions each socket holds
	writeProbe    bool     // also measure status writes from a process of their own
	tag           string
}

func parseStorm(args []string, stderr io.Writer) (*stormConfig, error) {
	c := &stormConfig{}
	var urls urlList
	var dev bool
	var secret string
	fs := flag.NewFlagSet("presence-bench storm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&urls, "url", "the nodes, loopback only, at least 2; repeat or comma-separate")
	fs.StringVar(&c.apiKey, "api-key", "", "API key for POST /v1/status")
	fs.IntVar(&c.perNode, "per-node", 3000, "sockets per node")
	fs.IntVar(&c.subs, "subs", 50, "users each socket watches")
	fs.IntVar(&c.probes, "probes", 20, "users who change status through POST /v1/status, on the survivors")
	fs.IntVar(&c.probeWatchers, "probe-watchers", 50, "survivors' sockets that watch each probe")
	fs.DurationVar(&c.interval, "interval", time.Second, "time between two changes of one probe")
	fs.DurationVar(&c.before, "before", 10*time.Second, "how long the probes change status before the kill")
	fs.DurationVar(&c.storm, "storm", 15*time.Second, "the window after the kill")
	fs.DurationVar(&c.after, "after", 15*time.Second, "how long the run goes on after that window")
	fs.DurationVar(&c.drain, "drain", 5*time.Second, "how long to wait for the last deliveries")
	fs.IntVar(&c.kill, "kill", -1, "index of the -url to kill (-1: the last)")
	fs.IntVar(&c.killPID, "kill-pid", 0, "pid to kill (0: the process listening on that node's port)")
	fs.IntVar(&c.perSource, "per-source", 5000, "sockets per source address 127.0.0.2, 127.0.0.3, …")
	var pprofs urlList
	fs.Var(&pprofs, "pprof-url", "a survivor's profiling address (its -pprof-addr, http://127.0.0.1:PORT); repeat or comma-separate: a CPU profile of each through the storm window and its goroutines 1 s and 3 s into it, into -profile-dir")
	fs.StringVar(&c.profileDir, "profile-dir", "", "where -pprof-url's profiles go (HOST_PORT-cpu.pprof, HOST_PORT-goroutines-1s.txt, …-3s.txt)")
	fs.BoolVar(&dev, "dev", false, "connect with a bare user_id (the servers run with -dev)")
	fs.StringVar(&secret, "jwt-secret", "", "mint a client token per connection with this secret (or $"+jwtSecretEnv+")")
	fs.BoolVar(&c.json, "json", false, "print the result as JSON")
	fs.BoolVar(&c.writeProbe, "write-probe", true, "also change one more user's status every 50 ms, watched by -probe-watchers sockets, all in a process of its own (write-probe) that the tool's own sockets do not slow: the isolated columns")
	fs.BoolVar(&c.known, "known", true, "re-subscribe after the reconnect with the versions each socket holds, as the clients do (false: the whole snapshot again)")
	fs.StringVar(&c.tag, "tag", "", "name the run's users st<tag>-… (default: new names each run)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	c.args = args
	for _, r := range pprofs {
		for p := range strings.SplitSeq(r, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			_, base, err := loopbackURL(strings.Replace(p, "http://", "ws://", 1))
			if err != nil {
				return nil, fmt.Errorf("-pprof-url: %w", err)
			}
			c.pprofURLs = append(c.pprofURLs, base)
		}
	}
	if (len(c.pprofURLs) > 0) != (c.profileDir != "") {
		return nil, errors.New("give -pprof-url and -profile-dir together")
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.eps, c.urlStrings, err = resolveEndpoints(urls, dev, secret); err != nil {
		return nil, err
	}
	n := len(c.eps)
	if n < 2 {
		return nil, errors.New("give at least two -url: one is killed, the others survive")
	}
	if c.kill == -1 {
		c.kill = n - 1
	}
	if c.kill < 0 || c.kill >= n {
		return nil, fmt.Errorf("-kill %d: must name one of the %d URLs (0…%d)", c.kill, n, n-1)
	}
	if c.killPID < 0 {
		return nil, fmt.Errorf("-kill-pid %d: not a pid", c.killPID)
	}
	if c.apiKey == "" {
		return nil, errors.New("give -api-key: the probes change status over HTTP")
	}
	if c.perNode < 1 || c.perNode*n+c.probes > maxStormSockets {
		return nil, fmt.Errorf("-per-node %d × %d nodes + %d probes: between 1 and %d sockets in all", c.perNode, n, c.probes, maxStormSockets)
	}
	total := c.perNode * n
	if c.subs < 1 || c.subs > maxStormSubs || c.subs >= total {
		return nil, fmt.Errorf("-subs %d: must be between 1 and %d, and below the %d sockets", c.subs, maxStormSubs, total)
	}
	if c.probes < 1 || c.probes > maxStormProbes {
		return nil, fmt.Errorf("-probes %d: must be between 1 and %d", c.probes, maxStormProbes)
	}
	if c.probeWatchers < 1 || c.probes*c.probeWatchers > c.perNode*(n-1) {
		return nil, fmt.Errorf("-probe-watchers %d × %d probes: at least 1 and at most the survivors' %d sockets (each watches one probe)",
			c.probeWatchers, c.probes, c.perNode*(n-1))
	}
	if c.interval < 100*time.Millisecond || c.interval > time.Minute {
		return nil, fmt.Errorf("-interval %v: must be between 100ms and 1m", c.interval)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"-before", c.before}, {"-storm", c.storm}, {"-after", c.after}} {
		if d.v < c.interval || d.v > 10*time.Minute {
			return nil, fmt.Errorf("%s %v: must be between -interval and 10m", d.name, d.v)
		}
	}
	if c.drain < 0 || c.drain > time.Minute {
		return nil, fmt.Errorf("-drain %v: must be between 0 and 1m", c.drain)
	}
	if last := firstSourceHost + (total+c.probes-1)/max(c.perSource, 1); c.perSource < 1 || c.perSource > maxPerSource || last > 254 {
		return nil, fmt.Errorf("-per-source %d: must be between 1 and %d, and the sockets fit 127.0.0.2…254", c.perSource, maxPerSource)
	}
	if c.tag == "" {
		c.tag = runTag()
	}
	if len(c.tag) > 16 || strings.Trim(c.tag, "0123456789abcdefghijklmnopqrstuvwxyz") != "" {
		return nil, fmt.Errorf("-tag %q: up to 16 lowercase letters and digits", c.tag)
	}
	return c, nil
}

func runStormCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseStorm, func(c *stormConfig) bool { return c.json }, runStorm, printStorm)
}

// stormResult is the outcome of the storm scenario (fields: see the file
// comment).
type stormResult struct {
	Scenario          string         `json:"scenario"`
	URLs              []string       `json:"urls"`
	KilledURL         string         `json:"killed_url"`
	KilledPID         int            `json:"killed_pid"`
	Sockets           int            `json:"sockets"`
	PerNode           int            `json:"per_node"`
	Subs              int            `json:"subs"`
	Probes            int            `json:"probes"`
	ProbeWatchers     int            `json:"probe_watchers"`
	Interval          string         `json:"interval"`
	Before            string         `json:"before"`
	Storm             string         `json:"storm"`
	After             string         `json:"after"`
	SetupSeconds      float64        `json:"setup_seconds"`
	Changes           int            `json:"changes"`
	ChangesFailed     int            `json:"changes_failed"`
	IsolatedFailed    int            `json:"isolated_writes_failed,omitempty"`
	Expected          int64          `json:"expected_deliveries"`
	Deliveries        int64          `json:"deliveries"`
	Missing           int64          `json:"missing_deliveries"`
	Windows           []stormWindow  `json:"windows"`
	Reconnect         stormReconnect `json:"reconnect"`
	FalseOffline      int64          `json:"false_offline"`
	FalseOfflineSnap  int64          `json:"false_offline_in_snapshots"`
	FalseOfflineUsers int            `json:"false_offline_users"`
	FalseOfflineFirst []string       `json:"false_offline_first,omitempty"`
	SlowestWrites     []string       `json:"slowest_writes"`
	Errors            int64          `json:"errors"`
	FirstError        string         `json:"first_error,omitempty"`
	Goal              stormGoal      `json:"goal"`
	GoalMet           bool           `json:"goal_met"`
}

// stormWindow is one window of the run, relative to the kill.
type stormWindow struct {
	Name    string     `json:"name"`
	FromMs  int64      `json:"from_ms"`
	ToMs    int64      `json:"to_ms"`
	Changes int        `json:"changes"`
	Fanout  latSummary `json:"fanout"`
	Write   latSummary `json:"write"`
	// IsolatedWrite and IsolatedFanout are the write probe's POSTs and
	// their deliveries to its watchers (-write-probe).
	IsolatedWrite  *latSummary `json:"isolated_write,omitempty"`
	IsolatedFanout *latSummary `json:"isolated_fanout,omitempty"`
}

// stormReconnect is what the killed node's sockets went through.
type stormReconnect struct {
	Sockets     int        `json:"sockets"`
	Reconnected int        `json:"reconnected"`
	Failed      int        `json:"failed"`
	Attempts    int        `json:"attempts"`
	Latency     latSummary `json:"latency"`
	// The re-subscribes' snapshots: users sent, users left out as
	// unchanged (-known), and bytes, over every socket that came back.
	Known          bool  `json:"known"`
	SnapshotUsers  int   `json:"snapshot_users"`
	UnchangedUsers int   `json:"unchanged_users"`
	SnapshotBytes  int64 `json:"snapshot_bytes"`
}

// stormGoal is what the figures are held against.
type stormGoal struct {
	FanoutP99Ms  float64 `json:"fanout_p99_ms"`
	WriteP99Ms   float64 `json:"write_p99_ms"`
	FalseOffline int     `json:"false_offline"`
}

// stormSocket is one socket of the population; its goroutine owns every
// field but the configuration.
type stormSocket struct {
	idx    int
	user   string
	node   int
	src    net.IP
	subs   []string
	probe  int // the probe it watches, -1 for none
	killed bool

	recv        []fanoutRecv // presence messages of its probe
	reconnected time.Time    // the snapshot on a survivor (killed sockets)
	attempts    int
	// versions is the newest version it was sent of each user it
	// watches (with -known), sent again by its re-subscribe.
	versions map[string]uint64
	resub    resubCost
}

// resubCost is what a killed socket's re-subscribe cost: the users its
// snapshot carried and those it left out as unchanged, and its bytes.
type resubCost struct {
	Sent, Unchanged, Bytes int
}

// stormChange is one POST /v1/status of a probe.
type stormChange struct {
	probe   int
	node    int // index into the -url values
	version uint64
	sent    time.Time
	took    time.Duration
	fresh   bool // on a new connection, not a kept-alive one
}

// stormShared is what every goroutine of a run (or of the process that
// holds the killed node's sockets: storm-killed) reports to.
type stormShared struct {
	ctx      context.Context
	cfg      *stormConfig
	errs     errCounter
	settled  atomic.Bool  // every socket connected: offlines count from now
	killing  atomic.Bool  // the node is about to be killed: its sockets' breaking is expected
	back     atomic.Int64 // the killed node's sockets subscribed again on a survivor
	probeIdx map[string]int
	people   map[string]bool // the population and probes: nobody ends
	onKilled map[string]bool // the users whose socket was on the killed node

	mu         sync.Mutex // guards falseBy and falseFirst
	falseBy    map[string]int
	falseFirst []falseShown
	falseAll   atomic.Int64
	falseSnap  atomic.Int64
}

// falseShown is one false offline: who was shown offline, in a snapshot
// or an event, and when it was read.
type falseShown struct {
	User     string `json:"user"`
	Snapshot bool   `json:"snapshot"`
	At       int64  `json:"at_unix_ns"`
}

// offline records an offline shown of user, in a snapshot or an event.
func (s *stormShared) offline(user string, snapshot bool) {
	if !s.settled.Load() || !s.people[user] {
		return
	}
	s.falseAll.Add(1)
	if snapshot {
		s.falseSnap.Add(1)
	}
	s.mu.Lock()
	s.falseBy[user]++
	if len(s.falseFirst) < 5 {
		s.falseFirst = append(s.falseFirst, falseShown{User: user, Snapshot: snapshot, At: time.Now().UnixNano()})
	}
	s.mu.Unlock()
}

// describe is f as the verdict names it, its time relative to the kill.
func (s *stormShared) describe(f falseShown, killed time.Time) string {
	where := "a survivor's"
	if s.onKilled[f.User] {
		where = "the killed node's"
	}
	kind := "an event"
	if f.Snapshot {
		kind = "a snapshot"
	}
	return fmt.Sprintf("%s (%s user) in %s at %+.2fs", f.User, where, kind, time.Unix(0, f.At).Sub(killed).Seconds())
}

// look checks one message a socket read: false offlines, and the
// presence of its probe.
func (s *stormShared) look(so *stormSocket, m *wsMsg, at time.Time) {
	if s.cfg.known {
		so.note(m)
	}
	switch m.Type {
	case "presence":
		if m.Status != nil && *m.Status == "offline" {
			s.offline(m.UserID, false)
		}
		if so.probe >= 0 {
			if p, ok := s.probeIdx[m.UserID]; ok && p == so.probe {
				so.recv = append(so.recv, fanoutRecv{target: p, version: m.Version, at: at})
			}
		}
	case "snapshot":
		for id, u := range m.Users {
			if u.Status != nil && *u.Status == "offline" {
				s.offline(id, true)
			}
		}
	case "error":
		if m.Code != "rate_limited" {
			s.errs.add(fmt.Errorf("server error %s: %s", m.Code, m.Message))
		}
	}
}

// note records the versions m carries of users so watches.
func (so *stormSocket) note(m *wsMsg) {
	if so.versions == nil {
		so.versions = make(map[string]uint64, len(so.subs))
	}
	switch m.Type {
	case "presence":
		so.versions[m.UserID] = max(so.versions[m.UserID], m.Version)
	case "snapshot":
		for id, u := range m.Users {
			so.versions[id] = max(so.versions[id], u.Version)
		}
	}
}

// newStormPopulation makes the run's users and sockets from cfg alone
// (its tag included), so that the storm and the process that holds the
// killed node's sockets (storm-killed) make the same ones: the probes,
// and every socket with the users it watches.
func newStormPopulation(ctx context.Context, cfg *stormConfig) (*stormShared, []*stormSocket, []string) {
	n := len(cfg.eps)
	total := cfg.perNode * n
	sh := &stormShared{ctx: ctx, cfg: cfg, probeIdx: make(map[string]int, cfg.probes),
		people: make(map[string]bool, total+cfg.probes), onKilled: make(map[string]bool, cfg.perNode), falseBy: make(map[string]int)}
	probes := make([]string, cfg.probes)
	for p := range probes {
		probes[p] = "st" + cfg.tag + "-p" + strconv.Itoa(p)
		sh.probeIdx[probes[p]] = p
		sh.people[probes[p]] = true
	}
	sockets := make([]*stormSocket, total)
	stride := max(1, total/(cfg.subs+1))
	for i := range sockets {
		so := &stormSocket{idx: i, user: "st" + cfg.tag + "-u" + strconv.Itoa(i), node: i % n,
			src: sourceAddr(i, cfg.perSource), probe: -1}
		so.killed = so.node == cfg.kill
		sockets[i] = so
		sh.people[so.user] = true
		sh.onKilled[so.user] = so.killed
	}
	for i, so := range sockets {
		seen := map[int]bool{i: true}
		for k := 1; len(so.subs) < cfg.subs; k++ {
			j := (i + k*stride) % total
			for seen[j] {
				j = (j + 1) % total
			}
			seen[j] = true
			so.subs = append(so.subs, sockets[j].user)
		}
	}
	// The probes' watchers: the survivors' sockets in order, each probe
	// in turn, in place of their last population user.
	w := 0
	for _, so := range sockets {
		if so.killed || w >= cfg.probes*cfg.probeWatchers {
			continue
		}
		so.probe = w % cfg.probes
		so.subs[len(so.subs)-1] = probes[so.probe]
		w++
	}
	return sh, sockets, probes
}

func runStorm(parent context.Context, cfg *stormConfig, stderr io.Writer) (*stormResult, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	n := len(cfg.eps)
	total := cfg.perNode * n
	survivors := stormSurvivors(cfg)
	killPID := cfg.killPID
	if killPID == 0 {
		port, _ := strconv.Atoi(cfg.eps[cfg.kill].url.Port())
		p, err := listeningPID(port)
		if err != nil {
			return nil, fmt.Errorf("the node to kill, %s: %w", cfg.eps[cfg.kill].url.Host, err)
		}
		killPID = p
	}
	for _, i := range survivors {
		port, _ := strconv.Atoi(cfg.eps[i].url.Port())
		if p, err := listeningPID(port); err == nil && p == killPID {
			return nil, fmt.Errorf("pid %d serves both %s and %s: the survivors must be other processes", killPID, cfg.eps[cfg.kill].url.Host, cfg.eps[i].url.Host)
		}
	}

	sh, sockets, probes := newStormPopulation(ctx, cfg)

	h := newStormHolder(sh, cancel, survivors)
	defer h.stop()

	// The killed node's sockets, in a process of their own (storm-killed):
	// their reconnecting would otherwise hold this process's threads
	// while it measures the probes.
	kp, err := startStormKilled(ctx, cfg, stderr)
	if err != nil {
		return nil, err
	}
	defer kp.abort()

	// Setup: the probes' sockets, then the survivors' population, subscribed.
	start := time.Now()
	fmt.Fprintf(stderr, "storm: %d probes on the survivors, then %d sockets × %d subscriptions on %d nodes (the %d of %s in a process of their own)\n",
		cfg.probes, total, cfg.subs, n, cfg.perNode, cfg.eps[cfg.kill].url.Host)
	if err := dialAll(ctx, cfg.probes, "storm probes", stderr, func(p int) error {
		c, err := cfg.eps[survivors[p%len(survivors)]].dialSrc(ctx, probes[p], "d", sourceAddr(total+p, cfg.perSource))
		if err != nil {
			return err
		}
		h.live.track(c, true)
		h.wg.Add(1)
		go func() { defer h.wg.Done(); sh.hold(c) }()
		return nil
	}); err != nil {
		return nil, err
	}
	var mine []*stormSocket
	for _, so := range sockets {
		if !so.killed {
			mine = append(mine, so)
		}
	}
	if err := h.dial(ctx, mine, "storm sockets", stderr); err != nil {
		return nil, err
	}
	if err := kp.ready(ctx); err != nil {
		return nil, err
	}
	setup := time.Since(start)
	sh.settled.Store(true)
	kp.tell("settled")
	fmt.Fprintf(stderr, "storm: all connected in %.1fs; probes change status every %v for %v before the kill\n", setup.Seconds(), cfg.interval, cfg.before)

	// The write probe, in a process of its own.
	var probeWrites func() ([]probeWrite, []probeDelivery, error)
	if cfg.writeProbe {
		bases := make([]string, 0, len(survivors))
		var wss []wsEndpoint
		for _, i := range survivors {
			bases = append(bases, cfg.eps[i].httpBase())
			wss = append(wss, cfg.eps[i])
		}
		var err error
		probeWrites, err = startWriteProbe(ctx, &writeProbeConfig{urls: bases, apiKey: cfg.apiKey, user: "st" + cfg.tag + "-w",
			every: stormWriteProbeEvery, dur: cfg.before + cfg.storm + cfg.after, ws: wss, watchers: cfg.probeWatchers}, stderr)
		if err != nil {
			return nil, err
		}
	}

	// The probes: POST /v1/status every interval, spread over it.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: cfg.probes, IdleConnTimeout: time.Minute}}
	defer hc.CloseIdleConnections()
	changes := make([][]stormChange, cfg.probes)
	var failed atomic.Int64
	t0 := time.Now()
	killAt := t0.Add(cfg.before)
	end := killAt.Add(cfg.storm + cfg.after)
	var probeWG sync.WaitGroup
	for p := range cfg.probes {
		probeWG.Add(1)
		go func() {
			defer probeWG.Done()
			next := t0.Add(cfg.interval * time.Duration(p) / time.Duration(cfg.probes))
			for k := 0; ; k++ {
				if !sleepUntil(ctx, next) || !time.Now().Before(end) {
					return
				}
				next = next.Add(cfg.interval)
				status := "online"
				if k%stormStatusChange == 0 {
					status = "busy"
				}
				node := survivors[k%len(survivors)]
				base := cfg.eps[node].httpBase()
				body := []byte(`{"user_id":"` + probes[p] + `","status":"` + status + `"}`)
				sent := time.Now()
				v, fresh, err := postStatus(ctx, hc, base+"/v1/status", cfg.apiKey, body)
				took := time.Since(sent)
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
						sh.errs.add(err)
					}
					continue
				}
				changes[p] = append(changes[p], stormChange{probe: p, node: node, version: v, sent: sent, took: took, fresh: fresh})
			}
		}()
	}

	// The kill.
	if !sleepUntil(ctx, killAt) {
		return nil, ctx.Err()
	}
	// Every socket of the node is told first: its breaking is expected.
	sh.killing.Store(true)
	if err := kp.killing(ctx); err != nil {
		return nil, err
	}
	if err := syscall.Kill(killPID, syscall.SIGKILL); err != nil {
		return nil, fmt.Errorf("kill %d: %w", killPID, err)
	}
	killed := time.Now()
	var profWG sync.WaitGroup
	for _, base := range cfg.pprofURLs {
		profWG.Add(1)
		go func() { defer profWG.Done(); profile(ctx, base, cfg.profileDir, cfg.storm, &sh.errs) }()
	}
	defer profWG.Wait()
	fmt.Fprintf(stderr, "storm: killed pid %d (%s) at %.1fs\n", killPID, cfg.eps[cfg.kill].url.Host, killed.Sub(t0).Seconds())
	waitProgress(&probeWG, func(now time.Time) {
		fmt.Fprintf(stderr, "storm %+6.1fs: %d false offlines (the survivors' sockets), %d failed changes, %d errors\n",
			now.Sub(killed).Seconds(), sh.falseAll.Load(), failed.Load(), sh.errs.n.Load())
	})
	sleepCtx(ctx, cfg.drain)
	h.stop()
	fctx, fcancel := context.WithTimeout(parent, time.Minute)
	report, err := kp.finish(fctx)
	fcancel()
	if err != nil {
		return nil, err
	}
	if err := sh.merge(report, sockets); err != nil {
		return nil, err
	}

	// The verdict.
	res := &stormResult{Scenario: "storm", URLs: cfg.urlStrings, KilledURL: cfg.urlStrings[cfg.kill], KilledPID: killPID,
		Sockets: total, PerNode: cfg.perNode, Subs: cfg.subs, Probes: cfg.probes, ProbeWatchers: cfg.probeWatchers,
		Interval: cfg.interval.String(), Before: cfg.before.String(), Storm: cfg.storm.String(), After: cfg.after.String(),
		SetupSeconds: setup.Seconds(), ChangesFailed: int(failed.Load()),
		Goal: stormGoal{FanoutP99Ms: ms(stormGoalP99), WriteP99Ms: ms(stormGoalP99)}}
	type key struct {
		probe   int
		version uint64
	}
	sentAt := make(map[key]stormChange)
	for _, cs := range changes {
		for _, c := range cs {
			sentAt[key{c.probe, c.version}] = c
			res.Changes++
		}
	}
	bounds := []struct {
		name     string
		from, to time.Time
	}{{"before", t0, killed}, {"storm", killed, killed.Add(cfg.storm)}, {"after", killed.Add(cfg.storm), end.Add(cfg.interval)}}
	win := func(t time.Time) int {
		for i, b := range bounds {
			if !t.Before(b.from) && t.Before(b.to) {
				return i
			}
		}
		return -1
	}
	all := make([]stormChange, 0, len(sentAt))
	for _, c := range sentAt {
		all = append(all, c)
	}
	slices.SortFunc(all, func(a, b stormChange) int { return cmp.Compare(b.took, a.took) })
	for _, c := range all[:min(5, len(all))] {
		conn := "a kept-alive connection"
		if c.fresh {
			conn = "a new connection"
		}
		res.SlowestWrites = append(res.SlowestWrites, fmt.Sprintf("%.1f ms, sent at %+.3fs to %s on %s", ms(c.took), c.sent.Sub(killed).Seconds(), cfg.eps[c.node].url.Host, conn))
	}
	var iso, isoFan []latSet
	if probeWrites != nil {
		ws, ds, err := probeWrites()
		if err != nil {
			sh.errs.add(err)
		}
		iso, isoFan = make([]latSet, len(bounds)), make([]latSet, len(bounds))
		byVersion := make(map[uint64]probeWrite, len(ws))
		for _, w := range ws {
			if w.took < 0 {
				res.IsolatedFailed++
				continue
			}
			byVersion[w.version] = w
			if i := win(w.sent); i >= 0 {
				iso[i].add(w.took)
			}
		}
		for _, d := range ds {
			if w, ok := byVersion[d.version]; ok {
				if i := win(w.sent); i >= 0 {
					isoFan[i].add(d.at.Sub(w.sent))
				}
			}
		}
	}
	fan := make([]latSet, len(bounds))
	write := make([]latSet, len(bounds))
	counts := make([]int, len(bounds))
	for _, c := range sentAt {
		if i := win(c.sent); i >= 0 {
			write[i].add(c.took)
			counts[i]++
		}
	}
	watchersOf := make([]int, cfg.probes)
	for _, so := range sockets {
		if so.probe >= 0 {
			watchersOf[so.probe]++
		}
		seen := make(map[uint64]bool, len(so.recv))
		for _, r := range so.recv {
			c, ok := sentAt[key{r.target, r.version}]
			if !ok || seen[r.version] {
				continue
			}
			seen[r.version] = true
			res.Deliveries++
			if i := win(c.sent); i >= 0 {
				fan[i].add(r.at.Sub(c.sent))
			}
		}
	}
	for _, c := range sentAt {
		res.Expected += int64(watchersOf[c.probe])
	}
	res.Missing = res.Expected - res.Deliveries
	res.GoalMet = res.Missing == 0
	for i, b := range bounds {
		wdw := stormWindow{Name: b.name, FromMs: b.from.Sub(killed).Milliseconds(), ToMs: b.to.Sub(killed).Milliseconds(),
			Changes: counts[i], Fanout: fan[i].summary(), Write: write[i].summary()}
		if iso != nil {
			w, f := iso[i].summary(), isoFan[i].summary()
			wdw.IsolatedWrite, wdw.IsolatedFanout = &w, &f
		}
		if wdw.Fanout.P99 > ms(stormGoalP99) || wdw.Write.P99 > ms(stormGoalP99) || wdw.Changes == 0 {
			res.GoalMet = false
		}
		res.Windows = append(res.Windows, wdw)
	}
	var rec latSet
	for _, so := range sockets {
		if !so.killed {
			continue
		}
		res.Reconnect.Sockets++
		res.Reconnect.Attempts += so.attempts
		if so.reconnected.IsZero() {
			res.Reconnect.Failed++
			continue
		}
		res.Reconnect.Reconnected++
		rec.add(so.reconnected.Sub(killed))
		res.Reconnect.SnapshotUsers += so.resub.Sent
		res.Reconnect.UnchangedUsers += so.resub.Unchanged
		res.Reconnect.SnapshotBytes += int64(so.resub.Bytes)
	}
	res.Reconnect.Known = cfg.known
	res.Reconnect.Latency = rec.summary()
	res.FalseOffline = sh.falseAll.Load()
	res.FalseOfflineSnap = sh.falseSnap.Load()
	res.FalseOfflineUsers = len(sh.falseBy)
	slices.SortFunc(sh.falseFirst, func(a, b falseShown) int { return cmp.Compare(a.At, b.At) })
	for _, f := range sh.falseFirst[:min(5, len(sh.falseFirst))] {
		res.FalseOfflineFirst = append(res.FalseOfflineFirst, sh.describe(f, killed))
	}
	res.Errors = sh.errs.n.Load()
	res.FirstError = sh.errs.firstErr()
	if res.FalseOffline > 0 || res.Reconnect.Failed > 0 || res.ChangesFailed > 0 {
		res.GoalMet = false
	}
	return res, nil
}

// profile saves a CPU profile of the node whose profiling endpoints are
// at base over d, and the stacks of its goroutines 1 s and 3 s into it,
// into dir as HOST_PORT-cpu.pprof, HOST_PORT-goroutines-1s.txt and
// HOST_PORT-goroutines-3s.txt.
func profile(ctx context.Context, base, dir string, d time.Duration, errs *errCounter) {
	name := strings.NewReplacer("http://", "", ":", "_").Replace(base)
	var wg sync.WaitGroup
	get := func(after time.Duration, path, file string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepCtx(ctx, after) {
				return
			}
			if err := fetchTo(ctx, base+path, filepath.Join(dir, name+"-"+file), d+30*time.Second); err != nil {
				errs.add(fmt.Errorf("profile %s: %w", file, err))
			}
		}()
	}
	get(0, "/debug/pprof/profile?seconds="+strconv.Itoa(max(1, int(d.Seconds()))), "cpu.pprof")
	get(300*time.Millisecond, "/debug/pprof/goroutine?debug=1", "goroutines-0.3s.txt")
	get(time.Second, "/debug/pprof/goroutine?debug=1", "goroutines-1s.txt")
	wg.Wait()
}

// fetchTo saves the body of GET u into file.
func fetchTo(ctx context.Context, u, file string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// hold heartbeats on a probe's socket and reads it until the run ends.
func (s *stormShared) hold(c *benchConn) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go beatLoop(ctx, c, c.beat())
	for {
		if _, err := c.read(time.Time{}); err != nil {
			if s.ctx.Err() == nil {
				s.errs.add(fmt.Errorf("probe socket: %w", err))
			}
			return
		}
	}
}

// serve runs one population socket: heartbeats and reads on c; when c
// breaks after the kill (its node died), reconnects to a survivor with
// the client's backoff and subscribes again, and goes on there.
func (s *stormShared) serve(so *stormSocket, c *benchConn, survivors []int, track func(*benchConn, bool)) {
	for {
		err := s.readUntilBroken(so, c)
		track(c, false)
		c.drop()
		if s.ctx.Err() != nil {
			return
		}
		if !s.killing.Load() || !so.killed || !so.reconnected.IsZero() {
			s.errs.add(fmt.Errorf("socket %d on %s broke: %w", so.idx, s.cfg.eps[so.node].url.Host, err))
			return
		}
		if c = s.reconnect(so, survivors, track); c == nil {
			return
		}
	}
}

// readUntilBroken heartbeats on c and reads it until it breaks.
func (s *stormShared) readUntilBroken(so *stormSocket, c *benchConn) error {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go beatLoop(ctx, c, c.beat())
	for {
		m, err := c.read(time.Time{})
		if err != nil {
			return err
		}
		s.look(so, m, time.Now())
	}
}

// reconnect dials a survivor until one answers, waiting the client's
// backoff before each attempt, then subscribes again; nil if the run
// ended first.
func (s *stormShared) reconnect(so *stormSocket, survivors []int, track func(*benchConn, bool)) *benchConn {
	for attempt := 0; ; attempt++ {
		if !sleepCtx(s.ctx, stormBackoff(attempt, rand.Float64())) {
			return nil
		}
		so.attempts++
		node := survivors[so.idx%len(survivors)]
		c, err := s.cfg.eps[node].dialSrc(s.ctx, so.user, "d", so.src)
		if err != nil {
			continue
		}
		track(c, true)
		var known map[string]uint64
		if s.cfg.known {
			known = make(map[string]uint64, len(so.versions))
			for id, v := range so.versions {
				if v > 0 {
					known[id] = v
				}
			}
		}
		snap, err := subscribeKnownWait(c, so.subs, known)
		if err != nil {
			track(c, false)
			c.drop()
			continue
		}
		so.resub = resubCost{Sent: len(snap.Users), Unchanged: snap.Unchanged, Bytes: snap.size}
		so.node = node
		so.reconnected = time.Now()
		s.look(so, snap, so.reconnected)
		s.back.Add(1)
		return c
	}
}

// stormBackoff is the Go client's wait before reconnect attempt n: a
// random time in [d/2, d], d = min(250ms·2ⁿ, 10s); r is uniform in [0, 1).
func stormBackoff(n int, r float64) time.Duration {
	d := stormMaxBackoff
	if n < 6 {
		d = min(stormMinBackoff<<n, stormMaxBackoff)
	}
	return d/2 + time.Duration(r*float64(d/2))
}

// postStatus POSTs a status change and returns the version its answer
// carries, and whether it took a new connection.
func postStatus(ctx context.Context, hc *http.Client, u, apiKey string, body []byte) (uint64, bool, error) {
	fresh := false
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { fresh = !i.Reused }})
	v, err := postStatusVersion(ctx, hc, u, apiKey, body)
	return v, fresh, err
}

func postStatusVersion(ctx context.Context, hc *http.Client, u, apiKey string, body []byte) (uint64, error) {
	b, err := postStatusOK(ctx, hc, u, apiKey, body)
	if err != nil {
		return 0, err
	}
	var v struct {
		Version uint64 `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.Version == 0 {
		return 0, fmt.Errorf("POST %s: no version in %.100q", u, b)
	}
	return v.Version, nil
}

func printStorm(w io.Writer, r *stormResult) {
	fmt.Fprintf(w, "storm: %d sockets (%d a node) × %d subscriptions on %v; killed %s (pid %d)\n",
		r.Sockets, r.PerNode, r.Subs, r.URLs, r.KilledURL, r.KilledPID)
	fmt.Fprintf(w, "%d probes, each watched by %d survivors' sockets, a change every %s; %d changes (%d failed); deliveries %d of %d, missing %d\n",
		r.Probes, r.ProbeWatchers, r.Interval, r.Changes, r.ChangesFailed, r.Deliveries, r.Expected, r.Missing)
	fmt.Fprintf(w, "reconnect: %d of %d sockets back (%d attempts), kill → snapshot p50 %.0f ms, p99 %.0f ms, max %.0f ms\n",
		r.Reconnect.Reconnected, r.Reconnect.Sockets, r.Reconnect.Attempts, r.Reconnect.Latency.P50, r.Reconnect.Latency.P99, r.Reconnect.Latency.Max)
	fmt.Fprintf(w, "re-subscribes (known versions %v): %d users in their snapshots, %d left out unchanged, %d bytes\n",
		r.Reconnect.Known, r.Reconnect.SnapshotUsers, r.Reconnect.UnchangedUsers, r.Reconnect.SnapshotBytes)
	fmt.Fprintf(w, "false offlines: %d (%d in reconnect snapshots; %d users; goal 0); errors %d\n", r.FalseOffline, r.FalseOfflineSnap, r.FalseOfflineUsers, r.Errors)
	for _, f := range r.FalseOfflineFirst {
		fmt.Fprintf(w, "  offline shown: %s\n", f)
	}
	for _, s := range r.SlowestWrites {
		fmt.Fprintf(w, "  a slowest POST: %s\n", s)
	}
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\tfrom kill\tchanges\tfan-out p50\tp99\tmax\tPOST p50\tp99\tmax\tisolated fan-out p99\tPOST p99\t")
	for _, x := range r.Windows {
		iso := "-\t-"
		if x.IsolatedWrite != nil {
			iso = fmt.Sprintf("%.2f ms\t%.2f ms", x.IsolatedFanout.P99, x.IsolatedWrite.P99)
		}
		fmt.Fprintf(tw, "%s\t%+.1f…%+.1f s\t%d\t%.2f ms\t%.2f ms\t%.2f ms\t%.2f ms\t%.2f ms\t%.2f ms\t%s\t\n", x.Name,
			float64(x.FromMs)/1000, float64(x.ToMs)/1000, x.Changes, x.Fanout.P50, x.Fanout.P99, x.Fanout.Max, x.Write.P50, x.Write.P99, x.Write.Max, iso)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "goal (p99 ≤ %.0f ms fan-out and POST in every window, no false offline, every socket back, nothing missing): met %v\n",
		r.Goal.FanoutP99Ms, r.GoalMet)
}

// httpBase is the node's HTTP base, http://host:port.
func (e wsEndpoint) httpBase() string { return "http://" + e.url.Host }

// dialSrc is dial from the source address src (nil: any).
func (e wsEndpoint) dialSrc(ctx context.Context, user, device string, src net.IP) (*benchConn, error) {
	if src == nil {
		return e.dial(ctx, user, device)
	}
	return e.dialWith(ctx, user, device, func(ctx context.Context, network, addr string) (net.Conn, error) {
		nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Control: bindNoPort}
		return nd.DialContext(ctx, network, addr)
	})
}

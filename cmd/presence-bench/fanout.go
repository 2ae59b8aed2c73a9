package main

// The fanout scenario: how long a status change takes from the target's
// socket to every watcher's socket.
//
//	presence-bench fanout -url ws://127.0.0.1:18081 -dev -watchers 500 -targets 10
//
// T target users each hold -devices connections on the first -url and
// change status (set_status busy ↔ online) every -interval, taking their
// devices in turn; a user's status changes share one bucket on the server
// (ratelimit.Status: one a second), so -interval is at least that and a
// higher rate of changes takes more targets. W watcher connections (spread round-robin over the
// other -url values, or on the first when there is only one) subscribe to
// every target. Device 0 of each target also watches its own user: the
// presence messages it receives tell which version each change got. A
// watcher's delivery is matched to its change by (user, version); its
// latency runs from the moment the set_status frame was written to the
// moment the watcher's read returned the frame. Every connection heartbeats
// at the interval its welcome announces.
//
// With -baseline-redis the same shape runs afterwards over plain Redis pub/sub
// (one PUBLISH per change on a channel per target, W subscriber connections
// each subscribed to every channel), and the ratio of the latencies is
// printed.
//
// The -json object (fanoutResult) has these fields: scenario ("fanout"),
// urls, watchers, targets, devices_per_target, interval, duration,
// changes (set_status sent), changes_confirmed (seen with a version by the
// target), rate_limited, expected_deliveries (watchers × confirmed changes),
// deliveries (matched, one per watcher and version), missing_deliveries
// (expected − deliveries; must be 0), coalesced (of the missing: changes a
// watcher never read although it read a later one of the same user — its
// socket fell behind and the server kept only the newest), watcher_drops, errors, first_error,
// deliveries_per_sec, latency {samples, p50_ms, p99_ms, p999_ms, max_ms}, and
// with a baseline: baseline {redis_url, publishes, expected_deliveries,
// deliveries, missing_deliveries, deliveries_per_sec, latency} and
// ratio_p50, ratio_p99 (presenced ÷ Redis).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/presenced/presenced/internal/ratelimit"
)

// Bounds of the fanout scenario.
const (
	maxFanoutWatchers   = 20_000
	maxFanoutTargets    = 500 // a watcher subscribes to every target
	maxFanoutDuration   = 10 * time.Minute
	maxFanoutChanges    = 100_000
	maxFanoutDeliveries = 50_000_000 // latency samples kept in memory
	dialConcurrency     = 32
)

type fanoutConfig struct {
	eps        []wsEndpoint
	watchers   int
	targets    int
	devices    int // per target
	interval   time.Duration
	duration   time.Duration
	changes    int // 0: until duration
	drain      time.Duration
	json       bool
	redisURL   string
	redisAddr  string
	tag        string
	urlStrings []string
}

func parseFanout(args []string, stderr io.Writer) (*fanoutConfig, error) {
	c := &fanoutConfig{}
	var urls urlList
	var dev bool
	var secret string
	fs := flag.NewFlagSet("presence-bench fanout", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&urls, "url", "presenced node(s), loopback only; repeat or comma-separate: targets on the first, watchers round-robin on the others (default "+defaultURL+")")
	fs.IntVar(&c.watchers, "watchers", 500, "watcher connections, each subscribed to every target")
	fs.IntVar(&c.targets, "targets", 1, "target users who change status")
	fs.IntVar(&c.devices, "devices", 1, "connections per target, taking turns at set_status")
	fs.DurationVar(&c.interval, "interval", ratelimit.Status.Every, "time between two changes of one target (at least the server's limit of a user's status changes)")
	fs.DurationVar(&c.duration, "duration", 20*time.Second, "how long targets change status")
	fs.IntVar(&c.changes, "changes", 0, "stop after this many changes in all (0: run for -duration)")
	fs.DurationVar(&c.drain, "drain", 5*time.Second, "how long to wait for the last deliveries")
	fs.BoolVar(&dev, "dev", false, "connect with a bare user_id (the server runs with -dev)")
	fs.StringVar(&secret, "jwt-secret", "", "mint a client token per connection with this secret (or $"+jwtSecretEnv+")")
	fs.StringVar(&c.redisURL, "baseline-redis", "", "also measure plain Redis PUBLISH/SUBSCRIBE of the same shape (redis://127.0.0.1:6379)")
	fs.BoolVar(&c.json, "json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.eps, c.urlStrings, err = resolveEndpoints(urls, dev, secret); err != nil {
		return nil, err
	}
	if c.watchers < 1 || c.watchers > maxFanoutWatchers {
		return nil, fmt.Errorf("-watchers %d: must be between 1 and %d", c.watchers, maxFanoutWatchers)
	}
	if c.targets < 1 || c.targets > maxFanoutTargets {
		return nil, fmt.Errorf("-targets %d: must be between 1 and %d (each watcher subscribes to all)", c.targets, maxFanoutTargets)
	}
	if c.interval < ratelimit.Status.Every || c.interval > time.Minute {
		return nil, fmt.Errorf("-interval %v: must be between %v (the server's limit of one user's status changes; more targets make more changes) and 1m",
			c.interval, ratelimit.Status.Every)
	}
	if c.devices < 1 || c.devices > 200 {
		return nil, fmt.Errorf("-devices %d: must be between 1 and 200", c.devices)
	}
	if c.duration <= 0 || c.duration > maxFanoutDuration {
		return nil, fmt.Errorf("-duration %v: must be between 0 and %v", c.duration, maxFanoutDuration)
	}
	if c.changes < 0 || c.changes > maxFanoutChanges {
		return nil, fmt.Errorf("-changes %d: must be between 0 and %d", c.changes, maxFanoutChanges)
	}
	if c.drain < 0 || c.drain > time.Minute {
		return nil, fmt.Errorf("-drain %v: must be between 0 and 1m", c.drain)
	}
	most := int64(c.duration/c.interval+1) * int64(c.targets)
	if c.changes > 0 {
		most = min(most, int64(c.changes))
	}
	if most*int64(c.watchers) > maxFanoutDeliveries {
		return nil, fmt.Errorf("up to %d changes × %d watchers is more than %d deliveries to keep: shorten -duration or lengthen -interval", most, c.watchers, maxFanoutDeliveries)
	}
	if c.redisURL != "" {
		if c.redisAddr, err = pubsubAddr(c.redisURL); err != nil {
			return nil, err
		}
	}
	c.tag = runTag()
	return c, nil
}

func runFanoutCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseFanout, func(c *fanoutConfig) bool { return c.json }, runFanout, printFanout)
}

// fanoutResult is the outcome of the fanout scenario (fields: see the file
// comment).
type fanoutResult struct {
	Scenario         string          `json:"scenario"`
	URLs             []string        `json:"urls"`
	Watchers         int             `json:"watchers"`
	Targets          int             `json:"targets"`
	DevicesPerTarget int             `json:"devices_per_target"`
	Interval         string          `json:"interval"`
	Duration         string          `json:"duration"`
	Changes          int             `json:"changes"`
	Confirmed        int             `json:"changes_confirmed"`
	RateLimited      int64           `json:"rate_limited"`
	Expected         int64           `json:"expected_deliveries"`
	Deliveries       int64           `json:"deliveries"`
	Missing          int64           `json:"missing_deliveries"`
	Coalesced        int64           `json:"coalesced"`
	WatcherDrops     int64           `json:"watcher_drops"`
	Errors           int64           `json:"errors"`
	FirstError       string          `json:"first_error,omitempty"`
	DeliveriesPerSec float64         `json:"deliveries_per_sec"`
	Latency          latSummary      `json:"latency"`
	Baseline         *fanoutBaseline `json:"baseline,omitempty"`
	RatioP50         float64         `json:"ratio_p50,omitempty"`
	RatioP99         float64         `json:"ratio_p99,omitempty"`
}

// fanoutBaseline is the plain Redis pub/sub run of the same shape.
type fanoutBaseline struct {
	RedisURL         string     `json:"redis_url"`
	Publishes        int        `json:"publishes"`
	Expected         int64      `json:"expected_deliveries"`
	Deliveries       int64      `json:"deliveries"`
	Missing          int64      `json:"missing_deliveries"`
	DeliveriesPerSec float64    `json:"deliveries_per_sec"`
	Latency          latSummary `json:"latency"`
}

// errCounter counts errors and keeps the first; safe for concurrent use.
type errCounter struct {
	n     atomic.Int64
	mu    sync.Mutex // guards first
	first string
}

func (e *errCounter) add(err error) {
	e.n.Add(1)
	e.mu.Lock()
	if e.first == "" {
		e.first = err.Error()
	}
	e.mu.Unlock()
}

func (e *errCounter) firstErr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.first
}

// fanoutSend is one set_status a target wrote.
type fanoutSend struct {
	busy bool
	at   time.Time
}

// fanoutEcho is one presence message a target saw of itself.
type fanoutEcho struct {
	busy    bool
	version uint64
}

// fanoutRecv is one presence message a watcher read.
type fanoutRecv struct {
	target  int
	version uint64
	at      time.Time
}

// fanoutTarget is one target user: its devices, what it sent and what it
// saw of itself.
type fanoutTarget struct {
	user  string
	base  uint64 // version before the first change
	conns []*benchConn
	sends []fanoutSend // owned by the target's change loop
	echo  []fanoutEcho // owned by device 0's reader
}

// fanoutWatcher is one watcher connection and what it read.
type fanoutWatcher struct {
	conn *benchConn
	recv []fanoutRecv // owned by its reader
}

func runFanout(parent context.Context, cfg *fanoutConfig, stderr io.Writer) (*fanoutResult, error) {
	ctx, cancel := context.WithCancel(parent) // the presenced phase
	defer cancel()
	var (
		wg          sync.WaitGroup // every reader and beater
		errs        errCounter
		drops       atomic.Int64
		rateLimited atomic.Int64
		delivered   atomic.Int64 // presence messages read by watchers
		echoed      atomic.Int64 // presence messages targets read of themselves
		mu          sync.Mutex   // guards conns
		conns       []*benchConn
	)
	defer func() { // whatever happens, every connection closes and every goroutine ends
		cancel()
		mu.Lock()
		for _, c := range conns {
			c.drop()
		}
		mu.Unlock()
		wg.Wait()
	}()
	keep := func(c *benchConn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); beatLoop(ctx, c, c.beat()) }()
	}
	// reader reads c until it ends; on is called for each message.
	reader := func(c *benchConn, watcher bool, on func(m *wsMsg, at time.Time)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := c.read(time.Time{})
				if err != nil {
					if ctx.Err() == nil {
						if watcher {
							drops.Add(1)
						}
						errs.add(err)
					}
					return
				}
				at := time.Now()
				switch m.Type {
				case "error":
					if m.Code == "rate_limited" {
						rateLimited.Add(1)
					} else {
						errs.add(fmt.Errorf("server error %s: %s", m.Code, m.Message))
					}
				case "presence":
					if on != nil {
						on(m, at)
					}
				}
			}
		}()
	}

	// Targets on the first node; device 0 watches its own user.
	targets := make([]*fanoutTarget, cfg.targets)
	index := make(map[string]int, cfg.targets)
	ids := make([]string, cfg.targets)
	for t := range targets {
		ft := &fanoutTarget{user: "fo" + cfg.tag + "-t" + strconv.Itoa(t)}
		targets[t], index[ft.user], ids[t] = ft, t, ft.user
	}
	if err := dialAll(ctx, cfg.targets, "fanout targets", stderr, func(t int) error {
		ft := targets[t]
		for d := range cfg.devices {
			c, err := cfg.eps[0].dial(ctx, ft.user, "d"+strconv.Itoa(d))
			if err != nil {
				return err
			}
			keep(c)
			ft.conns = append(ft.conns, c)
		}
		snap, err := subscribeWait(ft.conns[0], []string{ft.user})
		if err != nil {
			return fmt.Errorf("target %s watching itself: %w", ft.user, err)
		}
		ft.base = snap.Users[ft.user].Version
		for d, c := range ft.conns {
			var on func(*wsMsg, time.Time)
			if d == 0 {
				on = func(m *wsMsg, _ time.Time) {
					if m.UserID == ft.user && m.Status != nil {
						ft.echo = append(ft.echo, fanoutEcho{busy: *m.Status == "busy", version: m.Version})
						echoed.Add(1)
					}
				}
			}
			reader(c, false, on)
		}
		return nil
	}); err != nil {
		return nil, err
	}

	// Watchers, round-robin over the other nodes.
	weps := cfg.eps
	if len(weps) > 1 {
		weps = weps[1:]
	}
	watchers := make([]*fanoutWatcher, cfg.watchers)
	fmt.Fprintf(stderr, "fanout: %d targets × %d devices on %s; connecting %d watchers\n", cfg.targets, cfg.devices, cfg.eps[0].url.Host, cfg.watchers)
	if err := dialAll(ctx, cfg.watchers, "fanout watchers", stderr, func(i int) error {
		c, err := weps[i%len(weps)].dial(ctx, "fo"+cfg.tag+"-w"+strconv.Itoa(i), "w")
		if err != nil {
			return err
		}
		keep(c)
		if _, err := subscribeWait(c, ids); err != nil {
			return fmt.Errorf("watcher %d: %w", i, err)
		}
		w := &fanoutWatcher{conn: c}
		watchers[i] = w
		reader(c, true, func(m *wsMsg, at time.Time) {
			delivered.Add(1)
			if t, ok := index[m.UserID]; ok {
				w.recv = append(w.recv, fanoutRecv{target: t, version: m.Version, at: at})
			}
		})
		return nil
	}); err != nil {
		return nil, err
	}

	// Changes: each target every interval, its devices in turn.
	fmt.Fprintf(stderr, "fanout: all connected; changing status every %v per target for %v\n", cfg.interval, cfg.duration)
	var sent atomic.Int64
	start := time.Now()
	end := start.Add(cfg.duration)
	var changers sync.WaitGroup
	for t, ft := range targets {
		changers.Add(1)
		go func() {
			defer changers.Done()
			// Spread the targets over the interval.
			next := start.Add(cfg.interval * time.Duration(t) / time.Duration(len(targets)))
			for k := 0; ; k++ {
				if !sleepUntil(ctx, next) || !time.Now().Before(end) {
					return
				}
				if cfg.changes > 0 && sent.Add(1) > int64(cfg.changes) {
					return
				} else if cfg.changes == 0 {
					sent.Add(1)
				}
				busy := k%2 == 0
				msg := msgOnline
				if busy {
					msg = msgBusy
				}
				at, err := ft.conns[k%len(ft.conns)].sendAt(msg)
				if err != nil {
					errs.add(err)
					return
				}
				ft.sends = append(ft.sends, fanoutSend{busy: busy, at: at})
				next = next.Add(cfg.interval)
			}
		}()
	}
	sentSoFar := func() int64 {
		if n := sent.Load(); cfg.changes == 0 || n < int64(cfg.changes) {
			return n
		}
		return int64(cfg.changes)
	}
	progress := func(phase string) {
		fmt.Fprintf(stderr, "fanout %6.1fs %s: %d changes, %d presence messages read, %d rate limited, %d watcher drops, %d errors\n",
			time.Since(start).Seconds(), phase, sentSoFar(), delivered.Load(), rateLimited.Load(), drops.Load(), errs.n.Load())
	}
	waitProgress(&changers, func(time.Time) { progress("changing") })
	sendEnd := time.Now()
	// Drain: until the targets and every watcher have read as many
	// messages as there were changes, or -drain runs out.
	changes := 0
	for _, ft := range targets {
		changes += len(ft.sends)
	}
	drainEnd := time.Now().Add(cfg.drain)
	for (delivered.Load() < int64(changes)*int64(cfg.watchers) || echoed.Load() < int64(changes)) && time.Now().Before(drainEnd) {
		if !sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) {
			return nil, ctx.Err()
		}
	}
	progress("drained")
	// Stop the readers before reading what they recorded.
	cancel()
	mu.Lock()
	for _, c := range conns {
		c.drop()
	}
	conns = nil
	mu.Unlock()
	wg.Wait()

	res := &fanoutResult{
		Scenario: "fanout", URLs: cfg.urlStrings, Watchers: cfg.watchers, Targets: cfg.targets,
		DevicesPerTarget: cfg.devices, Interval: cfg.interval.String(), Duration: sendEnd.Sub(start).Round(time.Millisecond).String(),
		Changes: changes, RateLimited: rateLimited.Load(), WatcherDrops: drops.Load(), Errors: errs.n.Load(), FirstError: errs.firstErr(),
	}
	// Which version each change got: the target's own presence messages.
	sentAt := make([]map[uint64]time.Time, len(targets))
	for t, ft := range targets {
		sentAt[t] = matchEchoes(ft.base, ft.sends, ft.echo)
		res.Confirmed += len(sentAt[t])
	}
	versions := make([][]uint64, len(targets)) // confirmed, ascending
	for t := range targets {
		for v := range sentAt[t] {
			versions[t] = append(versions[t], v)
		}
		slices.Sort(versions[t])
	}
	var lat latSet
	last := make([]uint64, len(targets))
	got := make([]int64, len(targets))
	var lastAt time.Time
	for _, w := range watchers {
		clear(last)
		clear(got)
		for _, r := range w.recv {
			if r.version <= last[r.target] {
				continue
			}
			last[r.target] = r.version
			if at, ok := sentAt[r.target][r.version]; ok {
				got[r.target]++
				lat.add(r.at.Sub(at))
				if r.at.After(lastAt) {
					lastAt = r.at
				}
			}
		}
		// Versions below the last one this watcher read, and not read:
		// coalesced in its queue behind a newer change.
		for t := range targets {
			below, _ := slices.BinarySearch(versions[t], last[t]+1)
			res.Coalesced += int64(below) - got[t]
		}
	}
	res.Expected = int64(res.Confirmed) * int64(cfg.watchers)
	res.Deliveries = int64(lat.n())
	res.Missing = res.Expected - res.Deliveries
	if d := lastAt.Sub(start).Seconds(); d > 0 {
		res.DeliveriesPerSec = float64(res.Deliveries) / d
	}
	res.Latency = lat.summary()

	if cfg.redisAddr != "" {
		fmt.Fprintf(stderr, "fanout: baseline over Redis %s, %d subscribers × %d channels\n", cfg.redisAddr, cfg.watchers, cfg.targets)
		b, err := runRedisBaseline(parent, cfg, stderr)
		if err != nil {
			return nil, fmt.Errorf("baseline: %w", err)
		}
		res.Baseline = b
		if b.Latency.P50 > 0 {
			res.RatioP50 = res.Latency.P50 / b.Latency.P50
		}
		if b.Latency.P99 > 0 {
			res.RatioP99 = res.Latency.P99 / b.Latency.P99
		}
	}
	return res, nil
}

// matchEchoes maps versions to the send times of the changes that made
// them. A visible change adds exactly 1 to a user's version, so a jump of
// the echoed version skips as many changes as it jumped over (changes of
// one user coalesce in a slow socket's queue, the target's own included);
// then the next send with the echoed status is the change (a refused send
// produced no version).
func matchEchoes(base uint64, sends []fanoutSend, echo []fanoutEcho) map[uint64]time.Time {
	out := make(map[uint64]time.Time, len(sends))
	prev, k := base, 0
	for _, e := range echo {
		if e.version <= prev {
			continue // not newer than what was applied
		}
		if prev != 0 && e.version-prev > 1 {
			k += int(min(e.version-prev-1, uint64(len(sends))))
		}
		prev = e.version
		for k < len(sends) && sends[k].busy != e.busy {
			k++
		}
		if k >= len(sends) {
			break
		}
		out[e.version] = sends[k].at
		k++
	}
	return out
}

// subscribeWait subscribes c to ids and reads until the snapshot.
func subscribeWait(c *benchConn, ids []string) (*wsMsg, error) {
	return subscribeKnownWait(c, ids, nil)
}

// subscribeKnownWait is subscribeWait with the versions of ids the client
// holds (nil: none), and returns the last snapshot.
func subscribeKnownWait(c *benchConn, ids []string, known map[string]uint64) (*wsMsg, error) {
	for i := 0; i < len(ids); i += 500 {
		if err := c.send(subscribeKnownMsg(ids[i:min(i+500, len(ids))], known)); err != nil {
			return nil, err
		}
		for {
			m, err := c.read(time.Now().Add(10 * time.Second))
			if err != nil {
				return nil, err
			}
			if m.Type == "error" {
				return nil, fmt.Errorf("subscribe: %s: %s", m.Code, m.Message)
			}
			if m.Type == "snapshot" {
				if i+500 >= len(ids) {
					return m, nil
				}
				break
			}
		}
	}
	return nil, errors.New("nothing to subscribe to")
}

// dialAll runs open(i) for i in [0, n), dialConcurrency at a time, and
// returns the first error. Every second it reports its progress as what
// on progress (nil: silent).
func dialAll(ctx context.Context, n int, what string, progress io.Writer, open func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		done  atomic.Int64
	)
	if progress != nil {
		start := time.Now()
		tick := time.NewTicker(time.Second)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					fmt.Fprintf(progress, "%s %6.1fs: %d/%d connected\n", what, time.Since(start).Seconds(), done.Load(), n)
				}
			}
		}()
	}
	sem := make(chan struct{}, dialConcurrency)
	var dials sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		dials.Add(1)
		go func() {
			defer dials.Done()
			defer func() { <-sem }()
			if err := open(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel()
				return
			}
			done.Add(1)
		}()
	}
	dials.Wait()
	err := ctx.Err()
	cancel() // ends the progress reporter
	wg.Wait()
	if first == nil && err != nil {
		first = err
	}
	return first
}

// sleepUntil waits for t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

func printFanout(w io.Writer, r *fanoutResult) {
	fmt.Fprintf(w, "fanout: %d watchers × %d targets (%d devices each), a change every %s per target for %s on %v\n",
		r.Watchers, r.Targets, r.DevicesPerTarget, r.Interval, r.Duration, r.URLs)
	fmt.Fprintf(w, "changes %d sent, %d confirmed, %d rate limited; deliveries %d of %d expected, missing %d (goal 0; %d coalesced behind a newer change); %.0f deliveries/s; %d watcher drops, %d errors\n",
		r.Changes, r.Confirmed, r.RateLimited, r.Deliveries, r.Expected, r.Missing, r.Coalesced, r.DeliveriesPerSec, r.WatcherDrops, r.Errors)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "change → socket\tsamples\tp50\tp99\tp99.9\tmax\tdeliveries/s\tmissing\t")
	row := func(name string, l latSummary, rate float64, missing int64) {
		fmt.Fprintf(tw, "%s\t%d\t%.2f ms\t%.2f ms\t%.2f ms\t%.2f ms\t%.0f\t%d\t\n", name, l.Samples, l.P50, l.P99, l.P999, l.Max, rate, missing)
	}
	row("presenced", r.Latency, r.DeliveriesPerSec, r.Missing)
	if b := r.Baseline; b != nil {
		row("redis pub/sub", b.Latency, b.DeliveriesPerSec, b.Missing)
	}
	_ = tw.Flush()
	if r.Baseline != nil {
		fmt.Fprintf(w, "presenced ÷ redis: p50 %.2f×, p99 %.2f×\n", r.RatioP50, r.RatioP99)
	}
}

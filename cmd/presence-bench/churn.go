package main

// The churn scenario: flaky devices, and whether the server tells a dead
// device from a flaky one.
//
//	presenced -dev -api-key k -addr 127.0.0.1:18081 -data $(mktemp -d) -heartbeat-ttl 5s
//	presence-bench churn -url ws://127.0.0.1:18081 -dev -devices 2000 -duration 60s
//
// D devices (one user each) connect over WebSocket and heartbeat at the
// interval their welcome announces (ttl/3 if it announces none). Watcher
// connections, at most 500 subscriptions each, watch every device's user
// and record every presence message. For -duration the tool picks devices
// at random, -rate a second, and makes each misbehave in one of three ways,
// in the proportions -mix reconnect,miss,die (interleaved evenly rather
// than drawn at random, so even a short run has each one it weighs):
//
//   - reconnect: drop the TCP connection (no close frame, no bye) and
//     connect again with the same device id, at a random moment that still
//     keeps the device's beats less than ttl − slack apart and comes
//     within the close grace − slack of the drop;
//   - miss: skip one or two beats in a row (two only if the gap stays
//     under ttl − slack); when not even one can be skipped (a WebSocket
//     beats every ttl/2), send the next beat late, halfway between its
//     time and ttl − slack;
//   - die: drop the TCP connection and never come back.
//
// slack is max(ttl/10, 300ms): room for the scheduler of this busy tool.
// The close grace is what the welcome announces (close_grace_ms, 0: the
// device ends at the drop; a server that announces none keeps a closed
// device its whole ttl). With no grace a reconnect cannot be kept alive:
// give such a server a -mix without reconnects (0,4,2).
// The tool keeps the ground truth. A device is kept alive while the gaps
// between the moments its beats (or connects: the welcome read) happened
// stay below ttl − 200ms (loopback allowance) and, after a drop, it is back
// within the close grace − 200ms; the largest gap is reported, and a device
// that missed either is counted in kept_alive_violations (the tool's fault,
// not the server's) and excluded from the verdict. A false offline is an
// offline presence message for a device that was kept alive up to that
// message. A dead device's end is the earlier of its last beat + ttl and
// its drop + the close grace; a missed offline is a dead device whose
// offline did not arrive within its end + 5s. Detection lag is the time of
// the offline message − the end. The goal: false 0, missed 0, lag p99 ≤
// 200 ms when the grace is shorter than the ttl (watchers told within the
// grace + 0.2 s), else ≤ 1 s (offline ≤ ttl + 1 s after the last beat).
//
// The -json object (churnResult) has these fields: scenario ("churn"),
// urls, devices, watcher_conns, duration, ttl_ms, close_grace_ms,
// heartbeat_ms, slack_ms,
// rate, reconnects, reconnect_failures, misses, beats_skipped, deaths,
// detected, false_offline, missed_offline, kept_alive_violations,
// max_gap_ms, server_closes, errors, first_error, lag {samples, p50_ms,
// p99_ms, p999_ms, max_ms}, lag_min_ms, goal {false_offline, missed_offline,
// lag_p99_ms} and goal_met.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of the churn scenario.
const (
	maxChurnDevices  = 50_000
	maxChurnDuration = 30 * time.Minute
	churnAllowance   = 200 * time.Millisecond // loopback delay allowed on top of a gap
	churnMissedAfter = 5 * time.Second        // an offline later than ttl + this is missed
	churnSubsPerConn = 500
)

type churnConfig struct {
	eps        []wsEndpoint
	urlStrings []string
	devices    int
	duration   time.Duration
	rate       float64 // misbehaviours per second
	mix        [3]int  // weights: reconnect, miss, die
	json       bool
	tag        string
}

func parseChurn(args []string, stderr io.Writer) (*churnConfig, error) {
	c := &churnConfig{}
	var urls urlList
	var dev bool
	var secret, mix string
	fs := flag.NewFlagSet("presence-bench churn", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&urls, "url", "presenced node(s), loopback only; repeat or comma-separate: devices on the first, watchers round-robin on the others (default "+defaultURL+"); start the server with a short -heartbeat-ttl, e.g. 5s")
	fs.IntVar(&c.devices, "devices", 2000, "devices, one user each")
	fs.DurationVar(&c.duration, "duration", 60*time.Second, "how long devices misbehave")
	fs.Float64Var(&c.rate, "rate", 0, "misbehaviours a second over all devices (0: devices/50)")
	fs.StringVar(&mix, "mix", "4,4,2", "weights of reconnect, miss and die")
	fs.BoolVar(&dev, "dev", false, "connect with a bare user_id (the server runs with -dev)")
	fs.StringVar(&secret, "jwt-secret", "", "mint a client token per connection with this secret (or $"+jwtSecretEnv+")")
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
	if c.devices < 1 || c.devices > maxChurnDevices {
		return nil, fmt.Errorf("-devices %d: must be between 1 and %d", c.devices, maxChurnDevices)
	}
	if c.duration <= 0 || c.duration > maxChurnDuration {
		return nil, fmt.Errorf("-duration %v: must be between 0 and %v", c.duration, maxChurnDuration)
	}
	if c.rate == 0 {
		c.rate = float64(c.devices) / 50
	}
	if c.rate < 0 || c.rate > float64(c.devices) || c.rate > 10_000 {
		return nil, fmt.Errorf("-rate %v: must be between 0 and min(devices, 10000) a second", c.rate)
	}
	parts := strings.Split(mix, ",")
	if len(parts) != 3 {
		return nil, fmt.Errorf("-mix %q: want three weights reconnect,miss,die", mix)
	}
	sum := 0
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 || n > 1000 {
			return nil, fmt.Errorf("-mix %q: weights are integers from 0 to 1000", mix)
		}
		c.mix[i] = n
		sum += n
	}
	if sum == 0 {
		return nil, fmt.Errorf("-mix %q: all weights are 0", mix)
	}
	c.tag = runTag()
	return c, nil
}

func runChurnCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseChurn, func(c *churnConfig) bool { return c.json }, runChurn, printChurn)
}

// churnResult is the outcome of the churn scenario (fields: see the file
// comment).
type churnResult struct {
	Scenario          string     `json:"scenario"`
	URLs              []string   `json:"urls"`
	Devices           int        `json:"devices"`
	WatcherConns      int        `json:"watcher_conns"`
	Duration          string     `json:"duration"`
	TTLMs             int64      `json:"ttl_ms"`
	CloseGraceMs      int64      `json:"close_grace_ms"`
	HeartbeatMs       int64      `json:"heartbeat_ms"`
	SlackMs           int64      `json:"slack_ms"`
	Rate              float64    `json:"rate"`
	Reconnects        int64      `json:"reconnects"`
	ReconnectFailures int64      `json:"reconnect_failures"`
	Misses            int64      `json:"misses"`
	BeatsSkipped      int64      `json:"beats_skipped"`
	Deaths            int        `json:"deaths"`
	Detected          int        `json:"detected"`
	FalseOffline      int        `json:"false_offline"`
	MissedOffline     int        `json:"missed_offline"`
	Violations        int        `json:"kept_alive_violations"`
	MaxGapMs          float64    `json:"max_gap_ms"`
	ServerCloses      int64      `json:"server_closes"`
	Errors            int64      `json:"errors"`
	FirstError        string     `json:"first_error,omitempty"`
	Lag               latSummary `json:"lag"`
	LagMinMs          float64    `json:"lag_min_ms"`
	Goal              churnGoal  `json:"goal"`
	GoalMet           bool       `json:"goal_met"`
}

// churnGoal is what the figures are held against.
type churnGoal struct {
	FalseOffline  int     `json:"false_offline"`
	MissedOffline int     `json:"missed_offline"`
	LagP99Ms      float64 `json:"lag_p99_ms"` // detection ≤ ttl + this
}

// Commands to a device's goroutine.
const (
	cmdReconnect = iota
	cmdMiss
	cmdDie
)

// churnDevice is one device: its goroutine owns the connection; the fields
// under mu are its ground truth.
type churnDevice struct {
	idx  int
	user string
	cmds chan int // buffered 1
	busy atomic.Bool

	mu       sync.Mutex // guards the fields below
	lastBeat time.Time  // last heartbeat written or connect (welcome read)
	maxGap   time.Duration
	violated time.Time // first moment a gap exceeded ttl − allowance; zero if never
	dead     bool
	deadAt   time.Time
}

// beatAt records a beat (or connect) at now.
func (d *churnDevice) beatAt(now time.Time, limit time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.lastBeat.IsZero() {
		gap := now.Sub(d.lastBeat)
		d.maxGap = max(d.maxGap, gap)
		if gap > limit && d.violated.IsZero() {
			d.violated = d.lastBeat.Add(limit)
		}
	}
	d.lastBeat = now
}

// churnOffline is one offline presence message.
type churnOffline struct {
	dev int
	at  time.Time
}

// churnRun is the state of one run.
type churnRun struct {
	cfg      *churnConfig
	ctx      context.Context
	devices  []*churnDevice
	ttl      time.Duration
	grace    time.Duration // close grace (the ttl if the server announces none)
	interval time.Duration
	slack    time.Duration
	// ended is when the run took its last look for the offlines of the
	// dead: deaths after it (a command applied late) are no part of the
	// verdict. Offlines read after watched (the tool then drops every
	// socket) are none either. watched is taken after that look, so an
	// offline the look counted, read just after ended, is in (unset: the
	// cut-off is ended). Zero: no cut-off.
	ended, watched time.Time

	wg                    sync.WaitGroup // every goroutine of the run
	errs                  errCounter
	serverCloses          atomic.Int64
	reconnects, reconFail atomic.Int64
	misses, skipped       atomic.Int64
	deaths                atomic.Int64

	live liveConns // the sockets open

	mu       sync.Mutex // guards offlines
	offlines []churnOffline
}

// drain reads c until it ends; a close the tool did not ask for is counted.
func (r *churnRun) drain(c *benchConn, ours *atomic.Bool) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			m, err := c.read(time.Time{})
			if err != nil {
				if !ours.Load() && r.ctx.Err() == nil {
					r.serverCloses.Add(1)
					r.errs.add(fmt.Errorf("device connection: %w", err))
				}
				return
			}
			if m.Type == "error" {
				r.errs.add(fmt.Errorf("server error %s: %s", m.Code, m.Message))
			}
		}
	}()
}

func runChurn(parent context.Context, cfg *churnConfig, stderr io.Writer) (*churnResult, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	r := &churnRun{cfg: cfg, ctx: ctx}
	defer r.stop(cancel)

	// Devices on the first node; the first tells the ttl and the interval,
	// and each device beats from the moment it is connected.
	r.devices = make([]*churnDevice, cfg.devices)
	fmt.Fprintf(stderr, "churn: connecting %d devices to %s\n", cfg.devices, cfg.eps[0].url.Host)
	open := func(i int) error {
		d := &churnDevice{idx: i, user: "ch" + cfg.tag + "-" + strconv.Itoa(i), cmds: make(chan int, 1)}
		c, err := cfg.eps[0].dial(ctx, d.user, "d")
		if err != nil {
			return err
		}
		d.lastBeat = time.Now()
		r.live.track(c, true)
		r.devices[i] = d
		if i == 0 {
			r.ttl, r.interval, r.grace = c.ttl(), c.beat(), c.closeGrace()
			r.slack = max(r.ttl/10, 300*time.Millisecond)
			if r.ttl <= 0 || r.interval <= 0 || r.interval >= r.ttl-r.slack-churnAllowance {
				return fmt.Errorf("the welcome announces ttl %v, heartbeat %v: no room for misbehaviour", r.ttl, r.interval)
			}
		}
		r.wg.Add(1)
		go func() { defer r.wg.Done(); r.device(d, c) }()
		return nil
	}
	if err := open(0); err != nil {
		return nil, err
	}
	if err := dialAll(ctx, cfg.devices-1, "churn devices", stderr, func(i int) error { return open(i + 1) }); err != nil {
		return nil, err
	}

	// Watchers on the other nodes (or the first), ≤ 500 users each.
	weps := cfg.eps
	if len(weps) > 1 {
		weps = weps[1:]
	}
	nw := (cfg.devices + churnSubsPerConn - 1) / churnSubsPerConn
	index := make(map[string]int, cfg.devices)
	for i, d := range r.devices {
		index[d.user] = i
	}
	if err := dialAll(ctx, nw, "churn watchers", stderr, func(w int) error {
		c, err := weps[w%len(weps)].dial(ctx, "ch"+cfg.tag+"-w"+strconv.Itoa(w), "w")
		if err != nil {
			return err
		}
		r.live.track(c, true)
		r.wg.Add(1)
		go func() { defer r.wg.Done(); beatLoop(ctx, c, c.beat()) }()
		lo, hi := w*churnSubsPerConn, min((w+1)*churnSubsPerConn, cfg.devices)
		ids := make([]string, 0, hi-lo)
		for _, d := range r.devices[lo:hi] {
			ids = append(ids, d.user)
		}
		if _, err := subscribeWait(c, ids); err != nil {
			return fmt.Errorf("watcher %d: %w", w, err)
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for {
				m, err := c.read(time.Time{})
				if err != nil {
					if ctx.Err() == nil {
						r.errs.add(fmt.Errorf("watcher %d: %w", w, err))
						r.serverCloses.Add(1)
					}
					return
				}
				at := time.Now()
				if m.Type == "presence" && m.Status != nil && *m.Status == "offline" {
					if i, ok := index[m.UserID]; ok {
						r.mu.Lock()
						r.offlines = append(r.offlines, churnOffline{dev: i, at: at})
						r.mu.Unlock()
					}
				}
			}
		}()
		return nil
	}); err != nil {
		return nil, err
	}

	fmt.Fprintf(stderr, "churn: ttl %v, heartbeat %v; %d watcher connections; %.1f misbehaviours/s for %v\n", r.ttl, r.interval, nw, cfg.rate, cfg.duration)
	start := time.Now()
	progress := func(phase string) {
		r.mu.Lock()
		off := len(r.offlines)
		r.mu.Unlock()
		fmt.Fprintf(stderr, "churn %6.1fs %s: %d reconnects (%d failed), %d misses, %d deaths, %d offlines seen, %d server closes, %d errors\n",
			time.Since(start).Seconds(), phase, r.reconnects.Load(), r.reconFail.Load(), r.misses.Load(), r.deaths.Load(), off, r.serverCloses.Load(), r.errs.n.Load())
	}
	r.misbehave(start.Add(cfg.duration), progress)

	// Wait for the offlines of the dead: until each has one, or ttl + 5s
	// after the last beat of the last of them. The end is taken before
	// each look, so a death the look missed (its command applied late) is
	// after the end, and no part of the verdict.
	waitUntil := func() time.Time {
		var at time.Time
		for _, d := range r.devices {
			d.mu.Lock()
			if d.dead {
				at = later(at, r.end(d).Add(churnMissedAfter))
			}
			d.mu.Unlock()
		}
		return at
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var end time.Time
	for {
		end = time.Now()
		if !end.Before(waitUntil()) || r.allDetected() {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
			progress("waiting for the dead")
		case <-time.After(100 * time.Millisecond):
		}
	}
	r.ended, r.watched = end, time.Now()
	progress("done")
	r.stop(cancel) // before the result: every device's goroutine has ended
	return r.result(start, end), nil
}

// stop ends the run: cancel stops the devices' goroutines, every open
// socket is dropped, and it waits for them. Calling it again is harmless.
func (r *churnRun) stop(cancel context.CancelFunc) {
	cancel()
	r.live.dropAll()
	r.wg.Wait()
}

// end is when a dead device should be announced offline: the end of its
// ttl, or of the close grace after its connection dropped if that is
// earlier. The caller holds d.mu or owns d.
func (r *churnRun) end(d *churnDevice) time.Time {
	e := d.lastBeat.Add(r.ttl)
	if g := d.deadAt.Add(r.grace); g.Before(e) {
		e = g
	}
	return e
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// allDetected reports whether every dead device has an offline after its
// death.
func (r *churnRun) allDetected() bool {
	r.mu.Lock()
	seen := make(map[int]time.Time, len(r.offlines))
	for _, o := range r.offlines {
		seen[o.dev] = o.at
	}
	r.mu.Unlock()
	for _, d := range r.devices {
		d.mu.Lock()
		dead, at := d.dead, d.deadAt
		d.mu.Unlock()
		if dead && !seen[d.idx].After(at) {
			return false
		}
	}
	return true
}

// misbehave sends commands to random devices until end.
func (r *churnRun) misbehave(end time.Time, progress func(string)) {
	const step = 50 * time.Millisecond
	mix := newMixer(r.cfg.mix)
	minAlive := (r.cfg.devices + 9) / 10 // keep a tenth alive
	var owed float64
	lastProgress := time.Now()
	for next := time.Now(); next.Before(end); next = next.Add(step) {
		if !sleepUntil(r.ctx, next) {
			return
		}
		if time.Since(lastProgress) >= time.Second {
			lastProgress = time.Now()
			progress("churning")
		}
		owed += r.cfg.rate * step.Seconds()
		for ; owed >= 1; owed-- {
			d := r.devices[rand.IntN(len(r.devices))]
			if !d.busy.CompareAndSwap(false, true) {
				continue // dead or already misbehaving: a lost event
			}
			cmd := cmdReconnect
			switch mix.next() {
			case 1:
				cmd = cmdMiss
			case 2:
				cmd = cmdDie
				if r.cfg.devices-int(r.deaths.Load()) <= minAlive {
					cmd = cmdReconnect
				}
			}
			if cmd == cmdDie {
				r.deaths.Add(1)
			}
			d.cmds <- cmd // buffered, and busy says it is empty
		}
	}
}

// mixer interleaves three kinds in fixed proportions (smooth weighted
// round robin): of any sum(weights) picks in a row, kind i is weights[i].
type mixer struct {
	weights, current [3]int
	total            int
}

func newMixer(weights [3]int) *mixer {
	return &mixer{weights: weights, total: weights[0] + weights[1] + weights[2]}
}

// next returns the index of the next kind.
func (m *mixer) next() int {
	best := 0
	for i, w := range m.weights {
		m.current[i] += w
		if m.current[i] > m.current[best] {
			best = i
		}
	}
	m.current[best] -= m.total
	return best
}

// device runs one device until it dies or the run ends.
func (r *churnRun) device(d *churnDevice, c *benchConn) {
	limit := r.ttl - churnAllowance
	ours := &atomic.Bool{}
	r.drain(c, ours)
	closeConn := func() {
		ours.Store(true)
		c.drop()
		r.live.track(c, false)
	}
	defer func() {
		if c != nil {
			closeConn()
		}
	}()
	timer := time.NewTimer(time.Duration(rand.Int64N(int64(r.interval))))
	defer timer.Stop()
	skip := 0
	release := false // free the device for the next command after this beat
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-timer.C:
			timer.Reset(r.interval)
			if skip > 0 {
				skip--
				r.skipped.Add(1)
				release = skip == 0
				continue
			}
			if err := c.send(msgHeartbeat); err != nil {
				if r.ctx.Err() == nil {
					r.errs.add(fmt.Errorf("device %d: heartbeat: %w", d.idx, err))
				}
				continue // the reader counts the close; the gap will show
			}
			d.beatAt(time.Now(), limit)
			if release {
				// Only now: a second miss right after the first would
				// make one gap of both.
				release = false
				d.busy.Store(false)
			}
		case cmd := <-d.cmds:
			switch cmd {
			case cmdMiss:
				r.misses.Add(1)
				if 2*r.interval > r.ttl-r.slack {
					// No beat to spare (a WebSocket beats every ttl/2):
					// the next beat comes late instead, as one held up
					// by retransmissions would: halfway between its
					// time and ttl − slack, so that a loaded machine
					// does not make it later than the ttl.
					d.mu.Lock()
					last := d.lastBeat
					d.mu.Unlock()
					timer.Reset(time.Until(last.Add((r.interval + r.ttl - r.slack) / 2)))
					release = true
					continue
				}
				skip = 1
				if 3*r.interval <= r.ttl-r.slack && rand.IntN(2) == 0 {
					skip = 2
				}
			case cmdDie:
				// The death is the moment before the close: with no
				// close grace its offline may be read before closeConn
				// returns.
				d.mu.Lock()
				d.dead, d.deadAt = true, time.Now()
				d.mu.Unlock()
				closeConn()
				c = nil
				return
			case cmdReconnect:
				closeConn()
				dropped := time.Now()
				r.reconnects.Add(1)
				d.mu.Lock()
				last := d.lastBeat
				d.mu.Unlock()
				// Come back at a random moment that keeps the gap under
				// ttl − slack and the absence under the close grace −
				// slack, leaving 200ms for the handshake.
				budget := min(time.Until(last.Add(r.ttl-r.slack-200*time.Millisecond)),
					time.Until(dropped.Add(r.grace-r.slack-200*time.Millisecond)))
				if budget > 0 && !sleepUntil(r.ctx, time.Now().Add(time.Duration(rand.Int64N(int64(budget))))) {
					c = nil
					return
				}
				for {
					nc, err := r.cfg.eps[0].dial(r.ctx, d.user, "d")
					if err == nil {
						back := time.Now()
						d.beatAt(back, limit)
						if graceLimit := dropped.Add(r.grace - churnAllowance); back.After(graceLimit) {
							d.mu.Lock()
							if d.violated.IsZero() || graceLimit.Before(d.violated) {
								d.violated = graceLimit
							}
							d.mu.Unlock()
						}
						c, ours = nc, &atomic.Bool{}
						r.live.track(c, true)
						r.drain(c, ours)
						break
					}
					c = nil
					if r.ctx.Err() != nil {
						return
					}
					r.reconFail.Add(1)
					r.errs.add(fmt.Errorf("device %d: reconnect: %w", d.idx, err))
					if !sleepUntil(r.ctx, time.Now().Add(100*time.Millisecond)) {
						return
					}
				}
				timer.Reset(r.interval)
				d.busy.Store(false)
			}
		}
	}
}

// result judges the run against the ground truth.
func (r *churnRun) result(start, end time.Time) *churnResult {
	elapsed := end.Sub(start)
	res := &churnResult{
		Scenario: "churn", URLs: r.cfg.urlStrings, Devices: r.cfg.devices,
		WatcherConns: (r.cfg.devices + churnSubsPerConn - 1) / churnSubsPerConn,
		Duration:     elapsed.Round(time.Millisecond).String(), TTLMs: r.ttl.Milliseconds(), CloseGraceMs: r.grace.Milliseconds(),
		HeartbeatMs: r.interval.Milliseconds(), SlackMs: r.slack.Milliseconds(), Rate: r.cfg.rate,
		Reconnects: r.reconnects.Load(), ReconnectFailures: r.reconFail.Load(),
		Misses: r.misses.Load(), BeatsSkipped: r.skipped.Load(),
		ServerCloses: r.serverCloses.Load(), Errors: r.errs.n.Load(), FirstError: r.errs.firstErr(),
		Goal: churnGoal{LagP99Ms: 1000},
	}
	if r.grace < r.ttl {
		res.Goal.LagP99Ms = 200 // watchers told within the close grace + 0.2 s
	}
	byDev := make(map[int][]time.Time)
	for _, o := range r.offlines {
		// After the end the tool drops every socket: with no close
		// grace their offlines may reach the watchers still reading.
		if cut := later(r.ended, r.watched); cut.IsZero() || !o.at.After(cut) {
			byDev[o.dev] = append(byDev[o.dev], o.at)
		}
	}
	var lag latSet
	minLag := time.Duration(1<<63 - 1)
	var maxGap time.Duration
	limit := r.ttl - churnAllowance
	for _, d := range r.devices {
		if d.dead && !r.ended.IsZero() && d.deadAt.After(r.ended) {
			continue // a death the run ended before (its command was late)
		}
		if !d.dead { // the gap still open at the end counts too
			d.beatAt(end, limit)
		}
		maxGap = max(maxGap, d.maxGap)
		if !d.violated.IsZero() {
			res.Violations++
		}
		detected := false
		for _, at := range byDev[d.idx] {
			alive := !d.dead || at.Before(d.deadAt)
			switch {
			case alive && (d.violated.IsZero() || at.Before(d.violated)):
				res.FalseOffline++
			case alive:
				// the tool let the device lapse: not the server's fault
			case !detected:
				detected = true
				l := at.Sub(r.end(d))
				if l <= churnMissedAfter {
					lag.add(l)
					minLag = min(minLag, l)
				} else {
					detected = false
				}
			}
		}
		if d.dead {
			res.Deaths++
			if detected {
				res.Detected++
			} else {
				res.MissedOffline++
			}
		}
	}
	res.MaxGapMs = float64(maxGap.Microseconds()) / 1e3
	res.Lag = lag.summary()
	if lag.n() > 0 {
		res.LagMinMs = float64(minLag.Microseconds()) / 1e3
	}
	res.GoalMet = res.FalseOffline == 0 && res.MissedOffline == 0 && res.Lag.P99 <= res.Goal.LagP99Ms
	return res
}

func printChurn(w io.Writer, r *churnResult) {
	fmt.Fprintf(w, "churn: %d devices, ttl %d ms, close grace %d ms, heartbeat %d ms, %s on %v; %.1f misbehaviours/s\n",
		r.Devices, r.TTLMs, r.CloseGraceMs, r.HeartbeatMs, r.Duration, r.URLs, r.Rate)
	fmt.Fprintf(w, "behaviours: %d reconnects (%d failed dials), %d misses (%d beats skipped), %d deaths\n",
		r.Reconnects, r.ReconnectFailures, r.Misses, r.BeatsSkipped, r.Deaths)
	fmt.Fprintf(w, "false offline   %6d   (goal 0)\n", r.FalseOffline)
	fmt.Fprintf(w, "missed offline  %6d   (goal 0; %d of %d deaths detected within their end + 5s)\n", r.MissedOffline, r.Detected, r.Deaths)
	fmt.Fprintf(w, "detection lag   p50 %.0f ms  p99 %.0f ms  max %.0f ms  min %.0f ms after the end (the ttl, or the close grace after the drop; goal: p99 ≤ %.0f ms)\n",
		r.Lag.P50, r.Lag.P99, r.Lag.Max, r.LagMinMs, r.Goal.LagP99Ms)
	fmt.Fprintf(w, "largest gap between a kept device's beats %.0f ms (ttl %d ms); %d kept-alive violations by the tool; %d server closes, %d errors\n",
		r.MaxGapMs, r.TTLMs, r.Violations, r.ServerCloses, r.Errors)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	verdict := "goal met"
	if !r.GoalMet {
		verdict = "GOAL MISSED"
	}
	fmt.Fprintln(w, verdict)
}

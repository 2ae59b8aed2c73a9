package main

// The room-interval scenario: a big room in interval mode under a steady
// stream of joins and leaves — what its watchers are sent, and what the
// node's CPU pays, with and without watchers.
//
//	presence-bench room-interval -url ws://127.0.0.1:18090 -dev -api-key k -members 100000 -watchers 500 -rate 100 -duration 30s
//
// The room is seeded with -members over HTTP with the API key as
// room-count does (a heartbeat of each member's device, then its join).
// -movers more users come online, the even ones in the room, the odd ones
// out. -watchers sockets watch the room; each must be answered by a room
// message in -mode (interval: the room is above the server's
// -room-interval-above) with the count the seeding made. Then, for
// -duration, -rate joins and leaves a second over HTTP (-send-concurrency
// in flight): the movers in turn, each leaving if it is in and joining if
// it is out, so the count stays where it was, give or take one. Once
// every watcher has read the room's last version, the watchers unwatch
// the room and the same drive runs for -unwatched (0: no second phase):
// the node's CPU without a watcher.
//
// With several -url values (nodes sharing a store) the room is seeded and
// driven over HTTP through the first node and the watchers are spread
// round-robin over the others; the CPU is the sum over the nodes'
// processes (each counted once).
//
// For every watcher the tool counts its room messages (room_interval,
// room_change, room) in windows of -room-interval (the server's), centred
// on its first room_interval, and checks what it was told: the net joins
// minus leaves of the room_interval messages (joined and left ids plus
// more_joined and more_left) and of room_change joins and leaves must be
// what the drive did to the movers in the room, the count of the last
// message the room's count, and, while no message had more_ ids, no id
// may join twice or leave where it had not joined. A join and a leave of
// one user within an interval cancel out (docs/protocol.md "Rooms"):
// changes sent minus changes reported is twice the cancelled pairs.
//
// The -json object (roomIntervalResult): scenario ("room-interval"), url
// (the first node's http:// base), urls (every node's, with more than one),
// room, members, movers, watchers, rate, room_interval, mode, server_pid
// (the first node's), server_pids (each node's, with more than one),
// seeded, seed_seconds, final_count, want_count, watcher_drops, errors,
// first_error, watched and unwatched (absent with -unwatched 0), each
// {seconds sent joins leaves skipped errors changes_per_sec
// server_cpu_cores (all nodes) server_cpu_cores_each (one per
// server_pids) server_cpu_us_per_change generator_cpu_cores}, and
// messages {intervals (from the watched drive's start until every watcher
// read its last change, ÷ room_interval),
// room_interval room_change resyncs (all watchers), max_per_interval
// (the most one watcher read in one window), mean_per_interval (a
// watcher's messages ÷ the windows from its first to its last, the mean
// over the watchers), reported (joins and leaves the first watcher was told),
// max_told (the most joins and leaves one message told), with_more
// (room_interval messages, all watchers, that listed only part of their
// ids: a message lists at most 256 of each kind), cancelled_pairs,
// net_want, net_bad (watchers told another net), count_bad, ids_checked,
// id_errors, after_unwatch}.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/presenced/presenced/internal/ratelimit"
)

// Bounds of the room-interval scenario.
const (
	maxIntervalRate    = 10_000 // joins and leaves a second
	maxIntervalMovers  = 100_000
	maxIntervalSenders = 256
)

type roomIntervalConfig struct {
	benchFlags
	members   int
	movers    int
	watchers  int
	rate      int
	interval  time.Duration // the server's -room-interval
	unwatched time.Duration
	mode      string
	seedConc  int
	sendConc  int
	room      string
	tag       string
}

func parseRoomInterval(args []string, stderr io.Writer) (*roomIntervalConfig, error) {
	c := &roomIntervalConfig{}
	fs := flag.NewFlagSet("presence-bench room-interval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.registerNodes(fs, 30*time.Second, "seeding and joins and leaves", "watchers")
	fs.IntVar(&c.members, "members", 100_000, "members of the room, seeded over HTTP")
	fs.IntVar(&c.movers, "movers", 1000, "users beyond the members who join and leave in turn (half of them in the room at the start)")
	fs.IntVar(&c.watchers, "watchers", 500, "sockets watching the room")
	fs.IntVar(&c.rate, "rate", 100, "joins and leaves a second, over HTTP")
	fs.DurationVar(&c.interval, "room-interval", 5*time.Second, "the server's -room-interval: the window the messages are counted in")
	fs.DurationVar(&c.unwatched, "unwatched", -1, "then drive the room this long without watchers (0: not at all; default: -duration)")
	fs.StringVar(&c.mode, "mode", "interval", "the mode every watcher's room message must have: interval or events")
	fs.IntVar(&c.seedConc, "seed-concurrency", 64, "requests in flight while seeding")
	fs.IntVar(&c.sendConc, "send-concurrency", 16, "joins and leaves in flight")
	fs.StringVar(&c.room, "room", "", "the room (default: a new one per run)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := c.check(true); err != nil {
		return nil, err
	}
	if c.unwatched < 0 {
		c.unwatched = c.duration
	}
	switch {
	case c.members < 0 || c.members > maxRoomMembers:
		return nil, fmt.Errorf("-members %d: must be between 0 and %d", c.members, maxRoomMembers)
	case c.movers < 1 || c.movers > maxIntervalMovers:
		return nil, fmt.Errorf("-movers %d: must be between 1 and %d", c.movers, maxIntervalMovers)
	case c.watchers < 1 || c.watchers > maxRoomWatchers:
		return nil, fmt.Errorf("-watchers %d: must be between 1 and %d", c.watchers, maxRoomWatchers)
	case c.rate < 1 || c.rate > maxIntervalRate:
		return nil, fmt.Errorf("-rate %d: must be between 1 and %d", c.rate, maxIntervalRate)
	case c.interval < 100*time.Millisecond || c.interval > time.Minute:
		return nil, fmt.Errorf("-room-interval %v: from 100ms to 1m, as the server's", c.interval)
	case c.duration > maxRoomDuration || c.unwatched > maxRoomDuration:
		return nil, fmt.Errorf("-duration and -unwatched: at most %v", maxRoomDuration)
	case c.mode != "interval" && c.mode != "events":
		return nil, fmt.Errorf("-mode %q: interval or events", c.mode)
	case c.seedConc < 1 || c.seedConc > 1024 || c.sendConc < 1 || c.sendConc > maxIntervalSenders:
		return nil, fmt.Errorf("-seed-concurrency between 1 and 1024, -send-concurrency between 1 and %d", maxIntervalSenders)
	}
	// Each mover moves once every movers ÷ rate seconds: no faster than
	// the server lets one device join and leave.
	if every := time.Duration(int64(time.Second) * int64(c.movers) / int64(c.rate)); every < ratelimit.Rooms.Every {
		return nil, fmt.Errorf("-movers %d at -rate %d move each every %v, faster than a device may (%v): more movers", c.movers, c.rate, every, ratelimit.Rooms.Every)
	}
	c.tag = runTag()
	if c.room == "" {
		c.room = "ri" + c.tag
	}
	if !validID(c.room) {
		return nil, fmt.Errorf("-room %q: 1 to 64 letters, digits, and - _ . : @", c.room)
	}
	return c, nil
}

func runRoomIntervalCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseRoomInterval, func(c *roomIntervalConfig) bool { return c.json }, runRoomInterval, printRoomInterval)
}

// roomIntervalResult is the outcome of the room-interval scenario
// (fields: see the file comment).
type roomIntervalResult struct {
	Scenario     string     `json:"scenario"`
	URL          string     `json:"url"`
	URLs         []string   `json:"urls,omitempty"`
	Room         string     `json:"room"`
	Members      int        `json:"members"`
	Movers       int        `json:"movers"`
	Watchers     int        `json:"watchers"`
	Rate         int        `json:"rate"`
	RoomInterval string     `json:"room_interval"`
	Mode         string     `json:"mode"`
	ServerPID    int        `json:"server_pid"`
	ServerPIDs   []int      `json:"server_pids,omitempty"`
	Seeded       int64      `json:"seeded"`
	SeedSecs     float64    `json:"seed_seconds"`
	FinalCount   int        `json:"final_count"`
	WantCount    int        `json:"want_count"`
	WatcherDrops int64      `json:"watcher_drops"`
	Errors       int64      `json:"errors"`
	FirstError   string     `json:"first_error,omitempty"`
	Watched      riPhase    `json:"watched"`
	Unwatched    *riPhase   `json:"unwatched,omitempty"`
	Messages     riMessages `json:"messages"`
}

// riPhase is one drive of the room: what was sent, what the node paid.
type riPhase struct {
	Seconds        float64   `json:"seconds"`
	Sent           int64     `json:"sent"`
	Joins          int64     `json:"joins"`
	Leaves         int64     `json:"leaves"`
	Skipped        int64     `json:"skipped"`
	Errors         int64     `json:"errors"`
	PerSec         float64   `json:"changes_per_sec"`
	ServerCores    float64   `json:"server_cpu_cores"`
	ServerEach     []float64 `json:"server_cpu_cores_each,omitempty"`
	CPUPerChangeUs float64   `json:"server_cpu_us_per_change"`
	GeneratorCores float64   `json:"generator_cpu_cores"`
}

// riMessages is what the watchers read during the watched drive.
type riMessages struct {
	Intervals      float64 `json:"intervals"`
	RoomInterval   int64   `json:"room_interval"`
	RoomChange     int64   `json:"room_change"`
	Resyncs        int64   `json:"resyncs"`
	MaxPerInterval int     `json:"max_per_interval"`
	MeanPerIntvl   float64 `json:"mean_per_interval"`
	Reported       int64   `json:"reported"`
	CancelledPairs int64   `json:"cancelled_pairs"`
	NetWant        int64   `json:"net_want"`
	NetBad         int     `json:"net_bad"`
	CountBad       int     `json:"count_bad"`
	MaxTold        int     `json:"max_told"`
	WithMore       int64   `json:"with_more"`
	IDsChecked     bool    `json:"ids_checked"`
	IDErrors       int64   `json:"id_errors"`
	AfterUnwatch   int64   `json:"after_unwatch"`
}

// riMsg is one room message a watcher read.
type riMsg struct {
	at       time.Time
	kind     byte // 'i' room_interval, 'c' room_change, 'r' room
	net      int  // joins minus leaves it tells
	reported int  // joins and leaves it tells
	count    int
	more     bool // room_interval with ids only counted
}

// riWatcher is one watcher socket and what it read (owned by its reader).
type riWatcher struct {
	msgs     []riMsg
	in       map[string]bool // the movers in the room as the watcher was told
	idErrors int64
	version  atomic.Uint64 // the newest version read
}

func (w *riWatcher) record(m *wsMsg, at time.Time) {
	r := riMsg{at: at, count: m.Count}
	switch {
	case m.Type == "room_interval":
		r.kind = 'i'
		r.net = len(m.Joined) + m.MoreJoined - len(m.Left) - m.MoreLeft
		r.reported = len(m.Joined) + m.MoreJoined + len(m.Left) + m.MoreLeft
		r.more = m.MoreJoined > 0 || m.MoreLeft > 0
		for _, id := range m.Joined {
			w.told(id, true)
		}
		for _, id := range m.Left {
			w.told(id, false)
		}
	case m.Type == "room_change" && (m.Event == "join" || m.Event == "leave"):
		r.kind, r.net, r.reported = 'c', 1, 1
		if m.Event == "leave" {
			r.net = -1
		}
		w.told(m.UserID, m.Event == "join")
	case m.Type == "room":
		r.kind = 'r'
	default:
		return
	}
	w.msgs = append(w.msgs, r)
	if m.Version > w.version.Load() {
		w.version.Store(m.Version)
	}
}

// told checks a join or leave of id against what the watcher was told
// before: a user joins only from out of the room, leaves only from in it.
func (w *riWatcher) told(id string, join bool) {
	if w.in[id] == join {
		w.idErrors++
	}
	if join {
		w.in[id] = true
	} else {
		delete(w.in, id)
	}
}

// riDrive drives the room: joins and leaves of the movers in turn.
type riDrive struct {
	cfg       *roomIntervalConfig
	hc        *http.Client
	join      string // URLs
	leave     string
	movers    []string
	in        []bool // the state each mover's last send asked for (owned by the scheduler)
	next      int    // the next mover to move
	version   atomic.Uint64
	count     atomic.Int64 // the count of the answer with the highest version
	errs      *errCounter
	uncertain atomic.Bool // a send failed: the movers' state is not known
}

func (d *riDrive) inRoom() int64 {
	var n int64
	for _, in := range d.in {
		if in {
			n++
		}
	}
	return n
}

// run sends d.cfg.rate changes a second for dur; the CPU of pids is
// measured.
func (d *riDrive) run(ctx context.Context, label string, dur time.Duration, pids []int, stderr io.Writer) *riPhase {
	type job struct {
		mover int
		join  bool
	}
	jobs := make(chan job, d.cfg.sendConc)
	var sent, joins, leaves, skipped, errs atomic.Int64
	var senders sync.WaitGroup
	for range d.cfg.sendConc {
		senders.Add(1)
		go func() {
			defer senders.Done()
			var body bytes.Buffer
			for j := range jobs {
				u := d.leave
				if j.join {
					u = d.join
				}
				body.Reset()
				fmt.Fprintf(&body, `{"user_id":%q,"device_id":"d"}`, d.movers[j.mover])
				if err := d.send(ctx, u, body.Bytes()); err != nil {
					errs.Add(1)
					d.errs.add(err)
					d.uncertain.Store(true)
					continue
				}
				sent.Add(1)
				if j.join {
					joins.Add(1)
				} else {
					leaves.Add(1)
				}
			}
		}()
	}
	meter := startCPU(pids...)
	gen := startCPU(os.Getpid())
	start := time.Now()
	end := start.Add(dur)
	every := time.Second / time.Duration(d.cfg.rate)
	var sched sync.WaitGroup
	sched.Add(1)
	go func() {
		defer sched.Done()
		defer close(jobs)
		next := start
		for {
			if !sleepUntil(ctx, next) || !time.Now().Before(end) {
				return
			}
			select {
			case jobs <- job{mover: d.next, join: !d.in[d.next]}:
				d.in[d.next] = !d.in[d.next]
				d.next = (d.next + 1) % len(d.movers)
			default:
				skipped.Add(1) // every sender busy: the server is behind
			}
			next = next.Add(every)
			// A stalled scheduler skips what it missed rather than burst.
			if now := time.Now(); now.Sub(next) > time.Second {
				skipped.Add(int64(now.Sub(next) / every))
				next = now
			}
		}
	}()
	waitProgress(&sched, func(now time.Time) {
		fmt.Fprintf(stderr, "%s %5.1fs  sent %d (%d joins, %d leaves)  skipped %d  errors %d\n",
			label, now.Sub(start).Seconds(), sent.Load(), joins.Load(), leaves.Load(), skipped.Load(), errs.Load())
	})
	senders.Wait()
	secs := time.Since(start).Seconds()
	each := meter.coresEach()
	p := &riPhase{Seconds: secs, Sent: sent.Load(), Joins: joins.Load(), Leaves: leaves.Load(), Skipped: skipped.Load(),
		Errors: errs.Load(), GeneratorCores: gen.cores()}
	for _, c := range each {
		p.ServerCores += c
	}
	if len(d.cfg.nodes) > 1 {
		p.ServerEach = each
	}
	p.PerSec = divide(float64(p.Sent), secs)
	p.CPUPerChangeUs = divide(p.ServerCores*secs*1e6, float64(p.Sent))
	fmt.Fprintf(stderr, "%s: %d changes in %.1fs (%.0f/s), %d skipped, %d errors; server %.3f cores, %.1f µs a change\n",
		label, p.Sent, secs, p.PerSec, p.Skipped, p.Errors, p.ServerCores, p.CPUPerChangeUs)
	return p
}

// send posts one join or leave and keeps the room's newest version.
func (d *riDrive) send(ctx context.Context, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+d.cfg.apiKey)
	resp, err := d.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s %s", u, resp.Status, bytes.TrimSpace(b))
	}
	var got struct {
		Count   int    `json:"count"`
		Version uint64 `json:"version"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		return fmt.Errorf("POST %s: %w", u, err)
	}
	for {
		v := d.version.Load()
		if got.Version <= v {
			return nil
		}
		if d.version.CompareAndSwap(v, got.Version) {
			d.count.Store(int64(got.Count))
			return nil
		}
	}
}

func runRoomInterval(parent context.Context, cfg *roomIntervalConfig, stderr io.Writer) (*roomIntervalResult, error) {
	if cfg.apiKey == "" {
		return nil, errors.New("give -api-key: the room is seeded and driven over HTTP")
	}
	for _, n := range cfg.nodes {
		if err := roomsAvailable(parent, n.httpBase, cfg.apiKey, cfg.room); err != nil {
			return nil, err
		}
	}
	pids, err := cfg.resolvePIDs()
	if err != nil {
		return nil, fmt.Errorf("the server's CPU is the measure: %w (give -server-pid)", err)
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	res := &roomIntervalResult{Scenario: "room-interval", URL: cfg.httpBase, URLs: cfg.nodeURLs(true), Room: cfg.room, Members: cfg.members, Movers: cfg.movers,
		Watchers: cfg.watchers, Rate: cfg.rate, RoomInterval: cfg.interval.String(), ServerPID: pids[0]}
	if len(cfg.nodes) > 1 {
		res.ServerPIDs = pids
	}
	hc := roomHTTPClient(max(cfg.seedConc, cfg.sendConc))
	defer hc.CloseIdleConnections()
	roomURL := cfg.httpBase + "/v1/rooms/" + url.PathEscape(cfg.room)
	var errs errCounter
	d := &riDrive{cfg: cfg, hc: hc, join: roomURL + "/join", leave: roomURL + "/leave",
		movers: make([]string, cfg.movers), in: make([]bool, cfg.movers), errs: &errs}

	// The members, then the movers: the even ones in the room.
	if cfg.members > 0 {
		prefix := "ri" + cfg.tag + "-u"
		if res.Seeded, _, res.SeedSecs, err = seedEach(ctx, cfg.members, cfg.seedConc, "seed", stderr, func(i int, body *bytes.Buffer) error {
			return beatAndJoin(ctx, hc, cfg.httpBase, cfg.apiKey, body, prefix+strconv.Itoa(i), []string{d.join})
		}); err != nil {
			return nil, err
		}
	}
	for i := range d.movers {
		d.movers[i] = "ri" + cfg.tag + "-m" + strconv.Itoa(i)
		d.in[i] = i%2 == 0
	}
	if _, _, _, err := seedEach(ctx, cfg.movers, cfg.seedConc, "movers", stderr, func(i int, body *bytes.Buffer) error {
		var joins []string
		if d.in[i] {
			joins = []string{d.join}
		}
		return beatAndJoin(ctx, hc, cfg.httpBase, cfg.apiKey, body, d.movers[i], joins)
	}); err != nil {
		return nil, err
	}
	inStart := d.inRoom()

	// The watchers.
	var weps []wsEndpoint
	for _, n := range cfg.watcherNodes() {
		weps = append(weps, wsEndpoint{url: n.wsURL, dev: cfg.dev, secret: cfg.jwtSecret})
	}
	var (
		wg    sync.WaitGroup // readers and beaters
		drops atomic.Int64
		mu    sync.Mutex // guards conns
		conns []*benchConn
	)
	stop := func() {
		cancel()
		mu.Lock()
		for _, c := range conns {
			c.drop()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
	}
	defer stop()
	watchMsg, _ := json.Marshal(map[string]string{"type": "watch_room", "room": cfg.room})
	unwatchMsg, _ := json.Marshal(map[string]string{"type": "unwatch_room", "room": cfg.room})
	watchers := make([]*riWatcher, cfg.watchers)
	wconns := make([]*benchConn, cfg.watchers)
	wantCount := cfg.members + int(inStart)
	fmt.Fprintf(stderr, "room-interval: room %s of %d; connecting %d watchers on %d node(s)\n", cfg.room, wantCount, cfg.watchers, len(weps))
	if err := dialAll(ctx, cfg.watchers, "watchers", stderr, func(i int) error {
		c, err := weps[i%len(weps)].dial(ctx, "ri"+cfg.tag+"-w"+strconv.Itoa(i), "w")
		if err != nil {
			return err
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); beatLoop(ctx, c, c.beat()) }()
		m, err := watchRoomWait(c, watchMsg)
		if err != nil {
			return fmt.Errorf("watcher %d: %w", i, err)
		}
		if m.Mode != cfg.mode || m.Count != wantCount {
			return fmt.Errorf("watcher %d: a room in mode %q of %d members, want %q and %d", i, m.Mode, m.Count, cfg.mode, wantCount)
		}
		w := &riWatcher{in: make(map[string]bool, len(d.movers))}
		for k, in := range d.in {
			if in {
				w.in[d.movers[k]] = true
			}
		}
		w.version.Store(m.Version)
		watchers[i], wconns[i] = w, c
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := c.read(time.Time{})
				if err != nil {
					if ctx.Err() == nil {
						drops.Add(1)
						errs.add(fmt.Errorf("watcher %d: %w", i, err))
					}
					return
				}
				if m.Type == "error" {
					errs.add(fmt.Errorf("watcher %d: server error %s: %s", i, m.Code, m.Message))
					continue
				}
				w.record(m, time.Now())
			}
		}()
		return nil
	}); err != nil {
		return nil, err
	}
	res.Mode = cfg.mode

	// Watched: drive, then wait for every watcher to read the last version.
	driveStart := time.Now()
	res.Watched = *d.run(ctx, "watched", cfg.duration, pids, stderr)
	last := d.version.Load()
	deadline := time.Now().Add(cfg.interval + 15*time.Second)
	for {
		behind := 0
		for _, w := range watchers {
			if w.version.Load() < last {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		if time.Now().After(deadline) {
			errs.add(fmt.Errorf("%d watchers never read version %d, the room's last", behind, last))
			break
		}
		if !sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) {
			return nil, ctx.Err()
		}
	}
	watchedEnd := time.Now()
	inEnd := d.inRoom()
	res.WantCount = cfg.members + int(inEnd)

	// Unwatched: the same drive, no watcher.
	if cfg.unwatched > 0 {
		for i, c := range wconns {
			if err := c.send(unwatchMsg); err != nil {
				return nil, fmt.Errorf("watcher %d: unwatch: %w", i, err)
			}
		}
		if !sleepCtx(ctx, time.Second) { // the unwatches are read
			return nil, ctx.Err()
		}
		res.Unwatched = d.run(ctx, "unwatched", cfg.unwatched, pids, stderr)
		res.WantCount = cfg.members + int(d.inRoom())
	}
	res.WatcherDrops = drops.Load()
	var got struct {
		Count int `json:"count"`
	}
	if err := getJSON(ctx, hc, roomURL+"?limit=1", cfg.apiKey, true, &got); err != nil {
		return nil, err
	}
	res.FinalCount = got.Count
	stop() // the readers end before what they recorded is read

	res.Messages = riCount(watchers, cfg.interval, driveStart, watchedEnd, res.Watched, inEnd-inStart, cfg.members+int(inEnd))
	if d.uncertain.Load() {
		errs.add(errors.New("a join or leave failed: the net and count checks may not hold"))
	}
	res.Errors, res.FirstError = errs.n.Load(), errs.firstErr()
	return res, nil
}

// riCount sums what the watchers read between driveStart and end: the
// messages per window of interval, and whether they tell the net change
// netWant and the final count.
func riCount(watchers []*riWatcher, interval time.Duration, driveStart, end time.Time, drive riPhase, netWant int64, count int) riMessages {
	s := riMessages{Intervals: end.Sub(driveStart).Seconds() / interval.Seconds(), NetWant: netWant, IDsChecked: true}
	var perWatcher float64
	for k, w := range watchers {
		var net, reported int64
		lastCount := -1
		windows := map[int]int{}
		var origin time.Time // the centre of window 0: the watcher's first room_interval
		for _, m := range w.msgs {
			if m.kind == 'i' {
				origin = m.at
				break
			}
		}
		if origin.IsZero() {
			origin = driveStart.Add(interval / 2)
		}
		var n int
		for _, m := range w.msgs {
			if m.at.After(end) {
				s.AfterUnwatch++
				continue
			}
			n++
			windows[int(math.Floor(float64(m.at.Sub(origin))/float64(interval)+0.5))]++
			switch m.kind {
			case 'i':
				s.RoomInterval++
			case 'c':
				s.RoomChange++
			case 'r':
				s.Resyncs++
			}
			if m.more {
				s.IDsChecked = false
				s.WithMore++
			}
			s.MaxTold = max(s.MaxTold, m.reported)
			net += int64(m.net)
			reported += int64(m.reported)
			if m.kind != 'r' {
				lastCount = m.count
			}
		}
		lo, hi := math.MaxInt, math.MinInt
		for win, c := range windows {
			s.MaxPerInterval = max(s.MaxPerInterval, c)
			lo, hi = min(lo, win), max(hi, win)
		}
		if n > 0 {
			perWatcher += float64(n) / float64(hi-lo+1)
		}
		if net != netWant {
			s.NetBad++
		}
		if lastCount != count {
			s.CountBad++
		}
		s.IDErrors += w.idErrors
		if k == 0 {
			s.Reported = reported
			s.CancelledPairs = (drive.Sent - reported) / 2
		}
	}
	if !s.IDsChecked {
		s.IDErrors = 0 // ids missing from messages make false errors
	}
	s.MeanPerIntvl = divide(perWatcher, float64(len(watchers)))
	return s
}

func printRoomInterval(w io.Writer, r *roomIntervalResult) {
	on := r.URL
	if len(r.URLs) > 1 {
		on = fmt.Sprintf("%s, the watchers on %v", r.URLs[0], r.URLs[1:])
	}
	fmt.Fprintf(w, "room-interval: room %s of %d members and %d movers (%s mode), %d watchers, %d joins and leaves a second, room interval %s, on %s\n",
		r.Room, r.Members, r.Movers, r.Mode, r.Watchers, r.Rate, r.RoomInterval, on)
	fmt.Fprintf(w, "final count %d (want %d); %d watcher drops, %d errors\n", r.FinalCount, r.WantCount, r.WatcherDrops, r.Errors)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tseconds\tjoins\tleaves\tchanges/s\tskipped\terrors\tserver CPU\tper change\tgenerator CPU\t")
	row := func(name string, p riPhase) {
		fmt.Fprintf(tw, "%s\t%.1f\t%d\t%d\t%.1f\t%d\t%d\t%.3f cores%s\t%.1f µs\t%.3f cores\t\n", name, p.Seconds, p.Joins, p.Leaves, p.PerSec,
			p.Skipped, p.Errors, p.ServerCores, eachNode(p.ServerEach), p.CPUPerChangeUs, p.GeneratorCores)
	}
	row(fmt.Sprintf("%d watchers", r.Watchers), r.Watched)
	if r.Unwatched != nil {
		row("no watcher", *r.Unwatched)
	}
	_ = tw.Flush()
	m := r.Messages
	fmt.Fprintf(w, "messages over %.1f intervals (the drive and the wait for its last tick): %d room_interval, %d room_change, %d room; per watcher and interval: max %d, mean %.2f (over the intervals from its first message to its last)\n",
		m.Intervals, m.RoomInterval, m.RoomChange, m.Resyncs, m.MaxPerInterval, m.MeanPerIntvl)
	fmt.Fprintf(w, "told: %d joins and leaves of %d sent (%d pairs cancelled); net %+d, %d watchers told another net, %d another count; ids checked %v, %d id errors; %d messages after unwatching\n",
		m.Reported, r.Watched.Sent, m.CancelledPairs, m.NetWant, m.NetBad, m.CountBad, m.IDsChecked, m.IDErrors, m.AfterUnwatch)
	fmt.Fprintf(w, "the most joins and leaves in one message: %d; %d messages with ids only counted (more_joined, more_left)\n", m.MaxTold, m.WithMore)
}

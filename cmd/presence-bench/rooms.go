package main

// The rooms scenario: how long a join or leave of a room takes from the
// mover's socket to every watcher of the room, beside a change of status
// to the same watchers under the same load.
//
//	presence-bench rooms -url ws://127.0.0.1:18090 -dev -api-key k -watchers 500 -movers 10 -interval 100ms
//	presence-bench rooms -url ws://127.0.0.1:18191 -url ws://127.0.0.1:18192,ws://127.0.0.1:18193 -dev -api-key k …
//
// M movers, each over its own socket, join and leave one room in turn,
// each every -interval (at least ratelimit.Rooms.Every, the most a device
// may), spread over the interval. W watcher sockets watch the room
// (watch_room) and subscribe to S status users, who change status
// (set_status busy ↔ online) at the rate the movers make room events:
// a user may change its status once a ratelimit.Status.Every, so S =
// M × Status.Every / interval users, each at that limit. One observer
// socket watches the room too and tells which version each join and leave
// got; each status user's own socket watches itself for the versions of
// its changes. A delivery is matched by version; its latency runs from the
// write of the join, leave or set_status frame to the watcher's read of
// the room_change or presence message. A node without rooms answers
// rooms_unavailable, and the scenario says so before it starts.
//
// With several -url values (nodes sharing a store) the movers, the
// observer and the status users are on the first node and the watchers
// round-robin on the others, so that every delivery crosses nodes; the
// server's CPU is the sum over the nodes' processes (each counted once).
//
// The -json object (roomsResult) has these fields: scenario ("rooms"),
// url (the first node's), urls (every node's, with more than one), room, watchers, movers, status_users, interval, duration,
// server_pid (the first node's), server_pids (each node's, with more than
// one), server_cpu_cores (the sum over them), server_cpu_cores_each (one
// per server_pids) and generator_cpu_cores (over the
// changes), skipped (changes a stalled generator did not send, rather than
// send late in a burst), rate_limited,
// watcher_drops, errors, first_error, room_changes and status_changes,
// each {sent, confirmed, expected_deliveries (watchers × confirmed),
// deliveries, missing_deliveries (must be 0), coalesced (status: changes a
// watcher never read although it read a later one of the same user),
// resyncs (room: fresh room messages after the first), deliveries_per_sec,
// latency {samples, p50_ms, p99_ms, p999_ms, max_ms}}, and ratio_p99
// (room p99 ÷ status p99).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/presenced/presenced/internal/ratelimit"
)

// Bounds of the rooms scenario.
const (
	maxRoomWatchers    = 20_000
	maxRoomStatusUsers = 500 // a watcher subscribes to every one
	maxRoomDuration    = 10 * time.Minute
	maxRoomDeliveries  = 50_000_000 // latency samples kept in memory
)

type roomsConfig struct {
	benchFlags
	watchers    int
	movers      int
	statusUsers int // derived: the movers' rate of events, in status changes
	interval    time.Duration
	drain       time.Duration
	room        string
	tag         string
}

func parseRooms(args []string, stderr io.Writer) (*roomsConfig, error) {
	c := &roomsConfig{}
	fs := flag.NewFlagSet("presence-bench rooms", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.registerNodes(fs, 20*time.Second, "movers, observer and status users", "watchers")
	fs.IntVar(&c.watchers, "watchers", 500, "watcher sockets: each watches the room and subscribes to every status user")
	fs.IntVar(&c.movers, "movers", 10, "mover sockets, each joining and leaving the room in turn")
	fs.DurationVar(&c.interval, "interval", ratelimit.Rooms.Every, "time between two joins or leaves of one mover (at least the server's limit of a device's joins and leaves)")
	fs.DurationVar(&c.drain, "drain", 5*time.Second, "how long to wait for the last deliveries")
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
	if c.watchers < 1 || c.watchers > maxRoomWatchers {
		return nil, fmt.Errorf("-watchers %d: must be between 1 and %d", c.watchers, maxRoomWatchers)
	}
	if c.interval < ratelimit.Rooms.Every || c.interval > time.Minute {
		return nil, fmt.Errorf("-interval %v: must be between %v (the server's limit of one device's joins and leaves) and 1m", c.interval, ratelimit.Rooms.Every)
	}
	if c.duration > maxRoomDuration {
		return nil, fmt.Errorf("-duration %v: at most %v", c.duration, maxRoomDuration)
	}
	if c.drain < 0 || c.drain > time.Minute {
		return nil, fmt.Errorf("-drain %v: must be between 0 and 1m", c.drain)
	}
	if c.movers < 1 {
		return nil, fmt.Errorf("-movers %d: at least 1", c.movers)
	}
	// As many status changes a second as room events: users at their limit.
	c.statusUsers = int((int64(c.movers)*int64(ratelimit.Status.Every) + int64(c.interval) - 1) / int64(c.interval))
	if c.statusUsers > maxRoomStatusUsers {
		return nil, fmt.Errorf("-movers %d every %v make %d room events a second: matching them takes %d status users, more than %d (fewer movers or a longer -interval)",
			c.movers, c.interval, int(time.Second/c.interval)*c.movers, c.statusUsers, maxRoomStatusUsers)
	}
	events := int64(c.duration/c.interval+1) * int64(c.movers)
	if 2*events*int64(c.watchers) > maxRoomDeliveries {
		return nil, fmt.Errorf("up to %d room events and as many status changes × %d watchers is more than %d deliveries to keep: shorten -duration or lengthen -interval", events, c.watchers, maxRoomDeliveries)
	}
	c.tag = runTag()
	if c.room == "" {
		c.room = "rb" + c.tag
	}
	if !validID(c.room) {
		return nil, fmt.Errorf("-room %q: 1 to 64 letters, digits, and - _ . : @", c.room)
	}
	return c, nil
}

// validID is a loose local check of an id (the server's rules decide).
func validID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == ':' || r == '@') {
			return false
		}
	}
	return true
}

func runRoomsCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseRooms, func(c *roomsConfig) bool { return c.json }, runRooms, printRooms)
}

// roomsResult is the outcome of the rooms scenario (fields: see the file
// comment).
type roomsResult struct {
	Scenario       string    `json:"scenario"`
	URL            string    `json:"url"`
	URLs           []string  `json:"urls,omitempty"`
	Room           string    `json:"room"`
	Watchers       int       `json:"watchers"`
	Movers         int       `json:"movers"`
	StatusUsers    int       `json:"status_users"`
	Interval       string    `json:"interval"`
	Duration       string    `json:"duration"`
	ServerPID      int       `json:"server_pid"`
	ServerPIDs     []int     `json:"server_pids,omitempty"`
	ServerCores    float64   `json:"server_cpu_cores"`
	ServerEach     []float64 `json:"server_cpu_cores_each,omitempty"`
	GeneratorCores float64   `json:"generator_cpu_cores"`
	Skipped        int64     `json:"skipped"`
	RateLimited    int64     `json:"rate_limited"`
	WatcherDrops   int64     `json:"watcher_drops"`
	Errors         int64     `json:"errors"`
	FirstError     string    `json:"first_error,omitempty"`
	RoomChanges    roomsSide `json:"room_changes"`
	StatusChange   roomsSide `json:"status_changes"`
	RatioP99       float64   `json:"ratio_p99"`
}

// roomsSide is one kind of change: joins and leaves, or changes of status.
type roomsSide struct {
	Sent             int        `json:"sent"`
	Confirmed        int        `json:"confirmed"`
	Expected         int64      `json:"expected_deliveries"`
	Deliveries       int64      `json:"deliveries"`
	Missing          int64      `json:"missing_deliveries"`
	Coalesced        int64      `json:"coalesced"`
	Resyncs          int64      `json:"resyncs"`
	DeliveriesPerSec float64    `json:"deliveries_per_sec"`
	Latency          latSummary `json:"latency"`
}

// roomSend is one join or leave a mover wrote.
type roomSend struct {
	join bool
	at   time.Time
}

// roomEvent is one join or leave of a mover the observer read.
type roomEvent struct {
	join    bool
	version uint64
}

// roomRecv is one room_change or presence message a watcher read.
type roomRecv struct {
	target  int // status user (presence messages)
	version uint64
	at      time.Time
}

// roomWatcher is one watcher socket and what it read (owned by its reader).
type roomWatcher struct {
	rooms   []roomRecv
	status  []roomRecv
	resyncs int
}

// roomMover is one mover socket: what it sent, and what the observer saw
// of it.
type roomMover struct {
	user   string
	conn   *benchConn
	sends  []roomSend  // owned by the mover's loop
	events []roomEvent // owned by the observer's reader
}

func runRooms(parent context.Context, cfg *roomsConfig, stderr io.Writer) (*roomsResult, error) {
	for _, n := range cfg.nodes {
		if err := roomsAvailable(parent, n.httpBase, cfg.apiKey, cfg.room); err != nil {
			return nil, err
		}
	}
	ep := wsEndpoint{url: cfg.wsURL, dev: cfg.dev, secret: cfg.jwtSecret}
	weps := make([]wsEndpoint, 0, len(cfg.nodes))
	for _, n := range cfg.watcherNodes() {
		weps = append(weps, wsEndpoint{url: n.wsURL, dev: cfg.dev, secret: cfg.jwtSecret})
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var (
		wg          sync.WaitGroup // every reader and beater
		errs        errCounter
		drops       atomic.Int64
		rateLimited atomic.Int64
		roomRead    atomic.Int64 // room_change join/leave read by watchers
		statusRead  atomic.Int64 // presence messages read by watchers
		observed    atomic.Int64 // joins and leaves the observer read
		echoed      atomic.Int64 // presence messages status users read of themselves
		mu          sync.Mutex   // guards conns
		conns       []*benchConn
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
	defer stop() // whatever happens, every connection closes and every goroutine ends
	keep := func(c *benchConn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); beatLoop(ctx, c, c.beat()) }()
	}
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
				switch {
				case m.Type == "error" && m.Code == "rate_limited":
					rateLimited.Add(1)
				case m.Type == "error":
					errs.add(fmt.Errorf("server error %s: %s", m.Code, m.Message))
				case on != nil:
					on(m, at)
				}
			}
		}()
	}
	watchMsg, _ := json.Marshal(map[string]string{"type": "watch_room", "room": cfg.room})
	joinMsg, _ := json.Marshal(map[string]string{"type": "join", "room": cfg.room})
	leaveMsg, _ := json.Marshal(map[string]string{"type": "leave", "room": cfg.room})

	// The observer, then the movers and the status users.
	movers := make([]*roomMover, cfg.movers)
	moverIdx := make(map[string]int, cfg.movers)
	for i := range movers {
		movers[i] = &roomMover{user: "rb" + cfg.tag + "-m" + strconv.Itoa(i)}
		moverIdx[movers[i].user] = i
	}
	obs, err := ep.dial(ctx, "rb"+cfg.tag+"-o", "o")
	if err != nil {
		return nil, err
	}
	keep(obs)
	if _, err := watchRoomWait(obs, watchMsg); err != nil {
		return nil, fmt.Errorf("observer: %w", err)
	}
	reader(obs, false, func(m *wsMsg, _ time.Time) {
		if m.Type != "room_change" || (m.Event != "join" && m.Event != "leave") {
			return
		}
		if i, ok := moverIdx[m.UserID]; ok {
			movers[i].events = append(movers[i].events, roomEvent{join: m.Event == "join", version: m.Version})
			observed.Add(1)
		}
	})
	if err := dialAll(ctx, cfg.movers, "rooms movers", stderr, func(i int) error {
		c, err := ep.dial(ctx, movers[i].user, "d")
		if err != nil {
			return err
		}
		keep(c)
		movers[i].conn = c
		reader(c, false, nil)
		return nil
	}); err != nil {
		return nil, err
	}
	targets := make([]*fanoutTarget, cfg.statusUsers)
	index := make(map[string]int, cfg.statusUsers)
	ids := make([]string, cfg.statusUsers)
	for t := range targets {
		targets[t] = &fanoutTarget{user: "rb" + cfg.tag + "-s" + strconv.Itoa(t)}
		index[targets[t].user], ids[t] = t, targets[t].user
	}
	if err := dialAll(ctx, cfg.statusUsers, "rooms status users", stderr, func(t int) error {
		ft := targets[t]
		c, err := ep.dial(ctx, ft.user, "d")
		if err != nil {
			return err
		}
		keep(c)
		ft.conns = []*benchConn{c}
		snap, err := subscribeWait(c, []string{ft.user})
		if err != nil {
			return fmt.Errorf("status user %s watching itself: %w", ft.user, err)
		}
		ft.base = snap.Users[ft.user].Version
		reader(c, false, func(m *wsMsg, _ time.Time) {
			if m.Type == "presence" && m.UserID == ft.user && m.Status != nil {
				ft.echo = append(ft.echo, fanoutEcho{busy: *m.Status == "busy", version: m.Version})
				echoed.Add(1)
			}
		})
		return nil
	}); err != nil {
		return nil, err
	}

	// The watchers: the room, then the status users.
	watchers := make([]*roomWatcher, cfg.watchers)
	fmt.Fprintf(stderr, "rooms: room %s, %d movers, %d status users on %s; connecting %d watchers on %d node(s)\n",
		cfg.room, cfg.movers, cfg.statusUsers, cfg.wsURL.Host, cfg.watchers, len(weps))
	if err := dialAll(ctx, cfg.watchers, "rooms watchers", stderr, func(i int) error {
		c, err := weps[i%len(weps)].dial(ctx, "rb"+cfg.tag+"-w"+strconv.Itoa(i), "w")
		if err != nil {
			return err
		}
		keep(c)
		if _, err := watchRoomWait(c, watchMsg); err != nil {
			return fmt.Errorf("watcher %d: %w", i, err)
		}
		if _, err := subscribeWait(c, ids); err != nil {
			return fmt.Errorf("watcher %d: %w", i, err)
		}
		w := &roomWatcher{}
		watchers[i] = w
		reader(c, true, func(m *wsMsg, at time.Time) {
			switch m.Type {
			case "room_change":
				if m.Event == "join" || m.Event == "leave" {
					roomRead.Add(1)
					w.rooms = append(w.rooms, roomRecv{version: m.Version, at: at})
				}
			case "room":
				w.resyncs++
			case "presence":
				if t, ok := index[m.UserID]; ok {
					statusRead.Add(1)
					w.status = append(w.status, roomRecv{target: t, version: m.Version, at: at})
				}
			}
		})
		return nil
	}); err != nil {
		return nil, err
	}

	// The changes: movers every interval, status users every
	// ratelimit.Status.Every, each kind spread over its period.
	fmt.Fprintf(stderr, "rooms: all connected; %d joins or leaves and %d changes of status a second for %v\n",
		int(time.Second/cfg.interval)*cfg.movers, cfg.statusUsers*int(time.Second/ratelimit.Status.Every), cfg.duration)
	var pid int
	pids, err := cfg.resolvePIDs()
	if err != nil {
		pids = nil
	}
	var meter *cpuMeter
	if len(pids) > 0 {
		pid = pids[0]
		meter = startCPU(pids...)
	}
	gen := startCPU(os.Getpid())
	var sentRoom, sentStatus, skipped atomic.Int64
	start := time.Now()
	end := start.Add(cfg.duration)
	var changers sync.WaitGroup
	tick := func(offset, every time.Duration, do func(k int) error) {
		changers.Add(1)
		go func() {
			defer changers.Done()
			next := start.Add(offset)
			for k := 0; ; k++ {
				if !sleepUntil(ctx, next) || !time.Now().Before(end) {
					return
				}
				if err := do(k); err != nil {
					errs.add(err)
					return
				}
				next = next.Add(every)
				// A generator stalled for more than a period skips the
				// changes it missed: a burst of catching up would be
				// refused by the server's limits.
				if now := time.Now(); now.Sub(next) > every {
					skipped.Add(int64(now.Sub(next) / every))
					next = now
				}
			}
		}()
	}
	for i, mv := range movers {
		tick(cfg.interval*time.Duration(i)/time.Duration(len(movers)), cfg.interval, func(k int) error {
			join := k%2 == 0
			msg := leaveMsg
			if join {
				msg = joinMsg
			}
			at, err := mv.conn.sendAt(msg)
			if err == nil {
				mv.sends = append(mv.sends, roomSend{join: join, at: at})
				sentRoom.Add(1)
			}
			return err
		})
	}
	for t, ft := range targets {
		tick(ratelimit.Status.Every*time.Duration(t)/time.Duration(len(targets)), ratelimit.Status.Every, func(k int) error {
			busy := k%2 == 0
			msg := msgOnline
			if busy {
				msg = msgBusy
			}
			at, err := ft.conns[0].sendAt(msg)
			if err == nil {
				ft.sends = append(ft.sends, fanoutSend{busy: busy, at: at})
				sentStatus.Add(1)
			}
			return err
		})
	}
	progress := func(phase string) {
		fmt.Fprintf(stderr, "rooms %6.1fs %s: %d joins/leaves, %d status changes; read %d room changes, %d presence; %d rate limited, %d watcher drops, %d errors\n",
			time.Since(start).Seconds(), phase, sentRoom.Load(), sentStatus.Load(), roomRead.Load(), statusRead.Load(), rateLimited.Load(), drops.Load(), errs.n.Load())
	}
	waitProgress(&changers, func(time.Time) { progress("changing") })
	sendEnd := time.Now()
	var cores float64
	var each []float64
	if meter != nil {
		each = meter.coresEach()
		for _, c := range each {
			cores += c
		}
	}
	genCores := gen.cores()
	nRoom, nStatus := sentRoom.Load(), sentStatus.Load()
	w := int64(cfg.watchers)
	drainEnd := time.Now().Add(cfg.drain)
	for (roomRead.Load() < nRoom*w || statusRead.Load() < nStatus*w || observed.Load() < nRoom || echoed.Load() < nStatus) && time.Now().Before(drainEnd) {
		if !sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) {
			return nil, ctx.Err()
		}
	}
	progress("drained")
	stop() // the readers end before what they recorded is read

	res := &roomsResult{
		Scenario: "rooms", URL: cfg.wsURL.String(), URLs: cfg.nodeURLs(false), Room: cfg.room, Watchers: cfg.watchers, Movers: cfg.movers,
		StatusUsers: cfg.statusUsers, Interval: cfg.interval.String(), Duration: sendEnd.Sub(start).Round(time.Millisecond).String(),
		ServerPID: pid, ServerCores: cores, GeneratorCores: genCores, Skipped: skipped.Load(), RateLimited: rateLimited.Load(), WatcherDrops: drops.Load(),
		Errors: errs.n.Load(), FirstError: errs.firstErr(),
	}
	if len(cfg.nodes) > 1 {
		res.ServerPIDs, res.ServerEach = pids, each
	}
	res.RoomChanges = roomDeliveries(movers, watchers)
	res.StatusChange = statusDeliveries(targets, watchers)
	for _, s := range []*roomsSide{&res.RoomChanges, &res.StatusChange} {
		if d := sendEnd.Sub(start).Seconds(); d > 0 {
			s.DeliveriesPerSec = float64(s.Deliveries) / d
		}
	}
	res.RatioP99 = divide(res.RoomChanges.Latency.P99, res.StatusChange.Latency.P99)
	return res, nil
}

// roomDeliveries matches the watchers' room changes to the movers' sends.
func roomDeliveries(movers []*roomMover, watchers []*roomWatcher) roomsSide {
	var s roomsSide
	sentAt := make(map[uint64]time.Time)
	for _, mv := range movers {
		s.Sent += len(mv.sends)
		for v, at := range matchRoomEvents(mv.sends, mv.events) {
			sentAt[v] = at
		}
	}
	s.Confirmed = len(sentAt)
	var lat latSet
	for _, w := range watchers {
		var last uint64
		s.Resyncs += int64(w.resyncs)
		for _, r := range w.rooms {
			if r.version <= last {
				continue
			}
			last = r.version
			if at, ok := sentAt[r.version]; ok {
				lat.add(r.at.Sub(at))
			}
		}
	}
	s.Expected = int64(s.Confirmed) * int64(len(watchers))
	s.Deliveries = int64(lat.n())
	s.Missing = s.Expected - s.Deliveries
	s.Latency = lat.summary()
	return s
}

// statusDeliveries matches the watchers' presence messages to the status
// users' changes, as the fanout scenario does.
func statusDeliveries(targets []*fanoutTarget, watchers []*roomWatcher) roomsSide {
	var s roomsSide
	sentAt := make([]map[uint64]time.Time, len(targets))
	versions := make([][]uint64, len(targets)) // confirmed, ascending
	for t, ft := range targets {
		s.Sent += len(ft.sends)
		sentAt[t] = matchEchoes(ft.base, ft.sends, ft.echo)
		s.Confirmed += len(sentAt[t])
		for v := range sentAt[t] {
			versions[t] = append(versions[t], v)
		}
		slices.Sort(versions[t])
	}
	var lat latSet
	last := make([]uint64, len(targets))
	got := make([]int64, len(targets))
	for _, w := range watchers {
		clear(last)
		clear(got)
		for _, r := range w.status {
			if r.version <= last[r.target] {
				continue
			}
			last[r.target] = r.version
			if at, ok := sentAt[r.target][r.version]; ok {
				got[r.target]++
				lat.add(r.at.Sub(at))
			}
		}
		for t := range targets {
			below, _ := slices.BinarySearch(versions[t], last[t]+1)
			s.Coalesced += int64(below) - got[t]
		}
	}
	s.Expected = int64(s.Confirmed) * int64(len(watchers))
	s.Deliveries = int64(lat.n())
	s.Missing = s.Expected - s.Deliveries
	s.Latency = lat.summary()
	return s
}

// matchRoomEvents maps the versions of one mover's joins and leaves, in
// the order the observer read them, to the sends that made them: the next
// send of the same kind (a refused send made no event; a join of a device
// in the room, or a leave of one out of it, changes nothing).
func matchRoomEvents(sends []roomSend, events []roomEvent) map[uint64]time.Time {
	out := make(map[uint64]time.Time, len(events))
	k := 0
	for _, e := range events {
		for k < len(sends) && sends[k].join != e.join {
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

// watchRoomWait sends watch_room on c and reads until the room message.
func watchRoomWait(c *benchConn, msg []byte) (*wsMsg, error) {
	if err := c.send(msg); err != nil {
		return nil, err
	}
	for {
		m, err := c.read(time.Now().Add(10 * time.Second))
		if err != nil {
			return nil, err
		}
		switch m.Type {
		case "error":
			return nil, fmt.Errorf("watch_room: %s: %s", m.Code, m.Message)
		case "room":
			return m, nil
		}
	}
}

// roomsAvailable reads the room over HTTP from the node at base: a node
// without rooms answers 501 rooms_unavailable, and the scenario stops
// there.
func roomsAvailable(ctx context.Context, base, apiKey, room string) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/rooms/"+url.PathEscape(room)+"?limit=1", nil)
	if err != nil {
		return err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("reading the room on %s: %w", base, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusNotImplemented:
		return fmt.Errorf("the server %s has no rooms (rooms_unavailable)", base)
	default:
		return fmt.Errorf("GET /v1/rooms/%s: %s %s", room, resp.Status, b)
	}
}

func printRooms(w io.Writer, r *roomsResult) {
	on := r.URL
	if len(r.URLs) > 1 {
		on = fmt.Sprintf("%s, the watchers on %v", r.URLs[0], r.URLs[1:])
	}
	fmt.Fprintf(w, "rooms: %d watchers of room %s and of %d status users; %d movers, a join or leave every %s each, for %s on %s\n",
		r.Watchers, r.Room, r.StatusUsers, r.Movers, r.Interval, r.Duration, on)
	fmt.Fprintf(w, "server CPU %.2f cores%s, generator %.2f; %d changes skipped by a stalled generator, %d rate limited, %d watcher drops, %d errors\n",
		r.ServerCores, eachNode(r.ServerEach), r.GeneratorCores, r.Skipped, r.RateLimited, r.WatcherDrops, r.Errors)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "change → every watcher\tsent\tconfirmed\tsamples\tp50\tp99\tp99.9\tmax\tdeliveries/s\tmissing\t")
	row := func(name string, s roomsSide) {
		l := s.Latency
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f ms\t%.2f ms\t%.2f ms\t%.2f ms\t%.0f\t%d\t\n",
			name, s.Sent, s.Confirmed, l.Samples, l.P50, l.P99, l.P999, l.Max, s.DeliveriesPerSec, s.Missing)
	}
	row("join/leave (room_change)", r.RoomChanges)
	row("set_status (presence)", r.StatusChange)
	_ = tw.Flush()
	fmt.Fprintf(w, "room p99 ÷ status p99: %.2f×; %d status deliveries coalesced, %d fresh room messages\n",
		r.RatioP99, r.StatusChange.Coalesced, r.RoomChanges.Resyncs)
}

package main

// The room-count and room-memory scenarios: what a large room costs to
// read, and what a membership costs to hold, on the embedded node.
//
//	presence-bench room-count  -url http://127.0.0.1:18090 -api-key k -members 100000
//	presence-bench room-memory -url http://127.0.0.1:18090 -api-key k -users 100000 -memberships-per-user 10 -rooms 10000
//
// room-count seeds one room over HTTP with the API key (a heartbeat of
// each member's device, then its join; -seed-concurrency requests in
// flight), then -concurrency clients read it for -duration each way:
// GET /v1/rooms/{room}?limit=1 (the count and one member), then
// GET /v1/rooms?ids=<room> (the count alone). Its -json object
// (roomCountResult): scenario ("room-count"), url, room, members,
// concurrency, duration, server_pid, seeded, seed_seconds, seed_errors,
// and read and counts, each {reads reads_per_sec errors first_error
// server_cpu_cores latency {count mean_ms p50_ms p99_ms p999_ms max_ms}}.
//
// room-memory wants a fresh server: it reads the server's memory (RSS from
// /proc, Go heap from /metrics; with -pprof-url after a forced collection;
// each reading -duration after the last request) before anything, after -users devices came online (a heartbeat each),
// and after each of them joined -memberships-per-user rooms among -rooms
// (user i's j-th room is (i × per-user + j) mod rooms). Its -json object
// (roomMemResult): scenario ("room-memory"), url, users,
// memberships_per_user, rooms, memberships, server_pid, gc_forced, before,
// users_online, with_rooms (samples), seed_seconds, join_seconds, errors,
// first_error, and per_user, per_membership_with_users, per_membership,
// each {rss_bytes heap_inuse_bytes}, and checked_rooms, checked_members
// (the counts of the first 1,000 rooms, read back: each as the joins
// made it, or the run fails).
//
// Keep the server's -heartbeat-ttl above the run (10m): a member whose
// device ends leaves every room.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// Bounds of the room scenarios over HTTP.
const (
	maxRoomMembers     = 1_000_000
	maxMembershipsUser = 100 // presence.DefaultMaxRooms, a device's rooms
	maxMemRooms        = 1_000_000
	maxMemberships     = 10_000_000
)

type roomCountConfig struct {
	benchFlags
	members     int
	room        string
	seed        bool
	seedConc    int
	concurrency int
	tag         string
}

func parseRoomCount(args []string, stderr io.Writer) (*roomCountConfig, error) {
	c := &roomCountConfig{}
	fs := flag.NewFlagSet("presence-bench room-count", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs, 10*time.Second)
	fs.IntVar(&c.members, "members", 100_000, "members of the room, seeded over HTTP")
	fs.StringVar(&c.room, "room", "", "the room (default: a new one per run)")
	fs.BoolVar(&c.seed, "seed", true, "seed the room first (false: -room is already there)")
	fs.IntVar(&c.seedConc, "seed-concurrency", 64, "requests in flight while seeding")
	fs.IntVar(&c.concurrency, "concurrency", 8, "clients reading, one request in flight each")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := c.check(false); err != nil {
		return nil, err
	}
	if c.members < 1 || c.members > maxRoomMembers {
		return nil, fmt.Errorf("-members %d: must be between 1 and %d", c.members, maxRoomMembers)
	}
	if c.concurrency < 1 || c.concurrency > 1024 || c.seedConc < 1 || c.seedConc > 1024 {
		return nil, errors.New("-concurrency and -seed-concurrency must be between 1 and 1024")
	}
	if !c.seed && c.room == "" {
		return nil, errors.New("-seed=false reads an existing room: give -room")
	}
	c.tag = runTag()
	if c.room == "" {
		c.room = "rc" + c.tag
	}
	if !validID(c.room) {
		return nil, fmt.Errorf("-room %q: 1 to 64 letters, digits, and - _ . : @", c.room)
	}
	return c, nil
}

func runRoomCountCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseRoomCount, func(c *roomCountConfig) bool { return c.json }, runRoomCount, printRoomCount)
}

// roomCountResult is the outcome of the room-count scenario (fields: see
// the file comment).
type roomCountResult struct {
	Scenario    string    `json:"scenario"`
	URL         string    `json:"url"`
	Room        string    `json:"room"`
	Members     int       `json:"members"`
	Concurrency int       `json:"concurrency"`
	Duration    string    `json:"duration"`
	ServerPID   int       `json:"server_pid"`
	Seeded      int64     `json:"seeded"`
	SeedSecs    float64   `json:"seed_seconds"`
	SeedErrors  int64     `json:"seed_errors"`
	Read        readPhase `json:"read"`   // GET /v1/rooms/{room}?limit=1
	Counts      readPhase `json:"counts"` // GET /v1/rooms?ids=<room>
}

// roomHTTPClient is a keep-alive client for conns requests in flight.
func roomHTTPClient(conns int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
		IdleConnTimeout: time.Minute, DisableCompression: true,
	}}
}

func runRoomCount(ctx context.Context, cfg *roomCountConfig, stderr io.Writer) (*roomCountResult, error) {
	pid, err := cfg.resolvePID()
	if err != nil {
		return nil, err
	}
	res := &roomCountResult{Scenario: "room-count", URL: cfg.httpBase, Room: cfg.room, Members: cfg.members,
		Concurrency: cfg.concurrency, Duration: cfg.duration.String(), ServerPID: pid}
	hc := roomHTTPClient(max(cfg.concurrency, cfg.seedConc))
	defer hc.CloseIdleConnections()
	if cfg.seed {
		prefix := "rc" + cfg.tag + "-u"
		joinURL := cfg.httpBase + "/v1/rooms/" + url.PathEscape(cfg.room) + "/join"
		var err error
		res.Seeded, res.SeedErrors, res.SeedSecs, err = seedEach(ctx, cfg.members, cfg.seedConc, "seed", stderr, func(i int, body *bytes.Buffer) error {
			return beatAndJoin(ctx, hc, cfg.httpBase, cfg.apiKey, body, prefix+strconv.Itoa(i), []string{joinURL})
		})
		if err != nil {
			return nil, err
		}
	}
	roomURL := cfg.httpBase + "/v1/rooms/" + url.PathEscape(cfg.room) + "?limit=1"
	res.Read = runReads(ctx, "GET room", cfg.concurrency, cfg.duration, 0, 1, pid, stderr, func() func([]int32, bool) error {
		return func(_ []int32, check bool) error {
			var got struct {
				Count   int                        `json:"count"`
				Members map[string]json.RawMessage `json:"members"`
			}
			if err := getJSON(ctx, hc, roomURL, cfg.apiKey, check, &got); err != nil || !check {
				return err
			}
			if got.Count != cfg.members || len(got.Members) != 1 {
				return fmt.Errorf("GET room: count %d and %d members listed, want %d and 1", got.Count, len(got.Members), cfg.members)
			}
			return nil
		}
	})
	countsURL := cfg.httpBase + "/v1/rooms?ids=" + url.QueryEscape(cfg.room)
	res.Counts = runReads(ctx, "GET counts", cfg.concurrency, cfg.duration, 0, 1, pid, stderr, func() func([]int32, bool) error {
		return func(_ []int32, check bool) error {
			var got map[string]int
			if err := getJSON(ctx, hc, countsURL, cfg.apiKey, check, &got); err != nil || !check {
				return err
			}
			if got[cfg.room] != cfg.members {
				return fmt.Errorf("GET counts: %v, want %d", got, cfg.members)
			}
			return nil
		}
	})
	return res, nil
}

// seedEach runs do(i) for i in [0, n) from conc goroutines, reporting its
// progress every second; it gives up after 1,000 errors.
func seedEach(ctx context.Context, n, conc int, label string, stderr io.Writer, do func(i int, body *bytes.Buffer) error) (ok, nerr int64, secs float64, err error) {
	var next, done atomic.Int64
	var errs errLog
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body bytes.Buffer
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil || errs.n.Load() > 1000 {
					return
				}
				if err := do(int(i), &body); err != nil {
					errs.add(err)
					continue
				}
				done.Add(1)
			}
		}()
	}
	last, lastAt := int64(0), start
	waitProgress(&wg, func(now time.Time) {
		d := done.Load()
		fmt.Fprintf(stderr, "%s %5.1fs  %d/%d  %.0f/s  errors %d\n", label, now.Sub(start).Seconds(), d, n, float64(d-last)/now.Sub(lastAt).Seconds(), errs.n.Load())
		last, lastAt = d, now
	})
	ok, nerr, secs = done.Load(), errs.n.Load(), time.Since(start).Seconds()
	fmt.Fprintf(stderr, "%s: %d of %d in %.1fs (%d errors)\n", label, ok, n, secs, nerr)
	if nerr > 0 {
		return ok, nerr, secs, fmt.Errorf("%s: %d errors, first: %s", label, nerr, errs.firstErr())
	}
	return ok, nerr, secs, nil
}

// beatAndJoin brings user's device "d" online with a heartbeat, then
// joins it to every room of joinURLs (nil: none); every answer must be
// 200.
func beatAndJoin(ctx context.Context, hc *http.Client, base, apiKey string, body *bytes.Buffer, user string, joinURLs []string) error {
	body.Reset()
	fmt.Fprintf(body, `{"user_id":%q,"device_id":"d"}`, user)
	b := body.Bytes()
	if err := postOK(ctx, hc, base+"/v1/heartbeat", apiKey, b); err != nil {
		return err
	}
	for _, u := range joinURLs {
		if err := postOK(ctx, hc, u, apiKey, b); err != nil {
			return err
		}
	}
	return nil
}

// postOK posts the JSON body to u and wants a 2xx answer.
func postOK(ctx context.Context, hc *http.Client, u, apiKey string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
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
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("POST %s: %s %s", u, resp.Status, bytes.TrimSpace(b))
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// getJSON reads u; with decode, into v, else it only drains the body.
func getJSON(ctx context.Context, hc *http.Client, u, apiKey string, decode bool, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
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
		return fmt.Errorf("GET %s: %s %s", u, resp.Status, bytes.TrimSpace(b))
	}
	if !decode {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func printRoomCount(w io.Writer, r *roomCountResult) {
	fmt.Fprintf(w, "room-count: room %s of %d members on %s (seeded %d in %.1fs, %d errors); %d clients, %s each way\n",
		r.Room, r.Members, r.URL, r.Seeded, r.SeedSecs, r.SeedErrors, r.Concurrency, r.Duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "read\treads/s\tp50\tp99\tp99.9\tmax\terrors\tserver CPU\t")
	row := func(name string, p readPhase) {
		l := p.Latency
		fmt.Fprintf(tw, "%s\t%.0f\t%.3f ms\t%.3f ms\t%.3f ms\t%.3f ms\t%d\t%.2f cores\t\n", name, p.ReadsPerSec, l.P50Ms, l.P99Ms, l.P999Ms, l.MaxMs, p.Errors, p.ServerCores)
	}
	row("GET /v1/rooms/{room}?limit=1", r.Read)
	row("GET /v1/rooms?ids=<room>", r.Counts)
	_ = tw.Flush()
	for _, p := range []readPhase{r.Read, r.Counts} {
		if p.FirstError != "" {
			fmt.Fprintf(w, "first error: %s\n", p.FirstError)
		}
	}
}

type roomMemConfig struct {
	benchFlags
	users    int
	perUser  int
	rooms    int
	seedConc int
	pprof    string // http://127.0.0.1:PORT, or empty
	tag      string
}

func parseRoomMem(args []string, stderr io.Writer) (*roomMemConfig, error) {
	c := &roomMemConfig{}
	fs := flag.NewFlagSet("presence-bench room-memory", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs, 5*time.Second) // -duration: the wait before each reading
	fs.IntVar(&c.users, "users", 100_000, "users brought online, one device each")
	fs.IntVar(&c.perUser, "memberships-per-user", 10, "rooms each user's device joins")
	fs.IntVar(&c.rooms, "rooms", 10_000, "rooms the memberships are spread over")
	fs.IntVar(&c.seedConc, "seed-concurrency", 64, "requests in flight while seeding")
	fs.StringVar(&c.pprof, "pprof-url", "", "the server's -pprof-addr as http://127.0.0.1:PORT: force a collection before each reading (without it the heap holds garbage too)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := c.check(false); err != nil {
		return nil, err
	}
	if c.users < 1 || c.users > maxDevices {
		return nil, fmt.Errorf("-users %d: must be between 1 and %d", c.users, maxDevices)
	}
	if c.perUser < 1 || c.perUser > maxMembershipsUser {
		return nil, fmt.Errorf("-memberships-per-user %d: must be between 1 and %d (the rooms one device may be in)", c.perUser, maxMembershipsUser)
	}
	if c.rooms < c.perUser || c.rooms > maxMemRooms {
		return nil, fmt.Errorf("-rooms %d: must be between -memberships-per-user and %d", c.rooms, maxMemRooms)
	}
	if int64(c.users)*int64(c.perUser) > maxMemberships {
		return nil, fmt.Errorf("%d users × %d rooms is more than %d memberships", c.users, c.perUser, maxMemberships)
	}
	if c.seedConc < 1 || c.seedConc > 1024 {
		return nil, fmt.Errorf("-seed-concurrency %d: must be between 1 and 1024", c.seedConc)
	}
	if c.duration > 10*time.Minute {
		return nil, fmt.Errorf("-duration %v: at most 10m (the wait before each reading)", c.duration)
	}
	if c.pprof != "" {
		_, base, err := loopbackURL(c.pprof)
		if err != nil {
			return nil, fmt.Errorf("-pprof-url: %w", err)
		}
		c.pprof = base
	}
	c.tag = runTag()
	return c, nil
}

func runRoomMemCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseRoomMem, func(c *roomMemConfig) bool { return c.json }, runRoomMem, printRoomMem)
}

// memCost is a difference of memory divided among what it holds.
type memCost struct {
	RSS       float64 `json:"rss_bytes"`
	HeapInuse float64 `json:"heap_inuse_bytes"`
}

func costOf(before, after sample, n int) memCost {
	return memCost{
		RSS:       divide(float64(after.RSS)-float64(before.RSS), float64(n)),
		HeapInuse: divide(float64(after.HeapInuse)-float64(before.HeapInuse), float64(n)),
	}
}

// roomMemResult is the outcome of the room-memory scenario (fields: see
// the file comment).
type roomMemResult struct {
	Scenario       string  `json:"scenario"`
	URL            string  `json:"url"`
	Users          int     `json:"users"`
	PerUser        int     `json:"memberships_per_user"`
	Rooms          int     `json:"rooms"`
	Memberships    int     `json:"memberships"`
	ServerPID      int     `json:"server_pid"`
	GCForced       bool    `json:"gc_forced"`
	Before         sample  `json:"before"`
	UsersOnline    sample  `json:"users_online"`
	WithRooms      sample  `json:"with_rooms"`
	SeedSecs       float64 `json:"seed_seconds"`
	JoinSecs       float64 `json:"join_seconds"`
	Errors         int64   `json:"errors"`
	FirstError     string  `json:"first_error,omitempty"`
	CheckedRooms   int     `json:"checked_rooms"`
	CheckedMembers int     `json:"checked_members"`
	PerUserCost    memCost `json:"per_user"`
	PerMembership  memCost `json:"per_membership_with_users"`
	PerMembership0 memCost `json:"per_membership"`
}

func runRoomMem(ctx context.Context, cfg *roomMemConfig, stderr io.Writer) (*roomMemResult, error) {
	pid, err := cfg.resolvePID()
	if err != nil {
		return nil, err
	}
	srv := cfg.metricsReader()
	srv.pid = pid
	res := &roomMemResult{Scenario: "room-memory", URL: cfg.httpBase, Users: cfg.users, PerUser: cfg.perUser, Rooms: cfg.rooms,
		Memberships: cfg.users * cfg.perUser, ServerPID: pid, GCForced: cfg.pprof != ""}
	hc := roomHTTPClient(cfg.seedConc)
	defer hc.CloseIdleConnections()
	read := func(what string) (sample, error) {
		if !sleepCtx(ctx, cfg.duration) {
			return sample{}, ctx.Err()
		}
		if cfg.pprof != "" {
			if err := getJSON(ctx, hc, cfg.pprof+"/debug/pprof/heap?gc=1", "", false, nil); err != nil {
				return sample{}, fmt.Errorf("forcing a collection: %w", err)
			}
		}
		s, err := srv.sample()
		if err == nil && !s.Metrics {
			fmt.Fprintf(stderr, "warning: no Go heap figures: %s\n", s.MetricsErr)
		}
		fmt.Fprintf(stderr, "%s: RSS %s, heap in use %s\n", what, kib(float64(s.RSS)), kib(float64(s.HeapInuse)))
		return s, err
	}
	if res.Before, err = read("before"); err != nil {
		return nil, err
	}
	prefix := "rm" + cfg.tag + "-u"
	_, res.Errors, res.SeedSecs, err = seedEach(ctx, cfg.users, cfg.seedConc, "online", stderr, func(i int, body *bytes.Buffer) error {
		return beatAndJoin(ctx, hc, cfg.httpBase, cfg.apiKey, body, prefix+strconv.Itoa(i), nil)
	})
	if err != nil {
		return nil, err
	}
	if res.UsersOnline, err = read("users online"); err != nil {
		return nil, err
	}
	rooms := make([]string, cfg.rooms)
	for r := range rooms {
		rooms[r] = cfg.httpBase + "/v1/rooms/rm" + cfg.tag + "-r" + strconv.Itoa(r) + "/join"
	}
	var joins int64
	joins, res.Errors, res.JoinSecs, err = seedEach(ctx, res.Memberships, cfg.seedConc, "joins", stderr, func(k int, body *bytes.Buffer) error {
		i, j := k/cfg.perUser, k%cfg.perUser
		body.Reset()
		fmt.Fprintf(body, `{"user_id":"%s%d","device_id":"d"}`, prefix, i)
		return postOK(ctx, hc, rooms[(i*cfg.perUser+j)%cfg.rooms], cfg.apiKey, body.Bytes())
	})
	if err != nil {
		return nil, err
	}
	if joins != int64(res.Memberships) {
		return nil, fmt.Errorf("%d joins of %d", joins, res.Memberships)
	}
	if err := checkRoomCounts(ctx, hc, cfg, res, func(r int) string { return "rm" + cfg.tag + "-r" + strconv.Itoa(r) }); err != nil {
		return nil, err
	}
	if res.WithRooms, err = read("with rooms"); err != nil {
		return nil, err
	}
	res.PerUserCost = costOf(res.Before, res.UsersOnline, cfg.users)
	res.PerMembership = costOf(res.Before, res.WithRooms, res.Memberships)
	res.PerMembership0 = costOf(res.UsersOnline, res.WithRooms, res.Memberships)
	return res, nil
}

// checkRoomCounts reads the counts of the first 1,000 rooms: room r holds
// the memberships k ≡ r (mod rooms) of k = user × per-user + slot.
func checkRoomCounts(ctx context.Context, hc *http.Client, cfg *roomMemConfig, res *roomMemResult, room func(int) string) error {
	n := min(cfg.rooms, 1000)
	ids := make([]string, n)
	for r := range ids {
		ids[r] = room(r)
	}
	var got map[string]int
	if err := getJSON(ctx, hc, cfg.httpBase+"/v1/rooms?ids="+url.QueryEscape(strings.Join(ids, ",")), cfg.apiKey, true, &got); err != nil {
		return err
	}
	for r, id := range ids {
		want := res.Memberships / cfg.rooms
		if r < res.Memberships%cfg.rooms {
			want++
		}
		if got[id] != want {
			return fmt.Errorf("room %s: %d members, want %d", id, got[id], want)
		}
		res.CheckedMembers += got[id]
	}
	res.CheckedRooms = n
	return nil
}

func printRoomMem(w io.Writer, r *roomMemResult) {
	fmt.Fprintf(w, "room-memory: %d users online, each in %d of %d rooms (%d memberships) on %s; online in %.1fs, joined in %.1fs; collection forced: %v\n",
		r.Users, r.PerUser, r.Rooms, r.Memberships, r.URL, r.SeedSecs, r.JoinSecs, r.GCForced)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tbefore\tusers online\twith rooms\tper user\tper membership (with users)\tper membership\t")
	fmt.Fprintf(tw, "RSS\t%s\t%s\t%s\t%.0f B\t%.0f B\t%.0f B\t\n", kib(float64(r.Before.RSS)), kib(float64(r.UsersOnline.RSS)), kib(float64(r.WithRooms.RSS)),
		r.PerUserCost.RSS, r.PerMembership.RSS, r.PerMembership0.RSS)
	fmt.Fprintf(tw, "heap in use\t%s\t%s\t%s\t%.0f B\t%.0f B\t%.0f B\t\n", kib(float64(r.Before.HeapInuse)), kib(float64(r.UsersOnline.HeapInuse)), kib(float64(r.WithRooms.HeapInuse)),
		r.PerUserCost.HeapInuse, r.PerMembership.HeapInuse, r.PerMembership0.HeapInuse)
	_ = tw.Flush()
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// batchConfig is the configuration of the batch scenario.
type batchConfig struct {
	benchFlags
	users       int
	seed        bool
	seedConc    int
	concurrency int
	ids         int
	prefix      string
	baseline    string
	baseTTL     time.Duration

	redis redisTarget
}

func parseBatch(args []string, stderr io.Writer) (*batchConfig, error) {
	c := &batchConfig{}
	fs := flag.NewFlagSet("presence-bench batch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs, 10*time.Second)
	fs.IntVar(&c.users, "users", 1_000_000, "population: users <prefix>0 … seeded with one heartbeat each")
	fs.BoolVar(&c.seed, "seed", true, "seed the population over HTTP first (false: it is already there)")
	fs.IntVar(&c.seedConc, "seed-concurrency", 64, "heartbeat requests in flight while seeding")
	fs.IntVar(&c.concurrency, "concurrency", 8, "clients reading, one request in flight each")
	fs.IntVar(&c.ids, "ids", 1000, "distinct random ids per read (at most 1000)")
	fs.StringVar(&c.prefix, "prefix", "u", "user id prefix (letters, digits, - and _)")
	fs.StringVar(&c.baseline, "baseline-redis", "", "after the run, seed the same users as Redis keys and read them with one MGET per read (redis://127.0.0.1:6379/0)")
	fs.DurationVar(&c.baseTTL, "baseline-ttl", time.Hour, "baseline: ttl of the seeded keys")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, c.validate()
}

func (c *batchConfig) validate() error {
	if err := c.check(false); err != nil {
		return err
	}
	if c.users < 1 || c.users > maxUsers {
		return fmt.Errorf("-users %d: must be between 1 and %d", c.users, maxUsers)
	}
	if c.ids < 1 || c.ids > 1000 || c.ids > c.users {
		return fmt.Errorf("-ids %d: must be between 1 and min(1000, -users)", c.ids)
	}
	if c.concurrency < 1 || c.concurrency > 1024 || c.seedConc < 1 || c.seedConc > 1024 {
		return errors.New("-concurrency and -seed-concurrency must be between 1 and 1024")
	}
	if c.prefix == "" || len(c.prefix) > 32 {
		return fmt.Errorf("-prefix %q: 1 to 32 characters", c.prefix)
	}
	for _, r := range c.prefix {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("-prefix %q: letters, digits, - and _ only", c.prefix)
		}
	}
	if c.baseline != "" {
		t, err := parseRedisURL(c.baseline)
		if err != nil {
			return fmt.Errorf("-baseline-redis: %w", err)
		}
		c.redis = t
		if c.baseTTL < time.Second {
			return fmt.Errorf("-baseline-ttl %v: at least 1s", c.baseTTL)
		}
	}
	return nil
}

// readPhase is the outcome of one kind of read.
type readPhase struct {
	Reads       uint64  `json:"reads"`
	ReadsPerSec float64 `json:"reads_per_sec"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	Latency     latency `json:"latency"`
	ServerCores float64 `json:"server_cpu_cores"` // the server (Redis for the baseline); 0 if not visible
}

// batchResult is the outcome of the batch scenario (the -json object).
type batchResult struct {
	Scenario    string  `json:"scenario"` // "batch"
	URL         string  `json:"url"`
	Users       int     `json:"users"`
	IDs         int     `json:"ids_per_read"`
	Concurrency int     `json:"concurrency"`
	Duration    string  `json:"duration"` // of each phase
	ServerPID   int     `json:"server_pid"`
	Seeded      int64   `json:"seeded"` // heartbeats accepted while seeding (0 with -seed=false)
	SeedSecs    float64 `json:"seed_seconds"`
	SeedErrors  int64   `json:"seed_errors"`

	Get  readPhase `json:"get"`  // GET /presence/batch?user_ids=…
	Post readPhase `json:"post"` // POST /v1/presence/batch

	Baseline *batchBaseline `json:"baseline,omitempty"`
}

// batchBaseline is one MGET of the same number of keys per read.
type batchBaseline struct {
	Redis       string    `json:"redis"`
	SeedSecs    float64   `json:"seed_seconds"`
	MGet        readPhase `json:"mget"`
	KeysDeleted int64     `json:"keys_deleted"`
	// RatioReads is presenced's GET reads/s ÷ Redis's MGET reads/s;
	// RatioP99 is GET's p99 ÷ MGET's p99 (above 1: presenced is slower).
	RatioReads float64 `json:"ratio_reads_per_sec"`
	RatioP99   float64 `json:"ratio_p99"`
}

func runBatchCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseBatch, func(c *batchConfig) bool { return c.json }, runBatch, printBatch)
}

func runBatch(ctx context.Context, cfg *batchConfig, stderr io.Writer) (*batchResult, error) {
	pid, err := cfg.resolvePID()
	if err != nil {
		return nil, err
	}
	res := &batchResult{Scenario: "batch", URL: cfg.httpBase, Users: cfg.users, IDs: cfg.ids,
		Concurrency: cfg.concurrency, Duration: cfg.duration.String(), ServerPID: pid}
	conns := max(cfg.concurrency, cfg.seedConc)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
		IdleConnTimeout: time.Minute, DisableCompression: true,
	}}
	defer hc.CloseIdleConnections()
	if cfg.seed {
		if err := seedHTTP(ctx, cfg, hc, res, stderr); err != nil {
			return nil, err
		}
	}

	getURL := cfg.httpBase + "/presence/batch?user_ids="
	res.Get = runReads(ctx, "GET", cfg.concurrency, cfg.duration, cfg.ids, cfg.users, pid, stderr,
		func() func(ids []int32, check bool) error {
			var u []byte
			return func(ids []int32, check bool) error {
				u = append(u[:0], getURL...)
				for i, id := range ids {
					if i > 0 {
						u = append(u, ',')
					}
					u = append(u, cfg.prefix...)
					u = strconv.AppendInt(u, int64(id), 10)
				}
				return readHTTP(ctx, hc, http.MethodGet, string(u), cfg.apiKey, nil, len(ids), check)
			}
		})
	postURL := cfg.httpBase + "/v1/presence/batch"
	res.Post = runReads(ctx, "POST", cfg.concurrency, cfg.duration, cfg.ids, cfg.users, pid, stderr,
		func() func(ids []int32, check bool) error {
			var body []byte
			rd := bytes.NewReader(nil)
			return func(ids []int32, check bool) error {
				body = append(body[:0], `{"user_ids":[`...)
				for i, id := range ids {
					if i > 0 {
						body = append(body, ',')
					}
					body = append(body, '"')
					body = append(body, cfg.prefix...)
					body = strconv.AppendInt(body, int64(id), 10)
					body = append(body, '"')
				}
				body = append(body, "]}"...)
				rd.Reset(body)
				return readHTTP(ctx, hc, http.MethodPost, postURL, cfg.apiKey, rd, len(ids), check)
			}
		})
	if cfg.baseline != "" {
		b, err := redisBatch(ctx, cfg, stderr)
		if err != nil {
			return nil, fmt.Errorf("baseline: %w", err)
		}
		b.RatioReads = divide(res.Get.ReadsPerSec, b.MGet.ReadsPerSec)
		b.RatioP99 = divide(res.Get.Latency.P99Ms, b.MGet.Latency.P99Ms)
		res.Baseline = b
	}
	return res, nil
}

// seedHTTP beats every user once over HTTP, -seed-concurrency at a time.
func seedHTTP(ctx context.Context, cfg *batchConfig, hc *http.Client, res *batchResult, stderr io.Writer) error {
	var next, ok atomic.Int64
	var errs errLog
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.seedConc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body []byte
			rd := bytes.NewReader(nil)
			for {
				i := next.Add(1) - 1
				if i >= int64(cfg.users) || ctx.Err() != nil || errs.n.Load() > 1000 {
					return
				}
				body = append(body[:0], `{"user_id":"`...)
				body = append(body, cfg.prefix...)
				body = strconv.AppendInt(body, i, 10)
				body = append(body, `","device_id":"d"}`...)
				rd.Reset(body)
				if err := postBeat(ctx, hc, cfg.httpBase, cfg.apiKey, rd); err != nil {
					errs.add(err)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	last, lastAt := int64(0), start
	waitProgress(&wg, func(now time.Time) {
		n := ok.Load()
		fmt.Fprintf(stderr, "seed %5.1fs  %d/%d users  %.0f/s  errors %d\n", now.Sub(start).Seconds(), n, cfg.users, float64(n-last)/now.Sub(lastAt).Seconds(), errs.n.Load())
		last, lastAt = n, now
	})
	res.Seeded, res.SeedErrors, res.SeedSecs = ok.Load(), errs.n.Load(), time.Since(start).Seconds()
	fmt.Fprintf(stderr, "seeded %d users in %.1fs (%d errors)\n", res.Seeded, res.SeedSecs, res.SeedErrors)
	if res.SeedErrors > 1000 || res.Seeded == 0 {
		return fmt.Errorf("seeding failed: %d errors, first: %s", res.SeedErrors, errs.firstErr())
	}
	return nil
}

// readHTTP does one batch read and checks its status; with check it also
// decodes the answer and counts its users.
func readHTTP(ctx context.Context, hc *http.Client, method, u, apiKey string, body io.Reader, want int, check bool) error {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
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
		return fmt.Errorf("%s batch: %s %s", method, resp.Status, bytes.TrimSpace(b))
	}
	if !check {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	var m map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		return fmt.Errorf("%s batch: %w", method, err)
	}
	if len(m) != want {
		return fmt.Errorf("%s batch: %d users in the answer, want %d", method, len(m), want)
	}
	return nil
}

// runReads runs conc clients, each doing reads of ids distinct random ids
// out of users for d, and returns their merged latencies. newRead makes
// one client's read function; the first read of each client is checked.
func runReads(ctx context.Context, label string, conc int, d time.Duration, ids, users, pid int, stderr io.Writer,
	newRead func() func(ids []int32, check bool) error) readPhase {
	var (
		wg     sync.WaitGroup
		errs   errLog
		counts = make([]padded, conc)
		hists  = make([]*hist, conc)
	)
	runCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	var meter *cpuMeter
	if pid > 0 {
		meter = startCPU(pid)
	}
	start := time.Now()
	for c := range conc {
		hists[c] = newHist()
		read := newRead()
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := hists[c]
			seen := make(map[int32]struct{}, ids)
			pick := make([]int32, 0, ids)
			for first := true; runCtx.Err() == nil; first = false {
				pick = pick[:0]
				clear(seen)
				for len(pick) < ids {
					id := rand.Int32N(int32(users))
					if _, dup := seen[id]; !dup {
						seen[id] = struct{}{}
						pick = append(pick, id)
					}
				}
				t0 := time.Now()
				err := read(pick, first)
				if err != nil {
					if runCtx.Err() == nil {
						errs.add(err)
					}
					continue
				}
				h.record(int64(time.Since(t0)))
				counts[c].n.Add(1)
			}
		}()
	}
	total := func() int64 {
		var t int64
		for i := range counts {
			t += counts[i].n.Load()
		}
		return t
	}
	last, lastAt := int64(0), start
	waitProgress(&wg, func(now time.Time) {
		n := total()
		fmt.Fprintf(stderr, "%s %5.1fs  %7.0f reads/s  errors %d\n", label, now.Sub(start).Seconds(), float64(n-last)/now.Sub(lastAt).Seconds(), errs.n.Load())
		last, lastAt = n, now
	})
	wall := time.Since(start).Seconds()
	all := newHist()
	for _, h := range hists {
		all.merge(h)
	}
	p := readPhase{Reads: all.n, ReadsPerSec: float64(all.n) / wall, Errors: errs.n.Load(), FirstError: errs.firstErr(), Latency: all.summary()}
	if meter != nil {
		p.ServerCores = meter.cores()
	}
	fmt.Fprintf(stderr, "%s: %.0f reads/s, %s, %d errors\n", label, p.ReadsPerSec, p.Latency, p.Errors)
	return p
}

// redisBatch seeds the users as keys (pipelined: seeding is not what is
// measured) and reads them with one MGET per read from -concurrency
// connections.
func redisBatch(ctx context.Context, cfg *batchConfig, stderr io.Writer) (*batchBaseline, error) {
	b := &batchBaseline{Redis: cfg.redis.addr}
	keys := baselineKeys(baselinePrefix(), cfg.prefix, cfg.users)
	defer func() {
		n, err := deleteKeys(context.WithoutCancel(ctx), cfg.redis, keys)
		b.KeysDeleted = n
		if err != nil {
			fmt.Fprintf(stderr, "warning: baseline keys not deleted: %v\n", err)
		}
	}()
	c, err := dialRedis(ctx, cfg.redis)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	ttl := int(cfg.baseTTL / time.Second)
	ts := strconv.AppendInt(nil, time.Now().UnixMilli(), 10)
	for i := 0; i < len(keys); i += 1000 {
		batch := keys[i:min(i+1000, len(keys))]
		for _, k := range batch {
			c.setex(k, ttl, ts)
		}
		err := c.flush()
		for range batch {
			if err == nil {
				err = c.readOK()
			}
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("seed: %w", err)
		}
	}
	c.Close()
	b.SeedSecs = time.Since(start).Seconds()
	fmt.Fprintf(stderr, "baseline: seeded %d keys in %.1fs; MGET of %d keys from %d connections\n", len(keys), b.SeedSecs, cfg.ids, cfg.concurrency)

	var mu sync.Mutex
	var cs []*respConn
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range cfg.concurrency {
		c, err := dialRedis(ctx, cfg.redis)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	nextConn := 0
	b.MGet = runReads(ctx, "MGET", cfg.concurrency, cfg.duration, cfg.ids, cfg.users, redisPID(cfg.redis), stderr,
		func() func(ids []int32, check bool) error {
			mu.Lock()
			c := cs[nextConn]
			nextConn++
			mu.Unlock()
			ks := make([][]byte, 0, cfg.ids)
			return func(ids []int32, check bool) error {
				ks = ks[:0]
				for _, id := range ids {
					ks = append(ks, keys[id])
				}
				_ = c.nc.SetDeadline(time.Now().Add(30 * time.Second))
				c.keysCmd("MGET", ks)
				if err := c.flush(); err != nil {
					return err
				}
				n, nils, err := c.readBulkArray()
				if err != nil {
					return err
				}
				if check && (n != len(ids) || nils > 0) {
					return fmt.Errorf("MGET: %d values, %d missing, want %d", n, nils, len(ids))
				}
				return nil
			}
		})
	return b, nil
}

func printBatch(w io.Writer, r *batchResult) {
	fmt.Fprintf(w, "batch reads of %d ids out of %d users, %d clients, %s per phase\n", r.IDs, r.Users, r.Concurrency, r.Duration)
	if r.SeedSecs > 0 {
		fmt.Fprintf(w, "seeded %d users in %.1fs (%.0f/s), %d errors\n", r.Seeded, r.SeedSecs, float64(r.Seeded)/r.SeedSecs, r.SeedErrors)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\treads/s\tp50 ms\tp99 ms\tp99.9 ms\tmax ms\terrors\tserver CPU\t")
	row := func(name string, p readPhase) {
		l := p.Latency
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%.2f\t\n", name, p.ReadsPerSec, l.P50Ms, l.P99Ms, l.P999Ms, l.MaxMs, p.Errors, p.ServerCores)
	}
	row("presenced GET /presence/batch", r.Get)
	row("presenced POST /v1/presence/batch", r.Post)
	if b := r.Baseline; b != nil {
		row("Redis MGET", b.MGet)
		fmt.Fprintf(tw, "GET ÷ MGET\t%.2f×\t\t%.2f×\t\t\t\t\t\n", b.RatioReads, b.RatioP99)
	}
	_ = tw.Flush()
	for name, p := range map[string]readPhase{"GET": r.Get, "POST": r.Post} {
		if p.FirstError != "" {
			fmt.Fprintf(w, "%s first error: %s\n", name, p.FirstError)
		}
	}
	if b := r.Baseline; b != nil && b.MGet.FirstError != "" {
		fmt.Fprintf(w, "MGET first error: %s\n", b.MGet.FirstError)
	}
}

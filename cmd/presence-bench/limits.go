package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/maphash"
	"io"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// limitsConfig is the configuration of the limits scenario.
type limitsConfig struct {
	redisRaw  string
	requests  int
	pipeline  int
	tool      string
	users     int
	duration  time.Duration
	skipRedis bool
	json      bool

	redis redisTarget
}

func parseLimits(args []string, stderr io.Writer) (*limitsConfig, error) {
	c := &limitsConfig{}
	fs := flag.NewFlagSet("presence-bench limits", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.redisRaw, "redis", "127.0.0.1:6379", "Redis for redis-benchmark, on a loopback address (host:port or redis://…/db)")
	fs.IntVar(&c.requests, "requests", 1_000_000, "redis-benchmark -n: requests of each command")
	fs.IntVar(&c.pipeline, "pipeline", 16, "redis-benchmark -P: commands per round trip")
	fs.StringVar(&c.tool, "redis-benchmark", "redis-benchmark", "the redis-benchmark binary")
	fs.BoolVar(&c.skipRedis, "skip-redis", false, "measure only the in-process map")
	fs.IntVar(&c.users, "users", 1_000_000, "keys of the in-process sharded map")
	fs.DurationVar(&c.duration, "duration", 3*time.Second, "how long the in-process map is updated (at most 1h)")
	fs.BoolVar(&c.json, "json", false, "print the result as one JSON object")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if !c.skipRedis {
		t, err := parseRedisURL(c.redisRaw)
		if err != nil {
			return nil, fmt.Errorf("-redis: %w", err)
		}
		c.redis = t
	}
	if c.requests < 1 || c.requests > 100_000_000 {
		return nil, fmt.Errorf("-requests %d: must be between 1 and 100000000", c.requests)
	}
	if c.pipeline < 1 || c.pipeline > 1024 {
		return nil, fmt.Errorf("-pipeline %d: must be between 1 and 1024", c.pipeline)
	}
	if c.users < 1 || c.users > maxUsers {
		return nil, fmt.Errorf("-users %d: must be between 1 and %d", c.users, maxUsers)
	}
	if c.duration <= 0 || c.duration > maxDuration {
		return nil, fmt.Errorf("-duration %v: must be between 0 and %v", c.duration, maxDuration)
	}
	return c, nil
}

// limitsResult is the outcome of the limits scenario (the -json object).
type limitsResult struct {
	Scenario string `json:"scenario"` // "limits"
	// redis-benchmark -q -P <pipeline> -n <requests> against one key.
	Redis          string  `json:"redis,omitempty"`
	Requests       int     `json:"requests"`
	Pipeline       int     `json:"pipeline"`
	RedisSetPerSec float64 `json:"redis_set_per_sec"`   // SET pbench:limits:set v
	RedisSetexRate float64 `json:"redis_setex_per_sec"` // SETEX pbench:limits:setex 30 v
	RedisVersion   string  `json:"redis_benchmark_version,omitempty"`

	// The in-process floor: 256 mutex-guarded map[string]int64 shards,
	// GOMAXPROCS goroutines storing a timestamp under random keys.
	MapUsers      int     `json:"map_users"`
	MapShards     int     `json:"map_shards"`
	MapGoroutines int     `json:"map_goroutines"`
	MapDuration   string  `json:"map_duration"`
	MapUpdates    int64   `json:"map_updates"`
	MapPerSec     float64 `json:"map_updates_per_sec"`
}

func runLimitsCmd(args []string, stdout, stderr io.Writer) int {
	return scenario(args, stdout, stderr, parseLimits, func(c *limitsConfig) bool { return c.json }, runLimits, printLimits)
}

func runLimits(ctx context.Context, cfg *limitsConfig, stderr io.Writer) (*limitsResult, error) {
	res := &limitsResult{Scenario: "limits", Requests: cfg.requests, Pipeline: cfg.pipeline}
	if !cfg.skipRedis {
		res.Redis = cfg.redis.addr
		if out, err := exec.CommandContext(ctx, cfg.tool, "--version").Output(); err == nil {
			res.RedisVersion = strings.TrimSpace(string(out))
		}
		var err error
		if res.RedisSetPerSec, err = redisBenchmark(ctx, cfg, stderr, "SET", "pbench:limits:set", "v"); err != nil {
			return nil, err
		}
		if res.RedisSetexRate, err = redisBenchmark(ctx, cfg, stderr, "SETEX", "pbench:limits:setex", "30", "v"); err != nil {
			return nil, err
		}
		if _, err := deleteKeys(ctx, cfg.redis, [][]byte{[]byte("pbench:limits:set"), []byte("pbench:limits:setex")}); err != nil {
			fmt.Fprintf(stderr, "warning: keys pbench:limits:* not deleted: %v\n", err)
		}
	}
	fmt.Fprintf(stderr, "in-process sharded map: %d keys, %d goroutines, %v\n", cfg.users, runtime.GOMAXPROCS(0), cfg.duration)
	n, secs := shardedMapRate(ctx, cfg.users, cfg.duration)
	res.MapUsers, res.MapShards, res.MapGoroutines, res.MapDuration = cfg.users, mapShards, runtime.GOMAXPROCS(0), cfg.duration.String()
	res.MapUpdates, res.MapPerSec = n, float64(n)/secs
	fmt.Fprintf(stderr, "map: %.0f updates/s\n", res.MapPerSec)
	return res, nil
}

var rpsRE = regexp.MustCompile(`([0-9]+(?:\.[0-9]+)?) requests per second`)

// parseRedisBenchmark reads the figure of redis-benchmark -q: the last
// "<n> requests per second" of its output (progress lines end in \r).
func parseRedisBenchmark(out string) (float64, error) {
	var last string
	for line := range strings.FieldsFuncSeq(out, func(r rune) bool { return r == '\r' || r == '\n' }) {
		if m := rpsRE.FindStringSubmatch(line); m != nil {
			last = m[1]
		}
	}
	if last == "" {
		return 0, fmt.Errorf("no requests per second in %.200q", out)
	}
	return strconv.ParseFloat(last, 64)
}

// redisBenchmark runs redis-benchmark -q on one command and returns its
// requests per second.
func redisBenchmark(ctx context.Context, cfg *limitsConfig, stderr io.Writer, command ...string) (float64, error) {
	host, port, _ := splitHostPort(cfg.redis.addr)
	args := []string{"-h", host, "-p", strconv.Itoa(port), "-q", "-P", strconv.Itoa(cfg.pipeline), "-n", strconv.Itoa(cfg.requests)}
	if cfg.redis.db != 0 {
		args = append(args, "--dbnum", strconv.Itoa(cfg.redis.db))
	}
	if cfg.redis.user != "" {
		args = append(args, "--user", cfg.redis.user)
	}
	if cfg.redis.password != "" {
		args = append(args, "-a", cfg.redis.password)
	}
	args = append(args, command...)
	fmt.Fprintf(stderr, "%s %s\n", cfg.tool, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, cfg.tool, args...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return 0, fmt.Errorf("%s: %w (install redis-tools or give -redis-benchmark, or -skip-redis)", cfg.tool, err)
		}
		return 0, fmt.Errorf("%s: %w: %s", cfg.tool, err, strings.TrimSpace(errOut.String()))
	}
	v, err := parseRedisBenchmark(string(out))
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", cfg.tool, command[0], err)
	}
	fmt.Fprintf(stderr, "%s: %.0f/s\n", command[0], v)
	return v, nil
}

const mapShards = 256

// mapShard is one shard of the sharded map.
type mapShard struct {
	mu sync.Mutex       // guards m
	m  map[string]int64 // user → last beat (unix nanoseconds)
	_  [40]byte         // keep shards on their own cache lines
}

// shardedMapRate fills a 256-shard map with users keys and has GOMAXPROCS
// goroutines store the time under random keys for d. It returns the updates
// and the seconds they took.
func shardedMapRate(ctx context.Context, users int, d time.Duration) (int64, float64) {
	seed := maphash.MakeSeed()
	keys := make([]string, users)
	var shards [mapShards]mapShard
	for i := range shards {
		shards[i].m = make(map[string]int64, users/mapShards+1)
	}
	now := time.Now().UnixNano()
	for i := range keys {
		keys[i] = "u" + strconv.Itoa(i)
		s := uint8(maphash.String(seed, keys[i]))
		shards[s].m[keys[i]] = now
	}
	var total atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			for !stop.Load() {
				for range 1024 {
					k := keys[rand.IntN(users)]
					s := &shards[uint8(maphash.String(seed, k))]
					t := time.Now().UnixNano()
					s.mu.Lock()
					s.m[k] = t
					s.mu.Unlock()
				}
				n += 1024
			}
			total.Add(n)
		}()
	}
	sleepCtx(ctx, d)
	stop.Store(true)
	wg.Wait()
	return total.Load(), time.Since(start).Seconds()
}

func printLimits(w io.Writer, r *limitsResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "raw limit\tper second\t")
	if r.Redis != "" {
		fmt.Fprintf(tw, "redis-benchmark SET -P %d (%s)\t%.0f\t\n", r.Pipeline, r.Redis, r.RedisSetPerSec)
		fmt.Fprintf(tw, "redis-benchmark SETEX -P %d\t%.0f\t\n", r.Pipeline, r.RedisSetexRate)
	}
	fmt.Fprintf(tw, "sharded map, %d keys, %d goroutines\t%.0f\t\n", r.MapUsers, r.MapGoroutines, r.MapPerSec)
	_ = tw.Flush()
}

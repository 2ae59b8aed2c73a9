package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"
)

// The Redis baseline plays the design of the "seed articles" against a
// Redis: a key presence:<user> per user, SETEX on every beat, MGET of the
// keys to read. Its keys carry a prefix of their own (pbench:<pid>-<time>:)
// so they never meet presenced's, and are deleted at the end.

// baselinePrefix is the key prefix of one run.
func baselinePrefix() string {
	return "pbench:" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":presence:"
}

// baselineKeys are the keys of users <prefix>0 … <prefix>n-1.
func baselineKeys(keyPrefix, userPrefix string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = strconv.AppendInt([]byte(keyPrefix+userPrefix), int64(i), 10)
	}
	return keys
}

// redisPID is the process listening on the Redis port, 0 if not visible.
func redisPID(t redisTarget) int {
	_, port, _ := splitHostPort(t.addr)
	pid, err := listeningPID(port)
	if err != nil {
		return 0
	}
	return pid
}

func splitHostPort(addr string) (string, int, error) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			p, err := strconv.Atoi(addr[i+1:])
			return addr[:i], p, err
		}
	}
	return addr, 0, fmt.Errorf("no port in %q", addr)
}

// deleteKeys removes the baseline's keys.
func deleteKeys(ctx context.Context, t redisTarget, keys [][]byte) (int64, error) {
	c, err := dialRedis(ctx, t)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.nc.SetDeadline(time.Now().Add(time.Minute))
	return c.unlinkKeys(keys)
}

// redisHeartbeats plays the heartbeats scenario's load as one SETEX per
// beat, one round trip each, over min(-baseline-conns, -n) connections.
func redisHeartbeats(ctx context.Context, cfg *hbConfig, stderr io.Writer) (*hbBaseline, error) {
	conns := min(cfg.baseConns, cfg.n)
	b := &hbBaseline{Redis: cfg.redis.addr, Conns: conns, RedisPID: redisPID(cfg.redis)}
	keys := baselineKeys(baselinePrefix(), cfg.prefix, cfg.n)
	defer func() {
		n, err := deleteKeys(context.WithoutCancel(ctx), cfg.redis, keys)
		b.KeysDeleted = n
		if err != nil {
			fmt.Fprintf(stderr, "warning: baseline keys not deleted: %v\n", err)
		}
	}()
	cs := make([]*respConn, conns)
	defer func() {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i := range cs {
		c, err := dialRedis(ctx, cfg.redis)
		if err != nil {
			return nil, err
		}
		cs[i] = c
	}
	fmt.Fprintf(stderr, "baseline: %d devices every %v as SETEX over %d Redis connections at %s\n", cfg.n, cfg.interval, conns, cfg.redis.addr)
	g := &beatGen{sent: make([]padded, conns)}
	var failed padded
	ttl := int(cfg.baseTTL / time.Second)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for slot, p := range shares(cfg.n, conns) {
		c := cs[slot]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ts []byte
			g.schedule(runCtx, slot, p, cfg.interval, func(dev int32) outcome {
				ts = strconv.AppendInt(ts[:0], time.Now().UnixMilli(), 10)
				c.setex(keys[dev], ttl, ts)
				err := c.flush()
				if err == nil {
					err = c.readOK()
				}
				if err != nil {
					if runCtx.Err() != nil {
						return beatSkip // cut by the end of the run
					}
					failed.n.Add(1)
					g.errs.add(err)
				}
				return beatSent
			})
		}()
	}
	stats := func() (sent, ok int64) { s := g.total(); return s, s - failed.n.Load() }
	tick := func(phase string, d time.Duration) {
		start := time.Now()
		last, lastAt := int64(0), start
		last, _ = stats()
		for time.Since(start) < d {
			if !sleepCtx(ctx, min(time.Second, d-time.Since(start))) {
				return
			}
			s, _ := stats()
			now := time.Now()
			fmt.Fprintf(stderr, "baseline %s %5.1fs  SETEX %8.0f/s  errors %d\n", phase, now.Sub(start).Seconds(), float64(s-last)/now.Sub(lastAt).Seconds(), g.errs.n.Load())
			last, lastAt = s, now
		}
	}
	tick("warm-up", cfg.warmup)
	s0, ok0 := stats()
	var redisCPU *cpuMeter
	if b.RedisPID != 0 {
		redisCPU = startCPU(b.RedisPID)
	}
	genCPU := startCPU(os.Getpid())
	t0 := time.Now()
	tick("measure", cfg.duration)
	s1, ok1 := stats()
	wall := time.Since(t0).Seconds()
	if redisCPU != nil {
		b.RedisCores = redisCPU.cores()
	}
	b.GeneratorCores = genCPU.cores()
	stop()
	for _, c := range cs {
		_ = c.nc.SetDeadline(time.Now()) // unblock a round trip in flight
	}
	wg.Wait()
	b.Sent, b.Accepted = s1-s0, ok1-ok0
	b.SentPerSec, b.AcceptedPerSec = float64(b.Sent)/wall, float64(b.Accepted)/wall
	b.Errors, b.FirstError = g.errs.n.Load(), g.errs.firstErr()
	fmt.Fprintf(stderr, "baseline: SETEX %.0f/s accepted; Redis %.2f cores, generator %.2f cores\n", b.AcceptedPerSec, b.RedisCores, b.GeneratorCores)
	return b, nil
}

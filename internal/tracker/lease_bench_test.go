package tracker_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/tracker"
)

// newOwnedTracker is a tracker on a private Redis whose n users each have
// one device claimed by this node (a WebSocket each), as a node of the
// scale-out tier holds them.
func newOwnedTracker(b *testing.B, n int, r presence.Rules, c clock.Clock) (*tracker.Tracker, *testsvc.Server, rueidis.Client) {
	b.Helper()
	srv := testsvc.Redis(b)
	cl, err := redisstore.Dial(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	rs, err := redisstore.New(cl, redisstore.Config{Rules: r})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := rs.RaiseFloor(ctx, 0); err != nil {
		b.Fatal(err)
	}
	tr, err := tracker.New(tracker.Config{Store: rs, Durable: benchDurable{}, Clock: c, Rules: r})
	if err != nil {
		b.Fatal(err)
	}
	tr.TickLease(ctx)
	if tr.LeaseID() == 0 {
		b.Fatal("no lease")
	}
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				if _, err := tr.SocketBeat(ctx, ids()[i], "d", true); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return tr, srv, cl
}

// BenchmarkSocketBeatNoChange is BenchmarkHeartbeatNoChange on a node of
// the scale-out tier: the heartbeat of a device whose socket the node
// holds (it owns the device; Redis hears nothing). Goal: within 1.5× of
// the embedded node's BenchmarkHeartbeatNoChange, run beside it.
func BenchmarkSocketBeatNoChange(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			r := presence.Rules{TTL: time.Hour, IdleAfter: time.Hour}
			tr, _, _ := newOwnedTracker(b, size.n, r, clock.Real{})
			benchBeats(b, size.n, tr.SocketBeat)
		})
	}
}

// BenchmarkSocketBeatRedisCPU measures what a node's WebSocket heartbeats
// cost Redis, amortized over everything the node sends it meanwhile:
// 100,000 users on one node, each active and beating every 15 s of a
// fake clock (b.N beats after the first round: -benchtime 4000000x is
// ten minutes, two idle periods), with the node's sweep every 100 ms, its lease renewal
// every second and its checkpoint every second — the touches that keep
// active users online, the empty probes and drains. Redis's CPU (INFO cpu,
// user + system) over the run, per beat, is redis-µs/beat. In the same
// run, the naive design (SET user:<id> online EX 30 per beat): played as
// a web tier does, one round trip per beat from a pool of 64 connections,
// setex-redis-µs/beat (x-naive is its ratio to ours; goal at least 10),
// and at its most frugal, pipelined 100 at a time,
// setex-pipelined-redis-µs/beat.
func BenchmarkSocketBeatRedisCPU(b *testing.B) {
	const users = 100_000
	r := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	fc := clock.NewFake(start)
	// The users connect during the first 15 s (their first beats claim
	// their devices: transitions, not measured), then beat.
	tr, srv, cl := newOwnedTracker(b, 0, r, fc)
	ctx := context.Background()
	all := ids()[:users]
	// Every user's beat comes 15 s after its previous one: beat i is
	// user i%users at 15 s × i/users.
	step := 15 * time.Second / users
	sweepEvery := int(100 * time.Millisecond / step)
	secondEvery := int(time.Second / step)
	tick := func(i int) {
		if i%sweepEvery == 0 {
			if _, err := tr.Sweep(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if i%secondEvery == 0 {
			tr.TickLease(ctx)
			if err := tr.Checkpoint(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := range users {
		fc.Set(start.Add(time.Duration(i) * step))
		if _, err := tr.SocketBeat(ctx, all[i], "d", true); err != nil {
			b.Fatal(err)
		}
		tick(i)
	}
	cpu0 := redisCPUOf(b, cl)
	calls0 := scriptCallsOf(b, cl)
	b.ResetTimer()
	for i := users; i < users+b.N; i++ {
		fc.Set(start.Add(time.Duration(i) * step))
		if _, err := tr.SocketBeat(ctx, all[i%users], "d", true); err != nil {
			b.Fatal(err)
		}
		tick(i)
	}
	b.StopTimer()
	ours := redisCPUOf(b, cl) - cpu0
	calls := scriptCallsOf(b, cl) - calls0
	if s := tr.Stats(); s.Down || s.OwnedDevices != users {
		b.Fatalf("after the run: %+v", s)
	}
	// The naive design on the same server: a SETEX per beat.
	naive, err := benchfix.SetexPipelined(ctx, cl, b.N, func(j int) string { return "naive:" + all[j%users] })
	if err != nil {
		b.Fatal(err)
	}
	// The naive design as a web tier plays it: one SETEX round trip per
	// beat, from a pool of 64 connections (no pipelining), on a sample.
	rt := min(b.N, 400_000)
	pool, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true,
		DisableAutoPipelining: true, BlockingPoolSize: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var next atomic.Int64
	cpu0 = redisCPUOf(b, cl)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(rt); i = next.Add(1) {
				cmd := pool.B().Set().Key("naive:" + all[i%users]).Value("online").Ex(30 * time.Second).Build()
				if err := pool.Do(ctx, cmd).Error(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	roundTrip := redisCPUOf(b, cl) - cpu0
	b.ReportMetric(ours*1e6/float64(b.N), "redis-µs/beat")
	b.ReportMetric(naive*1e6/float64(b.N), "setex-pipelined-redis-µs/beat")
	b.ReportMetric(roundTrip*1e6/float64(rt), "setex-redis-µs/beat")
	b.ReportMetric(roundTrip/float64(rt)/max(ours/float64(b.N), 1e-12), "x-naive")
	b.ReportMetric(float64(calls)/float64(b.N), "scripts/beat")
}

func redisCPUOf(b *testing.B, c rueidis.Client) float64 {
	b.Helper()
	cpu, err := benchfix.RedisCPU(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return cpu
}

func scriptCallsOf(b *testing.B, c rueidis.Client) int64 {
	b.Helper()
	n, err := benchfix.RedisScripts(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

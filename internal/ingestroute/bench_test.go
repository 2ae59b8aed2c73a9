package ingestroute

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/wire"
)

// BenchmarkJetStreamIngestBeatRedisCPU is the Kafka ingest's
// BenchmarkIngestBeatRedisCPU for the JetStream ingest: 100,000 users on
// one node, each beating every 15 s of a fake clock (b.N beats after a
// first round that claims the devices, not measured), published to a
// private NATS server's ingest stream and applied by the node's consumer
// into a tracker on a private Redis, with the node's sweep every 100 ms
// and checkpoint every second of that clock. owner=on: the consumer's
// tracker is the router (the node owns every partition; the default
// with Redis); owner=off: the tracker itself, every beat a write to
// Redis. Beside them, SET user:<id> online EX 30 per beat, pipelined 100
// at a time, on the same Redis.
func BenchmarkJetStreamIngestBeatRedisCPU(b *testing.B) {
	for _, own := range []bool{true, false} {
		name := "owner=off"
		if own {
			name = "owner=on"
		}
		b.Run(name, func(b *testing.B) { benchJetStreamBeats(b, own) })
	}
}

func benchJetStreamBeats(b *testing.B, own bool) {
	const users, perSecond = 100_000, 100_000 / 15
	ctx := context.Background()
	fc := clock.NewFake(time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC))
	r := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}

	rsrv := testsvc.Redis(b)
	tr := benchfix.RedisNode(b, rsrv.URL, r, fc)
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	b.Cleanup(func() { stop(); wg.Wait() })

	nsrv := testsvc.NATS(b)
	conn, err := jsstream.Dial(nsrv.URL, "bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Close)
	var into ingest.Tracker = tr
	if own {
		rt, err := New(Config{Conn: conn, Tracker: tr, Lease: tr.LeaseID, Live: func() []uint64 { return []uint64{tr.LeaseID()} }})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { _ = rt.Run(runCtx) })
		for deadline := time.Now().Add(5 * time.Second); rt.Stats().Owned != 256; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("the router owns no partition")
			}
		}
		into = rt
	}
	c, err := ingest.Open(ctx, ingest.Config{Conn: conn, Tracker: into, Clock: fc, TTL: r.TTL})
	if err != nil {
		b.Fatal(err)
	}
	wg.Go(func() { _ = c.Run(runCtx) })
	b.Cleanup(func() { c.Close() })

	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{rsrv.Addr}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rc.Close)
	cpu := func() float64 {
		v, err := benchfix.RedisCPU(ctx, rc)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}

	// beat publishes users [from, to) a beat at the fake clock's now and
	// waits until the consumer applied every event so far.
	published := uint64(0)
	beat := func(from, to int) {
		at := fc.Now().UTC().Format(wire.TimeLayout)
		futs := make([]jetstream.PubAckFuture, 0, to-from)
		for i := from; i < to; i++ {
			f, err := conn.JS.PublishAsync("presence.ingest.gw", fmt.Appendf(nil,
				`{"type":"heartbeat","user_id":"u%d","device_id":"d","at":%q}`, i%users, at))
			if err != nil {
				b.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
		published += uint64(len(futs))
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
			s := c.Stats()
			if s.Applied+s.Stale+s.Ignored+s.Invalid+s.Refused+s.GivenUp >= published {
				if n := s.Stale + s.Invalid + s.Refused + s.GivenUp; n != 0 {
					b.Fatalf("%d beats not applied: %+v", n, s)
				}
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("the consumer applied %+v of %d events", s, published)
			}
		}
	}
	second := func(from, to int) {
		beat(from, to)
		if err := benchfix.PlaySecond(ctx, tr, fc); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < users; i += perSecond {
		second(i, min(i+perSecond, users))
	}
	cpu0 := cpu()
	b.ResetTimer()
	for i := 0; i < b.N; i += perSecond {
		second(users+i, users+min(i+perSecond, b.N))
	}
	b.StopTimer()
	ours := cpu() - cpu0
	if s := tr.Stats(); s.Down || (own && s.OwnedDevices != users) {
		b.Fatalf("after the run: %+v", s)
	}

	naive, err := benchfix.SetexPipelined(ctx, rc, b.N, func(j int) string { return fmt.Sprintf("naive:u%d", j%users) })
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(ours*1e6/float64(b.N), "redis-µs/beat")
	b.ReportMetric(naive*1e6/float64(b.N), "setex-pipelined-redis-µs/beat")
}

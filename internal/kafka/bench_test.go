package kafka_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/wire"
)

// BenchmarkIngestBeatRedisCPU measures what heartbeats that come through
// the Kafka ingest cost Redis, amortized over everything the node sends
// it meanwhile: 100,000 users on one node, each active and beating every
// 15 s of a fake clock (b.N beats after a first round that claims the
// devices, not measured), through a Kafka consumer (in-process brokers)
// into a tracker on a private Redis, with the node's sweep every 100 ms
// and checkpoint every second of that clock.
// owner=on is the node owning its partitions' devices (the default with
// Redis); owner=off every beat a write to Redis, as before. In the same
// run, the naive design, SET user:<id> online EX 30 per beat, pipelined
// 100 at a time (setex-pipelined-redis-µs/beat).
func BenchmarkIngestBeatRedisCPU(b *testing.B) {
	for _, own := range []bool{true, false} {
		name := "owner=off"
		if own {
			name = "owner=on"
		}
		b.Run(name, func(b *testing.B) { benchIngestBeats(b, own) })
	}
}

func benchIngestBeats(b *testing.B, own bool) {
	const users, perSecond = 100_000, 100_000 / 15
	ctx := context.Background()
	fc := clock.NewFake(epoch)
	r := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}

	srv := testsvc.Redis(b)
	tr := benchfix.RedisNode(b, srv.URL, r, fc)

	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, ingestT), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(kc.Close)
	gw, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.DefaultProduceTopic(ingestT),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(gw.Close)
	cfg := kafka.ConsumerConfig{Brokers: kc.ListenAddrs(), Topic: ingestT, Group: group, Tracker: tr, TTL: r.TTL, Clock: fc,
		SessionTimeout: 2 * time.Second}
	if own {
		cfg.Owner = tr
	}
	c, err := kafka.NewConsumer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(cctx) })
	b.Cleanup(func() { cancel(); wg.Wait(); c.Close() })

	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
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

	// beat sends users [from, to) a beat at the fake clock's now and
	// waits until the consumer is done with every record so far.
	produced := uint64(0)
	recs := make([]*kgo.Record, 0, perSecond+1)
	beat := func(from, to int) {
		recs = recs[:0]
		at := fc.Now().UTC().Format(wire.TimeLayout)
		for i := from; i < to; i++ {
			u := fmt.Sprintf("u%d", i%users)
			recs = append(recs, &kgo.Record{Key: []byte(u),
				Value: fmt.Appendf(nil, `{"type":"heartbeat","user_id":%q,"device_id":"d","at":%q}`, u, at)})
		}
		if err := gw.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
		produced += uint64(len(recs))
		for deadline := time.Now().Add(time.Minute); ; {
			s := c.Stats()
			if s.Applied+s.Coalesced+s.Stale+s.Ignored+s.Invalid+s.Refused+s.GivenUp >= produced {
				if n := s.Stale + s.Invalid + s.Refused + s.GivenUp; n != 0 {
					b.Fatalf("%d beats not applied: %+v", n, s)
				}
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("the consumer applied %+v of %d records", s, produced)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// second plays one second of the fake clock: the beats due in it,
	// ten sweeps, a checkpoint.
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
	calls0, err := benchfix.RedisScripts(ctx, rc)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i += perSecond {
		second(users+i, users+min(i+perSecond, b.N))
	}
	b.StopTimer()
	ours := cpu() - cpu0
	calls, err := benchfix.RedisScripts(ctx, rc)
	if err != nil {
		b.Fatal(err)
	}
	calls -= calls0
	if s := tr.Stats(); s.Down || (own && s.OwnedDevices != users) {
		b.Fatalf("after the run: %+v", s)
	}

	naive, err := benchfix.SetexPipelined(ctx, rc, b.N, func(j int) string { return fmt.Sprintf("naive:u%d", j%users) })
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(ours*1e6/float64(b.N), "redis-µs/beat")
	b.ReportMetric(naive*1e6/float64(b.N), "setex-pipelined-redis-µs/beat")
	b.ReportMetric(float64(calls)/float64(b.N), "scripts/beat")
}

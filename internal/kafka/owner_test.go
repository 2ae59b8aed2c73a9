package kafka_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// redisNode is a node of the scale-out tier: a tracker on the shared
// Redis under a lease of its own, running on the real clock, with a
// recorder of its changes.
type redisNode struct {
	tr  *tracker.Tracker
	rec *recorder
}

func newRedisNode(t *testing.T, redis *testsvc.Server, prefix string, epoch uint64, r presence.Rules) *redisNode {
	t.Helper()
	cl, err := redisstore.Dial(redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	r.Epoch = epoch
	rs, err := redisstore.Open(context.Background(), cl, redisstore.Config{Rules: r, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	n := &redisNode{rec: &recorder{}}
	n.tr, err = tracker.New(tracker.Config{Store: rs, Durable: benchfix.Nop{}, Publisher: n.rec, Clock: clock.Real{}, Rules: r,
		LeaseInterval: 100 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, NodeAlive: func(uint64) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = n.tr.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, "the node's lease", func() bool { return n.tr.LeaseID() != 0 })
	return n
}

// Two nodes on one Redis consume the ingest topic, each owning the
// devices of the partitions it consumes: every device is owned by exactly
// one node, partitions move when a node joins and back when it leaves
// (within a ttl, so the first node must claim again what it held before),
// and through both moves nobody is shown offline; a device whose events
// stop is announced offline once, a ttl after its last beat.
func TestPartitionsOwnTheirDevices(t *testing.T) {
	w := newWorld(t)
	redis := testsvc.Redis(t)
	rules := presence.Rules{TTL: 3 * time.Second, IdleAfter: time.Minute}
	prefix := testsvc.Unique(t) + ":"
	a := newRedisNode(t, redis, prefix, 1, rules)
	b := newRedisNode(t, redis, prefix, 2, rules)
	start := func(name string, n *redisNode) (*kafka.Consumer, func()) {
		return w.startNodeWith(name, n.tr, func(cfg *kafka.ConsumerConfig) {
			cfg.Owner = n.tr
			cfg.TTL = rules.TTL
			cfg.Clock = clock.Real{}
		})
	}

	const users, quiet = 40, 8 // users 0–7 fall silent later
	var silent atomic.Bool
	var beats atomic.Int64
	ctx, cancel := context.WithCancel(w.ctx)
	var wg sync.WaitGroup
	wg.Go(func() { // the connection layer: a beat of every device each 400 ms
		tick := time.NewTicker(400 * time.Millisecond)
		defer tick.Stop()
		for {
			recs := make([]*kgo.Record, 0, users)
			for i := range users {
				if i < quiet && silent.Load() {
					continue
				}
				at := time.Now().UTC().Format(time.RFC3339Nano)
				recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "u%d", i),
					Value: fmt.Appendf(nil, `{"type":"heartbeat","user_id":"u%d","device_id":"d","at":%q}`, i, at)})
			}
			if err := w.gw.ProduceSync(ctx, recs...).FirstErr(); err != nil && ctx.Err() == nil {
				t.Errorf("produce: %v", err)
			}
			beats.Add(int64(len(recs)))
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	defer func() { cancel(); wg.Wait() }()

	owned := func() (int, int) { return a.tr.Stats().OwnedDevices, b.tr.Stats().OwnedDevices }
	ca, _ := start("a", a)
	testwait.For(t, "node a owning every device", func() bool { na, _ := owned(); return na == users })

	// No device is ever owned by both nodes: a partition's devices are
	// handed off before the partition is assigned again.
	var most atomic.Int64
	wg.Go(func() {
		for ctx.Err() == nil {
			na, nb := owned()
			if n := int64(na + nb); n > most.Load() {
				most.Store(n)
			}
			time.Sleep(2 * time.Millisecond)
		}
	})

	// b joins: some partitions move to it, with their devices.
	cb, stopB := start("b", b)
	testwait.For(t, "the devices shared by a and b, each owned once", func() bool {
		na, nb := owned()
		return nb > 0 && na > 0 && na+nb == users && w.owned()["b"] > 0
	})
	moved := b.tr.Stats().OwnedDevices

	// b leaves within a ttl of joining: its partitions and devices go
	// back to a, which must claim them again (b held them meanwhile).
	stopB()
	testwait.For(t, "node a owning every device again", func() bool {
		na, nb := owned()
		return nb == 0 && na == users
	})
	time.Sleep(rules.TTL + time.Second) // past the ttl of b's last beats

	// Users 0–7 fall silent: each is announced offline once.
	silent.Store(true)
	time.Sleep(rules.TTL + 2*time.Second)
	if na, nb := owned(); na != users-quiet || nb != 0 {
		t.Fatalf("after the silent users' ttl a owns %d and b %d devices, want %d and 0", na, nb, users-quiet)
	}

	tr := map[string][]string{}
	for _, n := range []*redisNode{a, b} {
		for u, ts := range n.rec.transitions() {
			tr[u] = append(tr[u], ts...)
		}
	}
	for i := range users {
		u := fmt.Sprintf("u%d", i)
		want := "[offline>online]"
		if i < quiet {
			want = "[offline>online online>offline]"
		}
		if got := fmt.Sprint(tr[u]); got != want {
			t.Errorf("%s: %s, want %s", u, got, want)
		}
	}
	if n := most.Load(); n > users {
		t.Errorf("the nodes owned %d devices at once; there are %d", n, users)
	}
	sa, sb := ca.Stats(), cb.Stats()
	if sb.HandOffs == 0 || sb.HandOffErrors != 0 {
		t.Errorf("b's hand-offs: %d done, %d unfinished", sb.HandOffs, sb.HandOffErrors)
	}
	if sa.HandOffs == 0 {
		t.Errorf("a handed off no partition when b joined")
	}
	t.Logf("%d beats; %d devices moved to b when it joined; hand-offs a %d, b %d", beats.Load(), moved, sa.HandOffs, sb.HandOffs)
}

// recordingOwner is an Owner over the world's tracker that records the
// connect flag of each beat.
type recordingOwner struct {
	tr       *tracker.Tracker
	mu       sync.Mutex
	connects []bool
}

func (o *recordingOwner) SourceBeat(ctx context.Context, src uint32, user, device string, active, connect bool) (presence.Change, error) {
	o.mu.Lock()
	o.connects = append(o.connects, connect)
	o.mu.Unlock()
	return o.tr.SourceBeat(ctx, src, user, device, active, connect)
}

func (o *recordingOwner) HandOffSources(ctx context.Context, srcs ...uint32) error {
	return o.tr.HandOffSources(ctx, srcs...)
}

// A session_connected reaches the owner as a connect (it claims the
// device again); a heartbeat as a beat.
func TestOwnerHearsConnects(t *testing.T) {
	w := newWorld(t)
	own := &recordingOwner{tr: w.tr}
	c, _ := w.startNodeWith("a", nil, func(cfg *kafka.ConsumerConfig) { cfg.Owner = own })
	w.produce(w.event("session_connected", "kim", "tab", 0))
	testwait.For(t, "the connect applied", func() bool { return c.Stats().Applied == 1 })
	w.produce(w.event("heartbeat", "kim", "tab", 0))
	testwait.For(t, "the beat applied", func() bool { return c.Stats().Applied == 2 })
	own.mu.Lock()
	defer own.mu.Unlock()
	if fmt.Sprint(own.connects) != "[true false]" {
		t.Errorf("connect flags %v, want [true false]", own.connects)
	}
}

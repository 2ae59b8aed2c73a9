package benchfix

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/tracker"
)

// RedisNode returns a tracker on the Redis at url as a scale-out node
// runs one, for benchmarks of what its devices cost Redis: running (Run
// takes its lease and renews it every 100 ms of real time) on clock c,
// with no durable store, until tb ends.
func RedisNode(tb testing.TB, url string, r presence.Rules, c clock.Clock) *tracker.Tracker {
	tb.Helper()
	ctx := context.Background()
	cl, err := redisstore.Dial(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cl.Close)
	rs, err := redisstore.New(cl, redisstore.Config{Rules: r})
	if err != nil {
		tb.Fatal(err)
	}
	if err := rs.RaiseFloor(ctx, 0); err != nil {
		tb.Fatal(err)
	}
	tr, err := tracker.New(tracker.Config{Store: rs, Durable: Nop{}, Clock: c, Rules: r, LeaseInterval: 100 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = tr.Run(runCtx) })
	tb.Cleanup(func() { stop(); wg.Wait() })
	for deadline := time.Now().Add(5 * time.Second); tr.LeaseID() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatal("no lease")
		}
	}
	return tr
}

// PlaySecond plays one second of a node's fake clock after its beats of
// that second: ten sweeps 100 ms apart, then a checkpoint.
func PlaySecond(ctx context.Context, tr *tracker.Tracker, fc *clock.Fake) error {
	for range 10 {
		fc.Advance(100 * time.Millisecond)
		if _, err := tr.Sweep(ctx); err != nil {
			return err
		}
	}
	return tr.Checkpoint(ctx)
}

package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
)

// enterAsync enters g in a goroutine and returns where its answer comes.
func enterAsync(ctx context.Context, g *Gate) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- g.Enter(ctx) }()
	return ch
}

func waiting(g *Gate) int { return g.Stats().Waiting }

func TestLimitAndOrder(t *testing.T) {
	g := New(Config{Max: 8, Start: 2})
	ctx := context.Background()
	for range 2 {
		if err := g.Enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	first := enterAsync(ctx, g)
	testwait.For(t, "the third to wait", func() bool { return waiting(g) == 1 })
	second := enterAsync(ctx, g)
	testwait.For(t, "the fourth to wait", func() bool { return waiting(g) == 2 })
	select {
	case err := <-first:
		t.Fatalf("admitted over the limit (%v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	g.Leave()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	select {
	case <-second:
		t.Fatal("the later waiter was admitted before a place was free")
	case <-time.After(20 * time.Millisecond):
	}
	g.Leave()
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if s := g.Stats(); s.InFlight != 2 || s.Waiting != 0 || s.Admitted != 4 {
		t.Fatalf("stats %+v, want 2 in flight, none waiting, 4 admitted", s)
	}
}

func TestGiveUp(t *testing.T) {
	g := New(Config{Max: 1, Start: 1, MaxWait: 30 * time.Millisecond})
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Enter(context.Background()); !errors.Is(err, ErrBusy) {
		t.Fatalf("after MaxWait: %v, want ErrBusy", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := enterAsync(ctx, g)
	testwait.For(t, "the waiter", func() bool { return waiting(g) == 1 })
	cancel()
	if err := <-ch; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if s := g.Stats(); s.InFlight != 1 || s.Waiting != 0 || s.Busy != 1 || s.Admitted != 1 {
		t.Fatalf("stats %+v, want the first alone admitted, one busy", s)
	}
	// The place is still the first's, and free once it leaves.
	g.Leave()
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestLateWakeUpsHalveAndOnTimeGrow(t *testing.T) {
	g := New(Config{Max: 10, Start: 8, Late: 2 * time.Millisecond})
	g.mu.Lock()
	defer g.mu.Unlock()
	g.observe(3 * time.Millisecond)
	if g.limit != 4 {
		t.Fatalf("after a late wake-up the limit is %d, want 4", g.limit)
	}
	g.observe(2 * time.Millisecond) // at Late: on time
	g.observe(0)
	g.observe(time.Millisecond)
	if g.limit != 4 {
		t.Fatalf("after three on time the limit is %d, want 4", g.limit)
	}
	g.observe(0)
	if g.limit != 5 {
		t.Fatalf("after four on time the limit is %d, want 5", g.limit)
	}
	for range 100 {
		g.observe(time.Hour)
	}
	if g.limit != 1 {
		t.Fatalf("the limit fell to %d, want 1 at the least", g.limit)
	}
	for range 400 {
		g.observe(0)
	}
	if g.limit != 10 {
		t.Fatalf("the limit grew to %d, want Max 10", g.limit)
	}
	if g.late != 101 {
		t.Fatalf("late %d, want 101", g.late)
	}
}

// A limit that grows admits those waiting.
func TestGrowthAdmits(t *testing.T) {
	g := New(Config{Max: 4, Start: 1})
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	ch := enterAsync(context.Background(), g)
	testwait.For(t, "the waiter", func() bool { return waiting(g) == 1 })
	g.mu.Lock()
	for range 4 {
		g.observe(0)
	}
	g.mu.Unlock()
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
}

// The probe runs while there is work and, once idle, starts the gate again
// at Start; its late wake-ups halve the limit.
func TestRunProbesWhileBusy(t *testing.T) {
	g := New(Config{Max: 16, Start: 2, Tick: time.Millisecond, Late: time.Hour, Idle: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	if err := g.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the limit to grow while busy", func() bool { return g.Stats().Limit == 16 })
	g.Leave()
	testwait.For(t, "the limit to start again once idle", func() bool { return g.Stats().Limit == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Every wake-up late: the limit stays at 1.
	g = New(Config{Max: 16, Start: 8, Tick: time.Millisecond, Late: time.Nanosecond})
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- g.Run(ctx) }()
	if err := g.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the limit to fall", func() bool { return g.Stats().Limit == 1 })
	if g.Stats().Late == 0 {
		t.Fatal("no late wake-up counted")
	}
	g.Leave()
	cancel()
	<-done
}

func TestLeaveWithoutEnterPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	New(Config{}).Leave()
}

func BenchmarkEnterLeave(b *testing.B) {
	g := New(Config{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Enter(ctx); err != nil {
			b.Fatal(err)
		}
		g.Leave()
	}
}

package writegate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
)

// waitQueued polls until n writes wait at g (a goroutine's Enter is
// queued), with a deadline.
func waitQueued(t *testing.T, g *Gate, n int) {
	t.Helper()
	testwait.Forf(t, func() string { return fmt.Sprintf("%d writes waiting; %d are", n, g.Stats().Queued) },
		func() bool { return g.Stats().Queued == n })
}

// enterAsync enters g in a goroutine; its name is sent on order once it
// holds a slot, and its error on errs.
func enterAsync(g *Gate, k Kind, name string, order chan<- string, errs chan<- error) {
	go func() {
		err := g.Enter(context.Background(), k)
		if err == nil {
			order <- name
		}
		errs <- err
	}()
}

func TestBulkQueueIsBounded(t *testing.T) {
	g := New(Config{Slots: 1, MaxQueued: 2})
	ctx := t.Context()
	if err := g.Enter(ctx, Bulk); err != nil {
		t.Fatal(err)
	}
	order, errs := make(chan string, 4), make(chan error, 4)
	enterAsync(g, Bulk, "b1", order, errs)
	waitQueued(t, g, 1)
	enterAsync(g, Bulk, "b2", order, errs)
	waitQueued(t, g, 2)

	// The queue is full: a third bulk write is refused at once.
	if err := g.Enter(ctx, Bulk); !errors.Is(err, ErrBusy) {
		t.Fatalf("bulk write beyond the queue: got %v, want ErrBusy", err)
	}
	if got := g.Stats().Refused; got != 1 {
		t.Errorf("Refused = %d, want 1", got)
	}
	// An urgent write is never refused.
	enterAsync(g, Urgent, "u1", order, errs)
	waitQueued(t, g, 3)

	for _, want := range []string{"u1", "b1", "b2"} {
		g.Leave()
		if got := <-order; got != want {
			t.Fatalf("the slot went to %s, want %s", got, want)
		}
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	g.Leave()
	// Everything was given back: the queue takes bulk writes again.
	if err := g.Enter(ctx, Bulk); err != nil {
		t.Fatalf("bulk write after the queue drained: %v", err)
	}
	g.Leave()
}

// TestUrgentFirst: urgent writes take the slot before bulk writes that
// queued earlier, and in their own order of arrival.
func TestUrgentFirst(t *testing.T) {
	g := New(Config{})
	if err := g.Enter(t.Context(), Urgent); err != nil {
		t.Fatal(err)
	}
	order, errs := make(chan string, 8), make(chan error, 8)
	names := []struct {
		k    Kind
		name string
	}{{Bulk, "b1"}, {Urgent, "u1"}, {Bulk, "b2"}, {Urgent, "u2"}}
	for i, n := range names {
		enterAsync(g, n.k, n.name, order, errs)
		waitQueued(t, g, i+1)
	}
	// A new write does not jump the queue while writes wait, even with a
	// slot just given back.
	for _, want := range []string{"u1", "u2", "b1", "b2"} {
		g.Leave()
		if got := <-order; got != want {
			t.Fatalf("the slot went to %s, want %s", got, want)
		}
	}
	g.Leave()
}

// TestCancelWhileWaiting: a write whose context ends while it waits leaves
// the queue, holding nothing, and makes room for another bulk write.
func TestCancelWhileWaiting(t *testing.T) {
	g := New(Config{Slots: 1, MaxQueued: 1})
	if err := g.Enter(t.Context(), Urgent); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- g.Enter(ctx, Bulk) }()
	waitQueued(t, g, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Enter with its context cancelled: %v, want context.Canceled", err)
	}
	if n := g.Stats().Queued; n != 0 {
		t.Fatalf("a cancelled write still waits (%d queued)", n)
	}
	order, errs := make(chan string, 1), make(chan error, 1)
	enterAsync(g, Bulk, "b", order, errs)
	waitQueued(t, g, 1)
	g.Leave()
	if got := <-order; got != "b" {
		t.Fatalf("the slot went to %s", got)
	}
	g.Leave()

	// An ended context is refused before anything.
	if err := g.Enter(ctx, Urgent); !errors.Is(err, context.Canceled) {
		t.Fatalf("Enter with an ended context: %v", err)
	}
}

// TestSlotsUnderRace: writes of both kinds that enter, give up on
// deadlines at random moments (some just as a slot is handed to them) and
// leave never hold more than Slots at once, and give every slot back.
func TestSlotsUnderRace(t *testing.T) {
	const slots = 3
	g := New(Config{Slots: slots, MaxQueued: 8})
	var holding, most atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			k := Kind(i % 2)
			for j := range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(j%5)*time.Microsecond)
				err := g.Enter(ctx, k)
				cancel()
				if err != nil {
					continue
				}
				n := holding.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				holding.Add(-1)
				g.Leave()
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m > slots {
		t.Errorf("%d writes held a slot at once, want at most %d", m, slots)
	}
	// Every slot came back: as many writes as slots enter without waiting.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for range slots {
		if err := g.Enter(ctx, Bulk); err != nil {
			t.Fatalf("a slot was lost: %v", err)
		}
	}
	if s := g.Stats(); s.Queued != 0 {
		t.Errorf("Stats = %+v, want nothing queued", s)
	}
}

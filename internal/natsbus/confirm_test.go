package natsbus

import (
	"context"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testsvc"
)

// TestWaitForTheStream: Wait(Mark()) returns true once the stream holds
// every event published before Mark — the event is then in the stream,
// whatever becomes of the node — and false at once while NATS is down
// (the event waits in the queue; the caller is not kept waiting), true
// again after the reconnection once the queue reached the stream.
func TestWaitForTheStream(t *testing.T) {
	srv := testsvc.NATS(t)
	e := newEnv(t, srv)
	a := e.open("a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for v := uint64(1); v <= 50; v++ {
		a.Publish(event("w", v))
	}
	mark := a.Mark()
	if mark != 50 {
		t.Fatalf("Mark after 50 events: %d", mark)
	}
	if !a.Wait(ctx, mark) {
		t.Fatal("Wait: false with NATS up")
	}
	s := e.openStream(t, a.nc)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 50 {
		t.Errorf("Wait returned with %d of 50 events in the stream", info.State.Msgs)
	}

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the disconnection", func() bool { return !a.nc.IsConnected() })
	a.Publish(event("w", 51))
	start := time.Now()
	if a.Wait(ctx, a.Mark()) {
		t.Fatal("Wait: true with NATS down")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Wait took %s to give up with NATS down, want at once", took)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reconnection", func() bool { return a.nc.IsConnected() })
	if !a.Wait(ctx, a.Mark()) {
		t.Fatal("Wait after the reconnection: false")
	}
}

// TestConfirmedInOrder: acks that come out of order (a publish sent again
// goes behind newer ones) confirm nothing above a number not acked yet.
func TestConfirmedInOrder(t *testing.T) {
	var c confirmed
	for _, step := range []struct {
		ack, want uint64
	}{{1, 1}, {3, 1}, {4, 1}, {2, 4}, {6, 4}, {5, 6}, {5, 6}, {7, 7}} {
		c.acked(step.ack)
		if got := c.done.Load(); got != step.want {
			t.Fatalf("after the ack of %d: done %d, want %d", step.ack, got, step.want)
		}
	}
	if len(c.early) != 0 {
		t.Errorf("early acks left: %v", c.early)
	}
}

package natsbus

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
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
	testwait.For(t, "the disconnection", func() bool { return !a.nc.IsConnected() })
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
	testwait.For(t, "the reconnection", func() bool { return a.nc.IsConnected() })
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

// TestWaitWhileTheStreamFails: while the stream is missing and cannot be
// created again (a stream of another service holds one of its
// subjects), or refuses what is published (full: no room for a new
// message), Wait reports false at once — as while NATS is down — instead
// of holding each caller until its context ends; once the stream takes
// the changes again, Wait waits for them and reports true.
func TestWaitWhileTheStreamFails(t *testing.T) {
	defer func(d time.Duration) { ackTimeout = d }(ackTimeout)
	ackTimeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name        string
		break_, fix func(t *testing.T, e *env, js jetstream.JetStream)
	}{{
		name: "missing",
		break_: func(t *testing.T, e *env, js jetstream.JetStream) {
			if err := js.DeleteStream(context.Background(), e.stream); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: e.stream + "_OTHER",
				Subjects: []string{subjectOf(e.subject+".", "x")}}); err != nil {
				t.Fatal(err)
			}
		},
		fix: func(t *testing.T, e *env, js jetstream.JetStream) {
			if err := js.DeleteStream(context.Background(), e.stream+"_OTHER"); err != nil {
				t.Fatal(err)
			}
		},
	}, {
		name: "full",
		break_: func(t *testing.T, e *env, js jetstream.JetStream) {
			setLimit(t, js, e.stream, 1)
		},
		fix: func(t *testing.T, e *env, js jetstream.JetStream) {
			setLimit(t, js, e.stream, -1)
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testsvc.SharedNATS(t))
			a, b := e.open("a"), e.open("b")
			b.watch("u") // a publish no stream captures times out, as to a stalled server
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			a.Publish(event("u", 1))
			if !a.Wait(ctx, a.Mark()) {
				t.Fatal("Wait: false with the stream there")
			}
			js, err := jetstream.New(b.nc)
			if err != nil {
				t.Fatal(err)
			}
			tc.break_(t, e, js)
			a.Publish(event("u", 2))
			testwait.Forf(t, func() string { return fmt.Sprintf("the bus to find the stream failing: %+v", a.Stream()) }, func() bool {
				h := a.Stream()
				return h.Unacked > 0 || h.Missing
			})
			for v := uint64(3); v < 103; v++ {
				a.Publish(event("u", v))
				if a.Wait(ctx, a.Mark()) {
					t.Fatalf("Wait of version %d: true while the stream fails (%+v)", v, a.Stream())
				}
				if ctx.Err() != nil {
					t.Fatalf("Wait of version %d: false only once its context ended, while the bus knew the stream failing (%+v)", v, a.Stream())
				}
			}
			tc.fix(t, e, js)
			testwait.Forf(t, func() string { return fmt.Sprintf("every change acked: %+v", a.Stats()) }, func() bool { return a.Stats().Acked == 102 })
			a.Publish(event("u", 103))
			if !a.Wait(ctx, a.Mark()) {
				t.Errorf("Wait after the stream took the changes again: false (%+v)", a.Stats())
			}
		})
	}
}

// setLimit sets the most messages the stream keeps, refusing more
// (DiscardNew), or with -1 no limit (DiscardOld, as the bus makes it).
func setLimit(t *testing.T, js jetstream.JetStream, name string, max int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs, cfg.Discard = max, jetstream.DiscardOld
	if max > 0 {
		cfg.Discard = jetstream.DiscardNew
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

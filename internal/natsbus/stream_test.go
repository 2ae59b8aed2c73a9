package natsbus

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// streamMsgIDs returns the Nats-Msg-Id of every message the env's stream
// holds, oldest first, or an error if the stream cannot be read (it is
// missing).
func (e *env) streamMsgIDs(nc *nats.Conn) ([]string, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, e.stream)
	if err != nil {
		return nil, err
	}
	info := s.CachedInfo()
	var ids []string
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, err
		}
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids, nil
}

// TestStoreLost: NATS is killed, its store directory removed (the stream
// with it) and it is started again on the same port, while another node
// subscribes to the user whose changes are published — so a publish to
// the lost stream is not refused at once (no responders) but times out.
// The stream comes back, holding the changes made while NATS was down
// and after it came back, and the bus counted the re-creation.
func TestStoreLost(t *testing.T) {
	defer func(d time.Duration) { ackTimeout = d }(ackTimeout)
	ackTimeout = 500 * time.Millisecond
	for _, watched := range []bool{true, false} {
		name := "unwatched"
		if watched {
			name = "watched"
		}
		t.Run(name, func(t *testing.T) {
			srv := testsvc.NATS(t)
			e := newEnv(t, srv)
			a, b := e.open("a"), e.open("b")
			if watched {
				b.watch("u")
			}
			a.Publish(event("u", 1))
			testwait.For(t, "the first ack", func() bool { return a.Stats().Acked == 1 })
			if st := a.Stats(); st.StreamMissing || st.StreamRecreated != 0 {
				t.Fatalf("before the loss: %+v", st)
			}

			if err := srv.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(srv.Dir, "jetstream")); err != nil {
				t.Fatal(err)
			}
			a.Publish(event("u", 2)) // waits in a's queue
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			testwait.For(t, "a and b reconnected", func() bool { return a.nc.IsConnected() && b.nc.IsConnected() })
			if err := b.nc.FlushTimeout(5 * time.Second); err != nil { // b's subscription is back
				t.Fatal(err)
			}
			a.Publish(event("u", 3))
			var ids []string
			var err error
			testwait.Forf(t, func() string {
				return fmt.Sprintf("two changes in the stream after NATS came back: stream %v, err %v; a: %+v", ids, err, a.Stats())
			}, func() bool {
				ids, err = e.streamMsgIDs(b.nc)
				return err == nil && len(ids) == 2
			})
			if ids[0] != "u:2" || ids[1] != "u:3" {
				t.Errorf("the stream holds %v, want [u:2 u:3]", ids)
			}
			testwait.For(t, "everything acked", func() bool { st := a.Stats(); return st.Acked == 3 && st.InFlight == 0 })
			// Each node looks at the stream when it reconnects: one of
			// them (or both, at once) created it again. A node whose
			// look or creation failed (the other was creating it, or
			// JetStream was starting) looks again after its backoff.
			var sa, sb Stats
			testwait.Forf(t, func() string {
				return fmt.Sprintf("both nodes to find the stream: a %+v, b %+v", sa, sb)
			}, func() bool {
				sa, sb = a.Stats(), b.Stats()
				return !sa.StreamMissing && !sb.StreamMissing
			})
			if sa.StreamRecreated+sb.StreamRecreated == 0 || sa.Unacked != 0 {
				t.Errorf("after the re-creation: a %+v, b %+v, want re-created, nothing unacknowledged", sa, sb)
			}
			if watched {
				// (u:2 may have gone out before b subscribed again: a
				// node resyncs its watchers after a reconnection.)
				testwait.Forf(t, func() string {
					return fmt.Sprintf("b got the change made after the restart: %+v, stats %+v", b.rec.of("u"), b.Stats())
				}, func() bool {
					evs := b.rec.of("u")
					return len(evs) > 0 && evs[len(evs)-1].Version == 3
				})
			}
		})
	}
}

// TestStreamMissingReported: while the stream cannot be created again (a
// stream of another service holds one of its subjects), the bus says it
// is missing and how long its changes have waited; once it can, the
// stream is created and the changes land.
func TestStreamMissingReported(t *testing.T) {
	defer func(d time.Duration) { ackTimeout = d }(ackTimeout)
	ackTimeout = 300 * time.Millisecond
	e := newEnv(t, testsvc.SharedNATS(t))
	a, b := e.open("a"), e.open("b")
	b.watch("u")
	a.Publish(event("u", 1))
	// The ack is counted before the change leaves the waiting ones: wait
	// for both.
	testwait.For(t, "the first ack", func() bool { return a.Stats().Acked == 1 && a.Stream().Waiting == 0 })
	if h := a.Stream(); h.Missing || h.Unacked != 0 || h.Waiting != 0 {
		t.Fatalf("before: %+v", h)
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, e.stream); err != nil {
		t.Fatal(err)
	}
	blocker := e.stream + "_OTHER"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: blocker, Subjects: []string{subjectOf(a.prefix, "x")}}); err != nil {
		t.Fatal(err)
	}
	a.Publish(event("u", 2))
	testwait.Forf(t, func() string { return fmt.Sprintf("the stream reported missing: %+v", a.Stats()) }, func() bool {
		h := a.Stream()
		return h.Missing && h.Unacked > 0 && h.Waiting == 1
	})
	if st := a.Stats(); !st.StreamMissing || st.Unacked == 0 || st.StreamRecreated != 0 {
		t.Errorf("stats while missing: %+v", st)
	}
	if err := js.DeleteStream(ctx, blocker); err != nil {
		t.Fatal(err)
	}
	testwait.Forf(t, func() string { return fmt.Sprintf("the change acked: %+v", a.Stats()) }, func() bool { return a.Stats().Acked == 2 })
	ids, err := e.streamMsgIDs(b.nc)
	if err != nil || len(ids) != 1 || ids[0] != "u:2" {
		t.Errorf("the stream holds %v (%v), want [u:2]", ids, err)
	}
	if st := a.Stats(); st.StreamMissing || st.Unacked != 0 || st.StreamRecreated != 1 {
		t.Errorf("stats after: %+v, want not missing, nothing unacknowledged, re-created once", st)
	}
}

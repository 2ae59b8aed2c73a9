package natsbus

import (
	"context"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// TestBackendCallHistograms: the bus's calls to NATS record each in
// presenced_backend_call_duration_seconds{backend="nats"}: opening
// (ensure_stream), a JetStream publish once acked, a ping, a subscription
// and its end, a contact-list announcement.
func TestBackendCallHistograms(t *testing.T) {
	ops := []string{"ensure_stream", "publish", "ping", "subscribe", "unsubscribe", "announce"}
	before := map[string]uint64{}
	for _, op := range ops {
		before[op] = backendcall.New("nats", op).Count()
	}
	e := newEnv(t, testsvc.SharedNATS(t))
	a := e.open("a")
	a.Publish(event("alice", 1))
	testwait.For(t, "the publish acked", func() bool { return a.Stats().Acked == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	a.watch("bob")
	a.unwatch("bob")
	a.ContactsChanged("alice")
	testwait.For(t, "the announcement", func() bool { return a.Stats().Announced >= 1 })
	for _, op := range ops {
		if got := backendcall.New("nats", op).Count(); got <= before[op] {
			t.Errorf("nats %s: %d calls recorded before and %d after", op, before[op], got)
		}
	}
}

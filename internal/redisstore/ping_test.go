package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// TestPing: Ping answers while Redis runs, fails while it is stopped and
// answers again once it is back, with the same client.
func TestPing(t *testing.T) {
	srv := testsvc.Redis(t)
	s := newStore(t, dial(t, srv.URL), redisstore.Config{})
	ctx := t.Context()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	down, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.Ping(down); err == nil {
		t.Errorf("Ping while Redis is stopped: nil error")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.NoErr(t, "Ping after Redis is back", func() error { return s.Ping(ctx) })
}

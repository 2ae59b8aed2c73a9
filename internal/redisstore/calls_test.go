package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
)

// TestBackendCallHistograms: the store's calls to Redis record one call
// each in presenced_backend_call_duration_seconds{backend="redis"}, named
// by method (a heartbeat also by the batched script call that carries it).
func TestBackendCallHistograms(t *testing.T) {
	s := newStore(t, client(t), redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	snaps := make([]presence.Snapshot, 1)
	for _, c := range []struct {
		ops  []string
		call func() error
	}{
		{[]string{"ping"}, func() error { return s.Ping(ctx) }},
		{[]string{"ping_part"}, func() error { return s.PingPart(ctx, 0) }},
		{[]string{"load"}, func() error { return s.Load(ctx, now, &presence.Profile{UserID: "alice"}) }},
		{[]string{"beat", "beat_script"}, func() error { _, err := s.Beat(ctx, now, "alice", "d1", true); return err }},
		{[]string{"set_status"}, func() error { _, err := s.SetStatus(ctx, now, "alice", presence.ManualBusy, "x"); return err }},
		{[]string{"set_settings"}, func() error { _, err := s.SetSettings(ctx, now, "alice", &presence.Settings{}); return err }},
		{[]string{"get"}, func() error { return s.Get(ctx, now, []string{"alice"}, snaps) }},
		{[]string{"debug"}, func() error { _, _, _, err := s.Debug(ctx, "alice"); return err }},
		{[]string{"bye"}, func() error { _, err := s.Bye(ctx, now, "alice", "d1"); return err }},
		{[]string{"expire"}, func() error { _, err := s.Expire(ctx, now+3600_000, 100, nil); return err }},
		{[]string{"dirty"}, func() error { _, err := s.Dirty(ctx, nil); return err }},
		{[]string{"check_floor"}, func() error { _, err := s.CheckFloor(ctx); return err }},
	} {
		before := make([]uint64, len(c.ops))
		for i, op := range c.ops {
			before[i] = backendcall.New("redis", op).Count()
		}
		if err := c.call(); err != nil {
			t.Fatalf("%v: %v", c.ops, err)
		}
		for i, op := range c.ops {
			if got := backendcall.New("redis", op).Count(); got <= before[i] {
				t.Errorf("redis %s: %d calls recorded before and %d after a call", op, before[i], got)
			}
		}
	}
}

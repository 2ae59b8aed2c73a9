package durabletest

import (
	"context"
	"testing"

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/presence"
)

// RunBackendCalls checks that every method of s that reaches its database
// records one call in its presenced_backend_call_duration_seconds series
// (backend: "sqlite", "postgres").
func RunBackendCalls(t *testing.T, backend string, s Store) {
	ctx := context.Background()
	for _, c := range []struct {
		op   string
		call func() error
	}{
		{"ping", func() error { return s.Ping(ctx) }},
		{"save_status", func() error { return s.SaveStatus(ctx, "alice", presence.ManualBusy, "x") }},
		{"commit_writes", func() error { return s.SaveStatus(ctx, "alice", presence.ManualAway, "") }},
		{"save_settings", func() error { return s.SaveSettings(ctx, "alice", presence.Settings{}) }},
		{"save_last_seen", func() error {
			return s.SaveLastSeen(ctx, []presence.Profile{{UserID: "alice", LastSeen: 5, PubLastSeen: 5, Version: 5}})
		}},
		{"load_profiles", func() error { return s.LoadProfiles(ctx, []string{"alice"}, func(*presence.Profile) {}) }},
		{"next_epoch", func() error { _, err := s.NextEpoch(ctx); return err }},
		{"set_contacts", func() error { return s.SetContacts(ctx, "alice", []string{"bob"}) }},
		{"add_contacts", func() error { return s.AddContacts(ctx, "alice", []string{"carol"}) }},
		{"remove_contacts", func() error { return s.RemoveContacts(ctx, "alice", []string{"carol"}) }},
		{"contacts", func() error { _, err := s.Contacts(ctx, "alice"); return err }},
		{"listed_by", func() error { return s.ListedBy(ctx, "bob", []string{"alice"}, func(string) {}) }},
	} {
		op := backendcall.New(backend, c.op)
		before := op.Count()
		if err := c.call(); err != nil {
			t.Fatalf("%s: %v", c.op, err)
		}
		if got := op.Count(); got <= before {
			t.Errorf("%s %s: %d calls recorded before and %d after a call", backend, c.op, before, got)
		}
	}
}

package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/writegate"
)

// TestContactWritesQueue: contact-list writes hold at most half the
// pool's connections and wait in a bounded queue — one more is refused
// at once with writegate.ErrBusy, changing nothing — while status writes
// go on past them.
func TestContactWritesQueue(t *testing.T) {
	s, err := Open(t.Context(), Config{URL: newDatabase(t), MaxConns: 2, MaxQueuedContactWrites: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	// A contact-list write in progress holds the one slot (2 connections / 2).
	if err := s.lists.Enter(ctx, writegate.Bulk); err != nil {
		t.Fatal(err)
	}
	queued := func(n int) {
		t.Helper()
		testwait.Forf(t, func() string { return fmt.Sprintf("%d contact-list writes waiting; %d are", n, s.lists.Stats().Queued) },
			func() bool { return s.lists.Stats().Queued == n })
	}
	errs := make(chan error, 2)
	for i, owner := range []string{"a", "b"} {
		go func() { errs <- s.SetContacts(ctx, owner, []string{"x"}) }()
		queued(i + 1)
	}
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"SetContacts", func() error { return s.SetContacts(ctx, "c", []string{"x"}) }},
		{"AddContacts", func() error { return s.AddContacts(ctx, "c", []string{"x"}) }},
		{"RemoveContacts", func() error { return s.RemoveContacts(ctx, "a", []string{"x"}) }},
	} {
		err := op.call()
		if !errors.Is(err, writegate.ErrBusy) {
			t.Fatalf("%s with the queue full: %v, want writegate.ErrBusy", op.name, err)
		}
		if !strings.Contains(err.Error(), "too many writes are waiting for the durable store") {
			t.Errorf("%s: error %q does not say why", op.name, err)
		}
	}
	// Statuses and settings do not wait for contact-list writes.
	if err := s.SaveStatus(ctx, "s", presence.ManualBusy, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveSettings(ctx, "s", presence.Settings{Status: presence.Contacts}); err != nil {
		t.Fatal(err)
	}
	if n := s.lists.Stats().Queued; n != 2 {
		t.Fatalf("contact-list writes waiting after the status: %d, want 2", n)
	}
	s.lists.Leave()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for owner, want := range map[string][]string{"a": {"x"}, "b": {"x"}, "c": {}} {
		if got, err := s.Contacts(ctx, owner); err != nil || !slices.Equal(got, want) {
			t.Errorf("contacts of %s: %q, %v; want %q", owner, got, err, want)
		}
	}
}

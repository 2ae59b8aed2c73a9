package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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

// TestStatusWritesPassReads: a status or settings write does not queue
// for a connection behind reads. Every connection of the pool is held by
// a read that cannot finish (contacts is locked by another session) and
// more reads wait for one — the shape of a reconnect storm, each
// resubscribe reading its relations — yet statuses and settings commit,
// and the reads finish once the lock goes.
func TestStatusWritesPassReads(t *testing.T) {
	url := newDatabase(t)
	s, err := Open(t.Context(), Config{URL: url, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	lock, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	const reads = 6
	errs := make(chan error, reads)
	for i := range reads {
		go func() {
			errs <- s.ListedBy(ctx, "v"+strconv.Itoa(i), []string{"a", "b"}, func(string) {})
		}()
	}
	testwait.Forf(t, func() string {
		st := s.pool.Stat()
		return fmt.Sprintf("every connection held by a read blocked by the lock: %d of %d acquired", st.AcquiredConns(), st.TotalConns())
	}, func() bool {
		st := s.pool.Stat()
		return st.AcquiredConns() == 2 && st.TotalConns() == 2 && blockedReads(ctx, url) == 2
	})

	done := make(chan error, 1)
	go func() {
		if err := s.SaveStatus(ctx, "s", presence.ManualBusy, "here"); err != nil {
			done <- err
			return
		}
		done <- s.SaveSettings(ctx, "s", presence.Settings{Status: presence.Contacts})
	}()
	var werr error
	testwait.For(t, "the status and settings written while the reads wait", func() bool {
		select {
		case werr = <-done:
			return true
		default:
			return false
		}
	})
	if werr != nil {
		t.Fatal(werr)
	}
	if n := blockedReads(ctx, url); n != 2 {
		t.Fatalf("reads blocked by the lock after the writes: %d, want 2 (still)", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range reads {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var got *presence.Profile
	if err := s.LoadProfiles(ctx, []string{"s"}, func(p *presence.Profile) { c := *p; got = &c }); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.Manual != presence.ManualBusy || got.Text != "here" || got.Settings.Status != presence.Contacts {
		t.Fatalf("profile of s after the writes: %+v", got)
	}
}

// blockedReads counts the sessions of the database at url that wait for
// a lock.
func blockedReads(ctx context.Context, url string) int {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return -1
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		return -1
	}
	return n
}

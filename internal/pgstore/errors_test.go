package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// TestTransient pins which errors of the driver say "PostgreSQL cannot
// serve now" (HTTP 503 at the edge) and which are bugs or refusals (500, or
// the domain's own 4xx).
func TestTransient(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"} }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"57P01 admin_shutdown", pg("57P01"), true},
		{"57P02 crash_shutdown", pg("57P02"), true},
		{"57P03 cannot_connect_now (starting up)", pg("57P03"), true},
		{"57014 query_canceled", pg("57014"), true},
		{"08006 connection_failure", pg("08006"), true},
		{"08P01 protocol_violation", pg("08P01"), true},
		{"53300 too_many_connections", pg("53300"), true},
		{"53100 disk_full", pg("53100"), true},
		{"40001 serialization_failure", pg("40001"), true},
		{"40P01 deadlock_detected", pg("40P01"), true},
		{"25006 read_only_sql_transaction", pg("25006"), true},
		{"55P03 lock_not_available", pg("55P03"), true},
		{"wrapped 57P01", fmt.Errorf("save: %w", pg("57P01")), true},
		{"conn closed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), true},
		{"EOF on a dropped connection", fmt.Errorf("failed to receive message: %w", io.EOF), true},
		{"unexpected EOF", fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"connection reset", fmt.Errorf("write: %w", syscall.ECONNRESET), true},
		{"pool acquire timeout", fmt.Errorf("acquire: %w", context.DeadlineExceeded), true},
		{"pool closed", puddle.ErrClosedPool, true},

		{"23505 unique_violation", pg("23505"), false},
		{"42601 syntax_error", pg("42601"), false},
		{"42P01 undefined_table", pg("42P01"), false},
		{"58030 io_error (needs its operator)", pg("58030"), false},
		{"the caller canceled", fmt.Errorf("q: %w", context.Canceled), false},
		{"too many contacts", fmt.Errorf("%w (the change would make 10001)", presence.ErrTooManyContacts), false},
		{"no rows", pgx.ErrNoRows, false},
		{"anything else", errors.New("boom"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := transient(tc.err); got != tc.want {
				t.Errorf("transient(%v) = %v, want %v", tc.err, got, tc.want)
			}
			// What the edge sees: the store's error, classified by the one
			// function every edge uses.
			err := fail(tc.err, "save status of %q", "u")
			if got := tracker.Unavailable(err); got != tc.want {
				t.Errorf("tracker.Unavailable(%v) = %v, want %v", err, got, tc.want)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("%v does not wrap %v", err, tc.err)
			}
		})
	}
}

// TestWriteInFlightAtShutdown: a write waiting in PostgreSQL when the
// server shuts down fails with 57P01 (admin_shutdown), and the store says
// so as Unavailable, never as an unexplained error (HTTP 500). So do the
// store's calls while the server is stopped, and after it is back every
// call either succeeds or is Unavailable (the pool's connections of before
// the restart are dead).
func TestWriteInFlightAtShutdown(t *testing.T) {
	srv := testsvc.Postgres(t)
	url := srv.NewDatabase(t)
	s := open(t, url)
	ctx := t.Context()
	if err := s.SaveStatus(ctx, "u", presence.ManualBusy, ""); err != nil {
		t.Fatal(err)
	}

	// Another session locks u's row, so the store's write waits in the
	// server until the shutdown ends it.
	locker, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM users WHERE user_id = 'u' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.SaveStatus(ctx, "u", presence.ManualAway, "") }()
	watch, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	awaitLockWait(t, watch)

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	var inFlight error
	select {
	case inFlight = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the write in flight did not return after the shutdown")
	}
	// The server ends its sessions one by one: when it ends the locker's
	// first, the write may take the lock and commit before its own session
	// is ended. That is a write that succeeded, not an error to classify.
	var pe *pgconn.PgError
	switch {
	case inFlight == nil:
		t.Log("the write in flight committed before the shutdown ended its session")
	case !errors.As(inFlight, &pe) || pe.Code != "57P01":
		t.Errorf("the write in flight failed with %v, want SQLSTATE 57P01", inFlight)
	}
	if inFlight != nil && !tracker.Unavailable(inFlight) {
		t.Errorf("the write in flight at the shutdown: %v is not Unavailable", inFlight)
	}

	down, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for name, call := range storeCalls(s) {
		if err := call(down); err == nil || !tracker.Unavailable(err) {
			t.Errorf("%s while PostgreSQL is stopped: %v, want an Unavailable error", name, err)
		}
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	for name, call := range storeCalls(s) {
		var err error
		testwait.Forf(t, func() string { return fmt.Sprintf("%s to succeed after the restart; it fails: %v", name, err) }, func() bool {
			err = call(ctx)
			return err == nil || !tracker.Unavailable(err)
		})
		if err != nil {
			t.Errorf("%s after the restart: %v is not Unavailable", name, err)
		}
	}
}

// awaitLockWait waits until some session of the server waits for a lock.
// c must not be in a transaction: one sees a single snapshot of the
// statistics for its whole life.
func awaitLockWait(t *testing.T, c *pgx.Conn) {
	t.Helper()
	testwait.For(t, "a session to wait for the row lock", func() bool {
		var n int
		if err := c.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// storeCalls are one call of each method of the store.
func storeCalls(s *Store) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"Ping": s.Ping,
		"LoadProfiles": func(ctx context.Context) error {
			return s.LoadProfiles(ctx, []string{"u"}, func(*presence.Profile) {})
		},
		"SaveStatus":   func(ctx context.Context) error { return s.SaveStatus(ctx, "u", presence.ManualBusy, "") },
		"SaveSettings": func(ctx context.Context) error { return s.SaveSettings(ctx, "u", presence.Settings{}) },
		"SaveLastSeen": func(ctx context.Context) error {
			return s.SaveLastSeen(ctx, []presence.Profile{{UserID: "u", LastSeen: 1}})
		},
		"NextEpoch":      func(ctx context.Context) error { _, err := s.NextEpoch(ctx); return err },
		"SetContacts":    func(ctx context.Context) error { return s.SetContacts(ctx, "u", []string{"v"}) },
		"AddContacts":    func(ctx context.Context) error { return s.AddContacts(ctx, "u", []string{"w"}) },
		"RemoveContacts": func(ctx context.Context) error { return s.RemoveContacts(ctx, "u", []string{"w"}) },
		"Contacts":       func(ctx context.Context) error { _, err := s.Contacts(ctx, "u"); return err },
		"ListedBy": func(ctx context.Context) error {
			return s.ListedBy(ctx, "v", []string{"u"}, func(string) {})
		},
	}
}

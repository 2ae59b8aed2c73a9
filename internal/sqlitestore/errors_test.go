package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/tracker"
)

// TestBusyIsUnavailable: the file locked by another process past the busy
// timeout is transient — Unavailable, HTTP 503 — and records no failure
// of the storage.
func TestBusyIsUnavailable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "presenced.db")
	s := open(t, path)
	ctx := t.Context()
	// Another process's connection holds the write lock; a third one that
	// does not wait meets SQLITE_BUSY at once (the store's own connections
	// wait busyTimeoutMS, too long for a test).
	holder, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	conn, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK")
	impatient, err := sql.Open("sqlite", "file:"+filepath.ToSlash(path)+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer impatient.Close()
	_, busy := impatient.ExecContext(ctx, `UPDATE meta SET value = value`)
	if busy == nil || kind(busy) != failBusy {
		t.Fatalf("a write while another connection holds the lock: %v, want SQLITE_BUSY", busy)
	}
	err = s.fail(busy, "save status of %q", "u")
	if !tracker.Unavailable(err) {
		t.Errorf("%v is not Unavailable", err)
	}
	if s.fault.Load() != nil {
		t.Errorf("a busy file recorded a storage failure")
	}
}

// TestFullStorage: a disk that is full (SQLITE_FULL, here from a page limit
// on the writer connection) is not transient: the write fails with an
// error that is not Unavailable (HTTP 500, the detail in the log), Ping
// reports the failure (the node is not ready) until the storage takes
// writes again, and its probe leaves nothing behind.
func TestFullStorage(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "presenced.db"))
	ctx := t.Context()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping of a new store: %v", err)
	}
	var pages int
	if err := s.w.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
		t.Fatal(err)
	}
	// Contact lists grow until a page more is needed.
	var full error
	for i := 0; full == nil && i < 1000; i++ {
		contacts := make([]string, 50)
		for j := range contacts {
			contacts[j] = fmt.Sprintf("contact-%04d-%02d-%s", i, j, strings.Repeat("x", 40))
		}
		full = s.AddContacts(ctx, fmt.Sprintf("owner-%04d", i), contacts)
	}
	if full == nil || kind(errors.Unwrap(full)) != failStorage {
		t.Fatalf("writes into a full database: %v, want SQLITE_FULL", full)
	}
	if tracker.Unavailable(full) {
		t.Errorf("a full disk is Unavailable (%v): it is not transient", full)
	}
	if err := s.Ping(ctx); err == nil {
		t.Errorf("Ping after writes failed for a full disk: nil, want the failure")
	}

	if err := s.Ping(ctx); err == nil {
		t.Errorf("Ping again, the disk still full: nil, want the failure")
	}

	if _, err := s.w.ExecContext(ctx, "PRAGMA max_page_count = 1000000"); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping once the storage takes writes again: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping once the storage took a write again: %v", err)
	}
	if err := s.AddContacts(ctx, "owner-after", []string{"a"}); err != nil {
		t.Errorf("a write once the storage takes writes again: %v", err)
	}
	var probes int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM meta WHERE key = 'ping'`).Scan(&probes); err != nil || probes != 0 {
		t.Errorf("Ping's probe left %d rows (%v)", probes, err)
	}
}

// TestDamagedFileRefused: a file whose pages were overwritten is refused at
// Open with a message that says what to do, instead of failing reads and
// writes later.
func TestDamagedFileRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "presenced.db")
	s, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		contacts := make([]string, 20)
		for j := range contacts {
			contacts[j] = fmt.Sprintf("contact-%03d-%02d-%s", i, j, strings.Repeat("x", 40))
		}
		if err := s.SetContacts(t.Context(), fmt.Sprintf("owner-%03d", i), contacts); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A clean file opens.
	s, err = Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatalf("a sound file: %v", err)
	}
	s.Close()

	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	const page = 4096
	if st.Size() < 20*page {
		t.Fatalf("the file has only %d bytes", st.Size())
	}
	junk := []byte(strings.Repeat("\xde\xad\xbe\xef", 2*page/4))
	if _, err := f.WriteAt(junk, st.Size()/2/page*page); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = Open(t.Context(), Config{Path: path})
	if err == nil || !strings.Contains(err.Error(), "is damaged") || !strings.Contains(err.Error(), "restore it from a backup") {
		t.Fatalf("Open of a damaged file: %v, want it refused as damaged", err)
	}
}

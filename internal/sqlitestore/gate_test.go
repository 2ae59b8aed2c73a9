package sqlitestore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/writegate"
)

// TestContactWritesQueue: contact-list writes wait for the writer in a
// bounded queue — one more is refused at once with writegate.ErrBusy,
// changing nothing — and a status write that comes after them is
// committed before them (triggers log the order the writer ran them in).
func TestContactWritesQueue(t *testing.T) {
	s, err := Open(t.Context(), Config{Path: filepath.Join(t.TempDir(), "presenced.db"), MaxQueuedContactWrites: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, q := range []string{
		`CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, what TEXT NOT NULL)`,
		`CREATE TRIGGER log_users AFTER INSERT ON users BEGIN INSERT INTO log (what) VALUES ('status ' || NEW.user_id); END`,
		`CREATE TRIGGER log_contacts AFTER INSERT ON contacts BEGIN INSERT INTO log (what) VALUES ('contacts ' || NEW.user_id); END`,
	} {
		if _, err := s.w.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	// A write in progress holds the writer.
	if err := s.gate.Enter(ctx, writegate.Urgent); err != nil {
		t.Fatal(err)
	}
	queued := func(n int) {
		t.Helper()
		testwait.Forf(t, func() string {
			return fmt.Sprintf("%d writes waiting for the writer; %d are", n, s.gate.Stats().Queued)
		},
			func() bool { return s.gate.Stats().Queued == n })
	}
	errs := make(chan error, 3)
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
	// A status write is never refused and goes first.
	go func() { errs <- s.SaveStatus(ctx, "s", presence.ManualBusy, "") }()
	queued(3)
	s.gate.Leave()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	rows, err := s.r.Query(`SELECT what FROM log ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var order []string
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			t.Fatal(err)
		}
		order = append(order, w)
	}
	if want := []string{"status s", "contacts a", "contacts b"}; strings.Join(order, ",") != strings.Join(want, ",") {
		t.Errorf("the writer ran %q, want %q", order, want)
	}
	if got, err := s.Contacts(ctx, "c"); err != nil || len(got) != 0 {
		t.Errorf("contacts of c after refused writes: %q, %v; want none", got, err)
	}
}

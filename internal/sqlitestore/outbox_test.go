package sqlitestore

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/presenced/presenced/internal/backendcall"
)

// TestOutbox: entries are read back in order after a reopen; the cursors
// survive it, and the entries every cursor is past are gone.
func TestOutbox(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "presenced.db")
	s := open(t, path)
	if last, cur, err := s.OutboxState(ctx); err != nil || last != 0 || len(cur) != 0 {
		t.Fatalf("a new outbox: last %d, cursors %v, err %v", last, cur, err)
	}
	var entries [][]byte
	for i := range 10 {
		entries = append(entries, fmt.Appendf(nil, `{"n":%d}`, i+1))
	}
	if err := s.AppendOutbox(ctx, 1, entries[:4]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendOutbox(ctx, 5, entries[4:]); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path)
	read := func(after uint64, max int) string {
		t.Helper()
		var got string
		if err := s.ReadOutbox(ctx, after, max, func(seq uint64, data []byte) { got += fmt.Sprintf("%d=%s ", seq, data) }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got, want := read(7, 10), `8={"n":8} 9={"n":9} 10={"n":10} `; got != want {
		t.Errorf("read after 7: %q, want %q", got, want)
	}
	if got, want := read(0, 2), `1={"n":1} 2={"n":2} `; got != want {
		t.Errorf("read the first 2: %q, want %q", got, want)
	}
	if err := s.SetOutboxCursors(ctx, map[string]uint64{"a": 6, "b": 3}); err != nil {
		t.Fatal(err)
	}
	if got, want := read(0, 2), `4={"n":4} 5={"n":5} `; got != want {
		t.Errorf("after cursors 6 and 3: %q, want %q (1–3 removed)", got, want)
	}
	// One endpoint removed, the other past everything: the outbox is
	// empty, and the next number still follows the last one.
	if err := s.SetOutboxCursors(ctx, map[string]uint64{"a": 10}); err != nil {
		t.Fatal(err)
	}
	if got := read(0, 100); got != "" {
		t.Errorf("everything delivered, the outbox holds %q", got)
	}
	s.Close()
	s = open(t, path)
	last, cur, err := s.OutboxState(ctx)
	if err != nil || last != 10 || len(cur) != 1 || cur["a"] != 10 {
		t.Errorf("after a reopen: last %d, cursors %v, err %v; want 10, a=10", last, cur, err)
	}
}

// TestOutboxBackendCalls: each outbox method records its backend call.
func TestOutboxBackendCalls(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "presenced.db"))
	for _, c := range []struct {
		op   string
		call func() error
	}{
		{"append_outbox", func() error { return s.AppendOutbox(ctx, 1, [][]byte{[]byte("{}")}) }},
		{"read_outbox", func() error { return s.ReadOutbox(ctx, 0, 1, func(uint64, []byte) {}) }},
		{"outbox_state", func() error { _, _, err := s.OutboxState(ctx); return err }},
		{"set_outbox_cursors", func() error { return s.SetOutboxCursors(ctx, map[string]uint64{"a": 1}) }},
	} {
		op := backendcall.New("sqlite", c.op)
		before := op.Count()
		if err := c.call(); err != nil {
			t.Fatalf("%s: %v", c.op, err)
		}
		if op.Count() <= before {
			t.Errorf("%s: no call recorded", c.op)
		}
	}
}

package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/presenced/presenced/internal/durabletest"
	"github.com/presenced/presenced/internal/presence"
)

func open(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(context.Background(), Config{Path: path})
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	durabletest.Run(t, func(t *testing.T) durabletest.Store {
		return open(t, filepath.Join(t.TempDir(), "presenced.db"))
	})
}

// TestPoisoned: writes committed together fail or succeed each on its own
// (a trigger refuses one kind of write).
func TestPoisoned(t *testing.T) {
	durabletest.RunPoisoned(t, func(t *testing.T) durabletest.Store {
		s := open(t, filepath.Join(t.TempDir(), "presenced.db"))
		for _, when := range []string{"INSERT", "UPDATE"} {
			if _, err := s.w.Exec(`CREATE TRIGGER poison_` + when + ` BEFORE ` + when + ` ON users
				WHEN NEW.status_text = '` + durabletest.Poison + `' BEGIN SELECT RAISE(ABORT, 'poisoned'); END`); err != nil {
				t.Fatal(err)
			}
		}
		return s
	})
}

// TestCloseCommitsQueuedWrites: writes racing with Close either are
// durable or fail; none hangs; after Close every write fails.
func TestCloseCommitsQueuedWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "presenced.db")
	s := open(t, path)
	ctx := context.Background()
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = s.SaveStatus(ctx, fmt.Sprint(i), presence.ManualBusy, "queued") })
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	if err := s.SaveStatus(ctx, "late", presence.ManualBusy, ""); err == nil {
		t.Errorf("SaveStatus after Close: got nil error, want one")
	}
	s = open(t, path)
	found := map[string]bool{}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(i)
	}
	if err := s.LoadProfiles(ctx, ids, func(p *presence.Profile) { found[p.UserID] = true }); err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err == nil && !found[ids[i]] {
			t.Errorf("write %d returned nil before Close but is not durable", i)
		}
		if err != nil && found[ids[i]] {
			t.Errorf("write %d failed (%v) but is durable", i, err)
		}
	}
}

// TestReopen checks that everything written survives a Close and an Open
// of the same file, and that the schema is current.
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "presenced.db")
	s := durabletest.RunReopen(t, func(t *testing.T) durabletest.Store { return open(t, path) }).(*Store)
	if v := pragma(t, s.w, "user_version"); v != fmt.Sprint(len(migrations)) {
		t.Errorf("user_version = %s, want %d", v, len(migrations))
	}
}

func TestOpenSettings(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "presenced.db"))
	tests := []struct {
		db     *sql.DB
		pragma string
		want   string
	}{
		{s.w, "journal_mode", "wal"},
		{s.w, "synchronous", "2"}, // FULL
		{s.w, "busy_timeout", fmt.Sprint(busyTimeoutMS)},
		{s.r, "journal_mode", "wal"},
		{s.r, "busy_timeout", fmt.Sprint(busyTimeoutMS)},
		{s.r, "query_only", "1"},
	}
	for _, tc := range tests {
		if got := pragma(t, tc.db, tc.pragma); got != tc.want {
			t.Errorf("PRAGMA %s = %q, want %q", tc.pragma, got, tc.want)
		}
	}
}

// TestOpenPath checks that the parent directory is created and that no
// character of a path is taken for a driver parameter.
func TestOpenPath(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{
		"a/b/c/presenced.db",
		"with space/p.db",
		"q?mode=ro&_pragma=query_only(1)/p.db",
		"hash#frag/p%20.db",
	} {
		path := filepath.Join(dir, name)
		s := open(t, path)
		if err := s.SaveStatus(t.Context(), "u", presence.ManualBusy, ""); err != nil {
			t.Errorf("%q: SaveStatus: %v", name, err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("%q: Close: %v", name, err)
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%q: database file: %v", name, err)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(t.Context(), Config{}); err == nil {
		t.Errorf("Open without a path: got nil error, want one")
	}

	// A database written by a newer binary is refused, not downgraded.
	path := filepath.Join(t.TempDir(), "newer.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", len(migrations)+1)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if s, err := Open(t.Context(), Config{Path: path}); err == nil {
		s.Close()
		t.Errorf("Open of a database with a newer schema: got nil error, want one")
	}

	// Not a database at all.
	junk := filepath.Join(t.TempDir(), "junk.db")
	if err := os.WriteFile(junk, []byte(strings.Repeat("not a database ", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(t.Context(), Config{Path: junk}); err == nil {
		s.Close()
		t.Errorf("Open of a file that is no database: got nil error, want one")
	}
}

// TestQueryPlans checks that every read is an index search, never a scan.
func TestQueryPlans(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "presenced.db"))
	tests := []struct {
		name, query string
		args        []any
		want        string
	}{
		{"LoadProfiles", loadProfilesQuery(3), []any{"a", "b", "c"}, "SEARCH users USING PRIMARY KEY"},
		{"ListedBy", listedByQuery(3), []any{"v", "a", "b", "c"}, "SEARCH contacts USING COVERING INDEX contacts_by_contact (contact_id=? AND user_id=?)"},
		{"Contacts", contactsQuery, []any{"a"}, "SEARCH contacts USING PRIMARY KEY (user_id=?)"},
	}
	for _, tc := range tests {
		rows, err := s.r.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+tc.query, tc.args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if len(plan) != 1 || !strings.HasPrefix(plan[0], tc.want) {
			t.Errorf("%s: query plan %q, want one step %q", tc.name, plan, tc.want)
		}
	}
}

func pragma(t *testing.T, db *sql.DB, name string) string {
	t.Helper()
	var v string
	if err := db.QueryRowContext(t.Context(), "PRAGMA "+name).Scan(&v); err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return v
}

// BenchmarkSaveLastSeen measures a group commit of a checkpoint: every
// iteration moves every user of the batch forwards, so each row is
// really rewritten.
func BenchmarkSaveLastSeen(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			s := open(b, filepath.Join(b.TempDir(), "presenced.db"))
			ctx := context.Background()
			batch := make([]presence.Profile, n)
			for i := range batch {
				batch[i].UserID = fmt.Sprintf("user%07d", i)
			}
			now := int64(1_700_000_000_000)
			step := func() {
				now++
				for i := range batch {
					batch[i].LastSeen, batch[i].PubLastSeen, batch[i].Version = now, now, uint64(now)*1000
				}
			}
			step() // first write inserts; the loop measures updates
			if err := s.SaveLastSeen(ctx, batch); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			iters := 0
			for b.Loop() {
				step() // tens of µs against milliseconds of SQL
				if err := s.SaveLastSeen(ctx, batch); err != nil {
					b.Fatal(err)
				}
				iters++
			}
			b.ReportMetric(float64(iters*n)/b.Elapsed().Seconds(), "profiles/s")
		})
	}
}

// TestFileMode: the database holds who is whose contact; only its owner
// may read it.
func TestFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.db")
	s, err := Open(context.Background(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SaveStatus(context.Background(), "u", presence.ManualBusy, ""); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if mode := fi.Mode().Perm(); mode&0o077 != 0 {
			t.Errorf("%s has mode %o, want no access for group and others", filepath.Base(p), mode)
		}
	}
}

// BenchmarkSaveStatus: the durable write of a set_status, alone and with
// other writers at once (internal/durabletest.BenchStatus).
func BenchmarkSaveStatus(b *testing.B) {
	durabletest.BenchStatus(b, func(b *testing.B) durabletest.Store {
		return open(b, filepath.Join(b.TempDir(), "presenced.db"))
	})
}

// BenchmarkSetContacts: replacing a 10,000-entry contact list
// (internal/durabletest.BenchSetContacts).
func BenchmarkSetContacts(b *testing.B) {
	durabletest.BenchSetContacts(b, func(b *testing.B) durabletest.Store {
		return open(b, filepath.Join(b.TempDir(), "presenced.db"))
	})
}

package pgstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/presenced/presenced/internal/durabletest"
	"github.com/presenced/presenced/internal/presence"
)

func open(t testing.TB, url string) *Store {
	t.Helper()
	s, err := Open(context.Background(), Config{URL: url})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	durabletest.Run(t, func(t *testing.T) durabletest.Store {
		return open(t, newDatabase(t))
	})
}

// TestReopen checks that everything written survives a Close and an Open
// of the same database, and that the schema is current.
// TestPoisoned: concurrent writes fail or succeed each on its own (a
// trigger refuses one kind of write).
func TestPoisoned(t *testing.T) {
	durabletest.RunPoisoned(t, func(t *testing.T) durabletest.Store {
		s := open(t, newDatabase(t))
		if _, err := s.pool.Exec(t.Context(), `CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.status_text = '`+durabletest.Poison+`' THEN RAISE EXCEPTION 'poisoned'; END IF;
				RETURN NEW;
			END $$;
			CREATE TRIGGER poison BEFORE INSERT OR UPDATE ON users FOR EACH ROW EXECUTE FUNCTION poison()`); err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestReopen(t *testing.T) {
	url := newDatabase(t)
	s := durabletest.RunReopen(t, func(t *testing.T) durabletest.Store { return open(t, url) }).(*Store)
	if v := schemaVersion(t, s); v != len(migrations) {
		t.Errorf("schema version = %d, want %d", v, len(migrations))
	}
}

// TestConcurrentOpen: nodes starting at once against a new database
// migrate it once, and all of them work.
func TestConcurrentOpen(t *testing.T) {
	url := newDatabase(t)
	const nodes = 8
	stores := make([]*Store, nodes)
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			stores[i], errs[i] = Open(t.Context(), Config{URL: url, MaxConns: 2})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open #%d: %v", i, err)
		}
		t.Cleanup(func() { stores[i].Close() })
	}
	epochs := make([]uint64, nodes)
	for i, s := range stores {
		e, err := s.NextEpoch(t.Context())
		if err != nil {
			t.Fatalf("store %d: NextEpoch: %v", i, err)
		}
		epochs[i] = e
	}
	// One meta row: the epochs of the nodes are 1..nodes in some order.
	slices.Sort(epochs)
	for i, e := range epochs {
		if e != uint64(i+1) {
			t.Fatalf("epochs of %d nodes = %v, want 1..%d", nodes, epochs, nodes)
		}
	}
	if v := schemaVersion(t, stores[0]); v != len(migrations) {
		t.Errorf("schema version = %d, want %d", v, len(migrations))
	}
	var rows int
	if err := stores[0].pool.QueryRow(t.Context(), `SELECT count(*) FROM schema_version`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("schema_version holds %d rows (%v), want 1", rows, err)
	}
	// Reopening an up-to-date database changes nothing.
	again := open(t, url)
	if v := schemaVersion(t, again); v != len(migrations) {
		t.Errorf("after reopen schema version = %d, want %d", v, len(migrations))
	}
}

// TestConcurrentOverlappingBatches: checkpoints of many nodes name the same
// users in different orders, at once. Upserts that lock rows in the
// callers' orders deadlock (PostgreSQL aborts one: SQLSTATE 40P01); the
// store sorts every batch, so none may fail, and the newest values win.
func TestConcurrentOverlappingBatches(t *testing.T) {
	s := open(t, newDatabase(t))
	ctx := t.Context()
	const (
		writers = 8
		rounds  = 15
		users   = 2000
	)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			batch := make([]presence.Profile, 0, users+users/10)
			for r := range rounds {
				batch = batch[:0]
				v := int64(r*writers + w + 1)
				// Most users, some twice (an older checkpoint too).
				for u := range users {
					if rng.IntN(4) == 0 {
						continue
					}
					id := fmt.Sprintf("user%05d", u)
					batch = append(batch, presence.Profile{UserID: id, LastSeen: v, PubLastSeen: v, Version: uint64(v)})
					if rng.IntN(10) == 0 {
						batch = append(batch, presence.Profile{UserID: id, LastSeen: v - 1, PubLastSeen: 0, Version: 1})
					}
				}
				rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
				if err := s.SaveLastSeen(ctx, batch); err != nil {
					errs <- fmt.Errorf("writer %d round %d: %w", w, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	// Every user was in some batch of the last round with high probability;
	// at least, nothing may be below what some writer wrote last, and
	// every value must be one that was written.
	ids := make([]string, users)
	for u := range ids {
		ids[u] = fmt.Sprintf("user%05d", u)
	}
	n := 0
	err := s.LoadProfiles(ctx, ids, func(p *presence.Profile) {
		n++
		if p.LastSeen != p.PubLastSeen || uint64(p.LastSeen) != p.Version || p.LastSeen < 1 || p.LastSeen > rounds*writers {
			t.Errorf("%s: mixed or foreign values %+v", p.UserID, *p)
		}
		if p.LastSeen <= (rounds-1)*writers {
			t.Errorf("%s: last_seen %d, from before the last round (> %d)", p.UserID, p.LastSeen, (rounds-1)*writers)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != users {
		t.Errorf("found %d users, want %d", n, users)
	}
}

// TestBatchColumns: a checkpoint reaches the database sorted by id in byte
// order, each user once with the largest of each value; the caller's batch
// is left alone.
func TestBatchColumns(t *testing.T) {
	batch := []presence.Profile{
		{UserID: "b", LastSeen: 1, PubLastSeen: 9, Version: 5},
		{UserID: "é", LastSeen: 4, PubLastSeen: 4, Version: 4},
		{UserID: "B", LastSeen: 2, PubLastSeen: 2, Version: 2},
		{UserID: "b", LastSeen: 7, PubLastSeen: 3, Version: 1 << 62},
		{UserID: "a", LastSeen: 3, PubLastSeen: 3, Version: 3},
		{UserID: "b", LastSeen: 6, PubLastSeen: 8, Version: 6},
	}
	orig := slices.Clone(batch)
	var b lastSeenBatch
	b.columns(batch)
	if want := []string{"B", "a", "b", "é"}; !slices.Equal(b.ids, want) {
		t.Errorf("ids = %q, want %q", b.ids, want)
	}
	if want := []int64{2, 3, 7, 4}; !slices.Equal(b.lastSeen, want) {
		t.Errorf("last_seen = %v, want %v", b.lastSeen, want)
	}
	if want := []int64{2, 3, 9, 4}; !slices.Equal(b.pubLastSeen, want) {
		t.Errorf("pub_last_seen = %v, want %v", b.pubLastSeen, want)
	}
	if want := []int64{2, 3, 1 << 62, 4}; !slices.Equal(b.versions, want) {
		t.Errorf("versions = %v, want %v", b.versions, want)
	}
	if !slices.Equal(batch, orig) {
		t.Errorf("columns changed the caller's batch")
	}
	// Reused for a smaller batch: nothing of the previous one is left.
	b.columns(batch[:1])
	if len(b.ids) != 1 || b.ids[0] != "b" || b.lastSeen[0] != 1 {
		t.Errorf("reused: ids %q last_seen %v, want [b] [1]", b.ids, b.lastSeen)
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := t.Context()
	if _, err := Open(ctx, Config{}); err == nil {
		t.Errorf("Open without a URL: got nil error, want one")
	}
	if _, err := Open(ctx, Config{URL: "postgres://u:secret@127.0.0.1:1/x?sslmode=bogus"}); err == nil {
		t.Errorf("Open of an invalid URL: got nil error, want one")
	} else if strings.Contains(err.Error(), "secret") {
		t.Errorf("Open of an invalid URL: the error %q shows the password", err)
	}

	url := newDatabase(t)
	if _, err := Open(ctx, Config{URL: url, MaxConns: -1}); err == nil {
		t.Errorf("Open with MaxConns -1: got nil error, want one")
	}

	// A database migrated by a newer binary is refused, not downgraded.
	s := open(t, url)
	if _, err := s.pool.Exec(ctx, `UPDATE schema_version SET version = $1`, len(migrations)+1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err := Open(ctx, Config{URL: url}); err == nil {
		s.Close()
		t.Errorf("Open of a database with a newer schema: got nil error, want one")
	}
}

// TestMaxConns: Config.MaxConns bounds the pool.
func TestMaxConns(t *testing.T) {
	s, err := Open(t.Context(), Config{URL: newDatabase(t), MaxConns: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.pool.Config().MaxConns; got != 3 {
		t.Errorf("MaxConns = %d, want 3", got)
	}
}

// TestQueryPlans checks that the reads are index searches, never scans of
// a table (with enough rows that the planner prefers the index).
func TestQueryPlans(t *testing.T) {
	s := open(t, newDatabase(t))
	ctx := t.Context()
	batch := make([]presence.Profile, 20000)
	for i := range batch {
		batch[i] = presence.Profile{UserID: fmt.Sprintf("u%05d", i), LastSeen: 1}
		if i < 2000 {
			if err := s.AddContacts(ctx, batch[i].UserID, []string{"a", "b", "c", "d", "e"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.SaveLastSeen(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, query string
		args        []any
		want        string
	}{
		{"LoadProfiles", loadProfilesQuery, []any{[]string{"u00001", "u00002"}}, "Index Scan using users_pkey on users"},
		{"ListedBy", listedByQuery, []any{"a", []string{"u00001", "u00002"}}, "Index Only Scan using contacts_"}, // either index serves it,
		{"Contacts", contactsQuery, []any{"u00001"}, "Index Only Scan using contacts_pkey on contacts"},
	}
	for _, tc := range tests {
		rows, err := s.pool.Query(ctx, "EXPLAIN "+tc.query, tc.args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !strings.Contains(plan[0], tc.want) {
			t.Errorf("%s: query plan %q, want %q", tc.name, plan, tc.want)
		}
	}
}

// BenchmarkSaveLastSeen measures a group commit of a checkpoint: every
// iteration moves every user of the batch forwards, so each row is
// really rewritten.
func BenchmarkSaveLastSeen(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			s := open(b, newDatabase(b))
			ctx := context.Background()
			batch := make([]presence.Profile, n)
			for i := range batch {
				batch[i].UserID = fmt.Sprintf("user%07d", i)
			}
			// Checkpoints arrive in no order: the dirty set of a shard map.
			rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
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
				step()
				if err := s.SaveLastSeen(ctx, batch); err != nil {
					b.Fatal(err)
				}
				iters++
			}
			b.ReportMetric(float64(iters*n)/b.Elapsed().Seconds(), "profiles/s")
		})
	}
}

func schemaVersion(t *testing.T, s *Store) int {
	t.Helper()
	var v int
	if err := s.pool.QueryRow(t.Context(), `SELECT version FROM schema_version`).Scan(&v); err != nil {
		t.Fatalf("read schema version: %v", err)
	}
	return v
}

// BenchmarkSaveStatus: the durable write of a set_status, alone and with
// other writers at once (internal/durabletest.BenchStatus). The test
// server runs with fsync off; PRESENCED_BENCH_POSTGRES_URL names a
// database of a server that syncs its commits, as in production.
func BenchmarkSaveStatus(b *testing.B) {
	durabletest.BenchStatus(b, func(b *testing.B) durabletest.Store {
		if url := os.Getenv("PRESENCED_BENCH_POSTGRES_URL"); url != "" {
			return open(b, url)
		}
		return open(b, newDatabase(b))
	})
}

// BenchmarkSetContacts: replacing a 10,000-entry contact list
// (internal/durabletest.BenchSetContacts).
func BenchmarkSetContacts(b *testing.B) {
	durabletest.BenchSetContacts(b, func(b *testing.B) durabletest.Store {
		return open(b, newDatabase(b))
	})
}

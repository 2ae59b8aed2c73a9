package replica

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// population is a Source of n users "u0"… online.
type population int

func (p population) ScanReads(_ context.Context, fn func(string, *presence.Snapshot)) error {
	for i := range int(p) {
		id := "u" + strconv.Itoa(i)
		fn(id, &presence.Snapshot{UserID: id, Known: true, Status: presence.Online, Version: uint64(i + 1)})
	}
	return nil
}

func (p population) ReadPublished(_ context.Context, ids []string, out []presence.Snapshot) error {
	for i, id := range ids {
		n, err := strconv.Atoi(id[1:])
		if err != nil || n >= int(p) {
			out[i] = presence.Snapshot{UserID: id}
			continue
		}
		out[i] = presence.Snapshot{UserID: id, Known: true, Status: presence.Online, Version: uint64(n + 1),
			Devices: 1, LastSeen: 1_700_000_000_000, PubLastSeen: 1_700_000_000_000}
		if n%10 == 0 { // a tenth have a status text
			out[i].Text = "in a meeting until 3"
		}
	}
	return nil
}

// BenchmarkGet1000 reads 1,000 random users among 1,000,000 from a
// replica that holds all of them — filled, or bounded to a million and
// read through once — and reports the heap it holds per user; "full
// views" reads them with GetFull, every user's full view kept (a tenth
// with a status text).
func BenchmarkGet1000(b *testing.B) {
	b.Run("filled", func(b *testing.B) { benchGet1000(b, 0, false) })
	b.Run("bounded", func(b *testing.B) { benchGet1000(b, 1_000_000, false) })
	b.Run("full views", func(b *testing.B) { benchGet1000(b, 1_000_000, true) })
}

func benchGet1000(b *testing.B, limit int, full bool) {
	const users = 1_000_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, err := New(Config{Source: population(users), Max: limit, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	<-r.wake
	if err := r.fill(context.Background()); err != nil {
		b.Fatal(err)
	}
	r.filled.Store(r.asked.Load())
	r.NotesUp(true)
	get := r.Get
	if full {
		get = r.GetFull
	}
	if limit > 0 { // read everyone through once
		ids := make([]string, 1000)
		out := make([]presence.Snapshot, len(ids))
		for lo := 0; lo < users; lo += len(ids) {
			for j := range ids {
				ids[j] = "u" + strconv.Itoa(lo+j)
			}
			if err := get(context.Background(), 0, ids, out); err != nil {
				b.Fatal(err)
			}
		}
		if st := r.Stats(); st.Users != users || st.Evicted != 0 {
			b.Fatalf("%+v after reading everyone, want %d users, none evicted", st, users)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// A collection with the replica the only live data: what marking it
	// costs (the replica holds no pointers, so almost nothing).
	start := time.Now()
	runtime.GC()
	gc := time.Since(start)
	rng := rand.New(rand.NewPCG(1, 2))
	batches := make([][]string, 64)
	for i := range batches {
		batches[i] = make([]string, 1000)
		for j := range batches[i] {
			batches[i][j] = "u" + strconv.Itoa(rng.IntN(users))
		}
	}
	out := make([]presence.Snapshot, 1000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := get(context.Background(), 0, batches[i%len(batches)], out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/users, "heap-B/user")
	b.ReportMetric(float64(gc.Microseconds())/1000, "gc-ms")
	if st := r.Stats(); full && st.FullMisses != users {
		b.Fatalf("%d full views read through, want %d (each once)", st.FullMisses, users)
	}
	runtime.KeepAlive(r)
}

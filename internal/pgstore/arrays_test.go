package pgstore

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/presenced/presenced/internal/presence"
)

// TestArrays: the array arguments reach PostgreSQL exactly.
func TestArrays(t *testing.T) {
	s := open(t, newDatabase(t))
	ctx := t.Context()
	texts := [][]string{{}, {""}, {"a", "ünïcødé-用户", "o'brien\";--)", "{x,y}", `"q"`, "NULL"}}
	for _, want := range texts {
		var got []string
		if err := s.pool.QueryRow(ctx, `SELECT $1::text[]`, textArray(want)).Scan(&got); err != nil {
			t.Fatalf("text[] %q: %v", want, err)
		}
		if !slices.Equal(got, want) || got == nil {
			t.Errorf("text[] %q came back as %#v", want, got)
		}
	}
	ints := [][]int64{{}, {0}, {1, -1, math.MaxInt64, math.MinInt64, -1 << 62}}
	for _, want := range ints {
		var got []int64
		if err := s.pool.QueryRow(ctx, `SELECT $1::bigint[]`, int8Array(want)).Scan(&got); err != nil {
			t.Fatalf("bigint[] %v: %v", want, err)
		}
		if !slices.Equal(got, want) || got == nil {
			t.Errorf("bigint[] %v came back as %#v", want, got)
		}
	}
	var isNull bool
	if err := s.pool.QueryRow(ctx, `SELECT $1::text[] IS NULL AND $2::bigint[] IS NULL`, textArray(nil), int8Array(nil)).Scan(&isNull); err != nil || !isNull {
		t.Errorf("nil arrays: IS NULL = %v, %v; want true", isNull, err)
	}
}

// TestSaveLastSeenAllocs: a checkpoint costs a few allocations, not some
// per profile.
func TestSaveLastSeenAllocs(t *testing.T) {
	s := open(t, newDatabase(t))
	ctx := t.Context()
	batch := make([]presence.Profile, 1000)
	for i := range batch {
		batch[i] = presence.Profile{UserID: fmt.Sprintf("u%04d", i), LastSeen: 1}
	}
	if err := s.SaveLastSeen(ctx, batch); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(10, func() {
		for i := range batch {
			batch[i].LastSeen++
		}
		if err := s.SaveLastSeen(ctx, batch); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 100 {
		t.Errorf("SaveLastSeen of %d profiles: %.0f allocations, want at most 100", len(batch), allocs)
	}
}

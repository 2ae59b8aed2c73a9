package main

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestHistIndexRoundTrip(t *testing.T) {
	prev := -1
	for _, v := range []int64{0, 1, 127, 128, 255, 256, 257, 511, 512, 1000, 123456, 1 << 40, 1<<62 + 12345, 1<<63 - 1} {
		i := histIndex(v)
		if i < prev || i >= histBuckets {
			t.Errorf("histIndex(%d) = %d after %d (of %d)", v, i, prev, histBuckets)
		}
		prev = i
		low, w := histBounds(i)
		if v < low || v > low+w-1 {
			t.Errorf("%d in bucket %d = [%d, %d]", v, i, low, low+w-1)
		}
		if v >= 256 && float64(w)/float64(v) > 1.0/128 {
			t.Errorf("%d: bucket width %d is over 1/128 of it", v, w)
		}
	}
	// Every bucket's bounds map back to it, and the buckets tile the range.
	next := int64(0)
	for i := range histBuckets - 1 {
		low, w := histBounds(i)
		if low != next || histIndex(low) != i || histIndex(low+w-1) != i {
			t.Fatalf("bucket %d: [%d, +%d), want it to start at %d", i, low, w, next)
		}
		next = low + w
	}
}

func TestHistQuantiles(t *testing.T) {
	h := newHist()
	if h.quantile(0.5) != 0 || h.summary().Count != 0 {
		t.Error("empty histogram")
	}
	var vals []int64
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		v := int64(r.ExpFloat64() * 1e6) // about 1 ms, a long tail
		vals = append(vals, v)
		h.record(v)
	}
	slices.Sort(vals)
	for _, q := range []float64{0, 0.5, 0.9, 0.99, 0.999, 1} {
		exact := vals[max(0, int(q*float64(len(vals)))-1)]
		got := h.quantile(q)
		if d := float64(got-exact) / float64(exact+1); d < -0.01 || d > 0.01 {
			t.Errorf("q%.3f = %d, exact %d", q, got, exact)
		}
	}
	s := h.summary()
	if !(s.P50Ms <= s.P99Ms && s.P99Ms <= s.P999Ms && s.P999Ms <= s.MaxMs) || s.MaxMs != float64(vals[len(vals)-1])/1e6 {
		t.Errorf("summary out of order: %+v", s)
	}

	// Merging two halves gives the same histogram as one.
	a, b := newHist(), newHist()
	for i, v := range vals {
		if i%2 == 0 {
			a.record(v)
		} else {
			b.record(v)
		}
	}
	a.merge(b)
	a.merge(newHist())
	if a.summary() != s || a.min != vals[0] {
		t.Errorf("merged %+v, want %+v", a.summary(), s)
	}
	h2 := newHist()
	h2.record(-5)
	h2.record(7)
	if h2.quantile(0.5) != 0 || h2.quantile(1) != 7 {
		t.Errorf("negative values: %d %d", h2.quantile(0.5), h2.quantile(1))
	}
}

func TestHistRecordAllocs(t *testing.T) {
	h := newHist()
	if n := testing.AllocsPerRun(1000, func() { h.record(123456) }); n != 0 {
		t.Errorf("record allocates %.1f times", n)
	}
}

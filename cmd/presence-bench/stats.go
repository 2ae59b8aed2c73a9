package main

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// histSubBits sets the precision of a histogram: each power of two is cut
// into 2^histSubBits linear buckets, so a recorded value is off by less
// than 1/128 (0.8%) of itself; values below 256 are exact.
const histSubBits = 7

// histBuckets covers every non-negative int64.
const histBuckets = (64 - histSubBits) << histSubBits

// hist is a log-linear (HDR-style) histogram of non-negative int64 values,
// nanoseconds here. Recording is O(1) and allocation-free; quantiles are
// read by walking the counts. A hist is not safe for concurrent use: give
// each goroutine its own and merge them at the end.
type hist struct {
	counts   [histBuckets]uint64
	n        uint64
	sum      float64
	min, max int64
}

func newHist() *hist { return &hist{min: math.MaxInt64} }

// histIndex is the bucket of v ≥ 0.
func histIndex(v int64) int {
	u := uint64(v)
	shift := bits.Len64(u) - (histSubBits + 1)
	if shift <= 0 {
		return int(u)
	}
	return shift<<histSubBits + int(u>>uint(shift))
}

// histBounds is the lowest value of bucket i and the bucket's width.
func histBounds(i int) (low, width int64) {
	if i < 2<<histSubBits {
		return int64(i), 1
	}
	shift := i>>histSubBits - 1
	top := int64(i - shift<<histSubBits)
	return top << uint(shift), 1 << uint(shift)
}

// record adds one value; negative values count as 0.
func (h *hist) record(v int64) {
	if v < 0 {
		v = 0
	}
	h.counts[histIndex(v)]++
	h.n++
	h.sum += float64(v)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// merge adds the values of o to h.
func (h *hist) merge(o *hist) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// quantile is the smallest recorded value v (to the bucket's precision:
// the bucket's highest value, never above the maximum) such that a fraction
// q of the values are ≤ v. It is 0 for an empty histogram.
func (h *hist) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(1, min(rank, h.n))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			low, w := histBounds(i)
			return max(h.min, min(low+w-1, h.max))
		}
	}
	return h.max
}

// latency is the summary of a histogram of durations, in milliseconds.
type latency struct {
	Count  uint64  `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// summary reads the histogram of nanoseconds as a latency summary.
func (h *hist) summary() latency {
	ms := func(ns int64) float64 { return float64(ns) / float64(time.Millisecond) }
	l := latency{Count: h.n}
	if h.n == 0 {
		return l
	}
	l.MeanMs = h.sum / float64(h.n) / float64(time.Millisecond)
	l.P50Ms, l.P99Ms, l.P999Ms, l.MaxMs = ms(h.quantile(0.5)), ms(h.quantile(0.99)), ms(h.quantile(0.999)), ms(h.max)
	return l
}

func (l latency) String() string {
	return fmt.Sprintf("p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  max %.2f ms", l.P50Ms, l.P99Ms, l.P999Ms, l.MaxMs)
}

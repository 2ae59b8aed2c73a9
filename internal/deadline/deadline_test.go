package deadline

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestHeapPopsInOrder(t *testing.T) {
	var h Heap[int]
	if h.Due(0) || h.Len() != 0 {
		t.Fatal("an empty heap is due")
	}
	r := rand.New(rand.NewPCG(1, 2))
	var want []int64
	for i := range 1000 {
		at := r.Int64N(500)
		want = append(want, at)
		h.Push(at, i)
	}
	slices.Sort(want)
	if h.Due(want[0]-1) || !h.Due(want[0]) {
		t.Fatal("Due disagrees with the earliest item")
	}
	for i, at := range want {
		if it := h.Pop(); it.At != at {
			t.Fatalf("pop %d: at %d, want %d", i, it.At, at)
		}
	}
	if h.Len() != 0 {
		t.Fatalf("%d items left", h.Len())
	}
}

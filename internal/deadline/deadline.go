// Package deadline is the min-heap of deadlines that the memory store and
// the table of owned devices keep per shard: items ordered by their time,
// the earliest first. An item is typically authoritative only while it
// matches its owner's schedule; superseded items are dropped when popped
// (lazy re-arm), so a deadline that moves later touches no heap.
//
// A Heap is not safe for concurrent use: its shard's lock guards it.
package deadline

// Item is a deadline (At, Unix ms) of V.
type Item[T any] struct {
	At int64
	V  T
}

// Heap is a binary min-heap of Items by At. The zero value is empty.
type Heap[T any] struct {
	items []Item[T]
}

// Len returns the number of items.
func (h *Heap[T]) Len() int { return len(h.items) }

// Due reports whether the earliest item is at or before now.
func (h *Heap[T]) Due(now int64) bool { return len(h.items) > 0 && h.items[0].At <= now }

// Push adds v at at.
func (h *Heap[T]) Push(at int64, v T) {
	s := append(h.items, Item[T]{At: at, V: v})
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if s[p].At <= s[i].At {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
	h.items = s
}

// Pop removes and returns the earliest item. The heap must not be empty.
func (h *Heap[T]) Pop() Item[T] {
	s := h.items
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s[n] = Item[T]{}
	s = s[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s[r].At < s[l].At {
			m = r
		}
		if s[i].At <= s[m].At {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	h.items = s
	return top
}

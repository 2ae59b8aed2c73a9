package memstore

// HeapLen returns the number of items in all deadline heaps, stale ones
// included.
func (s *Store) HeapLen() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.heap.Len()
		sh.mu.Unlock()
	}
	return n
}

// Compactions returns how many times the shards' arenas were compacted.
func (s *Store) Compactions() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.compactions
		sh.mu.Unlock()
	}
	return n
}

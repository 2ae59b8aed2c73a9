package memstore

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

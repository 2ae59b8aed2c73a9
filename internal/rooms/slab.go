package rooms

// A slab hands out blocks of 1<<class words from one slice per class, so
// a room's member chunks and chunk directory are integers in slices the
// collector does not scan. A block is named by a ref: its class in the top
// classBits bits, its index in its class's slice below. Freed blocks are
// kept for reuse in their class.

const (
	classBits = 5
	blockBits = 32 - classBits
	maxBlock  = 1<<blockBits - 1
)

type slab struct {
	words [1 << classBits][]uint64
	free  [1 << classBits][]uint32
}

func classOf(ref uint32) uint { return uint(ref >> blockBits) }

// alloc returns a block of 1<<c words (not zeroed). It may move the words
// of class c: no block of that class may be held across it.
func (s *slab) alloc(c uint) uint32 {
	if k := len(s.free[c]); k > 0 {
		b := s.free[c][k-1]
		s.free[c] = s.free[c][:k-1]
		return uint32(c)<<blockBits | b
	}
	b := len(s.words[c]) >> c
	if b > maxBlock {
		panic("rooms: slab class full")
	}
	s.words[c] = append(s.words[c], make([]uint64, 1<<c)...)
	return uint32(c)<<blockBits | uint32(b)
}

// block returns the words of ref, valid until the next alloc of its class.
func (s *slab) block(ref uint32) []uint64 {
	c := classOf(ref)
	b := int(ref & maxBlock)
	return s.words[c][b<<c : (b+1)<<c : (b+1)<<c]
}

func (s *slab) release(ref uint32) {
	c := classOf(ref)
	s.free[c] = append(s.free[c], ref&maxBlock)
}

// resize moves the first n words of ref to a new block of class c and
// frees ref.
func (s *slab) resize(ref uint32, n int, c uint) uint32 {
	nr := s.alloc(c)
	copy(s.block(nr), s.block(ref)[:n])
	s.release(ref)
	return nr
}

// bytes is what the slab holds.
func (s *slab) bytes() int64 {
	var n int64
	for c := range s.words {
		n += int64(cap(s.words[c]))*8 + int64(cap(s.free[c]))*4
	}
	return n
}

package redisstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
)

// layoutReads is the value of the layout key once every user held has
// its field in the read hash (lua/read.lua).
const layoutReads = "2"

// RebuildReads makes sure every user Redis holds has its field in its
// shard's read hash, which a build before the read hash did not write: a
// node calls it at start, before it serves. If the layout key says the
// data was written by this layout, it returns at once; otherwise it walks
// every Redis node's user keys (SCAN), rebuilds each user's field from its
// hash in one script per user (batched), and sets the key. Until it has
// succeeded, a read looks for a user missing from the read hash in the
// user's own hash (correct, one round trip more). It returns the number of
// users rebuilt.
//
// Nodes of a build before the read hash must be stopped first: they keep
// changing users' hashes without their read fields (docs/operations.md).
func (s *Store) RebuildReads(ctx context.Context) (int, error) {
	v, err := s.c.Do(ctx, s.c.B().Get().Key(s.layout).Build()).ToString()
	switch {
	case err == nil && v == layoutReads:
		s.readsComplete.Store(true)
		return 0, nil
	case err != nil && !rueidis.IsRedisNil(err):
		return 0, fmt.Errorf("redisstore: read the layout: %w", err)
	}
	pattern := globEscape(s.prefix) + "{*}u:*"
	n := 0
	for addr, nc := range s.c.Nodes() {
		var cursor uint64
		for {
			e, err := nc.Do(ctx, nc.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return n, fmt.Errorf("redisstore: rebuild reads: scan %s: %w", addr, err)
			}
			if len(e.Elements) > 0 {
				execs := make([]rueidis.LuaExec, len(e.Elements))
				for i, k := range e.Elements {
					execs[i] = rueidis.LuaExec{Keys: []string{k}}
				}
				for i, r := range s.rebuildRead.execMulti(ctx, s.c, execs...) {
					m, err := r.AsInt64()
					if err != nil {
						return n, fmt.Errorf("redisstore: rebuild reads: %s: %w", e.Elements[i], s.rebuildRead.err(err))
					}
					n += int(m)
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	if err := s.c.Do(ctx, s.c.B().Set().Key(s.layout).Value(layoutReads).Build()).Error(); err != nil {
		return n, fmt.Errorf("redisstore: rebuild reads: set the layout: %w", err)
	}
	s.readsComplete.Store(true)
	return n, nil
}

// globEscape escapes what SCAN's MATCH would take for a pattern in s.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		switch c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

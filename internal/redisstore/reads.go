package redisstore

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
)

// readsComplete names the marker field of a shard's read hash: present
// once every user the shard holds has its read field. No user id can be
// it (ids have no spaces). It lives with the fields it vouches for: a read
// hash lost on its own (a failover that lost its last writes, an eviction)
// loses it too, and a read then looks for a user missing from the read
// hash in the user's own hash (Store.Get).
const readsComplete = " complete"

// RebuildReads makes sure every user Redis holds has its field in its
// shard's read hash, which a build before the read hash did not write:
// Open calls it, before the node serves. If every shard's read hash
// has its marker (written when the shard got its floor with this build, or
// by an earlier rebuild), it returns at once; otherwise it walks every
// Redis node's user keys (SCAN), rebuilds each user's field from its hash
// in one script per user (pipelined), and marks every shard. Reads are
// right before it is done, slower by a round trip for users missing from
// an unmarked shard. It returns the number of users rebuilt.
//
// Nodes of a build before the read hash must be stopped first: they keep
// changing users' hashes without their read fields (docs/operations.md).
func (s *Store) RebuildReads(ctx context.Context) (_ int, err error) {
	defer callRebuildReads.Start(ctx).Done(&err)
	cmds := make(rueidis.Commands, len(s.shards))
	for i := range s.shards {
		cmds[i] = s.c.B().Hexists().Key(s.shards[i].reads).Field(readsComplete).Build()
	}
	done := true
	for _, r := range s.c.DoMulti(ctx, cmds...) {
		ok, err := r.AsBool()
		if err != nil {
			return 0, fmt.Errorf("redisstore: rebuild reads: %w", err)
		}
		done = done && ok
	}
	if done {
		return 0, nil
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
	for i := range s.shards {
		cmds[i] = s.c.B().Hset().Key(s.shards[i].reads).FieldValue().FieldValue(readsComplete, "1").Build()
	}
	for _, r := range s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return n, fmt.Errorf("redisstore: rebuild reads: mark the read hashes: %w", err)
		}
	}
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

// ScanReads calls fn with every user the store holds as its read field
// shows it (the status last published — invisible for an invisible user
// with devices — the settings, the version; nothing due is applied): the
// fill of a node's read replica (package replica). It walks every shard's
// read hash with HSCAN, one round of calls to all unfinished shards at a
// time, so Redis is never held for long by one call. Read hashes without
// their completeness mark are rebuilt first (RebuildReads); a read hash
// that loses its mark during the scan (lost on its own: an eviction, a
// failover) fails the scan, as its users may not all have been yielded.
// fn is called from one goroutine; snap is valid during the call only.
func (s *Store) ScanReads(ctx context.Context, fn func(id string, snap *presence.Snapshot)) (err error) {
	defer callScanReads.Start(ctx).Done(&err)
	if _, err := s.RebuildReads(ctx); err != nil {
		return err
	}
	cursors := make([]uint64, len(s.shards))
	// HSCAN returns every field present for the whole scan: a read hash
	// whose mark it did not return was lost (and perhaps written again
	// in part) meanwhile, and its users cannot all have been seen.
	marked := make([]bool, len(s.shards))
	todo := make([]int, len(s.shards))
	for i := range todo {
		todo[i] = i
	}
	var snap presence.Snapshot
	for len(todo) > 0 {
		cmds := make(rueidis.Commands, len(todo))
		for j, k := range todo {
			cmds[j] = s.c.B().Hscan().Key(s.shards[k].reads).Cursor(cursors[k]).Count(1000).Build()
		}
		next := todo[:0]
		for j, r := range s.c.DoMulti(ctx, cmds...) {
			k := todo[j]
			e, err := r.AsScanEntry()
			if err != nil {
				return fmt.Errorf("redisstore: scan reads: %w", err)
			}
			if len(e.Elements)%2 != 0 {
				return fmt.Errorf("redisstore: scan reads: HSCAN answered %d elements", len(e.Elements))
			}
			for i := 0; i < len(e.Elements); i += 2 {
				id, v := e.Elements[i], e.Elements[i+1]
				if id == readsComplete {
					marked[k] = true
					continue
				}
				if _, err := snapshotFromRead(id, v, math.MinInt64, &snap); err != nil {
					return fmt.Errorf("redisstore: scan reads %q: %w", id, err)
				}
				fn(id, &snap)
			}
			if cursors[k] = e.Cursor; cursors[k] != 0 {
				next = append(next, k)
			}
		}
		todo = next
	}
	// …and one that has no mark now was lost after its scan went by.
	cmds := make(rueidis.Commands, len(s.shards))
	for k := range s.shards {
		cmds[k] = s.c.B().Hexists().Key(s.shards[k].reads).Field(readsComplete).Build()
	}
	for k, r := range s.c.DoMulti(ctx, cmds...) {
		ok, err := r.AsBool()
		if err != nil {
			return fmt.Errorf("redisstore: scan reads: %w", err)
		}
		if !ok || !marked[k] {
			return fmt.Errorf("redisstore: scan reads: the read hash %s lost its completeness mark during the scan (rebuilt by the next)", s.shards[k].reads)
		}
	}
	return nil
}

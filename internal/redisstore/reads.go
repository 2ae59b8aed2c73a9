package redisstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
)

// Migrate moves what builds before the packed layout kept in Redis into
// it (lua/packed.lua): each user's hash (<prefix>{shard}u:<id>) packed
// into its bucket, each lease's set of users in a shard
// (<prefix>{shard}own:<lease>) into its set of buckets, and the read hashes
// (<prefix>{shard}b) dropped. Open calls it before the node serves, unless
// Redis holds the layout key (CheckLayout: a node of this layout was
// here, so nothing older is left); it walks every Redis node's keys
// (SCAN). It returns the number of users packed.
//
// Nodes of a build before the packed layout must be stopped first: they
// keep reading and writing the old keys (docs/operations.md).
func (s *Store) Migrate(ctx context.Context) (_ int, err error) {
	defer callMigrate.Start(ctx).Done(&err)
	n := 0
	for addr, nc := range s.c.Nodes() {
		var cursor uint64
		for {
			e, err := nc.Do(ctx, nc.B().Scan().Cursor(cursor).Match(globEscape(s.prefix)+"{*}*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				return n, fmt.Errorf("redisstore: migrate: scan %s: %w", addr, err)
			}
			m, err := s.migrateKeys(ctx, e.Elements)
			n += m
			if err != nil {
				return n, err
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return n, nil
}

// migrateKeys moves the keys of the old layout among keys (Migrate).
func (s *Store) migrateKeys(ctx context.Context, keys []string) (int, error) {
	var execs []rueidis.LuaExec
	var drop rueidis.Commands
	for _, k := range keys {
		rest, ok := strings.CutPrefix(k, s.prefix+"{")
		if !ok {
			continue
		}
		_, rest, ok = strings.Cut(rest, "}")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(rest, "u:"):
			id := rest[2:]
			b, _ := s.bucketOf(id)
			execs = append(execs, rueidis.LuaExec{Keys: []string{k, b}, Args: []string{id}})
		case rest == "b":
			drop = append(drop, s.c.B().Del().Key(k).Build())
		case strings.HasPrefix(rest, "own:"):
			lease, err := strconv.ParseUint(rest[4:], 10, 64)
			if err != nil {
				continue
			}
			if err := s.migrateOwned(ctx, k, lease); err != nil {
				return 0, err
			}
			drop = append(drop, s.c.B().Del().Key(k).Build())
		}
	}
	n := 0
	for i, r := range s.migrate.execMulti(ctx, s.c, execs...) {
		m, err := r.AsInt64()
		if err != nil {
			return n, fmt.Errorf("redisstore: migrate: %s: %w", execs[i].Keys[0], s.migrate.err(err))
		}
		n += int(m)
	}
	for _, r := range s.c.DoMulti(ctx, drop...) {
		if err := r.Error(); err != nil {
			return n, fmt.Errorf("redisstore: migrate: %w", err)
		}
	}
	return n, nil
}

// migrateOwned adds the buckets of the users in key, a lease's set of
// users of the old layout, to the lease's sets of buckets: SSCAN of the
// set, one SADD of the distinct buckets per shard.
func (s *Store) migrateOwned(ctx context.Context, key string, lease uint64) error {
	buckets := map[int]map[string]bool{} // shard → its buckets named
	var cursor uint64
	for {
		e, err := s.c.Do(ctx, s.c.B().Sscan().Key(key).Cursor(cursor).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return fmt.Errorf("redisstore: migrate: %s: %w", key, err)
		}
		for _, u := range e.Elements {
			shard, n := s.place(u)
			if buckets[shard] == nil {
				buckets[shard] = map[string]bool{}
			}
			buckets[shard][strconv.Itoa(n)] = true
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	var cmds rueidis.Commands
	for shard, names := range buckets {
		cmds = append(cmds, s.c.B().Sadd().Key(s.shards[shard].ownedKey(lease)).Member(slices.Collect(maps.Keys(names))...).Build())
	}
	for _, r := range s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("redisstore: migrate: %s: %w", key, err)
		}
	}
	return nil
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

// ScanReads calls fn with every user the store holds as a read at no
// particular time shows it (the status last published — invisible for an
// invisible user with devices — the settings, the version; nothing due is
// applied): the fill of a node's read replica (package replica). It reads
// every bucket (HGETALL, a listpack of a few dozen users), up to
// scanBatch of them in one pipelined round trip, so Redis is never held
// for long by one call. fn is called from one goroutine; snap is valid
// during the call only.
func (s *Store) ScanReads(ctx context.Context, fn func(id string, snap *presence.Snapshot)) (err error) {
	defer callScanReads.Start(ctx).Done(&err)
	const scanBatch = 512
	total := len(s.shards) * s.buckets
	var snap presence.Snapshot
	var u packedUser
	cmds := make(rueidis.Commands, 0, scanBatch)
	for lo := 0; lo < total; lo += scanBatch {
		cmds = cmds[:0]
		for i := lo; i < min(total, lo+scanBatch); i++ {
			cmds = append(cmds, s.c.B().Hgetall().Key(s.shards[i/s.buckets].bucketKey(i%s.buckets)).Build())
		}
		for _, r := range s.c.DoMulti(ctx, cmds...) {
			kv, err := r.AsStrSlice()
			if err != nil {
				return fmt.Errorf("redisstore: scan reads: %w", err)
			}
			for i := 0; i+1 < len(kv); i += 2 {
				if err := decodePacked(kv[i], kv[i+1], &u); err != nil {
					return fmt.Errorf("redisstore: scan reads %q: %w", kv[i], err)
				}
				publishedSnapshot(&u, &snap)
				fn(kv[i], &snap)
			}
		}
	}
	return nil
}

// publishedSnapshot fills out with u as last published: ScanReads.
func publishedSnapshot(u *packedUser, out *presence.Snapshot) {
	st := u.Pub
	if st == presence.Offline && len(u.Devices) > 0 && u.Manual == presence.ManualInvisible {
		st = presence.Invisible
	}
	*out = presence.Snapshot{
		UserID:      u.UserID,
		Known:       true,
		Status:      st,
		Manual:      u.Manual,
		Text:        u.Text,
		LastSeen:    u.LastSeen,
		PubLastSeen: u.PubLastSeen,
		Devices:     len(u.Devices),
		Version:     u.Version,
		Settings:    u.Settings,
		PubText:     u.PubText,
		PubVersion:  u.PubVersion,
	}
}

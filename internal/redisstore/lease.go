package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// Owned devices (tracker.Leaser).
//
// A node that holds a device's socket claims it: the device in the packed
// user then names the node's lease (lua/packed.lua) and the user's bucket
// joins the lease's set in its shard,
//
//	<prefix>{<shard>}ob:<lease>    set: the buckets where the lease claimed a device
//	<prefix>leases                 hash: lease → last renewal (Unix ms), or "x:<renewal>:<ms>" while taken over
//
// (a bucket stays listed when its devices of the lease are gone: the set
// costs a few bytes a bucket, not a member a user, and a takeover reads
// every bucket listed whole),
//
// and from then on the device is alive in Redis until its owner releases
// it (its ttl or close grace ran out on the owner, or it said bye), hands
// it off (the owner stops), or the lease is taken over: a lease not
// renewed for a while is marked ("x:…" — after which its owner can renew it
// no more and claims its devices again under a new lease), then each
// shard's buckets are taken over in one script (takeover.lua: every
// device the lease owned lives a ttl from the lease's last renewal, and
// the set is deleted, so it happens once), then the lease is forgotten. The leases
// hash is one key (one slot on a Cluster); the scripts that read it touch
// nothing else.

var (
	_ tracker.Leaser       = (*Store)(nil)
	_ tracker.Partitioned  = (*Store)(nil)
	_ tracker.PartTakeOver = (*Store)(nil)
)

// ownedKey is the set of buckets of shard sk where lease claimed a device
// (claim.lua adds them; nothing removes one until the lease is taken
// over: a bucket listed may hold none of its devices any more).
func (sk *shardKeys) ownedKey(lease uint64) string {
	return sk.tag + "ob:" + strconv.FormatUint(lease, 10)
}

func u64(n uint64) string { return strconv.FormatUint(n, 10) }

// AcquireLease implements tracker.Leaser.
func (s *Store) AcquireLease(ctx context.Context, lease uint64, now int64) (err error) {
	defer callAcquireLease.Start(ctx).Done(&err)
	if err := s.c.Do(ctx, s.c.B().Hset().Key(s.leases).FieldValue().FieldValue(u64(lease), i64(now)).Build()).Error(); err != nil {
		return fmt.Errorf("redisstore: acquire lease: %w", err)
	}
	return nil
}

// RenewLease implements tracker.Leaser.
func (s *Store) RenewLease(ctx context.Context, lease uint64, now int64, out []tracker.Lease) (_ []tracker.Lease, err error) {
	defer callRenewLease.Start(ctx).Done(&err)
	m, err := s.renewLease.Exec(ctx, s.c, []string{s.leases}, []string{u64(lease), i64(now)}).ToMessage()
	if err != nil {
		return out, fmt.Errorf("redisstore: renew lease: %w", s.renewLease.err(err))
	}
	if n, err := m.AsInt64(); err == nil && n == -1 {
		return out, tracker.ErrLeaseLost
	}
	kv, err := m.AsStrSlice()
	if err != nil {
		return out, fmt.Errorf("redisstore: renew lease: %w", err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		id, err := strconv.ParseUint(kv[i], 10, 64)
		if err != nil {
			continue // not ours
		}
		l := tracker.Lease{ID: id}
		if x, ok := strings.CutPrefix(kv[i+1], "x:"); ok {
			renewed, at, _ := strings.Cut(x, ":")
			l.Taken = true
			l.Renewed, _ = strconv.ParseInt(renewed, 10, 64)
			l.TakenAt, _ = strconv.ParseInt(at, 10, 64)
		} else if l.Renewed, err = strconv.ParseInt(kv[i+1], 10, 64); err != nil {
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// TakeLease implements tracker.Leaser.
func (s *Store) TakeLease(ctx context.Context, lease uint64, renewed, now int64) (_ bool, err error) {
	defer callTakeLease.Start(ctx).Done(&err)
	n, err := s.takeLease.Exec(ctx, s.c, []string{s.leases}, []string{u64(lease), i64(renewed), i64(now)}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("redisstore: take lease: %w", s.takeLease.err(err))
	}
	return n == 1, nil
}

// EndLease implements tracker.Leaser.
func (s *Store) EndLease(ctx context.Context, lease uint64) (err error) {
	defer callEndLease.Start(ctx).Done(&err)
	if err := s.c.Do(ctx, s.c.B().Hdel().Key(s.leases).Field(u64(lease)).Build()).Error(); err != nil {
		return fmt.Errorf("redisstore: end lease: %w", err)
	}
	return nil
}

// TakeOver implements tracker.Leaser: one pipelined round trip lists the
// buckets where the lease claimed devices in every shard; then, a few
// buckets of a shard at a time (takeOverChunk, all shards' chunks
// pipelined up to takeOverBatch calls a round trip), the buckets are read
// to find the lease's users, their durable last_seen is asked for, and the
// takeover script runs on the chunk. Shards whose node does not answer (a
// Cluster master down) are left for a later call and the others taken
// over: the error is then a tracker.PartialError naming them.
func (s *Store) TakeOver(ctx context.Context, now int64, lease uint64, renewed int64,
	lastSeen func(ctx context.Context, users []string) (map[string]int64, error), out []presence.Change) ([]presence.Change, error) {
	return s.TakeOverParts(ctx, now, lease, renewed, lastSeen, nil, out)
}

// takeOverChunk is the number of buckets one takeover script reads (about
// a thousand users with 64 a bucket: a few milliseconds of Redis), and
// takeOverBatch the chunks read and taken over in one round trip.
const (
	takeOverChunk = 16
	takeOverBatch = 64
)

// TakeOverParts implements tracker.PartTakeOver: TakeOver of the shards
// skip does not name (nil: all).
func (s *Store) TakeOverParts(ctx context.Context, now int64, lease uint64, renewed int64,
	lastSeen func(ctx context.Context, users []string) (map[string]int64, error), skip func(part int) bool,
	out []presence.Change) (_ []presence.Change, err error) {
	defer callTakeOverParts.Start(ctx).Done(&err)
	cmds := make(rueidis.Commands, 0, len(s.shards))
	listed := make([]int, 0, len(s.shards))
	for i := range s.shards {
		if skip != nil && skip(i) {
			continue
		}
		cmds = append(cmds, s.c.B().Smembers().Key(s.shards[i].ownedKey(lease)).Build())
		listed = append(listed, i)
	}
	var failedShards []int
	var failed, answered int
	var firstErr error
	broken := map[int]bool{} // shards whose node failed a call: left for a later takeover
	fail := func(shard int, err error) {
		failed, firstErr = failed+1, firstOf(firstErr, err)
		if !broken[shard] {
			broken[shard] = true
			failedShards = append(failedShards, shard)
		}
	}
	type chunk struct {
		shard   int
		buckets []string
	}
	var chunks []chunk
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		m, err := r.AsStrSlice()
		if err != nil {
			fail(listed[j], err)
			continue
		}
		answered++
		for _, b := range m {
			if _, err := strconv.Atoi(b); err != nil {
				return out, fmt.Errorf("redisstore: take over: bucket %q of shard %d", b, listed[j])
			}
		}
		for lo := 0; lo < len(m); lo += takeOverChunk {
			chunks = append(chunks, chunk{listed[j], m[lo:min(len(m), lo+takeOverChunk)]})
		}
	}
	var u packedUser
	done := 0              // chunks taken over (or whose shard failed)
	var took time.Duration // the rounds so far
	for lo, size := 0, takeOverBatch/8; lo < len(chunks) && ctx.Err() == nil; lo, size = lo+size, takeOverBatch {
		// The first round is small, so that its time says what a round
		// costs before a full one is started.
		if dl, ok := ctx.Deadline(); ok && lo > 0 && time.Until(dl) < 2*took*time.Duration(size)/time.Duration(max(1, lo)) {
			break // stop between rounds, not in one: the rest is for the next call
		}
		began := time.Now()
		batch := chunks[lo:min(len(chunks), lo+size)]
		// The lease's users in the batch's buckets, for their durable
		// last_seen.
		var reads rueidis.Commands
		var readChunk []int
		for ci, c := range batch {
			if broken[c.shard] {
				continue
			}
			if lastSeen == nil {
				continue // nobody to ask: the script reads the buckets itself
			}
			for _, b := range c.buckets {
				reads = append(reads, s.c.B().Hgetall().Key(s.shards[c.shard].tag+"p:"+b).Build())
				readChunk = append(readChunk, ci)
			}
		}
		users := make([][]string, len(batch))
		var all []string
		for j, r := range s.c.DoMulti(ctx, reads...) {
			ci := readChunk[j]
			kv, err := r.AsStrSlice()
			if err != nil {
				fail(batch[ci].shard, err)
				continue
			}
			for i := 0; i+1 < len(kv); i += 2 {
				if decodePacked(kv[i], kv[i+1], &u) != nil {
					continue // the script says what it is (its chunk fails)
				}
				if u.holds(lease) {
					users[ci] = append(users[ci], kv[i])
					all = append(all, kv[i])
				}
			}
		}
		var seen map[string]int64
		if lastSeen != nil && len(all) > 0 {
			// Without the durable last_seen (PostgreSQL down or slow) the
			// takeover still happens, with the last_seen Redis holds: a
			// dead node's devices must not stay online for as long as
			// PostgreSQL is away. It gets half the time left.
			lctx, cancel := ctx, context.CancelFunc(func() {})
			if dl, ok := ctx.Deadline(); ok {
				lctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
			}
			seen, _ = lastSeen(lctx, all)
			cancel()
		}
		var execs []rueidis.LuaExec
		var execShard []int
		for ci, c := range batch {
			if broken[c.shard] {
				continue
			}
			sk := &s.shards[c.shard]
			args := append([]string{u64(lease), i64(renewed), i64(now), sk.tag, strconv.Itoa(len(c.buckets))}, c.buckets...)
			for _, id := range users[ci] {
				if ls, ok := seen[id]; ok {
					args = append(args, id, i64(ls))
				}
			}
			execs = append(execs, rueidis.LuaExec{Keys: []string{sk.ownedKey(lease), sk.due, sk.dirty}, Args: args})
			execShard = append(execShard, c.shard)
		}
		var claims []*roomClaim
		for j, r := range s.takeover.execMulti(ctx, s.c, execs...) {
			arr, err := r.ToArray()
			if err != nil {
				fail(execShard[j], s.takeover.err(err))
				continue
			}
			var bad int
			out, claims, bad, err = appendClaims(out, claims, arr, now)
			failed, firstErr = failed+bad, firstOf(firstErr, err)
		}
		if len(claims) > 0 {
			// The rooms of the devices that ended already, all the
			// batch's in one round trip. What a room's master did not
			// take is applied by a sweep once the claim lapses.
			evs, _ := s.applyRooms(ctx, now, claims)
			if len(evs) > 0 {
				out = append(out, presence.Change{Rooms: evs})
			}
		}
		done += len(batch)
		took += time.Since(began)
	}
	// Chunks left for want of time are taken over by a later call: their
	// buckets stay in the sets until then.
	var late error
	if done < len(chunks) {
		late = tracker.ErrTakeOverLeft
	}
	return out, takeOverErr(failed, answered, failedShards, firstErr, late)
}

// takeOverErr is TakeOverParts' error: nil, the error of a store that
// answered for no shard, or a PartialError naming the shards not taken
// over (whose node did not answer; with late, those that had no time left).
func takeOverErr(failed, answered int, shards []int, err, late error) error {
	if late != nil && failed == 0 {
		return fmt.Errorf("redisstore: take over: %w", late)
	}
	err = shardsErr("take over", failed, answered, err)
	var pe *tracker.PartialError
	if errors.As(err, &pe) {
		slices.Sort(shards)
		pe.Parts = slices.Compact(shards)
	}
	return err
}

// Claim implements tracker.Leaser.
func (s *Store) Claim(ctx context.Context, now int64, lease uint64, user string, d tracker.OwnedDevice) (_ presence.Change, err error) {
	defer callClaim.Start(ctx).Done(&err)
	k, bk := s.place(user)
	sk := &s.shards[k]
	m, err := s.execReplicated(ctx, s.claim, k, []string{sk.bucketKey(bk), sk.due, sk.dirty, sk.ownedKey(lease)},
		[]string{user, i64(now), d.ID, u64(lease), i64(d.LastBeat), i64(d.LastActive)})
	if err != nil && !errors.Is(err, tracker.ErrNotReplicated) {
		return presence.Change{}, wrapErr("claim", s.claim.err(err))
	}
	if arr, err := m.ToArray(); err == nil && len(arr) == 1 {
		if code, _ := arr[0].AsInt64(); code == -4 {
			return presence.Change{}, tracker.ErrClaimStale
		}
	}
	ch, cerr := s.change(m, user, now, "claim")
	switch {
	case cerr != nil:
		return ch, cerr
	case err != nil:
		s.unacked(user, ch)
		return presence.Change{}, wrapErr("claim", err)
	}
	return s.acked(user, ch), nil
}

// Touch implements tracker.Leaser: the touches go in calls of up to
// maxBeatBatch users, all pipelined — on one Redis any users together, on
// a Cluster (or behind a proxy that refused a call across slots) the users
// of one shard per call.
func (s *Store) Touch(ctx context.Context, now int64, lease uint64, touches []tracker.Touch) {
	defer callTouch.Start(ctx).End(nil)
	type call struct {
		keys, args []string
		idx        []int
	}
	perShard := s.mixedGroups == nil || s.crossSlotRefused.Load()
	open := map[int]*call{} // shard (or 0) → the call being filled
	var calls []*call
	for i := range touches {
		t := &touches[i]
		k, b := s.place(t.User)
		g := 0
		if perShard {
			g = k
		}
		c := open[g]
		if c == nil || len(c.idx) == maxBeatBatch {
			c = &call{args: []string{i64(now), u64(lease)}}
			open[g] = c
			calls = append(calls, c)
		}
		sk := &s.shards[k]
		c.keys = append(c.keys, sk.bucketKey(b), sk.due, sk.dirty)
		c.args = append(c.args, t.User, strconv.Itoa(len(t.Devices)))
		for _, d := range t.Devices {
			c.args = append(c.args, d.ID, i64(d.LastBeat), i64(d.LastActive))
		}
		c.idx = append(c.idx, i)
	}
	execs := make([]rueidis.LuaExec, len(calls))
	for i, c := range calls {
		execs[i] = rueidis.LuaExec{Keys: c.keys, Args: c.args}
	}
	for i, r := range s.touch.execMulti(ctx, s.c, execs...) {
		c := calls[i]
		arr, err := r.ToArray()
		if err == nil && len(arr) != len(c.idx) {
			err = fmt.Errorf("unexpected reply of %d elements for %d touches", len(arr), len(c.idx))
		}
		for j, ti := range c.idx {
			t := &touches[ti]
			if err != nil {
				t.Err = wrapErr("touch", s.touch.err(err))
				continue
			}
			t.Change, t.Lost, t.Err = s.ownedReply(arr[j], t.User, now, "touch")
		}
	}
}

// Release implements tracker.Leaser.
func (s *Store) Release(ctx context.Context, now int64, lease uint64, user string, devs []tracker.OwnedDevice, bye bool) (_ presence.Change, _ []string, err error) {
	defer callRelease.Start(ctx).Done(&err)
	b := "0"
	if bye {
		b = "1"
	}
	return s.ownedOp(ctx, s.release, "release", s.userKeys(user), []string{user, i64(now), u64(lease), b}, devs, user, now)
}

// HandOff implements tracker.Leaser.
func (s *Store) HandOff(ctx context.Context, now int64, lease uint64, user string, devs []tracker.OwnedDevice) (_ presence.Change, _ []string, err error) {
	defer callHandOff.Start(ctx).Done(&err)
	return s.ownedOp(ctx, s.handoff, "hand off", s.userKeys(user), []string{user, i64(now), u64(lease)}, devs, user, now)
}

// ownedOp runs a script that takes devices as (id, last beat, last
// activity) after args and answers {change, lost devices}.
func (s *Store) ownedOp(ctx context.Context, sc *script, op string, keys, args []string, devs []tracker.OwnedDevice,
	user string, now int64) (presence.Change, []string, error) {
	for _, d := range devs {
		args = append(args, d.ID, i64(d.LastBeat), i64(d.LastActive))
	}
	m, err := sc.Exec(ctx, s.c, keys, args).ToMessage()
	if err != nil {
		return presence.Change{}, nil, wrapErr(op, sc.err(err))
	}
	ch, lost, rooms, err := s.ownedReplyRooms(m, user, now, op)
	if err == nil && rooms {
		s.drainRooms(ctx, now, user, &ch)
	}
	if err == nil && len(lost) > 0 {
		// A device it did not find: a claim of it not replicated in
		// time was lost (a failover); its change must not be told.
		s.forget(user)
	}
	return ch, lost, err
}

// ownedReply decodes {change, lost devices}.
func (s *Store) ownedReply(m rueidis.RedisMessage, user string, now int64, op string) (presence.Change, []string, error) {
	ch, lost, _, err := s.ownedReplyRooms(m, user, now, op)
	return ch, lost, err
}

// ownedReplyRooms is ownedReply, and reports whether the script made room
// ops (Store.changeRooms).
func (s *Store) ownedReplyRooms(m rueidis.RedisMessage, user string, now int64, op string) (presence.Change, []string, bool, error) {
	arr, err := m.ToArray()
	if err != nil || len(arr) != 2 {
		return presence.Change{}, nil, false, wrapErr(op, fmt.Errorf("unexpected reply %v (%v)", m, err))
	}
	lost, err := arr[1].AsStrSlice()
	if err != nil {
		return presence.Change{}, nil, false, wrapErr(op, err)
	}
	ch, rooms, err := s.changeRooms(arr[0], user, now, op)
	return ch, lost, rooms, err
}

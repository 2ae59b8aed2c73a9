package tracker

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync/atomic"

	"github.com/presenced/presenced/internal/presence"
)

// Users whose durable profile cannot be loaded (the durable store is down)
// wait for it in the cold buffer of this node; see the package doc.

// coldBuffer holds the heartbeats and byes of users the state store does
// not hold and the durable store could not load.
type coldBuffer struct {
	n      atomic.Int64  // users in shards; read by every Heartbeat and Bye
	down   atomic.Bool   // a load failed for the durable store: loads fail fast until retryCold reaches it
	loaded atomic.Uint64 // users loaded and replayed from the buffer
	shards [bufShards]bufShard
}

func (t *Tracker) bufIndex(user string) uint64 {
	return maphash.String(t.lockSeed, user) % bufShards
}

// hold records o for user in the cold buffer. With onlyIfHeld it records
// it only if user has operations there already (so that a newer operation
// is applied after them), and reports whether it did. A user enters the
// buffer only while fewer than Config.MaxBuffered users are in it.
func (t *Tracker) hold(user string, o op, onlyIfHeld bool) (bool, error) {
	sh := &t.cold.shards[t.bufIndex(user)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	p := sh.users[user]
	if p == nil {
		if onlyIfHeld {
			return false, nil
		}
		if t.cold.n.Load() >= int64(t.maxBuffered) {
			return true, errColdFull
		}
		if sh.users == nil {
			sh.users = make(map[string]*pending)
		}
		p = &pending{}
		sh.users[user] = p
		t.cold.n.Add(1)
	}
	return true, p.add(o, t.rules.MaxDevices)
}

// held records o for user in a buffer instead of the store: the outage
// buffer while the store is down, else the cold buffer if user waits there
// already (so that o is applied after what it holds). It reports whether
// it took o (recorded, or refused with the returned error).
func (t *Tracker) held(user string, o op) (bool, error) {
	if !t.link.upFor(user) {
		if ok, err := t.buffer(user, o); ok {
			return true, err
		}
	}
	if t.cold.n.Load() == 0 {
		return false, nil
	}
	return t.hold(user, o, true)
}

// loadFailed classifies the error of a load: if the durable store is
// unavailable (and not the caller's context done) it returns a
// *profileError and makes the next loads fail fast until retryCold
// reaches the durable store again.
func (t *Tracker) loadFailed(ctx context.Context, user string, err error) error {
	if ctx.Err() != nil || !Unavailable(err) {
		return fmt.Errorf("load %q: %w", user, err)
	}
	if t.cold.down.CompareAndSwap(false, true) {
		t.log.Warn("durable store unavailable: heartbeats of users not in the state store wait in this node for their profile", "err", err)
	}
	return &profileError{user: user, err: err}
}

// coldBatch is how many users retryCold loads with one durable read.
const coldBatch = 1000

// retryCold loads the users of the cold buffer once the durable store
// answers, and applies what they did. Run calls it every ProbeInterval
// while the buffer is not empty or loads fail fast. It does nothing while
// the state store is down (the outage buffer is replayed first).
func (t *Tracker) retryCold(ctx context.Context) {
	if !t.link.up() || t.cold.n.Load() == 0 && !t.cold.down.Load() {
		return
	}
	var users []string
	for i := range t.cold.shards {
		sh := &t.cold.shards[i]
		sh.mu.Lock()
		for u := range sh.users {
			users = append(users, u)
		}
		sh.mu.Unlock()
	}
	if len(users) == 0 {
		// Loads fail fast, and nobody waits: only see whether the durable
		// store answers again.
		pctx, cancel := context.WithTimeout(ctx, t.loadTimeout)
		err := t.pingDurable(pctx)
		cancel()
		if err == nil && t.cold.down.CompareAndSwap(true, false) {
			t.log.Info("durable store answers again")
		}
		return
	}
	for len(users) > 0 && ctx.Err() == nil && t.link.up() {
		chunk := users[:min(len(users), coldBatch)]
		users = users[len(chunk):]
		profiles := make(map[string]presence.Profile, len(chunk))
		lctx, cancel := context.WithTimeout(ctx, t.loadTimeout)
		err := t.durable.LoadProfiles(lctx, chunk, func(p *presence.Profile) { profiles[p.UserID] = *p })
		cancel()
		if err != nil {
			return // still down: the next probe tries again
		}
		if t.cold.down.CompareAndSwap(true, false) {
			t.log.Info("durable store answers again; loading the users whose heartbeats waited", "users", t.cold.n.Load())
		}
		for _, u := range chunk {
			sh := &t.cold.shards[t.bufIndex(u)]
			p, ok := profiles[u]
			if !ok {
				p = presence.Profile{UserID: u}
			}
			if err := t.replayCold(ctx, sh, u, p); err != nil {
				if ctx.Err() != nil {
					return
				}
				t.log.Warn("loading a user whose heartbeats waited for the durable store failed; will retry", "user_id", u, "err", err)
				if Unavailable(err) {
					return // a backend is away again: the next probe retries
				}
			}
		}
	}
}

// pingDurable asks the durable store whether it answers: with its Ping if
// it has one, else with a read of a profile.
func (t *Tracker) pingDurable(ctx context.Context) error {
	if p, ok := t.durable.(interface{ Ping(context.Context) error }); ok {
		return p.Ping(ctx)
	}
	return t.durable.LoadProfiles(ctx, []string{"presenced-probe"}, func(*presence.Profile) {})
}

// replayCold applies what user did while its profile could not be loaded,
// p being its durable profile as read now. Operations arriving meanwhile
// are added to the buffer and applied after these. On a failure the
// operations go back in front of the newer ones.
func (t *Tracker) replayCold(ctx context.Context, sh *bufShard, user string, p presence.Profile) error {
	sh.mu.Lock()
	rec := sh.users[user]
	if rec == nil {
		sh.mu.Unlock()
		return nil
	}
	batch := *rec
	*rec = pending{}
	sh.mu.Unlock()
	for {
		if err := t.applyCold(ctx, user, p, &batch); err != nil {
			sh.mu.Lock()
			newer := rec.ops(nil)
			*rec = batch
			for _, o := range newer {
				_ = rec.add(o, t.rules.MaxDevices) // the newer ones were accepted once
			}
			sh.mu.Unlock()
			return err
		}
		sh.mu.Lock()
		if rec.empty() {
			delete(sh.users, user)
			t.cold.n.Add(-1)
			t.cold.loaded.Add(1)
			sh.mu.Unlock()
			return nil
		}
		batch = *rec
		*rec = pending{}
		sh.mu.Unlock()
		// p is stale now (the first round may have written last_seen):
		// the fold below only ever moves last_seen forward, so it is
		// still a sound base.
	}
}

// applyCold applies the buffered operations b of user, whose durable
// profile is p:
//
//   - devices that are still alive (beat within the ttl, no bye since) are
//     replayed through the ordinary path at their own times: the user is
//     loaded from the durable store as any user (its manual status, its
//     settings, its version + ReloadMargin), and the changes are published
//     as with any heartbeat — an invisible user's, none;
//   - devices that ended meanwhile (died or said bye) were never shown and
//     are not now: they only move last_seen (and the public last_seen, as
//     the rules say: not for an invisible user) forward, written to the
//     durable store directly.
func (t *Tracker) applyCold(ctx context.Context, user string, p presence.Profile, b *pending) error {
	now := t.Now()
	ttl := t.rules.TTL.Milliseconds()
	ended := func(id string) bool {
		for _, d := range b.devices {
			if d.id == id {
				return d.bye != 0 || d.beat+ttl <= now
			}
		}
		return true
	}
	ops := b.ops(nil)
	u := presence.NewUser(p)
	for _, o := range ops {
		switch {
		case !ended(o.device):
		case o.kind == opBeat:
			_, _ = u.Beat(&t.rules, o.at, o.device, o.active) // a refused beat was refused when buffered
		case o.kind == opBye:
			u.Bye(&t.rules, o.at, o.device)
		}
	}
	u.Expire(&t.rules, now)
	if u.LastSeen > p.LastSeen || u.PubLastSeen > p.PubLastSeen {
		seen := []presence.Profile{{UserID: user, LastSeen: u.LastSeen, PubLastSeen: u.PubLastSeen, Version: p.Version,
			Manual: u.Manual, Text: u.Text, PubText: u.PubText, PubVersion: u.PubVersion}} // the public face as it is
		lctx, cancel := context.WithTimeout(ctx, t.loadTimeout)
		err := t.durable.SaveLastSeen(lctx, seen)
		cancel()
		if err != nil {
			return fmt.Errorf("last_seen of devices that ended while the durable store was down: %w", err)
		}
	}
	for _, o := range ops {
		if ended(o.device) {
			continue
		}
		ch, err := t.applyBeat(ctx, o.at, user, o.device, o.active)
		if err != nil && !domainError(err) {
			return err
		}
		t.emit(&ch)
	}
	return nil
}

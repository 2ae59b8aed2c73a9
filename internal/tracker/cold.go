package tracker

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// cold holds the heartbeats and byes of users the state store does not
// hold and the durable store could not load (see docs/internals.md,
// "Users the durable store cannot load"), and loads them once the
// durable store answers again.
type cold struct {
	buf     userBuffer
	down    atomic.Bool   // a load failed for the durable store: loads fail fast until retry reaches it
	loaded  atomic.Uint64 // users loaded and replayed from the buffer
	link    *link
	durable Durable
	ping    func(context.Context) error // the durable store's Ping; nil: a read of a profile
	events  *emitter
	rules   presence.Rules
	timeout time.Duration // Config.LoadTimeout
	// beat applies a beat through the ordinary path (the user loaded
	// first), as a heartbeat does.
	beat func(ctx context.Context, now int64, user, device string, active bool) (presence.Change, error)
}

// waiting reports whether some user waits for their profile.
func (c *cold) waiting() bool { return c.buf.n.Load() > 0 }

// hold records o for user in the cold buffer. With onlyIfHeld it records
// it only if user has operations there already (so that a newer operation
// is applied after them), and reports whether it did. A user enters the
// buffer only while fewer than Config.MaxBuffered users are in it.
func (c *cold) hold(user string, o op, onlyIfHeld bool) (bool, error) {
	sh := c.buf.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return c.buf.addLocked(sh, user, o, !onlyIfHeld, errColdFull)
}

// failFast reports whether loads fail at once: the durable store did not
// answer a moment ago.
func (c *cold) failFast() bool { return c.down.Load() }

// loadFailed classifies the error of a load: if the durable store is
// unavailable (and not the caller's context done) it returns a
// *profileError and makes the next loads fail fast until retry reaches
// the durable store again.
func (c *cold) loadFailed(ctx context.Context, user string, err error) error {
	if ctx.Err() != nil || !Unavailable(err) {
		return fmt.Errorf("load %q: %w", user, err)
	}
	if c.down.CompareAndSwap(false, true) {
		c.link.log.Warn("durable store unavailable: heartbeats of users not in the state store wait in this node for their profile", "err", err)
	}
	return &profileError{user: user, err: err}
}

// coldBatch is how many users retry loads with one durable read.
const coldBatch = 1000

// retry loads the users of the cold buffer once the durable store
// answers, and applies what they did. Run calls it every ProbeInterval
// while the buffer is not empty or loads fail fast. It does nothing while
// the state store is down (the outage buffer is replayed first).
func (c *cold) retry(ctx context.Context) {
	if !c.link.up() || !c.waiting() && !c.down.Load() {
		return
	}
	var users []string
	for i := range c.buf.shards {
		users = c.buf.usersIn(&c.buf.shards[i], nil, users)
	}
	if len(users) == 0 {
		// Loads fail fast, and nobody waits: only see whether the durable
		// store answers again.
		pctx, cancel := context.WithTimeout(ctx, c.timeout)
		err := c.pingDurable(pctx)
		cancel()
		if err == nil && c.down.CompareAndSwap(true, false) {
			c.link.log.Info("durable store answers again")
		}
		return
	}
	for len(users) > 0 && ctx.Err() == nil && c.link.up() {
		chunk := users[:min(len(users), coldBatch)]
		users = users[len(chunk):]
		profiles := make(map[string]presence.Profile, len(chunk))
		lctx, cancel := context.WithTimeout(ctx, c.timeout)
		err := c.durable.LoadProfiles(lctx, chunk, func(p *presence.Profile) { profiles[p.UserID] = *p })
		cancel()
		if err != nil {
			return // still down: the next probe tries again
		}
		if c.down.CompareAndSwap(true, false) {
			c.link.log.Info("durable store answers again; loading the users whose heartbeats waited", "users", c.buf.n.Load())
		}
		for _, u := range chunk {
			p, ok := profiles[u]
			if !ok {
				p = presence.Profile{UserID: u}
			}
			if err := c.replay(ctx, u, p); err != nil {
				if ctx.Err() != nil {
					return
				}
				c.link.log.Warn("loading a user whose heartbeats waited for the durable store failed; will retry", "user_id", u, "err", err)
				if Unavailable(err) {
					return // a backend is away again: the next probe retries
				}
			}
		}
	}
}

// pingDurable asks the durable store whether it answers: with its Ping if
// it has one, else with a read of a profile.
func (c *cold) pingDurable(ctx context.Context) error {
	if c.ping != nil {
		return c.ping(ctx)
	}
	return c.durable.LoadProfiles(ctx, []string{"presenced-probe"}, func(*presence.Profile) {})
}

// replay applies what user did while its profile could not be loaded,
// p being its durable profile as read now. Operations arriving meanwhile
// are added to the buffer and applied after these. On a failure the
// operations go back in front of the newer ones.
func (c *cold) replay(ctx context.Context, user string, p presence.Profile) error {
	found, err := c.buf.drain(c.buf.shard(user), user, func(batch *pending) error {
		// After the first batch p is stale (it may have written
		// last_seen): apply only ever moves last_seen forward, so it is
		// still a sound base.
		return c.apply(ctx, user, p, batch)
	})
	if found && err == nil {
		c.loaded.Add(1)
	}
	return err
}

// apply applies the buffered operations b of user, whose durable
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
func (c *cold) apply(ctx context.Context, user string, p presence.Profile, b *pending) error {
	now := c.link.now()
	ttl := c.rules.TTL.Milliseconds()
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
			_, _ = u.Beat(&c.rules, o.at, o.device, o.active) // a refused beat was refused when buffered
		case o.kind == opBye:
			u.Bye(&c.rules, o.at, o.device)
		}
	}
	u.Expire(&c.rules, now)
	if u.LastSeen > p.LastSeen || u.PubLastSeen > p.PubLastSeen {
		seen := []presence.Profile{{UserID: user, LastSeen: u.LastSeen, PubLastSeen: u.PubLastSeen, Version: p.Version,
			Manual: u.Manual, Text: u.Text, PubText: u.PubText, PubVersion: u.PubVersion}} // the public face as it is
		lctx, cancel := context.WithTimeout(ctx, c.timeout)
		err := c.durable.SaveLastSeen(lctx, seen)
		cancel()
		if err != nil {
			return fmt.Errorf("last_seen of devices that ended while the durable store was down: %w", err)
		}
	}
	for _, o := range ops {
		if ended(o.device) {
			continue
		}
		ch, err := c.beat(ctx, o.at, user, o.device, o.active)
		if err != nil && !domainError(err) {
			return err
		}
		c.events.emit(&ch)
	}
	return nil
}

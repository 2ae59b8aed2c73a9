package tracker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/presenced/presenced/internal/presence"
)

// checkpoints write the last_seen of users to the durable store in
// batches, and keep a batch that failed until it is written. A user the
// store does not hold is read from the durable store with them
// (profiles).
type checkpoints struct {
	link    *link
	durable Durable
	// owned, if not nil, appends the last beats of the devices this node
	// holds (the store does not hear of them).
	owned func([]presence.Profile) []presence.Profile

	mu      sync.RWMutex // held by write, read by profiles; guards pending
	pending []presence.Profile
	flushed atomic.Uint64 // last_seen checkpoints written
	failed  atomic.Uint64 // checkpoints that failed
}

// write writes every last_seen changed since the previous checkpoint to
// the durable store in one transaction. On failure the batch is kept and
// retried with the next checkpoint, so nothing is lost while the durable
// store is away. While the state store is down only a waiting batch is
// retried; what a failed Dirty drained is kept in it.
func (c *checkpoints) write(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	retry := len(c.pending) > 0 // a failed batch is still waiting
	batch := c.pending
	if c.link.up() {
		b := c.link.bound(ctx)
		var err error
		if skip, ps := c.link.downParts(), c.link.can.partSweeper; skip != nil && ps != nil {
			batch, err = ps.DirtyParts(b.ctx, skip, c.pending)
		} else {
			batch, err = c.link.store.Dirty(b.ctx, c.pending)
		}
		c.link.release(b)
		c.pending = batch
		if err = c.link.check(ctx, err); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	if c.owned != nil {
		n := len(batch)
		batch = c.owned(batch)
		retry = retry || len(batch) > n
	}
	if len(batch) == 0 {
		return nil
	}
	if retry {
		// Dirty names each user once; a retried batch merged with newer
		// checkpoints, or the last beats of the devices this node
		// holds, can name one twice.
		batch = dedupeNewest(batch)
	}
	if err := c.durable.SaveLastSeen(ctx, batch); err != nil {
		c.pending = batch
		c.failed.Add(1)
		return fmt.Errorf("checkpoint of %d users: %w", len(batch), err)
	}
	c.flushed.Add(uint64(len(batch)))
	clear(batch)
	c.pending = batch[:0]
	return nil
}

// dedupeNewest keeps one profile per user, the newest, when a failed batch
// is retried together with newer checkpoints.
func dedupeNewest(b []presence.Profile) []presence.Profile {
	if len(b) < 2 {
		return b
	}
	idx := make(map[string]int, len(b))
	out := b[:0]
	for _, p := range b {
		if i, ok := idx[p.UserID]; ok {
			// Every field written only grows: keep the newest of each
			// (a checkpoint of the devices this node holds carries only
			// last_seen).
			q := &out[i]
			if p.Version >= q.Version && p.PubVersion != 0 {
				// The face goes with the newest version (Manual and
				// Text say whether it is kept: Profile.Frozen).
				q.Manual, q.Text, q.PubText, q.PubVersion = p.Manual, p.Text, p.PubText, p.PubVersion
			}
			q.LastSeen = max(q.LastSeen, p.LastSeen)
			q.PubLastSeen = max(q.PubLastSeen, p.PubLastSeen)
			q.Version = max(q.Version, p.Version)
			continue
		}
		idx[p.UserID] = len(out)
		out = append(out, p)
	}
	return out
}

// profiles calls fn with the profile of each of ids (each once) that the
// durable store knows or that this node checkpointed: the durable one
// with the checkpoints drained from the store but not yet durable (in
// flight, or pending after a failed write) merged in — the one rule for a
// user the store does not hold (a load, a degraded read). Versions count
// up from a loaded one, so loading without them would stamp versions that
// were already published. With wait, the durable read waits for a
// checkpoint in flight (a load must not miss it); without, a checkpoint
// in flight may be missed (a read, which must not queue behind a slow
// durable write: the last second of last_seen at worst).
func (c *checkpoints) profiles(ctx context.Context, ids []string, fn func(*presence.Profile), wait bool) error {
	first := make(map[string]int, len(ids)) // id → its index among the distinct
	got := make([]presence.Profile, 0, len(ids))
	have := make([]bool, 0, len(ids))
	for _, id := range ids {
		if _, ok := first[id]; !ok {
			first[id] = len(got)
			got = append(got, presence.Profile{UserID: id})
			have = append(have, false)
		}
	}
	if wait {
		c.mu.RLock()
		defer c.mu.RUnlock()
	}
	err := c.durable.LoadProfiles(ctx, ids, func(p *presence.Profile) {
		if i, ok := first[p.UserID]; ok {
			got[i], have[i] = *p, true
		}
	})
	if err != nil {
		return err
	}
	if !wait {
		c.mu.RLock()
		defer c.mu.RUnlock()
	}
	for _, q := range c.pending {
		if i, ok := first[q.UserID]; ok {
			p := &got[i]
			if q.Version >= p.Version {
				p.PubText, p.PubVersion = q.PubText, q.PubVersion // the face goes with the newest version
			}
			p.LastSeen = max(p.LastSeen, q.LastSeen)
			p.PubLastSeen = max(p.PubLastSeen, q.PubLastSeen)
			p.Version = max(p.Version, q.Version)
			have[i] = true
		}
	}
	for i := range got {
		if have[i] {
			fn(&got[i])
		}
	}
	return nil
}

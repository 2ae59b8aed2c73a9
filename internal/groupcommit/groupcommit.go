// Package groupcommit commits concurrent writes together: the writes that
// arrive while a commit is under way wait in a bounded queue and go
// together in the next commit — one transaction, one fsync or one round
// trip for all of them. A write that finds no commit under way is
// committed at once, by its own caller: a lone write waits for nothing but
// its own commit and crosses no goroutine.
//
// There is no goroutine of its own (leader and followers): the caller whose
// write opens a commit sends it; when it is done it hands the next commit
// to the first write that queued meanwhile (so no caller commits more than
// one group) and then wakes the callers of its group. The same pattern
// batches heartbeats in internal/redisstore.
//
// The durable stores use it for statuses and settings, the writes a caller
// waits for (internal/sqlitestore, internal/pgstore); last_seen has its own
// group commit, the tracker's checkpoint.
package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ErrClosed is the error of a write to a closed Committer.
var ErrClosed = errors.New("groupcommit: closed")

// Config configures a Committer. Zero values take the documented defaults.
type Config struct {
	// QueueLen bounds the writes waiting for or in a commit; a writer
	// beyond it waits for room (or gives up with its context). Default
	// 1024.
	QueueLen int
	// MaxGroup bounds the writes of one commit. Default 512.
	MaxGroup int
}

// CommitFunc writes group durably, in order, in one transaction, and
// returns nil only if all of it is durable. ctx is never cancelled; it has
// the latest deadline of the group's callers, or none if one has none.
type CommitFunc[W any] func(ctx context.Context, group []W) error

// Committer commits writes of type W in groups. It is safe for concurrent
// use.
type Committer[W any] struct {
	commit   CommitFunc[W]
	maxGroup int
	slots    chan struct{} // one per write queued or being committed

	mu      sync.Mutex // guards the fields below and pending.lead
	queue   []*pending[W]
	running bool       // a commit is under way, or handed to queue[0]
	closed  bool       // no more writes are taken
	idle    *sync.Cond // signalled when running turns false
}

type pending[W any] struct {
	ctx  context.Context // the caller's: a write whose caller gave up is dropped
	w    W
	lead bool      // handed the next commit (under Committer.mu)
	err  error     // the outcome, set before wake gets false
	wake chan bool // true: commit the next group; false: err is set
}

// New returns a Committer. It starts nothing; Close makes later writes
// fail.
func New[W any](cfg Config, commit CommitFunc[W]) *Committer[W] {
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 1024
	}
	if cfg.MaxGroup <= 0 {
		cfg.MaxGroup = 512
	}
	c := &Committer[W]{commit: commit, maxGroup: cfg.MaxGroup, slots: make(chan struct{}, cfg.QueueLen)}
	c.idle = sync.NewCond(&c.mu)
	return c
}

// Write commits w, together with the writes of the moment, and returns
// the outcome of its group — or, when a group of several writes failed,
// the outcome of w committed alone, so that every caller gets its own
// error and one bad write fails no other. Writes are committed in the
// order they were queued.
//
// If ctx ends while w waits for its group, w is dropped and ctx's error
// returned. If ctx ends while w's group is being committed, ctx's error is
// returned and w may be durable nonetheless, as with any database.
func (c *Committer[W]) Write(ctx context.Context, w W) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.slots }()
	p := &pending[W]{ctx: ctx, w: w, wake: make(chan bool, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.queue = append(c.queue, p)
	lead := !c.running
	c.running = true
	c.mu.Unlock()
	if !lead {
		select {
		case lead = <-p.wake:
		case <-ctx.Done():
			c.mu.Lock()
			if i := slices.Index(c.queue, p); i >= 0 && !p.lead {
				c.queue = slices.Delete(c.queue, i, i+1)
				c.mu.Unlock()
				return ctx.Err()
			}
			lead = p.lead
			c.mu.Unlock()
			if !lead {
				return ctx.Err() // in a commit under way; its outcome is not waited for
			}
			<-p.wake
		}
	}
	if lead {
		c.lead()
	}
	return p.err
}

// lead commits the group at the head of the queue (the leader's own write
// first), hands the next commit on and wakes the group's callers — even
// if the commit panicked.
func (c *Committer[W]) lead() {
	c.mu.Lock()
	n := min(len(c.queue), c.maxGroup)
	group := slices.Clone(c.queue[:n])
	rest := copy(c.queue, c.queue[n:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
	c.mu.Unlock()

	defer func() {
		r := recover()
		if r != nil {
			for _, p := range group {
				p.err = fmt.Errorf("groupcommit: commit panicked: %v", r)
			}
		}
		c.mu.Lock()
		if len(c.queue) > 0 {
			next := c.queue[0]
			next.lead = true
			next.wake <- true
		} else {
			c.running = false
			c.idle.Broadcast()
		}
		c.mu.Unlock()
		for _, p := range group[1:] {
			p.wake <- false
		}
		if r != nil {
			panic(r)
		}
	}()
	c.commitGroup(group)
}

// commitGroup commits the writes of group whose callers still wait and
// sets the outcome of every write.
func (c *Committer[W]) commitGroup(group []*pending[W]) {
	live := make([]*pending[W], 0, len(group))
	for _, p := range group {
		if p.err = p.ctx.Err(); p.err == nil {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return
	}
	ws := make([]W, len(live))
	for i, p := range live {
		ws[i] = p.w
	}
	err := c.commitWith(live, ws)
	if err == nil || len(live) == 1 {
		for _, p := range live {
			p.err = err
		}
		return
	}
	for i, p := range live {
		p.err = c.commitWith(live[i:i+1], ws[i:i+1])
	}
}

// commitWith calls commit for ws, the writes of live, with the latest
// deadline of their callers.
func (c *Committer[W]) commitWith(live []*pending[W], ws []W) error {
	var latest time.Time
	for _, p := range live {
		d, ok := p.ctx.Deadline()
		if !ok {
			return c.commit(context.Background(), ws)
		}
		if d.After(latest) {
			latest = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	defer cancel()
	return c.commit(ctx, ws)
}

// Close waits for the writes already queued to be committed and makes
// later writes fail with ErrClosed. It is idempotent and safe for
// concurrent use.
func (c *Committer[W]) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for c.running {
		c.idle.Wait()
	}
}

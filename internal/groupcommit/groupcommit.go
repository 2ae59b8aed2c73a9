// Package groupcommit commits concurrent writes together. A Committer owns
// one goroutine that takes the first write waiting in its bounded queue
// and every write queued behind it, and hands them to the backend's commit
// function in one call: one transaction, one fsync or one round trip for
// all of them. Writes that arrive while a commit is under way wait and form
// the next group, so a lone write waits for nothing but its own commit and
// many concurrent writes cost about one commit.
//
// The durable stores use it for statuses and settings, the writes a caller
// waits for (internal/sqlitestore, internal/pgstore); last_seen has its own
// group commit, the tracker's checkpoint.
package groupcommit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrClosed is the error of a write to a closed Committer.
var ErrClosed = errors.New("groupcommit: closed")

// Config configures a Committer. Zero values take the documented defaults.
type Config struct {
	// QueueLen bounds the writes waiting for a commit; a writer beyond it
	// waits for room (or gives up with its context). Default 1024.
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
	queue    chan *pending[W]
	stopped  chan struct{} // closed when the goroutine has returned

	mu     sync.RWMutex // guards closed; held for reading while sending to queue
	closed bool

	closeOnce sync.Once
}

type pending[W any] struct {
	ctx  context.Context // the caller's: a write whose caller gave up is dropped
	w    W
	done chan error // the outcome; buffered, so the committer never waits
}

// New returns a Committer and starts its goroutine; Close stops it.
func New[W any](cfg Config, commit CommitFunc[W]) *Committer[W] {
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 1024
	}
	if cfg.MaxGroup <= 0 {
		cfg.MaxGroup = 512
	}
	c := &Committer[W]{
		commit:   commit,
		maxGroup: cfg.MaxGroup,
		queue:    make(chan *pending[W], cfg.QueueLen),
		stopped:  make(chan struct{}),
	}
	go c.run()
	return c
}

// Write queues w and waits until the group holding it was committed. It
// returns the group's outcome — or, when a group of several writes failed,
// the outcome of w committed alone, so that every caller gets its own
// error and one bad write fails no other. Writes are committed in the
// order they were queued.
//
// If ctx ends while w waits in the queue, w is dropped and ctx's error
// returned. If ctx ends while w's group is being committed, ctx's error is
// returned and w may be durable nonetheless, as with any database.
func (c *Committer[W]) Write(ctx context.Context, w W) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := &pending[W]{ctx: ctx, w: w, done: make(chan error, 1)}
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return ErrClosed
	}
	select {
	case c.queue <- p:
	case <-ctx.Done():
		c.mu.RUnlock()
		return ctx.Err()
	}
	c.mu.RUnlock()
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close commits the writes already queued, stops the goroutine, and makes
// later writes fail with ErrClosed. It is idempotent and safe for
// concurrent use.
func (c *Committer[W]) Close() {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		close(c.queue)
		c.mu.Unlock()
	})
	<-c.stopped
}

func (c *Committer[W]) run() {
	defer close(c.stopped)
	group := make([]*pending[W], 0, c.maxGroup)
	for p := range c.queue {
		group = append(group[:0], p)
	more:
		for len(group) < c.maxGroup {
			select {
			case p, ok := <-c.queue:
				if !ok {
					break more
				}
				group = append(group, p)
			default:
				break more
			}
		}
		c.commitGroup(group)
		clear(group)
	}
}

// commitGroup commits the writes of group whose callers still wait and
// tells each its outcome.
func (c *Committer[W]) commitGroup(group []*pending[W]) {
	live := group[:0]
	for _, p := range group {
		if err := p.ctx.Err(); err != nil {
			p.done <- err
			continue
		}
		live = append(live, p)
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
			p.done <- err
		}
		return
	}
	for i, p := range live {
		p.done <- c.commitWith(live[i:i+1], ws[i:i+1])
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

// Package writegate admits a durable store's writes to its writer
// connections, so that a flood of big writes neither stands in front of
// the small writes callers wait for nor piles up without end.
//
// A Gate has a fixed number of slots (one for SQLite's single writer
// connection). Two kinds of write wait for them:
//
//   - Urgent writes (the group commits of statuses and settings, the
//     last_seen checkpoint: a few at a time by construction) take the next
//     free slot before any bulk write that waits. Under a flood of bulk
//     writes an urgent write waits for the bulk write in progress, never
//     for the queue behind it.
//   - Bulk writes (contact lists: up to 10,000 rows each) wait in a bounded
//     first-in first-out queue. A bulk write that finds the queue full is
//     refused at once with ErrBusy: its caller is told to retry instead of
//     waiting behind a backlog that only grows.
//
// Without it, SQLite's writer connection went to whichever waiter
// database/sql picked (at random): 8 connections replacing 10,000-entry
// contact lists in a loop made another user's status change wait 260 ms
// at the median, 1.4 s at p99 (docs/benchmarks.md).
package writegate

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
)

// ErrBusy is the error of a bulk write refused because the queue of bulk
// writes is full. Nothing was written; the caller may retry later.
var ErrBusy = errors.New("too many writes are waiting for the durable store")

// Kind is what kind of write enters the gate.
type Kind uint8

const (
	// Urgent writes are admitted before bulk writes and never refused.
	Urgent Kind = iota
	// Bulk writes wait in a bounded queue, behind urgent writes.
	Bulk
)

// Config configures a Gate. Zero values take the documented defaults.
type Config struct {
	// Slots is how many writes may be in progress at once. Default 1.
	Slots int
	// MaxQueued bounds the bulk writes waiting for a slot; a bulk write
	// beyond it gets ErrBusy. Default 16.
	MaxQueued int
}

// Gate admits writes to a store's writers. It is safe for concurrent use.
type Gate struct {
	maxQueued int
	refused   atomic.Uint64

	mu     sync.Mutex // guards the fields below
	free   int        // slots not held
	urgent []waiter   // in arrival order
	bulk   []waiter   // in arrival order, at most maxQueued
}

// A waiter is a write waiting for a slot. Its channel is closed when the
// slot is handed to it (under Gate.mu, which also removes it from its
// queue).
type waiter chan struct{}

// New returns a Gate.
func New(cfg Config) *Gate {
	if cfg.Slots <= 0 {
		cfg.Slots = 1
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 16
	}
	return &Gate{maxQueued: cfg.MaxQueued, free: cfg.Slots}
}

// Enter waits for a slot for a write of kind k, and returns nil once the
// caller holds it; the caller must then call Leave when its write is
// done. It returns ErrBusy at once for a bulk write that finds MaxQueued
// bulk writes waiting, and ctx's error if ctx ends first (holding
// nothing).
func (g *Gate) Enter(ctx context.Context, k Kind) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	g.mu.Lock()
	if g.free > 0 && len(g.urgent) == 0 && (k == Urgent || len(g.bulk) == 0) {
		g.free--
		g.mu.Unlock()
		return nil
	}
	q := &g.urgent
	if k == Bulk {
		if len(g.bulk) >= g.maxQueued {
			g.mu.Unlock()
			g.refused.Add(1)
			return ErrBusy
		}
		q = &g.bulk
	}
	w := make(waiter)
	*q = append(*q, w)
	g.mu.Unlock()

	select {
	case <-w:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(*q, w); i >= 0 {
		*q = slices.Delete(*q, i, i+1)
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	g.Leave() // handed a slot just as ctx ended: pass it on
	return ctx.Err()
}

// Leave gives back the slot the caller holds: to the first urgent write
// waiting, else to the first bulk write waiting.
func (g *Gate) Leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, q := range []*[]waiter{&g.urgent, &g.bulk} {
		if len(*q) > 0 {
			w := (*q)[0]
			*q = slices.Delete(*q, 0, 1)
			close(w)
			return
		}
	}
	g.free++
}

// Stats are a Gate's counters.
type Stats struct {
	Refused uint64 // bulk writes refused with ErrBusy
	Queued  int    // writes waiting now, urgent and bulk
}

// Stats returns the gate's counters.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	n := len(g.urgent) + len(g.bulk)
	g.mu.Unlock()
	return Stats{Refused: g.refused.Load(), Queued: n}
}

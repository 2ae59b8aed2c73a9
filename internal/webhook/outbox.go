package webhook

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/wire"
)

// Outbox is the durable log of an embedded node's changes
// (sqlitestore.Store). Entries are numbered by the Sender, one after
// another, from 1; each endpoint's cursor is the number of the last entry
// it is done with. An entry is the JSON of a change (wire.AppendChange)
// or of a room event (wire.AppendRoomEvent), told apart by how it starts
// (isRoomEvent), so the log needs no column for it. Its methods must be
// safe for concurrent use.
type Outbox interface {
	// AppendOutbox stores entries numbered first, first+1, … in one
	// transaction, durable when it returns nil.
	AppendOutbox(ctx context.Context, first uint64, entries [][]byte) error
	// ReadOutbox calls fn, in order, for up to max entries numbered above
	// after; fn must not keep data.
	ReadOutbox(ctx context.Context, after uint64, max int, fn func(seq uint64, data []byte)) error
	// OutboxState returns the highest number stored or named by a cursor
	// (0: none), and the cursors by endpoint key.
	OutboxState(ctx context.Context) (last uint64, cursors map[string]uint64, err error)
	// SetOutboxCursors replaces the cursors and removes the entries every
	// one of them is past.
	SetOutboxCursors(ctx context.Context, cursors map[string]uint64) error
}

// cursorSaveInterval is how often the writer records the endpoints'
// cursors (and so removes what they are past): a crash delivers again
// what was delivered since.
const cursorSaveInterval = time.Second

// outbox is the Sender's side of an Outbox: the changes published and
// not yet written, the writer that appends them, and where the endpoints
// are. It is a Confirmer: Mark numbers the changes published, Wait waits
// for them to be written.
type outbox struct {
	s  *Sender
	db Outbox

	mu       sync.Mutex    // guards pending and accepted's increments
	pending  []queued      // published, not yet taken by the writer
	accepted atomic.Uint64 // changes ever queued: the last one's number (Mark)
	dropped  atomic.Uint64 // changes dropped: pending full, or trimmed unread
	kick     chan struct{} // cap 1: pending grew

	written atomic.Uint64 // every change numbered up to it is in the outbox
	last    atomic.Uint64 // the number of the last entry in the outbox
	failing atomic.Bool   // the last append failed: Wait does not wait
	dirty   atomic.Bool   // a cursor moved since they were saved

	waitMu sync.Mutex    // guards waitCh
	waitCh chan struct{} // closed when written moves; nil while nobody waits

	// The writer's own (run).
	taking  []queued
	buf     []byte
	entries [][]byte
}

// queued is one event waiting for the writer: a change of presence, or
// (room not nil) a join or leave of a room. A room event is copied to the
// heap: a change, far more common, is queued without allocating.
type queued struct {
	ev   presence.Event
	room *presence.RoomEvent
}

var _ Confirmer = (*outbox)(nil)

func openOutbox(ctx context.Context, s *Sender) (*outbox, error) {
	ob := &outbox{s: s, db: s.cfg.Outbox, kick: make(chan struct{}, 1)}
	last, cursors, err := ob.db.OutboxState(ctx)
	if err != nil {
		return nil, fmt.Errorf("webhook: read the outbox: %w", err)
	}
	ob.last.Store(last)
	for _, e := range s.endpoints {
		c, ok := cursors[e.key]
		if !ok || c > last {
			c = last // a new endpoint is sent the changes from now on
		}
		e.cursor.Store(c)
	}
	// Forget the cursors of endpoints no longer configured, and what the
	// others are past.
	if err := ob.saveCursors(ctx); err != nil {
		return nil, fmt.Errorf("webhook: record the outbox's cursors: %w", err)
	}
	return ob, nil
}

// push queues a copy of ev (or of room, when ev is nil) for the writer;
// beyond QueueLen it is dropped and counted.
func (ob *outbox) push(ev *presence.Event, room *presence.RoomEvent) {
	if room != nil {
		cp := *room
		room = &cp
	}
	ob.mu.Lock()
	if len(ob.pending) >= ob.s.cfg.QueueLen {
		ob.mu.Unlock()
		if n := ob.dropped.Add(1); n == 1 || n%10000 == 0 {
			ob.s.log.Warn("webhook outbox: the disk does not keep up, changes dropped", "queue", ob.s.cfg.QueueLen, "dropped_total", n)
		}
		return
	}
	if ev != nil {
		ob.pending = append(ob.pending, queued{ev: *ev})
	} else {
		ob.pending = append(ob.pending, queued{room: room})
	}
	ob.accepted.Add(1)
	ob.mu.Unlock()
	select {
	case ob.kick <- struct{}{}:
	default:
	}
}

// Mark returns the number of the last change queued.
func (ob *outbox) Mark() uint64 { return ob.accepted.Load() }

// Wait waits until every change numbered up to mark is in the outbox. It
// reports false at once while the outbox does not take writes (a failing
// disk: its writer retries), as natsbus does while NATS is unreachable, so
// that callers are not held up one by one.
func (ob *outbox) Wait(ctx context.Context, mark uint64) bool {
	for {
		if ob.written.Load() >= mark {
			return true
		}
		if ob.failing.Load() {
			return false
		}
		ob.waitMu.Lock()
		if ob.waitCh == nil {
			ob.waitCh = make(chan struct{})
		}
		ch := ob.waitCh
		ob.waitMu.Unlock()
		if ob.written.Load() >= mark {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ob.written.Load() >= mark
		}
	}
}

// stats returns the changes not yet written plus those written that some
// endpoint has not taken, and the changes dropped before an endpoint.
func (ob *outbox) stats() (queued int, dropped uint64) {
	ob.mu.Lock()
	queued = len(ob.pending)
	ob.mu.Unlock()
	last := ob.last.Load()
	for _, e := range ob.s.endpoints {
		if c := e.cursor.Load(); c < last {
			queued += int(last - c)
		}
	}
	return queued, ob.dropped.Load()
}

// run is the writer: it appends what is queued, in one transaction per
// round, and records the cursors every cursorSaveInterval, until ctx is
// done; then it writes what is still queued and the cursors once more.
func (ob *outbox) run(ctx context.Context) {
	tick := time.NewTicker(cursorSaveInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ob.s.cfg.DrainTimeout)
			ob.flush(fctx)
			if ob.dirty.Swap(false) {
				if err := ob.saveCursors(fctx); err != nil {
					ob.s.log.Warn("webhook outbox: recording the cursors at shutdown failed; some changes will be sent again", "err", err)
				}
			}
			cancel()
			return
		case <-ob.kick:
			ob.flush(ctx)
		case <-tick.C:
			if ob.dirty.Swap(false) {
				if err := ob.saveCursors(ctx); err != nil {
					ob.dirty.Store(true)
					ob.s.logLimited("webhook outbox: recording the cursors failed; will retry", "err", err)
				}
			}
		}
	}
}

// flush appends what is queued, retrying with backoff until it is
// written or ctx ends (what is left then stays queued).
func (ob *outbox) flush(ctx context.Context) {
	for {
		ob.mu.Lock()
		batch := ob.pending
		ob.pending = ob.taking[:0]
		ob.mu.Unlock()
		ob.taking = batch
		if len(batch) == 0 {
			return
		}
		ob.buf, ob.entries = ob.buf[:0], ob.entries[:0]
		for i := range batch {
			start := len(ob.buf)
			if q := &batch[i]; q.room != nil {
				ob.buf = wire.AppendRoomEvent(ob.buf, q.room)
			} else {
				ob.buf = wire.AppendChange(ob.buf, &q.ev)
			}
			ob.entries = append(ob.entries, ob.buf[start:len(ob.buf):len(ob.buf)])
		}
		// ob.buf may have moved while it grew: cut the entries again.
		off := 0
		for i, e := range ob.entries {
			ob.entries[i] = ob.buf[off : off+len(e) : off+len(e)]
			off += len(e)
		}
		first := ob.last.Load() + 1
		backoff := ob.s.cfg.MinBackoff
		for {
			err := ob.db.AppendOutbox(ctx, first, ob.entries)
			if err == nil {
				break
			}
			if !ob.failing.Swap(true) {
				ob.wakeWaiters() // they stop waiting
			}
			ob.s.logLimited("webhook outbox: writing changes failed; will retry", "changes", len(batch), "err", err)
			if !sleep(ctx, backoff) {
				// Stopping: put them back in front, for a last try.
				ob.mu.Lock()
				ob.pending = append(batch, ob.pending...)
				ob.mu.Unlock()
				ob.taking = nil
				return
			}
			backoff = min(2*backoff, ob.s.cfg.MaxBackoff)
		}
		clear(batch) // keep no strings alive
		n := uint64(len(batch))
		ob.last.Store(first + n - 1)
		ob.written.Add(n)
		ob.failing.Store(false)
		ob.wakeWaiters()
		ob.trim(ctx)
		for _, e := range ob.s.endpoints {
			select {
			case e.wake <- struct{}{}:
			default:
			}
		}
	}
}

// wakeWaiters wakes the callers of Wait to look again.
func (ob *outbox) wakeWaiters() {
	ob.waitMu.Lock()
	if ob.waitCh != nil {
		close(ob.waitCh)
		ob.waitCh = nil
	}
	ob.waitMu.Unlock()
}

// trim keeps the outbox within QueueLen entries of the last: an endpoint
// further behind loses its oldest, counted as dropped.
func (ob *outbox) trim(ctx context.Context) {
	last := ob.last.Load()
	limit := uint64(ob.s.cfg.QueueLen)
	if last <= limit {
		return
	}
	floor := last - limit
	moved := false
	for _, e := range ob.s.endpoints {
		for {
			c := e.cursor.Load()
			if c >= floor {
				break
			}
			if e.cursor.CompareAndSwap(c, floor) {
				n := e.dropped.Add(floor - c)
				ob.s.logLimited("webhook outbox full: the oldest changes for an endpoint were dropped", "url", e.url,
					"kept", limit, "dropped_total", n)
				moved = true
				break
			}
		}
	}
	if moved {
		if err := ob.saveCursors(ctx); err != nil {
			ob.dirty.Store(true)
		}
	}
}

// saveCursors records every endpoint's cursor (removing what they are all
// past).
func (ob *outbox) saveCursors(ctx context.Context) error {
	m := make(map[string]uint64, len(ob.s.endpoints))
	for _, e := range ob.s.endpoints {
		m[e.key] = e.cursor.Load()
	}
	return ob.db.SetOutboxCursors(ctx, m)
}

// done moves e's cursor to seq (never back).
func (ob *outbox) done(e *endpoint, seq uint64) {
	for {
		c := e.cursor.Load()
		if c >= seq || e.cursor.CompareAndSwap(c, seq) {
			break
		}
	}
	ob.dirty.Store(true)
}

// next waits for entries after e's cursor and reads up to MaxBatch of
// them into batch (their data in buf), lingering for more when fewer
// are there. It returns an empty batch when ctx ends.
func (ob *outbox) next(ctx context.Context, e *endpoint, batch []entry, buf []byte) ([]entry, []byte) {
	backoff := ob.s.cfg.MinBackoff
	for {
		after := e.cursor.Load()
		if ob.last.Load() <= after {
			select {
			case <-ctx.Done():
				return batch, buf
			case <-e.wake:
			}
			continue
		}
		if ob.last.Load()-after < uint64(ob.s.cfg.MaxBatch) && !sleep(ctx, ob.s.cfg.Linger) {
			return batch, buf
		}
		after = e.cursor.Load() // the writer may have trimmed meanwhile
		err := ob.db.ReadOutbox(ctx, after, ob.s.cfg.MaxBatch, func(seq uint64, data []byte) {
			start := len(buf)
			buf = append(buf, data...)
			batch = append(batch, entry{seq: seq, data: buf[start:len(buf):len(buf)]})
		})
		if err != nil {
			batch, buf = batch[:0], buf[:0]
			if ctx.Err() != nil {
				return batch, buf
			}
			ob.s.logLimited("webhook outbox: reading failed; will retry", "url", e.url, "err", err)
			if !sleep(ctx, backoff) {
				return batch, buf
			}
			backoff = min(2*backoff, ob.s.cfg.MaxBackoff)
			continue
		}
		if len(batch) == 0 {
			// Nothing above the cursor although the outbox went further:
			// those entries are gone (removed by hand); skip them.
			ob.done(e, ob.last.Load())
			continue
		}
		// buf may have moved while it grew: cut the entries again.
		off := 0
		for i := range batch {
			n := len(batch[i].data)
			batch[i].data = buf[off : off+n : off+n]
			off += n
		}
		return batch, buf
	}
}

// runOutbox delivers e's entries from the outbox until ctx ends, then
// drains.
func (e *endpoint) runOutbox(ctx context.Context) {
	ob := e.s.ob
	var batch []entry
	var buf, body []byte
	for {
		batch, buf = ob.next(ctx, e, batch[:0], buf[:0])
		if len(batch) == 0 || ctx.Err() != nil {
			break
		}
		body = encode(body[:0], batch)
		if !e.deliver(ctx, context.Background(), body, len(batch)) {
			break
		}
		ob.done(e, batch[len(batch)-1].seq)
	}
	e.drainOutbox()
}

// drainOutbox makes one attempt per batch to deliver what the outbox
// holds for e, within DrainTimeout. What is not delivered stays for the
// next run.
func (e *endpoint) drainOutbox() {
	ctx, cancel := context.WithTimeout(context.Background(), e.s.cfg.DrainTimeout)
	defer cancel()
	ob := e.s.ob
	var batch []entry
	var buf, body []byte
	for ctx.Err() == nil && ob.last.Load() > e.cursor.Load() {
		batch, buf = batch[:0], buf[:0]
		err := ob.db.ReadOutbox(ctx, e.cursor.Load(), e.s.cfg.MaxBatch, func(seq uint64, data []byte) {
			batch = append(batch, entry{seq: seq, data: append([]byte(nil), data...)})
		})
		if err != nil || len(batch) == 0 {
			return
		}
		body = encode(body[:0], batch)
		if _, err := e.post(ctx, body); err != nil {
			return
		}
		e.delivered.Add(uint64(len(batch)))
		ob.done(e, batch[len(batch)-1].seq)
	}
}

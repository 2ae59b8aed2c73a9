package fanout

// The order of a room's events: each applied at the version after the
// room's, the rest held back (hold) until the missing ones come, or until
// GapWait, when the room's watchers are resynced by the hub's worker.

import (
	"context"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/wire"
)

// hold keeps he back in r until the events before it come; a join is
// indexed by its user, so that the user's changes of status meanwhile
// update it (applyStatus). Held: mu.
func (h *RoomHub) hold(r *room, he heldEvent) {
	h.unhold(r, he.ev.Version) // a duplicate replaces the first
	r.pending[he.ev.Version] = he
	if he.ev.Kind != presence.RoomJoin {
		return
	}
	rs := h.held[he.ev.UserID]
	if rs == nil {
		rs = make(map[*room]int, 1)
		h.held[he.ev.UserID] = rs
		h.touch(he.ev.UserID)
	}
	rs[r]++
}

// unhold forgets the event held back at version v. Held: mu.
func (h *RoomHub) unhold(r *room, v uint64) {
	he, ok := r.pending[v]
	if !ok {
		return
	}
	delete(r.pending, v)
	if he.ev.Kind != presence.RoomJoin {
		return
	}
	rs := h.held[he.ev.UserID]
	if rs[r]--; rs[r] <= 0 {
		delete(rs, r)
		if len(rs) == 0 {
			delete(h.held, he.ev.UserID)
			h.touch(he.ev.UserID)
		}
	}
}

func (h *RoomHub) unholdAll(r *room) {
	for v := range r.pending {
		h.unhold(r, v)
	}
}

// apply applies one queued event.
func (h *RoomHub) apply(ctx context.Context, it roomItem) {
	if it.user != nil {
		h.applyStatus(ctx, it.user, it.reread)
		return
	}
	ev := it.room
	var contacts map[string]bool
	if ev.Kind == presence.RoomJoin && ev.Settings.Status == presence.Contacts && h.watchedByOthers(ev) {
		contacts = h.contactsOf(ctx, ev.UserID)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rooms[ev.Room]
	if r == nil {
		return // nobody here watches it
	}
	if r.known && ev.Version <= r.applied {
		h.stale.Add(1)
		return
	}
	if !r.known || !r.follows(ev) {
		if len(r.pending) >= maxEarly {
			h.resyncLocked(r)
			return
		}
		h.hold(r, heldEvent{ev: ev, contacts: contacts})
		if r.known && r.gapSince == 0 {
			r.gapSince = h.now()
			h.gaps.Add(1)
		}
		return
	}
	h.applyEvent(r, ev, contacts, 0)
	h.applyPending(r)
	if r.resync {
		h.resyncLocked(r)
	}
}

// applyPending applies the held-back events that follow r.applied.
// Held: mu.
func (h *RoomHub) applyPending(r *room) {
	for len(r.pending) > 0 {
		v := r.applied + 1
		if _, ok := r.pending[v]; !ok && r.count == 0 {
			// An empty room is no room: its next event, the join that
			// makes it again, may be at any version above; the lowest
			// held back is the one.
			v = 0
			for pv := range r.pending {
				if pv > r.applied && (v == 0 || pv < v) {
					v = pv
				}
			}
		}
		he, ok := r.pending[v]
		if !ok || !r.follows(he.ev) {
			break
		}
		h.unhold(r, v)
		h.applyEvent(r, he.ev, he.contacts, he.version)
	}
	for v := range r.pending {
		if v <= r.applied {
			h.unhold(r, v)
		}
	}
	if len(r.pending) == 0 {
		r.gapSince = 0
	}
}

// setMode puts r in interval mode or takes it out; resync says its
// watchers must be sent a fresh snapshot (they hold the other mode).
func (r *room) setMode(interval, resync bool) {
	if interval == r.interval {
		return
	}
	r.interval, r.acc = interval, nil
	if interval {
		r.acc = &intervalAcc{joined: make(map[string]struct{}), left: make(map[string]struct{})}
	}
	r.resync = r.resync || resync
}

// follows reports whether ev is the room's next event: the one at the
// version after the room's, or, when the room is empty (removed from the
// store, its next version any above), a join that makes it again.
func (r *room) follows(ev *presence.RoomEvent) bool {
	return ev.Version == r.applied+1 ||
		(r.count == 0 && ev.Version > r.applied && ev.Kind == presence.RoomJoin && ev.Count == 1)
}

// checkGaps resyncs the rooms whose held-back events waited GapWait for
// a missing one, and every room once the queue overflowed (or Resync
// asked).
func (h *RoomHub) checkGaps(ctx context.Context) {
	all := h.lost.Swap(false)
	now := h.now()
	h.mu.Lock()
	var todo []*room
	for _, r := range h.rooms {
		over := false
		for _, w := range r.watchers {
			over = over || w.over
			if w.covered != nil && now >= w.coveredUntil {
				w.covered = nil
			}
		}
		if all || over || r.resync || (r.gapSince != 0 && now-r.gapSince >= h.gapWait) {
			todo = append(todo, r)
		}
	}
	for _, r := range todo {
		h.resyncLocked(r)
	}
	h.mu.Unlock()
}

// resyncLocked forgets what the hub holds of r and has each of its
// watchers read a fresh snapshot: the reads are the resync worker's (I/O
// is never done on Run's goroutine, which every room's events wait on).
// A watcher the worker's queue has no room for marks the room, resynced
// again by the next check. Held: mu.
func (h *RoomHub) resyncLocked(r *room) {
	h.resyncs.Add(1)
	for m := range r.members {
		h.dropMember(r, m)
	}
	h.unholdAll(r)
	*r = room{id: r.id, watchers: r.watchers, pending: make(map[uint64]heldEvent), ready: r.ready}
	for _, w := range r.watchers {
		w.ready, w.early, w.over = false, nil, false
		w.gen++
		select {
		case h.resyncQ <- resyncJob{sink: w.sink, room: r.id, gen: w.gen}:
		default:
			r.resync = true
		}
	}
}

// resyncJob is a watcher waiting for a fresh snapshot.
type resyncJob struct {
	sink RoomSink
	room string
	gen  uint64
}

// resyncWorker reads the snapshots of resynced watchers until ctx is
// done; Run owns it.
func (h *RoomHub) resyncWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-h.resyncQ:
			h.mu.Lock()
			if w := h.sinks[j.sink][j.room]; w != nil && w.gen == j.gen {
				if err := h.snapshotFor(ctx, w, j.room); err != nil && ctx.Err() == nil {
					h.snapErrs.Add(1)
					h.log.Warn("rooms: reading a snapshot for a resync failed; the watcher is sent an error", "room", j.room, "err", err)
					// It names the watch_room as the request refused: the
					// watch is what ends, and what the client is to send again.
					j.sink.DeliverRoom(j.room, wire.AppendRoomError(nil, "unavailable", "watch_room", j.room, "the room "+j.room+" could not be read again; watch it again"))
					h.unwatchLocked(j.sink, j.room)
				}
			}
			h.mu.Unlock()
		}
	}
}

package fanout

// What each watcher of a room is sent: a join or leave per class of
// watcher, a member's change of status, or a big room's interval message.

import (
	"context"
	"slices"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/wire"
)

// sendIntervals sends the watchers of each room in interval mode that
// changed one room_interval message: what it gathered since the last.
func (h *RoomHub) sendIntervals() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.rooms {
		a := r.acc
		if !r.interval || !r.known || !a.changed {
			continue
		}
		frame := wire.AppendRoomInterval(nil, r.id, r.count, sortedIDs(a.joined), sortedIDs(a.left), a.moreJoined, a.moreLeft, r.applied)
		h.intervals.Add(1)
		for _, w := range r.watchers {
			h.send(r, w, earlyFrame{version: r.applied, frame: frame})
		}
		clear(a.joined)
		clear(a.left)
		a.moreJoined, a.moreLeft, a.changed = 0, 0, false
	}
}

func sortedIDs(m map[string]struct{}) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// applyEvent applies ev, the room's next event (follows), and sends it to every
// watcher as its class sees it; a join shows the member's change of
// version (0: none) if one updated it while it was held back. Held: mu.
func (h *RoomHub) applyEvent(r *room, ev *presence.RoomEvent, contacts map[string]bool, version uint64) {
	r.applied, r.count = ev.Version, ev.Count
	if r.members != nil {
		if ev.Kind == presence.RoomJoin {
			h.addMember(r, ev.UserID)
		} else {
			h.dropMember(r, ev.UserID)
		}
	}
	switch {
	case r.interval && ev.Count*10 < h.above*9: // below nine tenths
		r.setMode(false, true)
		return // the watchers' fresh snapshots (in the new mode) show it
	case !r.interval && ev.Count > h.above:
		r.setMode(true, true)
		return
	}
	if r.interval {
		r.acc.add(ev) // sent by the next interval, O(1) now
		return
	}
	var frames [numClasses][]byte
	var shown *memberShown
	if ev.Kind == presence.RoomJoin && r.shown != nil {
		shown = r.shownOf(ev.UserID)
		shown.version = max(shown.version, version)
	}
	snap := presence.Snapshot{UserID: ev.UserID, Known: true, Status: ev.Status, Settings: ev.Settings}
	for _, w := range r.watchers {
		c := classOf(w.viewer, ev.UserID, contacts)
		if frames[c] == nil {
			v := privacy.Filter(relations[c], &snap)
			frames[c] = wire.AppendRoomChange(nil, ev, &v)
			if shown != nil {
				shown.class[c] = shownStatus{set: true, visible: v.StatusVisible, status: v.Status}
				shown.seen = shown.seen || v.StatusVisible
			}
		}
		h.send(r, w, earlyFrame{version: ev.Version, frame: frames[c]})
	}
	if ev.Kind == presence.RoomLeave && r.shown != nil {
		delete(r.shown, ev.UserID)
	}
}

func classOf(viewer, member string, contacts map[string]bool) class {
	switch {
	case viewer == member:
		return classSelf
	case contacts[viewer]:
		return classContact
	}
	return classOther
}

// send gives w f's frame, now or once its snapshot is sent; a member's
// change of status its snapshot showed already (covers) is not sent.
// Held: mu.
func (h *RoomHub) send(r *room, w *roomWatcher, f earlyFrame) {
	switch {
	case !w.ready:
		if len(w.early) >= maxEarly {
			w.over = true
			return
		}
		w.early = append(w.early, f)
	case f.status && w.covered != nil && w.covers(f.member, f.mversion, h.now()):
		h.repeats.Add(1)
	case f.version > w.held || (f.status && f.version == w.held):
		w.sink.DeliverRoom(r.id, f.frame)
		h.delivered.Add(1)
	}
}

func (r *room) shownOf(member string) *memberShown {
	s := r.shown[member]
	if s == nil {
		s = new(memberShown)
		r.shown[member] = s
	}
	return s
}

func (h *RoomHub) addMember(r *room, m string) {
	if r.shown == nil {
		r.shown = make(map[string]*memberShown)
	}
	r.members[m] = struct{}{}
	rs := h.index[m]
	if rs == nil {
		rs = make(map[*room]struct{}, 1)
		h.index[m] = rs
		h.touch(m)
	}
	rs[r] = struct{}{}
}

func (h *RoomHub) dropMember(r *room, m string) {
	delete(r.members, m)
	if rs := h.index[m]; rs != nil {
		delete(rs, r)
		if len(rs) == 0 {
			delete(h.index, m)
			h.touch(m)
		}
	}
}

// applyStatus sends a member's change of status to the watchers of its
// rooms, each class only what it may see and was not shown already, and
// nothing where they were sent a newer one. reread marks the member's
// state read again (rereadMembers): sent only where newer than what was
// sent, and a class it hides the status from, where the status may have
// been shown, is sent it hidden (the change of settings that hid it may
// be among those missed).
func (h *RoomHub) applyStatus(ctx context.Context, ev *presence.Event, reread bool) {
	var contacts map[string]bool
	if privacy.NeedsContact(&ev.Settings) || (ev.SettingsChanged && privacy.NeedsContact(&ev.PrevSettings)) {
		contacts = h.contactsOf(ctx, ev.UserID)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !ev.SelfOnly {
		// A join held back shows, once applied, the status of now.
		for r := range h.held[ev.UserID] {
			for v, he := range r.pending {
				if he.ev.UserID == ev.UserID && he.ev.Kind == presence.RoomJoin && newer(ev.Version, he.version, reread) {
					he.ev.Status, he.ev.Settings = ev.Status, ev.Settings
					he.version = ev.Version
					r.pending[v] = he
				}
			}
		}
	}
	var revealed *presence.Event // ev, as though every class may have seen the status before
	for r := range h.index[ev.UserID] {
		shown := r.shownOf(ev.UserID)
		if !newer(ev.Version, shown.version, reread) {
			h.stale.Add(1)
			continue
		}
		shown.version = ev.Version
		e := ev
		if reread && shown.seen {
			if revealed == nil {
				c := *ev
				c.SettingsChanged, c.PrevSettings = true, presence.Settings{Status: presence.Everyone, LastSeen: presence.Everyone}
				revealed = &c
			}
			e = revealed
		}
		var frames [numClasses][]byte
		var decided [numClasses]bool
		for _, w := range r.watchers {
			c := classOf(w.viewer, ev.UserID, contacts)
			if !decided[c] {
				decided[c] = true
				v, ok := privacy.Delivery(relations[c], e)
				now := shownStatus{set: true, visible: v.StatusVisible, status: v.Status}
				// A member is never offline to those who see it: an
				// offline status comes with (and before) its leave.
				if !ok || (v.StatusVisible && v.Status.Public() == presence.Offline) || shown.snapShown(c, &ev.Settings) == now {
					continue
				}
				shown.class[c] = now
				shown.seen = shown.seen || v.StatusVisible
				frames[c] = wire.AppendRoomStatus(nil, r.id, &v, r.count, r.applied)
				h.statusEvents.Add(1)
			}
			if frames[c] != nil {
				h.send(r, w, earlyFrame{version: r.applied, status: true, member: ev.UserID, mversion: ev.Version, frame: frames[c]})
			}
		}
	}
}

// newer reports whether a member's change at version is to be sent
// where its watchers were sent held: a change unless older, a state read
// again only if newer.
func newer(version, held uint64, reread bool) bool {
	if reread {
		return version > held
	}
	return version >= held
}

// rereadMembers reads again the members in users who are still wanted
// (MemberWatched), in batches of a snapshot's size, and queues for Run,
// as a change, the state of each that is newer than what the watchers of
// one of its rooms were sent, or that a join queued or held back is to
// show. The members of a read that failed are noted again, and it
// reports false: the caller tries again later.
func (h *RoomHub) rereadMembers(ctx context.Context, users map[string]struct{}) bool {
	h.mu.Lock()
	ids := make([]string, 0, len(users))
	for u := range users {
		if h.memberLocked(u) {
			ids = append(ids, u)
		}
	}
	h.mu.Unlock()
	states := make([]presence.Snapshot, min(len(ids), snapshotLimit))
	for len(ids) > 0 {
		batch := ids[:min(len(ids), snapshotLimit)]
		out := states[:len(batch)]
		clear(out)
		if err := h.reader.MemberStates(ctx, batch, out); err != nil {
			if ctx.Err() != nil {
				return true // stopping
			}
			h.memberReadErrs.Add(1)
			h.log.Warn("rooms: reading members again failed; tried again in a second", "members", len(ids), "err", err)
			h.mu.Lock()
			if h.reread == nil {
				h.reread = make(map[string]struct{}, len(ids))
			}
			for _, u := range ids {
				h.reread[u] = struct{}{}
			}
			h.mu.Unlock()
			return false
		}
		h.mu.Lock()
		for i := range out {
			s := &out[i]
			if !s.Known || !h.wantsLocked(batch[i], s.Version) {
				continue
			}
			ev := memberChange(batch[i], s)
			h.enqueueLocked(roomItem{user: &ev, reread: true})
		}
		h.memberReads.Add(uint64(len(batch))) // after the queueing: what follows is queued after
		h.mu.Unlock()
		ids = ids[len(batch):]
	}
	return true
}

// wantsLocked reports whether a state of user at version read again is
// to be queued: a join of the user is queued or held back, or the
// watchers of one of its rooms were sent an older one. Held: mu.
func (h *RoomHub) wantsLocked(user string, version uint64) bool {
	if h.joining[user] > 0 || h.held[user] != nil {
		return true
	}
	for r := range h.index[user] {
		if s := r.shown[user]; s == nil || version > s.version {
			return true
		}
	}
	return false
}

// memberChange is the change that brings a watcher from any earlier state
// of user to s, its true state read now.
func memberChange(user string, s *presence.Snapshot) presence.Event {
	text, _ := s.Public()
	pub := s.Status.Public()
	return presence.Event{UserID: user, Status: pub, Prev: pub, Self: s.Status, Settings: s.Settings,
		Text: text, SelfText: s.Text, LastSeen: s.PubLastSeen, Version: s.Version}
}

// watchedByOthers reports whether someone but the member watches ev's
// room here (a contact list is looked up only then).
func (h *RoomHub) watchedByOthers(ev *presence.RoomEvent) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rooms[ev.Room]
	if r == nil {
		return false
	}
	for _, w := range r.watchers {
		if w.viewer != ev.UserID {
			return true
		}
	}
	return false
}

// contactsOf returns owner's contact list as a set; nil (nobody a contact:
// the side that shows less) if it cannot be read.
func (h *RoomHub) contactsOf(ctx context.Context, owner string) map[string]bool {
	h.contactLookups.Add(1)
	list, err := h.contacts.Contacts(ctx, owner)
	if err != nil {
		h.contactErrors.Add(1)
		h.log.Warn("rooms: reading a member's contact list failed; its contacts are shown what strangers are", "user_id", owner, "err", err)
		return nil
	}
	m := make(map[string]bool, len(list))
	for _, c := range list {
		m[c] = true
	}
	return m
}

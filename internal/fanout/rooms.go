package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
)

// A RoomHub is who, on this node, watches which room, and the delivery of
// each join, leave and member's change of status to them, in the room's
// version order, each watcher shown the status its relation to the member
// allows.
//
// Events reach it out of order (two users' operations in two store
// shards publish concurrently), so it puts them back in order: one
// goroutine (Run) takes them from a bounded queue and applies each room's
// events at consecutive versions, holding back an event that comes ahead
// of a missing one for at most Config.GapWait; after that (or when the
// queue overflowed) the room's watchers are sent a fresh snapshot. A
// watcher starts with the snapshot read when it starts watching, and is
// sent only what is newer than it.
//
// Locks: mu guards the rooms, the watchers and the member index. Sinks
// are called under it and must not block or call back. No lock is held
// across a call to the RoomReader or ContactLists.

// RoomSink is a connection that watches rooms (the gateway's).
type RoomSink interface {
	// Viewer returns the user the connection belongs to; it never
	// changes.
	Viewer() string
	// DeliverRoom queues frame, a complete message about room, for
	// sending. It must not block and must not call back into the hub;
	// frames of a room are never coalesced. frame is shared and must not
	// be modified.
	DeliverRoom(room string, frame []byte)
}

// RoomSnapshot is a room as one viewer reads it when it starts watching:
// its count and version, and its first members, each as the viewer may
// see them. Next is the last member listed when more follow (a room
// larger than one read: its watchers get no member's change of status).
type RoomSnapshot struct {
	Version uint64
	Count   int
	Members []privacy.View
	Next    string
}

// RoomReader reads a room as viewer sees it.
type RoomReader interface {
	// RoomSnapshot reads up to limit members.
	RoomSnapshot(ctx context.Context, viewer, room string, limit int) (RoomSnapshot, error)
}

// ContactLists gives an owner's contact list (the durable store).
type ContactLists interface {
	Contacts(ctx context.Context, owner string) ([]string, error)
}

// Defaults of RoomConfig.
const (
	DefaultMaxWatchedRooms = 50
	DefaultIntervalAbove   = 1000
	DefaultInterval        = 5 * time.Second
	DefaultGapWait         = 500 * time.Millisecond
	// intervalPage is how many members a snapshot of a room in interval
	// mode lists (the first page; the rest is read over HTTP).
	intervalPage = 100
	// snapshotLimit is how many members a snapshot of a room in events
	// mode reads: a batch read's worth (query.MaxBatch). A room that
	// holds more is not complete: no member's status is sent.
	snapshotLimit = 1000
	// resyncQueue bounds the watchers waiting for a fresh snapshot.
	resyncQueue = 4096
	// intervalIDs is how many ids of joins and of leaves one interval
	// message names; beyond them it counts.
	intervalIDs      = 256
	defaultRoomQueue = 1 << 16
	maxEarly         = 1024 // frames kept for a watcher whose snapshot is being read
)

// RoomConfig configures a RoomHub. Zero values take the defaults.
type RoomConfig struct {
	Reader   RoomReader   // required
	Contacts ContactLists // required
	// MaxWatched caps the rooms one sink watches (default 50).
	MaxWatched int
	// IntervalAbove is the count of members above which a room's
	// watchers are sent one room_interval message every Interval instead
	// of a message per change (default 1,000); the room goes back to
	// events below nine tenths of it.
	IntervalAbove int
	Interval      time.Duration // default 5 s
	// GapWait is how long an event is held back for a missing earlier
	// one of its room before the room's watchers are sent a snapshot.
	GapWait time.Duration
	// Queue bounds the events waiting for Run (default 65,536); beyond
	// it events are dropped and the watchers of every room resynced.
	Queue  int
	Clock  clock.Clock
	Logger *slog.Logger
}

// ErrTooManyWatchedRooms refuses a watch beyond RoomConfig.MaxWatched.
var ErrTooManyWatchedRooms = errors.New("fanout: too many watched rooms for one connection")

// RoomHub is the fan-out of rooms on one node. It is safe for concurrent
// use; Run must be running for anything to be delivered.
type RoomHub struct {
	reader   RoomReader
	contacts ContactLists
	maxWatch int
	above    int // IntervalAbove
	interval time.Duration
	gapWait  int64
	clock    clock.Clock
	log      *slog.Logger

	q       chan roomItem
	resyncQ chan resyncJob // watchers waiting for a fresh snapshot (resyncWorker)
	lost    atomic.Bool    // the queue overflowed: resync every room

	mu     sync.Mutex
	epochs uint64 // rooms made known so far (room.epoch)
	rooms  map[string]*room
	sinks  map[RoomSink]map[string]*roomWatcher
	index  map[string]map[*room]struct{} // member → rooms with every member known
	held   map[string]map[*room]int      // user → rooms holding back joins of the user
	// joining counts per user the joins of watched rooms queued and not
	// yet applied: its changes of status are queued too, to follow them.
	joining map[string]int

	intervals                                             atomic.Uint64
	running                                               atomic.Bool
	published, delivered, dropped, resyncs, stale, gaps   atomic.Uint64
	statusEvents, contactLookups, contactErrors, snapErrs atomic.Uint64
}

var (
	_ tracker.RoomPublisher = (*RoomHub)(nil)
	_ tracker.Publisher     = (*RoomHub)(nil)
)

// roomItem is a queued event: a room's join or leave, or a user's change.
type roomItem struct {
	room    *presence.RoomEvent
	user    *presence.Event
	joining bool // room is a join counted in RoomHub.joining
}

// room is one watched room.
type room struct {
	id       string
	watchers map[RoomSink]*roomWatcher
	known    bool   // applied and count are set (a snapshot was read)
	applied  uint64 // the version whose state the hub holds
	// base is the version of the snapshot that made the room known, and
	// epoch names that moment (RoomHub.epochs): the events up to base
	// were never kept, so a snapshot read before it and older than base
	// misses them (stale).
	base, epoch uint64
	count       int
	members     map[string]struct{} // nil when not every member is known
	pending     map[uint64]heldEvent
	gapSince    int64 // ms; 0: no event held back
	// shown is per member the status last sent to each class of watcher,
	// so a change a class cannot see, or sees already, sends nothing.
	shown map[string]*[numClasses]shownStatus
	// interval: the room is big; its watchers get acc once per interval.
	interval bool
	acc      *intervalAcc
	resync   bool // the room changed mode: its watchers need a fresh snapshot
}

// intervalAcc is what a room in interval mode gathered since its last
// room_interval message: the net joins and leaves (a join then a leave
// of one user in one interval cancel out), the first intervalIDs of each
// by id, the rest counted.
type intervalAcc struct {
	joined, left         map[string]struct{}
	moreJoined, moreLeft int
	changed              bool
}

func (a *intervalAcc) add(ev *presence.RoomEvent) {
	a.changed = true
	in, out, more := a.joined, a.left, &a.moreJoined
	if ev.Kind == presence.RoomLeave {
		in, out, more = a.left, a.joined, &a.moreLeft
	}
	if _, ok := out[ev.UserID]; ok {
		delete(out, ev.UserID) // back to what it was when the interval began
		return
	}
	if len(in) < intervalIDs {
		in[ev.UserID] = struct{}{}
	} else {
		*more++
	}
}

type shownStatus struct {
	set     bool
	visible bool
	status  presence.Status
}

// heldEvent is an event held back for a missing earlier one, with the
// member's contact list if it was looked up.
type heldEvent struct {
	ev       *presence.RoomEvent
	contacts map[string]bool
}

// roomWatcher is one sink watching one room.
type roomWatcher struct {
	sink   RoomSink
	viewer string
	ready  bool   // its snapshot was sent
	held   uint64 // the version of its snapshot
	gen    uint64 // bumped by each resync: a snapshot read for an older one is dropped
	early  []earlyFrame
	over   bool // early overflowed: a resync follows
}

// earlyFrame is a frame for a watcher whose snapshot was not sent yet.
type earlyFrame struct {
	version uint64
	status  bool // a member's change of status (sent at the room's version, not above it)
	frame   []byte
}

// NewRoomHub returns an empty hub.
func NewRoomHub(cfg RoomConfig) (*RoomHub, error) {
	if cfg.Reader == nil || cfg.Contacts == nil {
		return nil, errors.New("fanout: RoomConfig.Reader and Contacts are required")
	}
	if cfg.MaxWatched < 0 || cfg.GapWait < 0 || cfg.Queue < 0 || cfg.IntervalAbove < 0 || cfg.Interval < 0 {
		return nil, fmt.Errorf("fanout: negative limit in %+v", cfg)
	}
	h := &RoomHub{
		reader:   cfg.Reader,
		contacts: cfg.Contacts,
		maxWatch: cmp(cfg.MaxWatched, DefaultMaxWatchedRooms),
		above:    cmp(cfg.IntervalAbove, DefaultIntervalAbove),
		interval: cmp(cfg.Interval, DefaultInterval),
		gapWait:  cmp(cfg.GapWait, DefaultGapWait).Milliseconds(),
		clock:    cfg.Clock,
		log:      cfg.Logger,
		q:        make(chan roomItem, cmp(cfg.Queue, defaultRoomQueue)),
		resyncQ:  make(chan resyncJob, resyncQueue),
		rooms:    make(map[string]*room),
		sinks:    make(map[RoomSink]map[string]*roomWatcher),
		index:    make(map[string]map[*room]struct{}),
		held:     make(map[string]map[*room]int),
		joining:  make(map[string]int),
	}
	if h.clock == nil {
		h.clock = clock.Real{}
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	return h, nil
}

// cmp is v, or def when v is zero.
func cmp[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

func (h *RoomHub) now() int64 { return h.clock.Now().UnixMilli() }

// Watch makes s watch room: it reads the room's snapshot as s's viewer,
// sends it, and from then on every change newer than it. Watching a room
// s watches already sends a fresh snapshot.
func (h *RoomHub) Watch(ctx context.Context, s RoomSink, id string) error {
	h.mu.Lock()
	ws := h.sinks[s]
	w := ws[id]
	if w == nil {
		if len(ws) >= h.maxWatch {
			h.mu.Unlock()
			return ErrTooManyWatchedRooms
		}
		if ws == nil {
			ws = make(map[string]*roomWatcher)
			h.sinks[s] = ws
		}
		r := h.rooms[id]
		if r == nil {
			r = &room{id: id, watchers: make(map[RoomSink]*roomWatcher), pending: make(map[uint64]heldEvent)}
			h.rooms[id] = r
		}
		w = &roomWatcher{sink: s, viewer: s.Viewer()}
		ws[id] = w
		r.watchers[s] = w
	} else {
		w.ready, w.early, w.over = false, nil, false
		w.gen++
	}
	err := h.snapshotFor(ctx, w, id)
	if err != nil {
		h.snapErrs.Add(1)
		h.unwatchLocked(s, id)
	}
	h.mu.Unlock()
	return err
}

// snapshotFor reads w's snapshot of room id, again while it is stale,
// and sends it. It returns the read's error (w was sent nothing); nil
// also when w was unwatched or watched again meanwhile. Held: mu, which
// it releases during each read.
func (h *RoomHub) snapshotFor(ctx context.Context, w *roomWatcher, id string) error {
	for {
		r := h.rooms[id]
		gen, epoch := w.gen, r.knownEpoch()
		limit := snapshotLimit
		if r.known && r.interval {
			limit = intervalPage
		}
		h.mu.Unlock()
		snap, err := h.reader.RoomSnapshot(ctx, w.viewer, id, limit)
		h.mu.Lock()
		if h.sinks[w.sink][id] != w || w.gen != gen {
			return nil // unwatched, or watched again, meanwhile
		}
		if err != nil {
			return err
		}
		if r := h.rooms[id]; !r.stale(epoch, &snap) {
			h.sendSnapshot(r, w, &snap)
			return nil
		}
		// Read again: the room is known now, so once more is enough.
	}
}

// knownEpoch is r.epoch when r is known, else 0: what a snapshot read
// started now compares with when it ends (stale).
func (r *room) knownEpoch() uint64 {
	if !r.known {
		return 0
	}
	return r.epoch
}

// stale reports whether snap, read from when r's knownEpoch was epoch,
// misses events the hub no longer has: another snapshot made r known
// meanwhile, and snap is older than it (an empty room's snapshot, at
// version 0, may be either). Such a snapshot must be read again.
func (r *room) stale(epoch uint64, snap *RoomSnapshot) bool {
	if !r.known || r.epoch == epoch {
		return false // the events since the read began are in its watcher's early frames
	}
	return snap.Version < r.base || (snap.Version == 0 && r.base != 0)
}

// sendSnapshot sends w its snapshot and what came meanwhile that is newer;
// the first snapshot of a room gives the hub its state. Held: mu.
func (h *RoomHub) sendSnapshot(r *room, w *roomWatcher, snap *RoomSnapshot) {
	if !r.known {
		h.epochs++
		r.known, r.applied, r.count = true, snap.Version, snap.Count
		r.base, r.epoch = snap.Version, h.epochs
		r.setMode(snap.Count > h.above, false)
		if snap.Next == "" && !r.interval {
			r.members = make(map[string]struct{}, len(snap.Members))
			for i := range snap.Members {
				h.addMember(r, snap.Members[i].UserID)
			}
		}
	}
	members, next := snap.Members, snap.Next
	if r.interval && len(members) > intervalPage {
		members, next = members[:intervalPage], members[intervalPage-1].UserID
	}
	w.sink.DeliverRoom(r.id, wire.AppendRoom(nil, r.id, r.interval, snap.Count, members, next, snap.Version))
	h.delivered.Add(1)
	w.ready, w.held = true, snap.Version
	for _, f := range w.early {
		if f.version > w.held || (f.status && f.version == w.held) {
			w.sink.DeliverRoom(r.id, f.frame)
			h.delivered.Add(1)
		}
	}
	clear(w.early)
	w.early = w.early[:0]
	if r.known && len(r.pending) > 0 {
		h.applyPending(r)
	}
}

// Unwatch stops s watching room.
func (h *RoomHub) Unwatch(s RoomSink, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unwatchLocked(s, id)
}

func (h *RoomHub) unwatchLocked(s RoomSink, id string) {
	ws := h.sinks[s]
	if ws[id] == nil {
		return
	}
	delete(ws, id)
	if len(ws) == 0 {
		delete(h.sinks, s)
	}
	r := h.rooms[id]
	delete(r.watchers, s)
	if len(r.watchers) == 0 {
		for m := range r.members {
			h.dropMember(r, m)
		}
		h.unholdAll(r)
		delete(h.rooms, id)
	}
}

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
		}
	}
}

func (h *RoomHub) unholdAll(r *room) {
	for v := range r.pending {
		h.unhold(r, v)
	}
}

// Remove stops s watching every room (its connection closed).
func (h *RoomHub) Remove(s RoomSink) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.sinks[s] {
		h.unwatchLocked(s, id)
	}
}

// Watched returns the rooms s watches.
func (h *RoomHub) Watched(s RoomSink) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sinks[s])
}

// PublishRoom queues a join or leave for Run (tracker.RoomPublisher).
func (h *RoomHub) PublishRoom(ev *presence.RoomEvent) {
	e := *ev
	it := roomItem{room: &e}
	if e.Kind == presence.RoomJoin {
		h.mu.Lock()
		if h.rooms[e.Room] != nil {
			it.joining = true
			h.joining[e.UserID]++
		}
		h.mu.Unlock()
	}
	h.enqueue(it)
}

// Publish queues a user's change for Run (tracker.Publisher): the
// watchers of rooms the user is a member of are shown its new status.
// Only users in a watched room are queued, or with a join of one queued
// (the change follows the join in the queue).
func (h *RoomHub) Publish(ev *presence.Event) {
	h.mu.Lock()
	_, member := h.index[ev.UserID]
	member = member || h.joining[ev.UserID] > 0 || h.held[ev.UserID] != nil
	h.mu.Unlock()
	if !member {
		return
	}
	e := *ev
	h.enqueue(roomItem{user: &e})
}

func (h *RoomHub) enqueue(it roomItem) {
	h.published.Add(1)
	select {
	case h.q <- it:
	default:
		h.dropped.Add(1)
		h.lost.Store(true)
		h.joined(it)
	}
}

// joined uncounts it, taken from the queue or dropped, in h.joining.
func (h *RoomHub) joined(it roomItem) {
	if !it.joining {
		return
	}
	h.mu.Lock()
	if h.joining[it.room.UserID]--; h.joining[it.room.UserID] <= 0 {
		delete(h.joining, it.room.UserID)
	}
	h.mu.Unlock()
}

// Run applies the queued events until ctx is done.
func (h *RoomHub) Run(ctx context.Context) error {
	if !h.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer h.running.Store(false)
	wctx, stop := context.WithCancel(ctx)
	worker := make(chan struct{})
	go func() { h.resyncWorker(wctx); close(worker) }()
	defer func() { stop(); <-worker }()
	tick := time.NewTicker(time.Duration(max(h.gapWait/4, 10)) * time.Millisecond)
	defer tick.Stop()
	every := time.NewTicker(h.interval)
	defer every.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case it := <-h.q:
			h.apply(ctx, it)
			h.joined(it)
		case <-tick.C:
			h.checkGaps(ctx)
		case <-every.C:
			h.sendIntervals()
		}
	}
}

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
			h.send(r, w, r.applied, false, frame)
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

// apply applies one queued event.
func (h *RoomHub) apply(ctx context.Context, it roomItem) {
	if it.user != nil {
		h.applyStatus(ctx, it.user)
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
		h.hold(r, heldEvent{ev, contacts})
		if r.known && r.gapSince == 0 {
			r.gapSince = h.now()
			h.gaps.Add(1)
		}
		return
	}
	h.applyEvent(r, ev, contacts)
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
		h.applyEvent(r, he.ev, he.contacts)
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

// applyEvent applies ev, the room's next event (follows), and sends it to every
// watcher as its class sees it. Held: mu.
func (h *RoomHub) applyEvent(r *room, ev *presence.RoomEvent, contacts map[string]bool) {
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
	snap := presence.Snapshot{UserID: ev.UserID, Known: true, Status: ev.Status, Settings: ev.Settings}
	for _, w := range r.watchers {
		c := classOf(w.viewer, ev.UserID, contacts)
		if frames[c] == nil {
			v := privacy.Filter(relations[c], &snap)
			frames[c] = wire.AppendRoomChange(nil, ev, &v)
			if ev.Kind == presence.RoomJoin && r.shown != nil {
				r.shownOf(ev.UserID)[c] = shownStatus{set: true, visible: v.StatusVisible, status: v.Status}
			}
		}
		h.send(r, w, ev.Version, false, frames[c])
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

// send gives w frame at version, now or once its snapshot is sent.
// Held: mu.
func (h *RoomHub) send(r *room, w *roomWatcher, version uint64, status bool, frame []byte) {
	switch {
	case !w.ready:
		if len(w.early) >= maxEarly {
			w.over = true
			return
		}
		w.early = append(w.early, earlyFrame{version: version, status: status, frame: frame})
	case version > w.held || (status && version == w.held):
		w.sink.DeliverRoom(r.id, frame)
		h.delivered.Add(1)
	}
}

func (r *room) shownOf(member string) *[numClasses]shownStatus {
	s := r.shown[member]
	if s == nil {
		s = new([numClasses]shownStatus)
		r.shown[member] = s
	}
	return s
}

func (h *RoomHub) addMember(r *room, m string) {
	if r.shown == nil {
		r.shown = make(map[string]*[numClasses]shownStatus)
	}
	r.members[m] = struct{}{}
	rs := h.index[m]
	if rs == nil {
		rs = make(map[*room]struct{}, 1)
		h.index[m] = rs
	}
	rs[r] = struct{}{}
}

func (h *RoomHub) dropMember(r *room, m string) {
	delete(r.members, m)
	if rs := h.index[m]; rs != nil {
		delete(rs, r)
		if len(rs) == 0 {
			delete(h.index, m)
		}
	}
}

// applyStatus sends a member's change of status to the watchers of its
// rooms, each class only what it may see and was not shown already.
func (h *RoomHub) applyStatus(ctx context.Context, ev *presence.Event) {
	var contacts map[string]bool
	if privacy.NeedsContact(&ev.Settings) || (ev.SettingsChanged && privacy.NeedsContact(&ev.PrevSettings)) {
		contacts = h.contactsOf(ctx, ev.UserID)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !ev.SelfOnly {
		// A join held back shows, once applied, the status of now.
		for r := range h.held[ev.UserID] {
			for _, he := range r.pending {
				if he.ev.UserID == ev.UserID && he.ev.Kind == presence.RoomJoin {
					he.ev.Status, he.ev.Settings = ev.Status, ev.Settings
				}
			}
		}
	}
	for r := range h.index[ev.UserID] {
		var frames [numClasses][]byte
		var decided [numClasses]bool
		shown := r.shownOf(ev.UserID)
		for _, w := range r.watchers {
			c := classOf(w.viewer, ev.UserID, contacts)
			if !decided[c] {
				decided[c] = true
				v, ok := privacy.Delivery(relations[c], ev)
				now := shownStatus{set: true, visible: v.StatusVisible, status: v.Status}
				// A member is never offline to those who see it: an
				// offline status comes with (and before) its leave.
				if !ok || (v.StatusVisible && v.Status.Public() == presence.Offline) || shown[c] == now {
					continue
				}
				shown[c] = now
				frames[c] = wire.AppendRoomStatus(nil, r.id, &v, r.count, r.applied)
				h.statusEvents.Add(1)
			}
			if frames[c] != nil {
				h.send(r, w, r.applied, true, frames[c])
			}
		}
	}
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

// checkGaps resyncs the rooms whose held-back events waited GapWait for
// a missing one, and every room once the queue overflowed.
func (h *RoomHub) checkGaps(ctx context.Context) {
	all := h.lost.Swap(false)
	now := h.now()
	h.mu.Lock()
	var todo []*room
	for _, r := range h.rooms {
		over := false
		for _, w := range r.watchers {
			over = over || w.over
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
	*r = room{id: r.id, watchers: r.watchers, pending: make(map[uint64]heldEvent)}
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
					j.sink.DeliverRoom(j.room, wire.AppendError(nil, "unavailable", "the room "+j.room+" could not be read again; watch it again"))
					h.unwatchLocked(j.sink, j.room)
				}
			}
			h.mu.Unlock()
		}
	}
}

// RoomStats are the hub's counters and gauges.
type RoomStats struct {
	Rooms, Watchers int
	Published       uint64 // events queued
	Delivered       uint64 // frames handed to sinks
	Dropped         uint64 // events lost to a full queue (every room resynced)
	Resyncs         uint64 // rooms whose watchers were sent a fresh snapshot
	Gaps            uint64 // events that came ahead of a missing one
	Stale           uint64 // events at or below what the hub held
	StatusEvents    uint64 // members' changes of status encoded
	Intervals       uint64 // room_interval messages encoded (one per room in interval mode per interval that changed it)
	ContactLookups  uint64
	ContactErrors   uint64
	SnapshotErrors  uint64
}

// Stats returns the counters.
func (h *RoomHub) Stats() RoomStats {
	h.mu.Lock()
	rooms, watchers := len(h.rooms), 0
	for _, r := range h.rooms {
		watchers += len(r.watchers)
	}
	h.mu.Unlock()
	return RoomStats{
		Rooms: rooms, Watchers: watchers,
		Published: h.published.Load(), Delivered: h.delivered.Load(), Dropped: h.dropped.Load(),
		Resyncs: h.resyncs.Load(), Gaps: h.gaps.Load(), Stale: h.stale.Load(),
		StatusEvents: h.statusEvents.Load(), Intervals: h.intervals.Load(), ContactLookups: h.contactLookups.Load(),
		ContactErrors: h.contactErrors.Load(), SnapshotErrors: h.snapErrs.Load(),
	}
}

package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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
// allows (rooms_deliver.go).
//
// Events reach it out of order (two users' operations in two store
// shards publish concurrently), so it puts them back in order
// (rooms_order.go): one goroutine (Run) takes them from a bounded queue
// and applies each room's events at consecutive versions, holding back an
// event that comes ahead of a missing one for at most GapWait; after
// that (or when the queue overflowed) the room's watchers are sent a
// fresh snapshot, read by the hub's worker goroutine so that no read
// holds up another room. A watcher starts with the snapshot read when it
// starts watching, and is sent only what is newer than it. A room above
// IntervalAbove members sends its watchers one message per Interval.
//
// With a RoomInterest (a cross-node bus) the hub tells it which rooms it
// watches — a room's first watcher waits for WatchRooms before its
// snapshot is read, so no event of another node falls between the two —
// and which users are members of them, so that their changes of status
// on other nodes reach it too. A change of a member made between the
// read that showed the member (a room's snapshot, a join) and the moment
// the member's changes reach the hub (the bus subscribed; the member in
// its index) is not lost: once the interest's Watch returned, the hub
// reads those members again (RoomReader.MemberStates, in batches) and
// sends what is newer than what their rooms' watchers were sent, as a
// change (rereadMembers).
//
// Locks: mu guards the rooms, the watchers and the indexes. Sinks are
// called under it and must not block or call back. No lock is held
// across a call to the RoomReader, ContactLists or RoomInterest.

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

// RoomReader reads a room as viewer sees it, and members as they are.
type RoomReader interface {
	// RoomSnapshot reads up to limit members.
	RoomSnapshot(ctx context.Context, viewer, room string, limit int) (RoomSnapshot, error)
	// MemberStates fills out[i] with the true state of ids[i] now
	// (query.Reader.States), unfiltered: the hub filters it per class of
	// watcher as it filters a change. At most 1,000 ids; a user known
	// nowhere has Known false.
	MemberStates(ctx context.Context, ids []string, out []presence.Snapshot) error
}

// RoomInterest is told which rooms a RoomHub watches and which users are
// members of them (natsbus.Bus implements it), so that a cross-node bus
// subscribes to those only. WatchRooms is called with a room that got its
// first watcher, after it is registered and before any snapshot of it is
// read; UnwatchRooms with rooms that lost their last watcher. Watch and
// Unwatch (Interest) are called with users that became, or may have
// stopped being, members of watched rooms (RoomHub.MemberWatched), in
// batches. All but WatchRooms are called from a goroutine of Run's.
// Calls for one room or user may race: the implementation decides by
// RoomHub.RoomWatched and MemberWatched, which are always current.
type RoomInterest interface {
	Interest
	WatchRooms(rooms []string)
	UnwatchRooms(rooms []string)
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
	// coverFor is how long a watcher's snapshot stands for the members it
	// showed ahead of the hub (roomWatcher.covered): long enough for
	// their changes in flight when it was read to reach the hub, and
	// maxCovered bounds how many members it stands for.
	coverFor   = 2 * time.Second
	maxCovered = 64
	// memberRetry is how long a failed read of members again waits
	// before it is tried again.
	memberRetry = time.Second
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
	// Interest, when set, is told which rooms and members this hub
	// watches (nil: one node, nothing to tell). A bus built after the
	// hub registers with SetInterest instead.
	Interest RoomInterest
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
	lost    atomic.Bool    // the queue overflowed, or Resync: resync every room
	// told is signalled (cap 1) when touched or gone grew: Run's
	// interest goroutine tells the interest (tellInterest).
	told chan struct{}

	mu     sync.Mutex
	epochs uint64 // rooms made known so far (room.epoch)
	rooms  map[string]*room
	sinks  map[RoomSink]map[string]*roomWatcher
	index  map[string]map[*room]struct{} // member → rooms with every member known
	held   map[string]map[*room]int      // user → rooms holding back joins of the user
	// joining counts per user the joins of watched rooms queued and not
	// yet applied: its changes of status are queued too, to follow them.
	joining map[string]int
	// interest is told of rooms and members (nil: nobody to tell).
	// touched holds the users that entered or left index, held or
	// joining, and gone the rooms that lost their last watcher, since the
	// interest goroutine last told it: one entry each, however often.
	interest RoomInterest
	touched  map[string]struct{}
	gone     map[string]struct{}
	// reread holds the members to read again once the interest is told
	// of them (rereadLater): one entry each.
	reread map[string]struct{}

	intervals                                             atomic.Uint64
	running                                               atomic.Bool
	watched                                               atomic.Int64 // len(rooms), read without mu by Publish and PublishRoom
	published, delivered, dropped, resyncs, stale, gaps   atomic.Uint64
	repeats                                               atomic.Uint64 // members' changes a watcher's snapshot showed already
	statusEvents, contactLookups, contactErrors, snapErrs atomic.Uint64
	memberReads, memberReadErrs                           atomic.Uint64
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
	reread  bool // user is a member's state read again (rereadMembers)
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
	// shown is per member what its watchers were sent of it, so a change
	// a class cannot see, or sees already, or older than what they were
	// sent, sends nothing.
	shown map[string]*memberShown
	// interval: the room is big; its watchers get acc once per interval.
	interval bool
	acc      *intervalAcc
	resync   bool // the room changed mode: its watchers need a fresh snapshot
	// ready is non-nil while the RoomInterest's WatchRooms of the room's
	// first watcher is under way, and closed when it returned: no
	// snapshot of the room is read before (snapshotFor).
	ready chan struct{}
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

// memberShown is what a room's watchers were sent of one member.
type memberShown struct {
	class [numClasses]shownStatus // the status last sent to each class
	// version is the newest version of the member's state they were sent
	// (by the room's first snapshot, where it showed the status, and by
	// changes): an older change is stale, and a state read again is sent
	// only if newer.
	version uint64
	// seen: a watcher may have been shown the member's status (a
	// snapshot, a join or a change showed it): a state read again that
	// hides it from a class sends that class the status hidden.
	seen bool
	// snap is what the snapshots showed the member's watchers who are
	// not the member, while they all showed the same (mixed: they did
	// not); it stands for a class no change was sent to (snapShown).
	snap  shownStatus
	mixed bool
}

// noteSnapshot records what a snapshot showed viewer of the member
// (v): exactly for the member itself, which is its own class; for anyone
// else, whose class (contact or not) the hub does not know here, as what
// the snapshots of the others showed, while they agree. A snapshot older
// than a change sent to the member's watchers records nothing: those
// watchers are sent that change after it.
func (s *memberShown) noteSnapshot(viewer string, v *privacy.View) {
	if v.StatusVisible && v.Version < s.version {
		return
	}
	now := shownStatus{set: true, visible: v.StatusVisible, status: v.Status}
	switch {
	case viewer == v.UserID:
		s.class[classSelf] = now
	case !s.snap.set:
		s.snap = now
	case s.snap != now:
		s.mixed = true
	}
}

// snapShown is what class c was last shown of the member, for a change
// made under settings: the status a change sent it, or, if none was
// sent to it, what the snapshots showed — only when every watcher but
// the member saw the same and the settings show contacts and strangers
// the same, as then the class's watchers saw it too.
func (s *memberShown) snapShown(c class, set *presence.Settings) shownStatus {
	if s.class[c].set || c == classSelf || !s.snap.set || s.mixed || privacy.NeedsContact(set) {
		return s.class[c]
	}
	return s.snap
}

// heldEvent is an event held back for a missing earlier one, with the
// member's contact list if it was looked up, and for a join the version
// of the member's change whose status it took meanwhile (applyStatus).
type heldEvent struct {
	ev       *presence.RoomEvent
	contacts map[string]bool
	version  uint64
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
	// covered holds, sorted by id, members its snapshot showed at a
	// version above what the hub had sent the room's watchers of them
	// (at most maxCovered): a change of such a member at or below that
	// version that reaches the hub after the read is one the watcher
	// holds already, and is not sent it — until coveredUntil (Unix ms),
	// when checkGaps drops it.
	covered      []coveredMember
	coveredUntil int64
}

// coveredMember is a member's version as a watcher's snapshot showed it.
type coveredMember struct {
	id      string
	version uint64
}

// covers reports whether w's snapshot showed member at version or newer
// (covered), at now (Unix ms) before coveredUntil.
func (w *roomWatcher) covers(member string, version uint64, now int64) bool {
	if now >= w.coveredUntil {
		return false
	}
	i, ok := slices.BinarySearchFunc(w.covered, member, func(c coveredMember, id string) int { return strings.Compare(c.id, id) })
	return ok && w.covered[i].version >= version
}

// earlyFrame is a frame for a watcher whose snapshot was not sent yet.
type earlyFrame struct {
	version uint64
	// status marks a member's change of status, sent at the room's
	// version (not above it); member and mversion are the member and the
	// version of its change.
	status   bool
	member   string
	mversion uint64
	frame    []byte
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
		interest: cfg.Interest,
		told:     make(chan struct{}, 1),
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

// MaxWatched is the cap of rooms one sink watches (RoomConfig.MaxWatched).
func (h *RoomHub) MaxWatched() int { return h.maxWatch }

// Watch makes s watch room: it reads the room's snapshot as s's viewer,
// sends it, and from then on every change newer than it. Watching a room
// s watches already sends a fresh snapshot. The first watcher of a room
// tells the RoomInterest before the snapshot is read, and the other
// watchers' snapshots wait for that too.
func (h *RoomHub) Watch(ctx context.Context, s RoomSink, id string) error {
	h.mu.Lock()
	ws := h.sinks[s]
	w := ws[id]
	if w == nil {
		if len(ws) >= h.maxWatch {
			h.mu.Unlock()
			return fmt.Errorf("%w: at most %d", ErrTooManyWatchedRooms, h.maxWatch)
		}
		if ws == nil {
			ws = make(map[string]*roomWatcher)
			h.sinks[s] = ws
		}
		r := h.rooms[id]
		first := r == nil
		if first {
			r = &room{id: id, watchers: make(map[RoomSink]*roomWatcher), pending: make(map[uint64]heldEvent)}
			h.rooms[id] = r
			h.watched.Add(1)
		}
		w = &roomWatcher{sink: s, viewer: s.Viewer()}
		ws[id] = w
		r.watchers[s] = w
		if first && h.interest != nil {
			// The bus subscribes to the room before anybody reads it.
			ready := make(chan struct{})
			r.ready = ready
			h.mu.Unlock()
			h.interest.WatchRooms([]string{id})
			h.mu.Lock()
			close(ready)
			r.ready = nil
		}
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
// and sends it; while the room's first WatchRooms is under way it waits
// for it first. It returns the read's error (w was sent nothing), or
// ctx's if it ended while waiting; nil also when w was unwatched or
// watched again meanwhile. Held: mu, which it releases during each wait
// and read.
func (h *RoomHub) snapshotFor(ctx context.Context, w *roomWatcher, id string) error {
	for {
		if h.sinks[w.sink][id] != w {
			return nil // unwatched while mu was released
		}
		r := h.rooms[id]
		if ready := r.ready; ready != nil {
			gen := w.gen
			h.mu.Unlock()
			var err error
			select {
			case <-ready:
			case <-ctx.Done():
				err = ctx.Err()
			}
			h.mu.Lock()
			if h.sinks[w.sink][id] != w || w.gen != gen {
				return nil
			}
			if err != nil {
				return err
			}
			continue
		}
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
				m := &snap.Members[i]
				h.addMember(r, m.UserID)
				if m.StatusVisible {
					r.shownOf(m.UserID).version = m.Version
				}
				// Changes of the member made since the read reach the
				// hub only from now (from the bus once it subscribed).
				h.rereadLater(m.UserID)
			}
		}
	}
	if r.members != nil {
		for i := range snap.Members {
			m := &snap.Members[i]
			if _, ok := r.members[m.UserID]; !ok {
				continue
			}
			shown := r.shownOf(m.UserID)
			shown.seen = shown.seen || m.StatusVisible
			shown.noteSnapshot(w.viewer, m)
		}
	}
	members, next := snap.Members, snap.Next
	if r.interval && len(members) > intervalPage {
		members, next = members[:intervalPage], members[intervalPage-1].UserID
	}
	w.sink.DeliverRoom(r.id, wire.AppendRoom(nil, r.id, r.interval, snap.Count, members, next, snap.Version))
	h.delivered.Add(1)
	w.ready, w.held = true, snap.Version
	h.cover(r, w, snap)
	var shows map[string]uint64 // the snapshot's visible members' versions, made for the first early change of status
	for _, f := range w.early {
		if f.status {
			// A change the read already saw: the snapshot shows it, or newer.
			if shows == nil {
				shows = visibleVersions(snap.Members)
			}
			if v, ok := shows[f.member]; ok && v >= f.mversion {
				h.repeats.Add(1)
				continue
			}
		}
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

// cover records in w.covered the members snap showed w ahead of what the
// hub sent the room's watchers of them: changes of theirs still on their
// way to the hub when snap was read. A room's first snapshot sets what
// was sent (its members' versions) and needs none. Held: mu.
func (h *RoomHub) cover(r *room, w *roomWatcher, snap *RoomSnapshot) {
	w.covered = nil
	if r.members == nil {
		return
	}
	for i := range snap.Members {
		m := &snap.Members[i]
		if !m.StatusVisible || m.Version == 0 {
			continue
		}
		if s := r.shown[m.UserID]; s != nil && s.version >= m.Version {
			continue
		}
		if len(w.covered) == maxCovered {
			break
		}
		w.covered = append(w.covered, coveredMember{id: m.UserID, version: m.Version})
	}
	if len(w.covered) > 0 {
		slices.SortFunc(w.covered, func(a, b coveredMember) int { return strings.Compare(a.id, b.id) })
		w.coveredUntil = h.now() + coverFor.Milliseconds()
	}
}

// visibleVersions maps each member whose status views show to its version.
func visibleVersions(views []privacy.View) map[string]uint64 {
	m := make(map[string]uint64, len(views))
	for i := range views {
		if views[i].StatusVisible {
			m[views[i].UserID] = views[i].Version
		}
	}
	return m
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
		h.watched.Add(-1)
		if h.interest != nil {
			if h.gone == nil {
				h.gone = make(map[string]struct{})
			}
			h.gone[id] = struct{}{}
			h.tell()
		}
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

// RoomWatched reports whether any sink watches room now (a cross-node
// bus subscribes to the room while it does).
func (h *RoomHub) RoomWatched(room string) bool {
	if h.watched.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rooms[room] != nil
}

// MemberWatched reports whether user's changes of status are wanted here
// now (Publish queues them): the user is a member of a watched room whose
// every member the hub knows, or has a join of one queued or held back.
// A cross-node bus subscribes to the user while it is.
func (h *RoomHub) MemberWatched(user string) bool {
	if h.watched.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.memberLocked(user)
}

// memberLocked is MemberWatched. Held: mu.
func (h *RoomHub) memberLocked(user string) bool {
	_, member := h.index[user]
	return member || h.joining[user] > 0 || h.held[user] != nil
}

// SetInterest registers the RoomInterest of a bus built after the hub
// (the bus delivers into the hub, so it cannot exist when the hub is
// made). It must be called before the hub's first Watch, and at most
// once; RoomConfig.Interest must then be nil.
func (h *RoomHub) SetInterest(i RoomInterest) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.interest != nil {
		panic("fanout: SetInterest on a room hub that has an interest")
	}
	h.interest = i
}

// Resync has every watcher of every room sent a fresh snapshot, as after
// events were lost (Run's next check of the gaps does it): for a node
// that may have missed events of other nodes, cut off from the bus.
// It never blocks.
func (h *RoomHub) Resync() { h.lost.Store(true) }

// touch notes that user entered or left index, held or joining, for
// the interest. Held: mu.
func (h *RoomHub) touch(user string) {
	if h.interest == nil {
		return
	}
	if h.touched == nil {
		h.touched = make(map[string]struct{})
	}
	h.touched[user] = struct{}{}
	h.tell()
}

// rereadLater notes that user's state is to be read again once the
// interest is told of it (tellInterest), also without an interest: the
// node's own changes made since the read that showed the member did not
// reach the room either. Held: mu.
func (h *RoomHub) rereadLater(user string) {
	if h.reread == nil {
		h.reread = make(map[string]struct{})
	}
	h.reread[user] = struct{}{}
	h.tell()
}

// tell wakes the interest goroutine.
func (h *RoomHub) tell() {
	select {
	case h.told <- struct{}{}:
	default:
	}
}

// tellInterest tells the interest, until ctx is done, which rooms lost
// their last watcher and which users became or stopped being members
// (noted under mu by unwatchLocked and touch), batched: what was noted
// while a call ran goes in the next. Then it reads again the members
// noted by rereadLater (rereadMembers): the interest's Watch returned, so
// their changes reach the hub from now, and the read sees those made
// before. Run owns it; it runs outside mu, so the bus may flush and ask
// RoomWatched and MemberWatched, and the reader may take its time.
func (h *RoomHub) tellInterest(ctx context.Context) {
	var again <-chan time.Time // a failed read of members is tried again
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.told:
		case <-again:
		}
		again = nil
		h.mu.Lock()
		i := h.interest
		reread := h.reread
		h.reread = nil
		var in, out, gone []string
		for u := range h.touched {
			if h.memberLocked(u) {
				in = append(in, u)
			} else {
				out = append(out, u)
			}
		}
		for r := range h.gone {
			if h.rooms[r] == nil {
				gone = append(gone, r)
			}
		}
		h.touched, h.gone = nil, nil
		h.mu.Unlock()
		if len(gone) > 0 {
			i.UnwatchRooms(gone)
		}
		if len(out) > 0 {
			i.Unwatch(out)
		}
		if len(in) > 0 {
			i.Watch(in)
		}
		if len(reread) > 0 && !h.rereadMembers(ctx, reread) {
			again = time.After(memberRetry)
		}
	}
}

// PublishRoom queues a join or leave for Run (tracker.RoomPublisher).
func (h *RoomHub) PublishRoom(ev *presence.RoomEvent) {
	if h.watched.Load() == 0 {
		return // a room watched from now on starts from a snapshot read after
	}
	e := *ev
	it := roomItem{room: &e}
	if e.Kind != presence.RoomJoin {
		h.enqueue(it)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// A room in interval mode shows no member's status: its joins need
	// no change of status after them (nor the bus's subscription to the
	// member, for a moment, at every join).
	if r := h.rooms[e.Room]; r != nil && !(r.known && r.interval) {
		it.joining = true
		if h.joining[e.UserID]++; h.joining[e.UserID] == 1 {
			h.touch(e.UserID)
		}
		// The join shows the member's status when it was made; a change
		// made on another node since, before the bus subscribed to the
		// member, is read. Queued under mu, the join is ahead of the
		// read's change in the queue.
		h.rereadLater(e.UserID)
	}
	h.enqueueLocked(it)
}

// Publish queues a user's change for Run (tracker.Publisher): the
// watchers of rooms the user is a member of are shown its new status.
// Only users in a watched room are queued, or with a join of one queued
// (the change follows the join in the queue).
func (h *RoomHub) Publish(ev *presence.Event) {
	if h.watched.Load() == 0 {
		return // every change of the node passes here: no lock while no room is watched
	}
	h.mu.Lock()
	member := h.memberLocked(ev.UserID)
	h.mu.Unlock()
	if !member {
		return
	}
	e := *ev
	h.enqueue(roomItem{user: &e})
}

func (h *RoomHub) enqueue(it roomItem) {
	if !h.push(it) {
		h.joined(it)
	}
}

// enqueueLocked is enqueue. Held: mu.
func (h *RoomHub) enqueueLocked(it roomItem) {
	if !h.push(it) {
		h.joinedLocked(it)
	}
}

// push queues it for Run; when the queue is full it drops it, and every
// room is resynced.
func (h *RoomHub) push(it roomItem) bool {
	h.published.Add(1)
	select {
	case h.q <- it:
		return true
	default:
		h.dropped.Add(1)
		h.lost.Store(true)
		return false
	}
}

// joined uncounts it, taken from the queue or dropped, in h.joining.
func (h *RoomHub) joined(it roomItem) {
	if !it.joining {
		return
	}
	h.mu.Lock()
	h.joinedLocked(it)
	h.mu.Unlock()
}

// joinedLocked is joined. Held: mu.
func (h *RoomHub) joinedLocked(it roomItem) {
	if !it.joining {
		return
	}
	if h.joining[it.room.UserID]--; h.joining[it.room.UserID] <= 0 {
		delete(h.joining, it.room.UserID)
		h.touch(it.room.UserID)
	}
}

// Run applies the queued events until ctx is done. It owns the goroutines
// that read the snapshots of resyncs and tell the RoomInterest.
func (h *RoomHub) Run(ctx context.Context) error {
	if !h.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer h.running.Store(false)
	wctx, stop := context.WithCancel(ctx)
	var workers sync.WaitGroup
	workers.Go(func() { h.resyncWorker(wctx) })
	workers.Go(func() { h.tellInterest(wctx) })
	defer func() { stop(); workers.Wait() }()
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

// RoomStats are the hub's counters and gauges.
type RoomStats struct {
	Rooms, Watchers int
	Published       uint64 // events queued
	Delivered       uint64 // frames handed to sinks
	Dropped         uint64 // events lost to a full queue (every room resynced)
	Resyncs         uint64 // rooms whose watchers were sent a fresh snapshot
	Gaps            uint64 // events that came ahead of a missing one
	Stale           uint64 // events at or below what the hub held, members' changes older than what their rooms were sent
	Repeats         uint64 // members' changes not sent to a watcher whose snapshot showed them already
	StatusEvents    uint64 // members' changes of status encoded
	Intervals       uint64 // room_interval messages encoded (one per room in interval mode per interval that changed it)
	ContactLookups  uint64
	ContactErrors   uint64
	SnapshotErrors  uint64
	// MemberReads counts the members read again after their changes
	// began to reach the hub (RoomReader.MemberStates), MemberReadErrors
	// the reads that failed (tried again a second later).
	MemberReads      uint64
	MemberReadErrors uint64
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
		Resyncs: h.resyncs.Load(), Gaps: h.gaps.Load(), Stale: h.stale.Load(), Repeats: h.repeats.Load(),
		StatusEvents: h.statusEvents.Load(), Intervals: h.intervals.Load(), ContactLookups: h.contactLookups.Load(),
		ContactErrors: h.contactErrors.Load(), SnapshotErrors: h.snapErrs.Load(),
		MemberReads: h.memberReads.Load(), MemberReadErrors: h.memberReadErrs.Load(),
	}
}

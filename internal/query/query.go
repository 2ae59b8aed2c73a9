// Package query answers bulk reads of presence: one pass over the state
// store for all ids, one durable read for the users the store does not
// hold, one contact look-up for the targets whose settings depend on it,
// and the privacy filter over every answer. Room reads a page of a room's
// members the same way.
package query

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
)

// MaxBatch is the most ids one read may ask for.
const MaxBatch = 1000

// ErrTooMany is returned for a read of more than MaxBatch ids.
var ErrTooMany = fmt.Errorf("too many ids: at most %d per request", MaxBatch)

// States is the hot state as the reader needs it.
type States interface {
	Get(ctx context.Context, now int64, ids []string, out []presence.Snapshot) error
}

// Profiles is the durable store of users the hot state does not hold.
type Profiles interface {
	LoadProfiles(ctx context.Context, ids []string, fn func(*presence.Profile)) error
}

// Contacts tells which owners list a viewer as a contact.
type Contacts interface {
	ListedBy(ctx context.Context, viewer string, owners []string, fn func(owner string)) error
}

// Config configures a Reader. All but Clock are required.
type Config struct {
	States   States
	Profiles Profiles
	Contacts Contacts
	Clock    clock.Clock
	// ColdVersionMargin is added to the version of a user read from the
	// durable store because the hot state does not hold it: the tracker's
	// ReloadMargin, so that such a read is ordered after every version a
	// shared store may have published and lost, and before every version
	// the user gets when it is loaded again. Zero with an embedded store.
	ColdVersionMargin uint64
	// Statuses, if set, answers ReadStatuses in place of States: a
	// node's read replica, which holds what everyone sees of each user,
	// not their own view. When it returns an error (it may have missed
	// changes) States answers instead.
	Statuses States
	// Views, if set, answers ReadViews in place of States: a node's read
	// replica's full views (what everyone may see of each user), which
	// lag a change by the bus's delivery. When it returns an error
	// States answers instead.
	Views States
	// Rooms, if set, answers the member pages of Room; nil: Room
	// returns ErrNoRooms.
	Rooms Rooms
}

// Reader answers reads. It is safe for concurrent use.
type Reader struct {
	states   States
	statuses States // nil: States answers ReadStatuses too
	views    States // nil: States answers ReadViews too
	profiles Profiles
	contacts Contacts
	rooms    Rooms // nil: no rooms
	clock    clock.Clock
	margin   uint64
	bufs     sync.Pool // *buffers
}

type buffers struct {
	snaps  []presence.Snapshot
	misses []string
	owners []string
	index  map[string]int
}

// New returns a Reader.
func New(cfg Config) (*Reader, error) {
	if cfg.States == nil || cfg.Profiles == nil || cfg.Contacts == nil {
		return nil, errors.New("query: States, Profiles and Contacts are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &Reader{states: cfg.States, statuses: cfg.Statuses, views: cfg.Views, profiles: cfg.Profiles, contacts: cfg.Contacts,
		rooms: cfg.Rooms, clock: cfg.Clock, margin: cfg.ColdVersionMargin}, nil
}

// Read fills out[i] with what viewer may see of ids[i]; len(out) must be
// len(ids) and ids must be valid and distinct. An empty viewer is anonymous:
// it sees what each user shows to everyone.
func (r *Reader) Read(ctx context.Context, viewer string, ids []string, out []privacy.View) error {
	return r.read(ctx, viewer, ids, out, nil)
}

// ReadViews is Read for a caller that may be answered a moment late:
// with Config.Views it reads there (the viewer's own view from States),
// so a change made on another node shows once the bus brought it. Not
// for a snapshot that a watch's changes continue (a change that came
// before the watch and not yet to the replica would never be sent).
func (r *Reader) ReadViews(ctx context.Context, viewer string, ids []string, out []privacy.View) error {
	return r.read(ctx, viewer, ids, out, r.views)
}

// ReadStatuses is Read for a caller that uses only each view's status
// (Status and StatusVisible): with Config.Statuses it reads from there,
// the viewer's own status from States (a replica holds what everyone
// sees). Its views' other fields may be empty.
func (r *Reader) ReadStatuses(ctx context.Context, viewer string, ids []string, out []privacy.View) error {
	return r.read(ctx, viewer, ids, out, r.statuses)
}

// read is Read with src, if not nil, in place of States (but for the
// viewer's own view).
func (r *Reader) read(ctx context.Context, viewer string, ids []string, out []privacy.View, src States) error {
	if len(ids) > MaxBatch {
		return ErrTooMany
	}
	if len(out) != len(ids) {
		return errors.New("query: len(out) != len(ids)")
	}
	b, _ := r.bufs.Get().(*buffers)
	if b == nil {
		b = &buffers{index: make(map[string]int)}
	}
	defer r.release(b)

	snaps := grow(b.snaps, len(ids))
	b.snaps = snaps
	if err := r.getStates(ctx, viewer, ids, snaps, src); err != nil {
		return fmt.Errorf("read state: %w", err)
	}

	// Users the hot state does not hold: one durable read for all of them.
	// Users it holds who may read as absent to this viewer — publicly
	// offline (invisible, or gone a moment ago), or with a status that may
	// be hidden from them — are read along and the answer ignored: an
	// invisible user must take as long to answer as one who logged out
	// long ago, a hidden user online as long as a hidden user offline, or
	// a stopwatch would tell them apart (the views are the same bytes).
	// Only users everyone sees present skip the read, and they show that.
	b.misses = b.misses[:0]
	for i := range snaps {
		s := &snaps[i]
		if !s.Known || s.Status.Public() == presence.Offline || s.Settings.Status != presence.Everyone {
			b.misses = append(b.misses, ids[i])
			b.index[ids[i]] = i
		}
	}
	if len(b.misses) > 0 {
		err := r.profiles.LoadProfiles(ctx, b.misses, func(p *presence.Profile) {
			if i, ok := b.index[p.UserID]; ok && !snaps[i].Known {
				// A store that may lose its data gives the version its
				// users are loaded from at least (its floor) as the
				// version of a user it does not hold: the cold read is
				// ordered between what was published and what follows.
				// The public version keeps its distance below the
				// version (an invisible user's face: presence.Profile).
				floor := snaps[i].Version
				snaps[i] = presence.SnapshotFromProfile(p)
				snaps[i].Raise(r.margin, floor)
			}
		})
		if err != nil {
			return fmt.Errorf("read profiles: %w", err)
		}
	}

	// The contact relation, only where a setting depends on it.
	var contact map[string]bool
	if viewer != "" {
		b.owners = b.owners[:0]
		for i := range snaps {
			if ids[i] != viewer && privacy.NeedsContact(&snaps[i].Settings) {
				b.owners = append(b.owners, ids[i])
			}
		}
		if len(b.owners) > 0 {
			contact = make(map[string]bool, len(b.owners))
			err := r.contacts.ListedBy(ctx, viewer, b.owners, func(owner string) { contact[owner] = true })
			if err != nil {
				return fmt.Errorf("read contacts: %w", err)
			}
		}
	}

	for i := range snaps {
		snaps[i].UserID = ids[i]
		rel := privacy.Relation{Self: viewer != "" && ids[i] == viewer, Contact: contact[ids[i]]}
		out[i] = privacy.Filter(rel, &snaps[i])
	}
	return nil
}

// getStates reads the snapshots of ids into snaps: from src if it is
// set and answers, the viewer's own from States.
func (r *Reader) getStates(ctx context.Context, viewer string, ids []string, snaps []presence.Snapshot, src States) error {
	now := r.clock.Now().UnixMilli()
	if src == nil || src.Get(ctx, now, ids, snaps) != nil {
		return r.states.Get(ctx, now, ids, snaps)
	}
	if viewer == "" {
		return nil
	}
	for i, id := range ids {
		if id == viewer {
			return r.states.Get(ctx, now, ids[i:i+1], snaps[i:i+1])
		}
	}
	return nil
}

func (r *Reader) release(b *buffers) {
	clear(b.snaps)
	clear(b.index)
	clear(b.misses)
	clear(b.owners)
	r.bufs.Put(b)
}

func grow(s []presence.Snapshot, n int) []presence.Snapshot {
	if cap(s) < n {
		return make([]presence.Snapshot, n)
	}
	return s[:n]
}

// States fills out[i] with the true state of ids[i], unfiltered, for a
// caller that filters it per viewer itself, as it filters a change (the
// room hub, reading members again): from States, never from
// Config.Statuses (a replica may not have a change yet that the caller
// must not miss), and from Profiles for the users States does not hold,
// their versions raised as Read raises them. len(out) must be len(ids),
// at most MaxBatch; a user known to neither has Known false.
func (r *Reader) States(ctx context.Context, ids []string, out []presence.Snapshot) error {
	if len(ids) > MaxBatch {
		return ErrTooMany
	}
	if len(out) != len(ids) {
		return errors.New("query: len(out) != len(ids)")
	}
	if err := r.states.Get(ctx, r.clock.Now().UnixMilli(), ids, out); err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	var misses []string
	var index map[string]int
	for i := range out {
		out[i].UserID = ids[i]
		if !out[i].Known {
			if index == nil {
				index = make(map[string]int)
			}
			misses = append(misses, ids[i])
			index[ids[i]] = i
		}
	}
	if len(misses) == 0 {
		return nil
	}
	err := r.profiles.LoadProfiles(ctx, misses, func(p *presence.Profile) {
		if i, ok := index[p.UserID]; ok && !out[i].Known {
			floor := out[i].Version
			out[i] = presence.SnapshotFromProfile(p)
			out[i].Raise(r.margin, floor)
		}
	})
	if err != nil {
		return fmt.Errorf("read profiles: %w", err)
	}
	return nil
}

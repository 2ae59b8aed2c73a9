package kafka

import (
	"cmp"
	"slices"
	"time"

	"github.com/presenced/presenced/internal/ingest"
)

// op is what a window does to one device: the net effect of the device's
// events in the window, at most a beat (the device is alive from there)
// and then a disconnect (it ends there), each at the position of the event
// it stands for, so that the devices of a user come and go in the order
// their events did.
type op struct {
	user, device string

	beat     bool      // apply a heartbeat at beatSeq
	active   bool      // one of the beats since the device's last disconnect was user activity
	connect  bool      // one of them was a session_connected: an owner claims the device again
	beatAt   time.Time // the latest of those beats' at (for staleness)
	beatSeq  uint64
	beatDone bool

	bye     bool // apply a disconnect at byeSeq (after the beat if both)
	byeSeq  uint64
	byeDone bool

	failures int // tracker errors so far
	done     bool
}

// action is one tracker call of an op.
type action struct {
	op   *op
	bye  bool
	seq  uint64
	part int32 // the partition of its records
}

// devKey names one device of one user.
type devKey struct{ user, device string }

// window is the records of one partition polled and not yet applied, as
// one op per device. Applying the ops' actions in order leaves every
// device as applying the events one by one would, and shows its user's
// changes as they would, except for flashes: a device that disconnected
// and reconnected within the window is alive throughout, and beats after
// the first are folded into it.
//
// A window read again (replay: the first after the partition was assigned,
// which the previous owner may have applied in part before it died) is
// applied so that it shows nothing the previous owner showed already: a
// device whose last event is a disconnect is only disconnected (no session
// that came and went is shown), and the beats of the devices that stay
// alive go before every disconnect, so that a user who stays online is
// never shown offline in between. Whatever prefix of the window's actions
// the previous owner applied, the replay after it leaves every device as
// the whole window would and changes the user's status at most as often
// (TestReplayShowsNothingTwice).
//
// A window is used by the consumer's loop only (not safe for concurrent
// use); its ops are applied by workers while the loop waits.
type window struct {
	first  int64 // offset of its first record
	next   int64 // offset after its last record: committed once it is applied
	epoch  int32 // leader epoch of its last record
	opened time.Time
	replay bool // its records may have been applied before
	ops    []*op
	index  map[devKey]int // device → its op in ops
}

func newWindow(first int64, opened time.Time, replay bool) *window {
	return &window{first: first, next: first, epoch: -1, opened: opened, replay: replay, index: make(map[devKey]int)}
}

// outcome is what fold did with an event.
type outcome uint8

const (
	folded    outcome = iota + 1 // a new op
	coalesced                    // folded into the device's op
	stale                        // a beat older than the ttl
	ignored                      // before a disconnect remembered (or a disconnect before a reconnect remembered)
)

// fold adds ev (an event of the window, seq its order) by the rules of
// mem: a beat older than now − ttl is stale; a beat at or before a
// remembered disconnect of its device, or a disconnect before a remembered
// reconnect, is ignored; a disconnect is remembered as it is folded.
// Otherwise ev becomes its device's op or is folded into it:
//
//   - a beat after beats adds its activity;
//   - a beat after a disconnect cancels the disconnect (the device
//     reconnected): it is alive from its first beat in the window, or
//     from this one if it had none;
//   - a disconnect ends the device here, after its beat if it had one (a
//     session shown coming and going) — in a replay without the beat.
func (w *window) fold(ev ingest.Event, seq uint64, now time.Time, ttl time.Duration, mem *ingest.Memory) outcome {
	if ev.Bye {
		if !mem.ByeAllowed(ev.User, ev.Device, ev.At, now) {
			return ignored
		}
		mem.RecordBye(ev.User, ev.Device, ev.At, now)
	} else {
		if ev.At.Before(now.Add(-ttl)) {
			return stale
		}
		if !mem.BeatAllowed(ev.User, ev.Device, ev.At, now) {
			return ignored
		}
	}
	k := devKey{ev.User, ev.Device}
	i, ok := w.index[k]
	if !ok {
		o := &op{user: ev.User, device: ev.Device}
		if ev.Bye {
			o.bye, o.byeSeq = true, seq
		} else {
			o.beat, o.active, o.connect, o.beatAt, o.beatSeq = true, ev.Active, ev.Connect, ev.At, seq
		}
		w.index[k] = len(w.ops)
		w.ops = append(w.ops, o)
		return folded
	}
	o := w.ops[i]
	switch {
	case ev.Bye:
		if w.replay {
			o.beat, o.beatDone = false, false
		}
		o.bye, o.byeSeq, o.byeDone = true, seq, false
	case o.bye:
		if !o.beat {
			o.beatSeq = seq
		}
		o.beat, o.active, o.connect, o.beatAt, o.beatDone = true, ev.Active, ev.Connect, ev.At, false
		o.bye, o.byeDone = false, false
	default:
		o.active = o.active || ev.Active
		o.connect = o.connect || ev.Connect
		if ev.At.After(o.beatAt) {
			o.beatAt = ev.At
		}
		o.beatDone = false
	}
	return coalesced
}

// actions returns the tracker calls not made yet of the ops not done, in
// the order of their events — in a replay, every beat first.
func (w *window) actions() []action {
	var as []action
	for _, o := range w.ops {
		if o.done {
			continue
		}
		if o.beat && !o.beatDone {
			as = append(as, action{op: o, seq: o.beatSeq})
		}
		if o.bye && !o.byeDone {
			as = append(as, action{op: o, bye: true, seq: o.byeSeq})
		}
	}
	slices.SortFunc(as, func(a, b action) int {
		if w.replay && a.bye != b.bye {
			if a.bye {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return as
}

// prune drops the ops that are done, so that later events of their
// devices make new ops. It returns how many remain.
func (w *window) prune() int {
	ops := w.ops[:0]
	clear(w.index)
	for _, o := range w.ops {
		if !o.done {
			w.index[devKey{o.user, o.device}] = len(ops)
			ops = append(ops, o)
		}
	}
	clear(w.ops[len(ops):])
	w.ops = ops
	return len(ops)
}

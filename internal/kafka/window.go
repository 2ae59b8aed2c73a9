package kafka

import (
	"cmp"
	"slices"
	"time"

	"github.com/presenced/presenced/internal/ingest"
)

// op is what a window does to one device: the net effect of the device's
// events in the window.
type op struct {
	user, device string
	bye          bool      // end the device; else a beat
	at           time.Time // of the last event folded in
	active       bool      // a beat: one of the beats since the last disconnect was active
	seq          uint64    // order of the last event folded in, within the consumer
	failures     int       // tracker errors so far
	done         bool
}

// devKey names one device of one user.
type devKey struct{ user, device string }

// window is the records of one partition polled and not yet applied, as
// one op per device. Applying its ops in seq order (per user) leaves every
// device as applying its events one by one would, except that a device that
// came and went within the window is never shown for a moment, and a device
// that reconnected within it is not shown leaving.
//
// A window is used by the consumer's loop only (not safe for concurrent
// use); its ops are applied by workers while the loop waits.
type window struct {
	first  int64 // offset of its first record
	next   int64 // offset after its last record: committed once it is applied
	epoch  int32 // leader epoch of its last record
	opened time.Time
	ops    []*op
	index  map[devKey]int // device → its op in ops
}

func newWindow(first int64, opened time.Time) *window {
	return &window{first: first, next: first, epoch: -1, opened: opened, index: make(map[devKey]int)}
}

// outcome is what fold did with an event.
type outcome uint8

const (
	folded    outcome = iota + 1 // a new op
	coalesced                    // folded into the device's op: an earlier event was superseded
	stale                        // a beat older than the ttl
	ignored                      // before a disconnect remembered (or a disconnect before a reconnect remembered)
)

// fold adds ev (an event of the window, seq its order) by the rules of
// mem: a beat older than now − ttl is stale; a beat at or before a
// remembered disconnect of its device, or a disconnect before a remembered
// reconnect, is ignored; a disconnect is remembered as it is folded.
// Otherwise ev becomes its device's op or is folded into it: a disconnect
// supersedes what came before; a beat after a disconnect replaces it (the
// device reconnected); a beat after a beat keeps the later at and is
// active if either was.
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
	if i, ok := w.index[k]; ok {
		o := w.ops[i]
		switch {
		case ev.Bye:
			o.bye, o.active = true, false
			o.at = ev.At
		case o.bye:
			o.bye, o.active = false, ev.Active
			o.at = ev.At
		default:
			o.active = o.active || ev.Active
			if ev.At.After(o.at) {
				o.at = ev.At
			}
		}
		o.seq = seq
		return coalesced
	}
	w.index[k] = len(w.ops)
	w.ops = append(w.ops, &op{user: ev.User, device: ev.Device, bye: ev.Bye, at: ev.At, active: ev.Active && !ev.Bye, seq: seq})
	return folded
}

// undone returns the ops not done, in seq order.
func (w *window) undone() []*op {
	var ops []*op
	for _, o := range w.ops {
		if !o.done {
			ops = append(ops, o)
		}
	}
	slices.SortFunc(ops, func(a, b *op) int { return cmp.Compare(a.seq, b.seq) })
	return ops
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

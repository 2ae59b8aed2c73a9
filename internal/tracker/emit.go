package tracker

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/presenced/presenced/internal/presence"
)

// emitter counts every change of presence and hands it to the Publisher.
// Every part of the tracker that makes a change publishes it here.
type emitter struct {
	pub         Publisher     // nil: changes are counted and dropped
	roomPub     RoomPublisher // nil: room events are counted and dropped
	roomEvents  atomic.Uint64
	transitions [5][5]atomic.Uint64 // [prev][next] public status
	textChanges atomic.Uint64
	online      atomic.Int64 // users whose public status is not offline
}

// newEmitter returns the emitter of pub, which may also take room events
// (RoomPublisher), or be nil.
func newEmitter(pub Publisher) *emitter {
	e := &emitter{pub: pub}
	e.roomPub, _ = pub.(RoomPublisher)
	return e
}

// emit counts and publishes ch if it is a change. It takes the change by
// address so that the common no-change heartbeat keeps its Change on the
// stack.
func (e *emitter) emit(ch *presence.Change) {
	if ch.Changed {
		e.publish(ch.Event)
	}
	for i := range ch.Rooms {
		e.publishRoom(&ch.Rooms[i])
	}
}

// publishRoom counts and publishes one join or leave.
func (e *emitter) publishRoom(ev *presence.RoomEvent) {
	e.roomEvents.Add(1)
	if e.roomPub != nil {
		e.roomPub.PublishRoom(ev)
	}
}

func (e *emitter) publish(ev presence.Event) {
	p := &ev
	if p.Prev != p.Status {
		e.transitions[p.Prev][p.Status].Add(1)
		switch {
		case p.Prev == presence.Offline:
			e.online.Add(1)
		case p.Status == presence.Offline:
			e.online.Add(-1)
		}
	} else {
		e.textChanges.Add(1)
	}
	if e.pub != nil {
		e.pub.Publish(p)
	}
}

// stripedCounter is a counter that many goroutines bump without fighting
// over one cache line.
type stripedCounter struct {
	stripes [32]struct {
		n atomic.Uint64
		_ [56]byte
	}
}

func (c *stripedCounter) add() { c.stripes[rand.Uint32()&31].n.Add(1) }

func (c *stripedCounter) load() uint64 {
	var n uint64
	for i := range c.stripes {
		n += c.stripes[i].n.Load()
	}
	return n
}

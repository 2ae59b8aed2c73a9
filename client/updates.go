package client

import (
	"slices"
	"sync"
)

const (
	// updatesBuffer is the capacity of the Updates channel: room for the
	// last updates when the client closes while the application is not
	// reading.
	updatesBuffer = 16
	// maxNotices bounds the StateChanges and ServerErrors waiting for the
	// application; the oldest is dropped beyond it.
	maxNotices = 64
	// maxRoomBacklog bounds the updates of one room waiting for the
	// application; beyond it they give way to one RoomSnapshot of the room
	// as it is then.
	maxRoomBacklog = 256
)

// queue holds the updates the application has not taken yet. Presence
// coalesces per user, so it is bounded by the number of watched users;
// the updates of a room by maxRoomBacklog each; notices by maxNotices.
// Pushing never blocks.
type queue struct {
	notify chan struct{} // cap 1: something was pushed

	mu      sync.Mutex // guards the fields below
	items   []item
	pending map[string]Event // the newest undelivered Event per user
	rooms   map[string]int   // updates waiting per room
	notices int              // items that are neither presence nor rooms
}

// item is a notice, an update of room, or (u == nil) the place of a
// user's pending Event.
type item struct {
	user string
	room string
	u    Update
}

func newQueue() *queue {
	return &queue{notify: make(chan struct{}, 1), pending: make(map[string]Event), rooms: make(map[string]int)}
}

// pushRoom queues an update of room (a RoomSnapshot or a RoomChange),
// never coalesced: each join and leave is delivered. When the room has
// maxRoomBacklog updates waiting, they all give way to one RoomSnapshot,
// snap(), at the end of the queue.
func (q *queue) pushRoom(room string, u Update, snap func() RoomSnapshot) {
	q.mu.Lock()
	if q.rooms[room] >= maxRoomBacklog {
		q.dropRoomLocked(room)
		u = snap()
	}
	q.items = append(q.items, item{room: room, u: u})
	q.rooms[room]++
	q.mu.Unlock()
	q.signal()
}

// dropRoom removes every update of room that waits.
func (q *queue) dropRoom(room string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dropRoomLocked(room)
}

func (q *queue) dropRoomLocked(room string) {
	if q.rooms[room] == 0 {
		return
	}
	q.items = slices.DeleteFunc(q.items, func(it item) bool { return it.room == room })
	delete(q.rooms, room)
}

func (q *queue) signal() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *queue) push(u Update) {
	q.mu.Lock()
	if ev, ok := u.(Event); ok {
		if _, waiting := q.pending[ev.UserID]; !waiting {
			q.items = append(q.items, item{user: ev.UserID})
		}
		q.pending[ev.UserID] = ev
	} else {
		if q.notices == maxNotices {
			for i, it := range q.items {
				if it.u != nil && it.room == "" {
					q.items = append(q.items[:i], q.items[i+1:]...)
					q.notices--
					break
				}
			}
		}
		q.items = append(q.items, item{u: u})
		q.notices++
	}
	q.mu.Unlock()
	q.signal()
}

// pop takes the oldest update.
func (q *queue) pop() (Update, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil, false
	}
	it := q.items[0]
	q.items[0] = item{}
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // let the backing array go
	}
	if it.room != "" {
		if q.rooms[it.room]--; q.rooms[it.room] == 0 {
			delete(q.rooms, it.room)
		}
		return it.u, true
	}
	if it.u != nil {
		q.notices--
		return it.u, true
	}
	ev := q.pending[it.user]
	delete(q.pending, it.user)
	return ev, true
}

// pump moves updates from the queue to the Updates channel. After the run
// loop has ended it delivers what is left and closes the channel; after
// Close it only puts what fits into the channel's buffer, the run loop's
// final StateChange included.
func (c *Client) pump() {
	defer c.wg.Done()
	defer close(c.updates)
	runDone := c.runDone
	for {
		u, ok := c.q.pop()
		if !ok {
			if runDone == nil { // the run loop has ended and all is delivered
				return
			}
			select {
			case <-c.q.notify:
			case <-runDone:
				runDone = nil // its last update is queued: drain, then stop
			case <-c.ctx.Done():
				<-c.runDone // Close ends it promptly; its last update counts
				c.flush()
				return
			}
			continue
		}
		select {
		case c.updates <- u:
		case <-c.ctx.Done():
			<-c.runDone
			c.flush(u)
			return
		}
	}
}

// flush puts what fits into the channel's buffer without waiting; the
// rest is dropped.
func (c *Client) flush(first ...Update) {
	for _, u := range first {
		select {
		case c.updates <- u:
		default:
			return
		}
	}
	for {
		u, ok := c.q.pop()
		if !ok {
			return
		}
		select {
		case c.updates <- u:
		default:
			return
		}
	}
}

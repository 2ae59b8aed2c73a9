package client

import "sync"

const (
	// updatesBuffer is the capacity of the Updates channel: room for the
	// last updates when the client closes while the application is not
	// reading.
	updatesBuffer = 16
	// maxNotices bounds the StateChanges and ServerErrors waiting for the
	// application; the oldest is dropped beyond it.
	maxNotices = 64
)

// queue holds the updates the application has not taken yet. Presence
// coalesces per user, so it is bounded by the number of watched users;
// notices are bounded by maxNotices. Pushing never blocks.
type queue struct {
	notify chan struct{} // cap 1: something was pushed

	mu      sync.Mutex // guards the fields below
	items   []item
	pending map[string]Event // the newest undelivered Event per user
	notices int              // items that are not presence
}

// item is a notice, or (u == nil) the place of a user's pending Event.
type item struct {
	user string
	u    Update
}

func newQueue() *queue {
	return &queue{notify: make(chan struct{}, 1), pending: make(map[string]Event)}
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
				if it.u != nil {
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
	select {
	case q.notify <- struct{}{}:
	default:
	}
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

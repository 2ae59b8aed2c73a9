package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// Refused room messages (docs/protocol.md "Rooms": an error that answers a
// room message names the message, "request", and its room). The client
// holds the rooms the application joined, left and watched; a refusal
// means the server did not do what the message asked, so the client
// either sends that message again after a backoff — for a code a retry
// can cure, while the application still wants what it asked for — or,
// for a join or watch refused for good, drops the room from what it holds.
// Either way it tells the application.

// roomRetryable reports whether sending a refused room message again can
// succeed: the store was down for a moment (unavailable), too many
// messages or joins and leaves (rate_limited), or the device had ended
// apart from this socket (device_not_alive; a heartbeat first brings it
// back).
func roomRetryable(code string) bool {
	switch code {
	case "unavailable", "rate_limited", "device_not_alive":
		return true
	}
	return false
}

// Types of room messages, as the server names them in an error's request.
const (
	reqJoin    = "join"
	reqLeave   = "leave"
	reqWatch   = "watch_room"
	reqUnwatch = "unwatch_room"
)

// retryKey is what one retry is about: the device's membership of a room
// (join or leave) or the connection's watch of it (watch_room or
// unwatch_room). A room has one retry of each at most.
type retryKey struct {
	room  string
	watch bool
}

func keyOf(typ, room string) retryKey {
	return retryKey{room: room, watch: typ == reqWatch || typ == reqUnwatch}
}

// roomRetries are the refused room messages one connection is to send
// again. Their lifetime is the connection's: a reconnect joins and watches
// every room again anyway, and sends the leaves still due (leaving).
type roomRetries struct {
	wake chan struct{} // cap 1: a retry was scheduled

	mu    sync.Mutex
	rooms map[retryKey]*roomRetry
}

// roomRetry is the retry of one room's membership or watch.
type roomRetry struct {
	typ     string    // the message to send again: the last one refused
	at      time.Time // when to send it; zero: nothing scheduled
	attempt int       // retries of this episode so far
	beat    bool      // send a heartbeat first (a join's device_not_alive)
	sent    time.Time // when the last retry went out
}

// retryJob is one retry due: send typ about room again.
type retryJob struct {
	typ, room string
	beat      bool
}

func newRoomRetries() *roomRetries {
	return &roomRetries{wake: make(chan struct{}, 1), rooms: make(map[retryKey]*roomRetry)}
}

// schedule plans to send the refused message typ about room again after
// the backoff of its attempt: the n-th refusal in a row waits a random
// duration in [d/2, d] with d = min(lo·2ⁿ, hi), like a reconnect. A
// refusal that comes more than hi after the last retry went out starts
// again at lo. A retry planned already of the room's membership (or
// watch) keeps its time and sends the message refused last.
func (r *roomRetries) schedule(typ, room string, beat bool, now time.Time, lo, hi time.Duration) {
	r.mu.Lock()
	k := keyOf(typ, room)
	rr := r.rooms[k]
	if rr == nil {
		rr = &roomRetry{}
		r.rooms[k] = rr
	}
	if rr.typ != typ {
		rr.typ, rr.beat = typ, false
	}
	rr.beat = rr.beat || beat
	if !rr.at.IsZero() {
		r.mu.Unlock()
		return // one is planned already
	}
	if !rr.sent.IsZero() && now.Sub(rr.sent) > hi {
		rr.attempt = 0
	}
	rr.at = now.Add(backoff(rr.attempt, lo, hi, rand.Float64()))
	rr.attempt++
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// supersede forgets the planned retry of the membership (or the watch) of
// room that the application's own message typ replaces; the backoff of a
// refusal of that message goes on from where it was.
func (r *roomRetries) supersede(typ, room string) {
	r.mu.Lock()
	if rr := r.rooms[keyOf(typ, room)]; rr != nil {
		rr.at, rr.beat = time.Time{}, false
	}
	r.mu.Unlock()
}

// planned reports whether a retry of the refused message typ about room
// is planned.
func (r *roomRetries) planned(typ, room string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rr := r.rooms[keyOf(typ, room)]
	return rr != nil && rr.typ == typ && !rr.at.IsZero()
}

// due takes the retries due at now and returns when the next one is due
// (zero: none planned). It forgets retries whose last one is long past.
func (r *roomRetries) due(now time.Time, hi time.Duration) (jobs []retryJob, next time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, rr := range r.rooms {
		switch {
		case rr.at.IsZero():
			if now.Sub(rr.sent) > 2*hi {
				delete(r.rooms, k)
			}
		case !rr.at.After(now):
			jobs = append(jobs, retryJob{typ: rr.typ, room: k.room, beat: rr.beat})
			rr.at, rr.beat, rr.sent = time.Time{}, false, now
		case next.IsZero() || rr.at.Before(next):
			next = rr.at
		}
	}
	return jobs, next
}

// retryRooms sends the planned retries of cn's refused room messages until
// ctx is done (the connection ended, or the client closed).
func (c *Client) retryRooms(ctx context.Context, cn *conn) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		jobs, next := cn.retries.due(time.Now(), c.cfg.MaxBackoff)
		for _, j := range jobs {
			if !c.retryRoom(ctx, cn, j) {
				return
			}
		}
		var fire <-chan time.Time
		if !next.IsZero() {
			t.Reset(time.Until(next))
			fire = t.C
		}
		select {
		case <-ctx.Done():
			return
		case <-cn.retries.wake:
			t.Stop()
		case <-fire:
		}
	}
}

// wantsLocked reports whether the application still wants what the room
// message typ asks for; c.mu is held.
func (c *Client) wantsLocked(typ, room string) bool {
	_, joined := c.joined[room]
	watched := c.watched[room] != nil
	switch typ {
	case reqJoin:
		return joined
	case reqLeave:
		_, leaving := c.leaving[room]
		return leaving && !joined
	case reqWatch:
		return watched
	case reqUnwatch:
		return !watched
	}
	return false
}

// retryRoom sends j's message again on cn if the application still wants
// what it asks for; false when cn is no longer usable.
func (c *Client) retryRoom(ctx context.Context, cn *conn, j retryJob) bool {
	c.roomMu.Lock()
	defer c.roomMu.Unlock()
	c.mu.Lock()
	current := c.cur == cn
	want := c.wantsLocked(j.typ, j.room)
	c.mu.Unlock()
	if !current {
		return false
	}
	if !want {
		return true
	}
	if j.beat && j.typ == reqJoin {
		msg := heartbeatMsg{Type: "heartbeat"}
		if !c.active.Load() {
			msg.Active = new(false)
		}
		if err := cn.sendJSON(ctx, msg); err != nil {
			cn.close() // the read loop notices and the run loop reconnects
			return false
		}
	}
	c.log.Debug("presence: sending a refused room message again", "type", j.typ, "room", j.room)
	if err := c.sendRoom(ctx, cn, j.typ, j.room); err != nil {
		cn.close()
		return false
	}
	c.mu.Lock()
	if c.wantsLocked(j.typ, j.room) {
		switch j.typ {
		case reqJoin:
			c.joined[j.room] = cn
		case reqLeave:
			c.leaveSentLocked(cn, j.room)
		case reqWatch:
			c.watched[j.room].sentOn = cn
		}
	}
	c.mu.Unlock()
	return true
}

// roomRefused handles an error of the server that names a room, which
// answers a join, leave, watch_room or unwatch_room sent on cn: the
// message refused (se.Request) is sent again later if a retry can cure
// the code and the application still wants what it asked for; a join or
// watch refused otherwise is dropped. The error reaches the application
// either way.
func (c *Client) roomRefused(cn *conn, se *ServerError) {
	defer c.q.push(se)
	room, retry := se.Room, roomRetryable(se.Code)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch se.Request {
	case "":
		c.roomRefusedUnnamedLocked(cn, se)
		return
	case reqJoin, reqWatch, reqUnwatch:
	case reqLeave:
		// The device is still in the room: the leave is due again, on
		// this connection after a backoff or on the next one.
		if _, joined := c.joined[room]; retry && !joined {
			c.leaving[room] = struct{}{}
		}
	default:
		return // a message of a later protocol: not one of ours
	}
	switch want := c.wantsLocked(se.Request, room); {
	case !want:
		// The application asked for something else since; its own
		// message went out after the refused one.
	case retry:
		cn.retries.schedule(se.Request, room, se.Code == "device_not_alive", time.Now(), c.cfg.MinBackoff, c.cfg.MaxBackoff)
	case se.Request == reqJoin:
		delete(c.joined, room)
	case se.Request == reqWatch:
		delete(c.watched, room)
		c.q.dropRoom(room)
	}
}

// roomRefusedUnnamedLocked is roomRefused for a server that names the room
// of a refused message but not the message (no "request"): the join
// and the watch of the room still wanted are sent again if a retry can
// cure the code, and otherwise the code tells which was refused where
// only one of them gets it; a code both get drops both, the watch only if
// its room message had not come yet. c.mu is held.
func (c *Client) roomRefusedUnnamedLocked(cn *conn, se *ServerError) {
	room := se.Room
	if roomRetryable(se.Code) {
		now := time.Now()
		if _, ok := c.joined[room]; ok {
			cn.retries.schedule(reqJoin, room, se.Code == "device_not_alive", now, c.cfg.MinBackoff, c.cfg.MaxBackoff)
		}
		if c.watched[room] != nil {
			cn.retries.schedule(reqWatch, room, false, now, c.cfg.MinBackoff, c.cfg.MaxBackoff)
		}
		return
	}
	joinOnly := se.Code == "too_many_rooms"
	watchOnly := se.Code == "too_many_watched_rooms"
	if _, ok := c.joined[room]; ok && !watchOnly {
		delete(c.joined, room)
	}
	// A room watched whose room message came already was not refused now
	// (but by too_many_watched_rooms, which only a watch gets).
	if v := c.watched[room]; v != nil && !joinOnly && (!v.have || watchOnly) {
		delete(c.watched, room)
		c.q.dropRoom(room)
	}
}

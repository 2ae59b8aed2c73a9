package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// Refused room messages (docs/protocol.md "Rooms": an error that answers a
// room message names its room). The client holds the rooms the
// application joined and watched; a refusal means the server holds the
// room neither joined nor watched, so the client either sends the join
// or watch again after a backoff — for a code a retry can cure — or drops
// the room from what it holds and tells the application.

// roomRetryable reports whether sending a refused join or watch again can
// succeed: the store was down for a moment (unavailable), too many
// messages or joins (rate_limited), or the device had ended apart from
// this socket (device_not_alive; a heartbeat first brings it back).
func roomRetryable(code string) bool {
	switch code {
	case "unavailable", "rate_limited", "device_not_alive":
		return true
	}
	return false
}

// roomRetries are the rooms one connection is to join or watch again.
// Their lifetime is the connection's: a reconnect joins and watches every
// room again anyway.
type roomRetries struct {
	wake chan struct{} // cap 1: a retry was scheduled

	mu    sync.Mutex
	rooms map[string]*roomRetry
}

// roomRetry is the retry of one room's join and watch.
type roomRetry struct {
	at      time.Time // when to send again; zero: nothing scheduled
	attempt int       // retries of this episode so far
	beat    bool      // send a heartbeat first (device_not_alive)
	sent    time.Time // when the last retry went out
}

func newRoomRetries() *roomRetries {
	return &roomRetries{wake: make(chan struct{}, 1), rooms: make(map[string]*roomRetry)}
}

// schedule plans a retry of room after the backoff of its attempt: the
// n-th refusal in a row waits a random duration in [d/2, d] with
// d = min(lo·2ⁿ, hi), like a reconnect. A refusal that comes more than hi
// after the last retry went out starts again at lo. One retry sends both
// the join and the watch of the room that are still wanted.
func (r *roomRetries) schedule(room string, beat bool, now time.Time, lo, hi time.Duration) {
	r.mu.Lock()
	rr := r.rooms[room]
	if rr == nil {
		rr = &roomRetry{}
		r.rooms[room] = rr
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

// due takes the retries due at now, with whether each needs a heartbeat
// first, and returns when the next one is due (zero: none planned). It
// forgets rooms whose last retry is long past.
func (r *roomRetries) due(now time.Time, hi time.Duration) (rooms []string, beats []bool, next time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for room, rr := range r.rooms {
		switch {
		case rr.at.IsZero():
			if now.Sub(rr.sent) > 2*hi {
				delete(r.rooms, room)
			}
		case !rr.at.After(now):
			rooms, beats = append(rooms, room), append(beats, rr.beat)
			rr.at, rr.beat, rr.sent = time.Time{}, false, now
		case next.IsZero() || rr.at.Before(next):
			next = rr.at
		}
	}
	return rooms, beats, next
}

// retryRooms sends the planned retries of cn's refused rooms until ctx is
// done (the connection ended, or the client closed).
func (c *Client) retryRooms(ctx context.Context, cn *conn) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		rooms, beats, next := cn.retries.due(time.Now(), c.cfg.MaxBackoff)
		for i, room := range rooms {
			if !c.retryRoom(ctx, cn, room, beats[i]) {
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

// retryRoom sends room's join and watch again on cn, each if the
// application still wants it; false when cn is no longer usable.
func (c *Client) retryRoom(ctx context.Context, cn *conn, room string, beat bool) bool {
	c.roomMu.Lock()
	defer c.roomMu.Unlock()
	c.mu.Lock()
	current := c.cur == cn
	_, join := c.joined[room]
	watch := c.watched[room] != nil
	c.mu.Unlock()
	if !current {
		return false
	}
	if beat && join {
		msg := heartbeatMsg{Type: "heartbeat"}
		if !c.active.Load() {
			msg.Active = new(false)
		}
		if err := cn.sendJSON(ctx, msg); err != nil {
			cn.close() // the read loop notices and the run loop reconnects
			return false
		}
	}
	for _, typ := range []string{"join", "watch_room"} {
		if typ == "join" && !join || typ == "watch_room" && !watch {
			continue
		}
		c.log.Debug("presence: sending a refused room message again", "type", typ, "room", room)
		if err := c.sendRoom(ctx, cn, typ, room); err != nil {
			cn.close()
			return false
		}
	}
	c.mu.Lock()
	if _, ok := c.joined[room]; ok && join {
		c.joined[room] = cn
	}
	if v := c.watched[room]; v != nil && watch {
		v.sentOn = cn
	}
	c.mu.Unlock()
	return true
}

// roomRefused handles an error of the server that names a room, which
// answers a join, leave, watch_room or unwatch_room sent on cn: a join or
// watch still wanted is sent again later if a retry can cure the code,
// and dropped otherwise. The error reaches the application either way.
func (c *Client) roomRefused(cn *conn, se *ServerError) {
	room := se.Room
	if roomRetryable(se.Code) {
		c.mu.Lock()
		_, join := c.joined[room]
		watch := c.watched[room] != nil
		c.mu.Unlock()
		if join || watch {
			cn.retries.schedule(room, se.Code == "device_not_alive", time.Now(), c.cfg.MinBackoff, c.cfg.MaxBackoff)
		}
		c.q.push(se)
		return
	}
	c.mu.Lock()
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
	c.mu.Unlock()
	c.q.push(se)
}

package natsbus

import (
	"context"
	"errors"
	"hash/maphash"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/presenced/presenced/internal/presence"
)

var stripeSeed = maphash.MakeSeed()

// subjectSub is the subscription to one user's subject (Bus.subs) or
// one room's (Bus.roomSubs).
type subjectSub struct {
	sub *nats.Subscription
	// recent holds the versions of the user's (or room's) events
	// delivered last (guarded by Bus.subsMu; 0 is no version, next the
	// slot to overwrite). A publish retried after a lost ack reaches the
	// subscribers again, possibly after newer events of the same user:
	// a version among the recent ones is dropped. Only those are: a lower
	// version may follow a reset of the user's hot state, and consumers
	// order by version anyway.
	recent [recentVersions]uint64
	next   uint8
}

// recentVersions is how many delivered versions a subscription remembers.
const recentVersions = 4

// seen reports whether version v was delivered recently, and remembers it
// if not.
func (us *subjectSub) seen(v uint64) bool {
	for _, r := range us.recent {
		if r == v && v != 0 {
			return true
		}
	}
	us.recent[us.next] = v
	us.next = (us.next + 1) % recentVersions
	return false
}

func (b *Bus) stripe(id string) *sync.Mutex {
	return &b.stripes[maphash.String(stripeSeed, id)%numStripes]
}

// Watch is called when this node starts watching users (the hub calls it
// after registering a user's first watcher): each user that
// Local.Watched reports as watched and is not subscribed yet is
// subscribed. If any was, the connection is flushed once (at most 2 s; an
// error is logged, and nats.go restores subscriptions on reconnection) so
// that the server knows of the interest before the caller reads the users'
// snapshots. Safe for concurrent use.
func (b *Bus) Watch(users []string) { b.watch(users, false) }

// Unwatch is called when this node may have stopped watching users (the
// hub calls it after removing a user's last watcher): each user that
// Local.Watched no longer reports as watched is unsubscribed. Safe for
// concurrent use.
func (b *Bus) Unwatch(users []string) { b.unwatch(users, false) }

// WatchRooms is Watch for rooms (the room hub calls it when a room gets
// its first watcher, before it reads the room's snapshot): each room that
// Config.Rooms reports as watched and is not subscribed yet is
// subscribed, and the connection flushed once if any was. Without
// Config.Rooms it does nothing. Safe for concurrent use.
func (b *Bus) WatchRooms(rooms []string) {
	if b.cfg.Rooms != nil {
		b.watch(rooms, true)
	}
}

// UnwatchRooms is Unwatch for rooms: each room that Config.Rooms no
// longer reports as watched is unsubscribed. Safe for concurrent use.
func (b *Bus) UnwatchRooms(rooms []string) {
	if b.cfg.Rooms != nil {
		b.unwatch(rooms, true)
	}
}

// watch subscribes to the users (or rooms) that are watched and flushes
// if it subscribed any.
func (b *Bus) watch(ids []string, rooms bool) {
	added := 0
	for _, id := range ids {
		if b.reconcile(context.Background(), id, rooms) > 0 {
			added++
		}
	}
	if added == 0 || !b.nc.IsConnected() {
		// While NATS is away the subscriptions wait in nats.go, which
		// sends them first thing on reconnection: no flush to wait for.
		return
	}
	if err := b.nc.FlushTimeout(watchFlushWait); err != nil {
		b.log.Warn("flush after subscribing failed; the subscriptions are restored on reconnection",
			"subscribed", added, "rooms", rooms, "err", err)
	}
}

// unwatch unsubscribes from the users (or rooms) no longer watched.
func (b *Bus) unwatch(ids []string, rooms bool) {
	for _, id := range ids {
		b.reconcile(context.Background(), id, rooms)
	}
}

// reconcile makes a user's subject subscribed iff Local.Watched(id) — a
// room's, with rooms, iff Config.Rooms.RoomWatched(id) — under the id's
// stripe lock, and returns +1 if it subscribed, -1 if it unsubscribed, 0
// if nothing changed. ctx is the caller's, for the calls' spans: the
// hubs' Watch and Unwatch carry none, and pass context.Background().
func (b *Bus) reconcile(ctx context.Context, id string, rooms bool) int {
	if id == "" {
		return 0
	}
	subs, n, what := b.subs, &b.nsubs, "user"
	if rooms {
		subs, n, what = b.roomSubs, &b.nroomSubs, "room"
	}
	mu := b.stripe(id)
	mu.Lock()
	defer mu.Unlock()
	var want bool
	if rooms {
		want = b.cfg.Rooms.RoomWatched(id)
	} else {
		want = b.cfg.Local.Watched(id)
	}
	b.subsMu.Lock()
	us := subs[id]
	b.subsMu.Unlock()
	switch {
	case want && us == nil:
		subject := subjectOf(b.prefix, id)
		if rooms {
			subject = roomSubjectOf(b.prefix, id)
		}
		c := callSubscribe.Start(ctx)
		sub, err := b.nc.ChanSubscribe(subject, b.in)
		c.End(err)
		if err != nil {
			if !errors.Is(err, nats.ErrConnectionClosed) { // after Close: nothing to say
				b.log.Error("subscribe failed", what, id, "err", err)
			}
			return 0
		}
		b.subsMu.Lock()
		subs[id] = &subjectSub{sub: sub}
		b.subsMu.Unlock()
		n.Add(1)
		return 1
	case !want && us != nil:
		dropped, _ := us.sub.Dropped()
		c := callUnsubscribe.Start(ctx)
		err := us.sub.Unsubscribe()
		c.End(err)
		if err != nil && b.nc.IsConnected() {
			b.log.Warn("unsubscribe failed", what, id, "err", err)
		}
		b.subsMu.Lock()
		delete(subs, id)
		if dropped > 0 {
			b.retiredDrops += uint64(dropped)
		}
		b.subsMu.Unlock()
		n.Add(-1)
		return -1
	}
	return 0
}

// dispatch delivers what the subscriptions receive until ctx is done.
func (b *Bus) dispatch(ctx context.Context) {
	var ev presence.Event
	var rev presence.RoomEvent
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-b.in:
			if strings.HasPrefix(m.Subject, b.rooms) {
				b.handleRoom(m, &rev)
			} else {
				b.handle(m, &ev)
			}
		}
	}
}

// mirror hands every change of another node that the whole-tree
// subscription receives to Config.Mirror, until ctx is done.
func (b *Bus) mirror(ctx context.Context) {
	var ev presence.Event
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-b.mirrorIn:
			if m.Header.Get(nodeHeader) == b.node {
				continue // its tracker fed the mirror already
			}
			if strings.HasPrefix(m.Subject, b.rooms) {
				continue // a room event: for the stream's readers, no change of a user
			}
			if b.decode(m, &ev) {
				b.mirrored.Add(1)
				b.cfg.Mirror(&ev)
			}
		}
	}
}

// handle processes one incoming message.
func (b *Bus) handle(m *nats.Msg, ev *presence.Event) {
	own := m.Header.Get(nodeHeader) == b.node
	if m.Subject == b.contacts {
		owner := string(m.Data)
		if own || owner == "" || b.cfg.OnContactsChanged == nil || !b.cfg.Local.Watched(owner) {
			return
		}
		b.queueContacts(owner)
		return
	}
	b.received.Add(1)
	if own {
		b.skippedOwn.Add(1)
		return
	}
	if !b.decode(m, ev) {
		return
	}
	b.subsMu.Lock()
	if us := b.subs[ev.UserID]; us != nil {
		if us.seen(ev.Version) {
			b.subsMu.Unlock()
			b.duplicates.Add(1)
			return
		}
	}
	b.subsMu.Unlock()
	if b.parkIfAnnounced(ev) {
		return
	}
	b.delivered.Add(1)
	b.cfg.Local.Publish(ev)
}

// handleRoom processes one message of a room's subject: a join or leave
// another node published is handed to Config.Rooms, a join with the
// member's status and settings from its header.
func (b *Bus) handleRoom(m *nats.Msg, ev *presence.RoomEvent) {
	b.received.Add(1)
	if m.Header.Get(nodeHeader) == b.node {
		b.skippedOwn.Add(1) // its room hub had it from the tracker
		return
	}
	if b.cfg.Rooms == nil {
		return // not subscribed to rooms: a message of before a Close
	}
	if err := decodeRoomEvent(m.Data, ev); err != nil {
		b.decoding.Add(1)
		b.logLimited(&b.lastDecodeLog, "undecodable room message dropped", "subject", m.Subject, "err", err)
		return
	}
	if !isSubjectOf(m.Subject, b.rooms, ev.Room) {
		b.decoding.Add(1)
		b.logLimited(&b.lastDecodeLog, "room message dropped: room does not match its subject", "subject", m.Subject, "room", ev.Room)
		return
	}
	if err := decodeMember(m.Header.Get(memberHeader), ev); err != nil {
		b.logLimited(&b.lastDecodeLog, "a join's member header does not decode; the member's status is shown to nobody", "room", ev.Room, "user_id", ev.UserID, "err", err)
	}
	b.subsMu.Lock()
	if rs := b.roomSubs[ev.Room]; rs != nil && rs.seen(ev.Version) {
		b.subsMu.Unlock()
		b.duplicates.Add(1)
		return
	}
	b.subsMu.Unlock()
	b.delivered.Add(1)
	b.deliveredRooms.Add(1)
	b.cfg.Rooms.PublishRoom(ev)
}

// decode decodes m into ev and checks that it is the change of its
// subject's user; a message that is not is counted, logged and dropped.
func (b *Bus) decode(m *nats.Msg, ev *presence.Event) bool {
	if err := decodeEvent(m.Data, ev); err != nil {
		b.decoding.Add(1)
		b.logLimited(&b.lastDecodeLog, "undecodable message dropped", "subject", m.Subject, "err", err)
		return false
	}
	if !isSubjectOf(m.Subject, b.prefix, ev.UserID) {
		b.decoding.Add(1)
		b.logLimited(&b.lastDecodeLog, "message dropped: user_id does not match its subject", "subject", m.Subject, "user_id", ev.UserID)
		return false
	}
	return true
}

// ContactsChanged announces to the other nodes (core NATS, not the stream)
// that owner's contact list changed, so the nodes that watch owner refresh
// what their watchers may see. It does not block: if NATS is unreachable
// the announcement is kept (up to a bound) and sent again by Run once the
// connection is back. Safe for concurrent use.
func (b *Bus) ContactsChanged(owner string) {
	if owner == "" {
		return
	}
	// The caller passes no context: the call's span, if any, has no parent.
	if err := b.announce(context.Background(), owner); err == nil {
		return
	}
	b.annMu.Lock()
	if len(b.annPending) >= maxPendingAnn {
		b.annMu.Unlock()
		b.announceFailed.Add(1)
		b.logLimited(&b.lastAnnLog, "contact announcement lost: NATS unreachable and too many waiting", "owner", owner)
		return
	}
	b.annPending = append(b.annPending, owner)
	b.annMu.Unlock()
	select {
	case b.annNotify <- struct{}{}:
	default:
	}
}

// announce publishes that owner's contact list changed. ctx is the
// caller's, for the call's span.
func (b *Bus) announce(ctx context.Context, owner string) (err error) {
	defer callAnnounce.Start(ctx).Done(&err)
	m := &nats.Msg{Subject: b.contacts, Data: []byte(owner), Header: nats.Header{nodeHeader: {b.node}}}
	if err := b.nc.PublishMsg(m); err != nil {
		return err
	}
	b.announced.Add(1)
	return nil
}

// sendAnnouncements sends the announcements that failed earlier, if NATS is
// connected; the publisher calls it with its own ctx.
func (p *publisher) sendAnnouncements(ctx context.Context) {
	b := p.b
	if !b.nc.IsConnected() {
		return
	}
	b.annMu.Lock()
	pending := b.annPending
	b.annPending = nil
	b.annMu.Unlock()
	for i, owner := range pending {
		if err := b.announce(ctx, owner); err != nil {
			b.annMu.Lock()
			b.annPending = append(pending[i:], b.annPending...)
			b.annMu.Unlock()
			return
		}
	}
}

// maxPendingContacts bounds the owners whose announcement waits for
// OnContactsChanged.
const maxPendingContacts = 65536

// contEntry is an owner whose announcement is queued for, or in,
// OnContactsChanged (guarded by Bus.contMu).
type contEntry struct {
	queued bool            // in contOrder
	parked *presence.Event // the newest change of the owner that arrived meanwhile
}

// parkIfAnnounced keeps ev back if its user's contact-list announcement has
// not been applied yet: the hub would filter it with the relations of
// before the change, and a watcher just removed from the list must not see
// it. The contacts goroutine delivers it after OnContactsChanged (only the
// newest: each change carries the whole state). It reports whether it did.
func (b *Bus) parkIfAnnounced(ev *presence.Event) bool {
	b.contMu.Lock()
	defer b.contMu.Unlock()
	e := b.contState[ev.UserID]
	if e == nil {
		return false
	}
	if e.parked == nil || ev.Version > e.parked.Version {
		cp := *ev
		e.parked = &cp
	}
	return true
}

// queueContacts hands an announced owner to the contacts goroutine:
// OnContactsChanged reads a durable store, and the dispatcher that
// delivers every change to this node's watchers must not wait for it. An
// owner already queued is not queued twice (the callback reads the list as
// it is then); the owner's changes that arrive meanwhile wait for the
// callback (parkIfAnnounced). Beyond maxPendingContacts owners the
// announcement is dropped, counted (Stats.ContactsDropped) and a resync is
// asked for (OnReconnect), which reads every watcher's relations again.
func (b *Bus) queueContacts(owner string) {
	b.contMu.Lock()
	e := b.contState[owner]
	if e != nil && e.queued {
		b.contMu.Unlock()
		return
	}
	if len(b.contOrder) >= maxPendingContacts {
		b.contMu.Unlock()
		b.contactsDropped.Add(1)
		b.logLimited(&b.lastContLog, "contact announcements dropped: too many waiting; watchers will be resynchronised")
		if b.cfg.OnReconnect != nil {
			b.cfg.OnReconnect()
		}
		return
	}
	if e == nil {
		if b.contState == nil {
			b.contState = make(map[string]*contEntry)
		}
		e = &contEntry{}
		b.contState[owner] = e
	}
	e.queued = true
	b.contOrder = append(b.contOrder, owner)
	b.contMu.Unlock()
	select {
	case b.contNotify <- struct{}{}:
	default:
	}
}

// contactsLoop calls OnContactsChanged for the queued owners, in the order
// of their announcements, and then delivers the changes parked meanwhile,
// until ctx is done.
func (b *Bus) contactsLoop(ctx context.Context) {
	for {
		for ctx.Err() == nil {
			b.contMu.Lock()
			if len(b.contOrder) == 0 {
				b.contOrder = nil // let a burst's array go
				b.contMu.Unlock()
				break
			}
			owner := b.contOrder[0]
			b.contOrder[0] = ""
			b.contOrder = b.contOrder[1:]
			e := b.contState[owner]
			e.queued = false
			b.contMu.Unlock()
			if b.cfg.Local.Watched(owner) {
				b.contactsIn.Add(1)
				b.cfg.OnContactsChanged(owner)
			}
			b.contMu.Lock()
			var ev *presence.Event
			if !e.queued { // else announced again: the next call releases it
				delete(b.contState, owner)
				ev, e.parked = e.parked, nil
			}
			b.contMu.Unlock()
			if ev != nil {
				b.delivered.Add(1)
				b.cfg.Local.Publish(ev)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-b.contNotify:
		}
	}
}

package natsbus

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/wire"
)

// Calls to NATS timed into presenced_backend_call_duration_seconds.
var (
	// callPublish is a JetStream publish, from the send to its ack (or
	// failure): the publisher keeps up to maxInFlight under way.
	callPublish      = backendcall.New("nats", "publish")
	callPing         = backendcall.New("nats", "ping")
	callEnsureStream = backendcall.New("nats", "ensure_stream")
	callStreamInfo   = backendcall.New("nats", "stream_info")
	callAnnounce     = backendcall.New("nats", "announce")
	callSubscribe    = backendcall.New("nats", "subscribe")
	callUnsubscribe  = backendcall.New("nats", "unsubscribe")
)

// item is one event in the queue: a change of presence, or (room not
// nil) a join or leave of a room. A room event is copied to the heap: a
// change of presence, far more common, is queued without allocating.
type item struct {
	ev   presence.Event
	room *presence.RoomEvent
}

// queue is the bounded queue between Publish (and PublishRoom) and the
// publisher goroutine. Producers append to buf under mu; the publisher
// swaps the whole slice out, so neither side allocates once the slices
// have grown. n counts the events that were accepted and not yet handed
// to NATS (those in buf and those the publisher took but has not sent),
// so the bound holds for both.
type queue struct {
	max    int
	n      atomic.Int64
	notify chan struct{} // cap 1: something was appended
	// accepted counts the events ever appended, in the order of buf:
	// the k-th is the event the publisher numbers k (Bus.Mark).
	accepted atomic.Uint64

	mu  sync.Mutex // guards buf
	buf []item     // accepted events, oldest first
}

func (q *queue) init(max int) {
	q.max = max
	q.notify = make(chan struct{}, 1)
}

// push copies ev (or room, when ev is nil) into the queue; false when the
// queue is full.
func (q *queue) push(ev *presence.Event, room *presence.RoomEvent) bool {
	if q.n.Add(1) > int64(q.max) {
		q.n.Add(-1)
		return false
	}
	if room != nil {
		cp := *room
		room = &cp
	}
	q.mu.Lock()
	if ev != nil {
		q.buf = append(q.buf, item{ev: *ev})
	} else {
		q.buf = append(q.buf, item{room: room})
	}
	q.accepted.Add(1)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
	return true
}

// take returns the queued events and keeps spare (emptied) for the next
// appends.
func (q *queue) take(spare []item) []item {
	q.mu.Lock()
	got := q.buf
	q.buf = spare[:0]
	q.mu.Unlock()
	return got
}

// len returns the events accepted and not yet sent.
func (q *queue) len() int { return int(q.n.Load()) }

// Publish queues a copy of ev for publishing. It never blocks: when the
// queue is full the event is dropped and counted (Stats.Dropped), and a
// warning is logged at most once a second. Safe for concurrent use.
func (b *Bus) Publish(ev *presence.Event) {
	if b.shut.Load() || !b.q.push(ev, nil) {
		b.drop()
		return
	}
	b.published.Add(1)
}

// PublishRoom queues a copy of a join or leave of a room for publishing,
// in the same queue as the changes of presence and in order with them,
// to the subject of the room (roomSubjectOf). Like Publish it never
// blocks, and Mark and Wait count it. Safe for concurrent use.
func (b *Bus) PublishRoom(ev *presence.RoomEvent) {
	if b.shut.Load() || !b.q.push(nil, ev) {
		b.drop()
		return
	}
	b.published.Add(1)
	b.publishedRooms.Add(1)
}

// drop counts an event the queue had no room for (or that came after
// Close), and says so at most once a second.
func (b *Bus) drop() {
	b.dropped.Add(1)
	b.logLimited(&b.lastDropLog, "outgoing queue full: presence events dropped", "queue_size", b.q.max, "dropped_total", b.dropped.Load())
}

// outMsg is one event on its way to the stream.
type outMsg struct {
	seq  uint64 // the event's number in the order of the queue (Bus.Mark)
	msg  *nats.Msg
	paf  jetstream.PubAckFuture // nil until sent
	sent backendcall.Call       // the publish under way, ended by its ack or failure
}

// publisher is the state of the outgoing side. It is used by one goroutine
// at a time: Run's publisher goroutine, or Close after Run has returned.
type publisher struct {
	b *Bus

	batch    []item // taken from the queue, batch[next:] not sent yet
	next     int
	taken    uint64    // the events encoded from the queue so far (the last one's number)
	inflight []*outMsg // sent, awaiting ack, oldest first
	retry    []*outMsg // failed, to send again before anything newer
	retryAt  time.Time
	backoff  time.Duration
	check    bool         // a publish failed, or NATS came back: look up the stream before sending
	nheld    atomic.Int64 // len(inflight)+len(retry), for Stats
	timer    *time.Timer
	buf      []byte
}

func newPublisher(b *Bus) *publisher {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &publisher{b: b, timer: t}
}

func (p *publisher) held() int { return int(p.nheld.Load()) }

func (p *publisher) setHeld() { p.nheld.Store(int64(len(p.inflight) + len(p.retry))) }

// run publishes until ctx is done. With flush it returns as soon as
// nothing is left to publish. It returns the number of events left.
func (p *publisher) run(ctx context.Context, flush bool) int {
	b := p.b
	for {
		p.harvest()
		p.sendAnnouncements(ctx)
		p.send(ctx)
		p.setHeld()
		pendingQueue := b.q.len() > 0
		if flush && !pendingQueue && len(p.inflight) == 0 && len(p.retry) == 0 {
			return 0
		}

		// Wait for something to do.
		var ok <-chan *jetstream.PubAck
		var errc <-chan error
		if len(p.inflight) > 0 {
			ok, errc = p.inflight[0].paf.Ok(), p.inflight[0].paf.Err()
		}
		var notify <-chan struct{}
		if len(p.retry) == 0 && len(p.inflight) < maxInFlight {
			notify = b.q.notify // every append signals it after the append
		}
		var timerC <-chan time.Time
		if (len(p.retry) > 0 || p.check) && len(p.inflight) < maxInFlight {
			p.timer.Reset(time.Until(p.retryAt))
			timerC = p.timer.C
		}
		select {
		case <-ctx.Done():
			p.timer.Stop()
			return b.q.len() + len(p.inflight) + len(p.retry)
		case a := <-ok:
			p.acked(a)
		case err := <-errc:
			p.failedHead(err)
		case <-notify:
		case <-b.annNotify:
		case <-timerC:
		case <-b.reconn:
			// NATS is back: look at the stream (a server that lost its
			// store lost it) and retry now.
			p.retryAt = time.Time{}
			p.backoff = 0
			p.check = true
		}
		p.timer.Stop() // (Go ≥ 1.23: no stale tick is left in C)
	}
}

// harvest takes every settled publish off the head of inflight without
// waiting. Acks come back in order on one connection, so looking at the
// head is enough.
func (p *publisher) harvest() {
	for len(p.inflight) > 0 {
		head := p.inflight[0].paf
		select {
		case a := <-head.Ok():
			p.acked(a)
		case err := <-head.Err():
			p.failedHead(err)
		default:
			return
		}
	}
}

func (p *publisher) acked(*jetstream.PubAck) {
	p.b.conf.acked(p.inflight[0].seq)
	p.inflight[0].sent.End(nil)
	p.inflight[0] = nil
	p.inflight = p.inflight[1:]
	p.b.acked.Add(1)
	p.b.failingSince.Store(0)
	p.backoff = 0
}

// failedHead moves the head of inflight to the retry list.
func (p *publisher) failedHead(err error) {
	m := p.inflight[0]
	m.sent.End(err)
	p.inflight[0] = nil
	p.inflight = p.inflight[1:]
	m.paf = nil
	p.retry = append(p.retry, m)
	p.fail(err)
}

// fail schedules the retry list after the next backoff step. Failures
// while a retry is already scheduled (the rest of a failed round) do not
// lengthen the wait.
//
// A failure that persists — a second round failing with no ack between —
// may mean that the stream is gone, so the stream is looked up (and
// created again if missing) before the next round. A publish to a subject
// no stream captures is refused at once only when nobody else listens on
// it (jetstream.ErrNoStreamResponse, which is looked into at once); one to
// a subject that nodes subscribe to (a watched user) reaches those
// subscribers and times out instead, like a publish to a slow server.
func (p *publisher) fail(err error) {
	p.b.failedConn.Store(p.b.nc.Stats().Reconnects) // before failingSince: Bus.failing
	if p.b.failingSince.CompareAndSwap(0, time.Now().UnixNano()) {
		p.b.conf.wake() // Wait gives up now
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		p.check = true
	}
	if time.Now().Before(p.retryAt) {
		return
	}
	if p.backoff == 0 {
		p.backoff = minBackoff
	} else {
		p.backoff = min(2*p.backoff, maxBackoff)
		p.check = true // the retries failed too
	}
	p.retryAt = time.Now().Add(p.backoff)
	p.b.logLimited(&p.b.lastPubLog, "publish to the stream failed; will retry", "err", err, "waiting", len(p.retry))
}

// send publishes retries (when due) and then queued events while fewer
// than maxInFlight await their ack.
func (p *publisher) send(ctx context.Context) {
	b := p.b
	for len(p.inflight) < maxInFlight {
		if (p.check || len(p.retry) > 0) && time.Now().Before(p.retryAt) {
			return
		}
		if p.check {
			if !p.checkStream(ctx) {
				return
			}
			p.check = false
		}
		var m *outMsg
		fromRetry := false
		switch {
		case len(p.retry) > 0:
			m, fromRetry = p.retry[0], true
		default:
			if p.next >= len(p.batch) {
				clear(p.batch) // keep no strings alive
				p.batch, p.next = b.q.take(p.batch[:0]), 0
				if len(p.batch) == 0 {
					return
				}
			}
			m = p.encode(&p.batch[p.next])
		}
		m.sent = callPublish.Start(ctx)
		paf, err := b.js.PublishMsgAsync(m.msg)
		if err != nil {
			m.sent.End(err)
			if !fromRetry {
				p.next++
				b.q.n.Add(-1)
				p.retry = append(p.retry, m)
			}
			p.fail(err)
			return
		}
		m.paf = paf
		p.inflight = append(p.inflight, m)
		if fromRetry {
			p.retry[0] = nil
			p.retry = p.retry[1:]
			b.retried.Add(1)
		} else {
			p.next++
			b.q.n.Add(-1)
		}
	}
}

// checkStream looks the stream up and creates it again if it is missing
// (a NATS server that lost its store, an operator's delete). It reports
// whether publishing may go on; if not, it scheduled the next look (fail).
func (p *publisher) checkStream(ctx context.Context) bool {
	b := p.b
	if !b.nc.IsConnected() {
		p.fail(nats.ErrConnectionReconnecting)
		return false
	}
	err := b.lookUpStream(ctx)
	switch {
	case err == nil:
		if b.streamMissing.Swap(false) {
			b.log.Info("the stream is there again", "stream", b.cfg.Stream)
		}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		p.fail(err) // no answer (JetStream starting, NATS slow): look again later
		return false
	default:
		if !b.streamMissing.Swap(true) {
			b.log.Warn("the stream is missing (NATS lost its store, or it was deleted): creating it again; "+
				"what it held is lost, changes of this node wait until it exists", "stream", b.cfg.Stream)
		}
		if err := b.ensureStream(ctx); err != nil {
			p.fail(err)
			return false
		}
		b.streamMissing.Store(false)
		b.recreated.Add(1)
		b.log.Warn("stream re-created", "stream", b.cfg.Stream, "waiting", b.q.len()+len(p.retry))
	}
	if len(p.retry) == 0 && len(p.inflight) == 0 {
		b.failingSince.Store(0) // no failed publish waits: what failed was a look
	}
	return true
}

// encode builds the message of it: a change of presence to its user's
// subject, a room event to its room's (a join with the member's status
// and settings in memberHeader).
func (p *publisher) encode(it *item) *outMsg {
	var subject, id, member string
	if ev := it.room; ev != nil {
		p.buf = wire.AppendRoomEvent(p.buf[:0], ev)
		subject, id = roomSubjectOf(p.b.prefix, ev.Room), roomMsgID(ev.Room, ev.Version)
		if ev.Kind == presence.RoomJoin {
			member = memberValue(ev)
		}
	} else {
		ev := &it.ev
		p.buf = appendEvent(p.buf[:0], ev)
		subject, id = subjectOf(p.b.prefix, ev.UserID), msgID(ev.UserID, ev.Version)
	}
	data := make([]byte, len(p.buf))
	copy(data, p.buf)
	m := &nats.Msg{
		Subject: subject,
		Data:    data,
		Header: nats.Header{
			jetstream.MsgIDHeader: {id},
			nodeHeader:            {p.b.node},
		},
	}
	if member != "" {
		m.Header[memberHeader] = []string{member}
	}
	p.taken++
	return &outMsg{seq: p.taken, msg: m}
}

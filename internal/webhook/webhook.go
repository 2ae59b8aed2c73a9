// Package webhook POSTs every change of presence, and every join and
// leave of a room, to the app's HTTP endpoints: batched (up to MaxBatch
// events, or what arrived within Linger of the first), signed (package
// webhooksig: HMAC-SHA256 over the timestamp and the body), retried with
// exponential backoff and jitter, at least once and in order, one request
// in flight per endpoint. Room events travel with the changes, through
// the same log, and are listed apart in the body ("room_events").
//
// The changes come from a durable log, never from memory alone, so a change
// a client was told of reaches every endpoint even if the node dies right
// after: with NATS (Config.Stream) the stream PRESENCE_CHANGES through a
// durable consumer per endpoint, delivered by the node that holds the
// endpoint's lease (stream.go); on the embedded node (Config.Outbox) an
// outbox in the node's SQLite file (outbox.go). Confirm is what makes this
// hold for the clients: the node answers a request that made a change only
// once the change is in the log.
//
// The body, the signature, the guarantee and what can still be lost are in
// docs/operations.md ("Webhooks").
package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/webhooksig"
)

// Config configures a Sender. Zero values take the documented defaults.
// Exactly one of Outbox and Stream is required.
type Config struct {
	URLs   []string // required
	Secret []byte   // required: the HMAC key receivers verify with
	// Outbox is the durable log of an embedded node (sqlitestore.Store):
	// the Sender is then the tracker's Publisher.
	Outbox Outbox
	// Stream reads the changes from the NATS stream instead.
	Stream *StreamConfig
	// MaxBatch bounds the events of one request (default 256); Linger is
	// how long a request waits for more after the first (default 100ms).
	MaxBatch int
	Linger   time.Duration
	// QueueLen bounds the changes the outbox keeps for an endpoint that
	// does not take them (default 100,000); beyond it the oldest are
	// dropped and counted. It also bounds the changes waiting in memory
	// for the outbox's writer (a disk that does not take writes).
	QueueLen int
	// Timeout bounds one request (default 5s).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a retry (defaults
	// 100ms and 30s), doubled after each failure, with full jitter.
	MinBackoff, MaxBackoff time.Duration
	// DrainTimeout bounds, when Run stops, the request under way and the
	// last attempts to deliver what the outbox holds (default 2s); what is
	// not delivered stays in the log.
	DrainTimeout time.Duration
	// ConfirmTimeout bounds Confirm (default 2s).
	ConfirmTimeout time.Duration
	Client         *http.Client // default: one with Timeout
	Clock          clock.Clock
	Logger         *slog.Logger
}

// Confirmer tells when the changes published so far are in the durable
// log (natsbus.Bus: in the stream). Mark numbers the changes published so
// far; Wait waits until every one up to mark is durable, and reports
// false when it cannot be (soon), or when ctx ends first.
type Confirmer interface {
	Mark() uint64
	Wait(ctx context.Context, mark uint64) bool
}

// Stats are a Sender's counters, summed over its endpoints.
type Stats struct {
	Queued    int    // changes waiting for an endpoint now: in this node's outbox, or in the stream for the endpoints this node delivers
	Delivered uint64 // events answered 2xx
	Retried   uint64 // requests sent again
	Dropped   uint64 // changes lost: the outbox or its queue was full, or the stream no longer held them (older than its MaxAge)
	Rejected  uint64 // events an endpoint refused for good (4xx other than 408 and 429)
	// Unconfirmed counts the changes a client was answered for before
	// they were in the durable log (NATS unreachable, a disk that does
	// not take writes, or ConfirmTimeout passed): a crash of the node
	// before they got there loses them.
	Unconfirmed uint64
}

// Sender delivers changes and room events to webhooks. With an Outbox it
// is a tracker.Publisher and a tracker.RoomPublisher (Publish and
// PublishRoom never block). Run delivers. Safe for concurrent use.
type Sender struct {
	cfg       Config
	log       *slog.Logger
	endpoints []*endpoint
	ob        *outbox // nil with a Stream
	st        *stream // nil with an Outbox

	unconfirmed atomic.Uint64
	lastLog     atomic.Int64 // unix ns of the last rate-limited log line
}

type endpoint struct {
	s   *Sender
	url string
	key string // names the endpoint's cursor and consumer: hex of SHA-256 of the URL, 16 digits

	// outbox: written to when entries were appended; the last entry done with
	wake   chan struct{}
	cursor atomic.Uint64
	// stream: the messages in hand and the consumer's backlog last seen
	held, backlog atomic.Int64
	// stream: where this node last saw the consumer (stream.consumer),
	// the endpoint's goroutine's (and New's before it): the creation
	// time of its stream, and the stream sequence up to which it had
	// acknowledged every change
	born  time.Time
	acked uint64

	delivered, retried, dropped, rejected atomic.Uint64
}

// entry is one change or room event on its way: its JSON and its number
// in the log.
type entry struct {
	seq  uint64
	data []byte
}

// roomEventStart is how the JSON of a room event starts
// (wire.AppendRoomEvent); a change's starts with {"user_id":.
var roomEventStart = []byte(`{"room":`)

// isRoomEvent reports whether data, the JSON of a logged event, is a
// room event's.
func isRoomEvent(data []byte) bool { return bytes.HasPrefix(data, roomEventStart) }

// New checks cfg and prepares the log: with an Outbox it reads where
// each endpoint is; with a Stream it creates each endpoint's consumer if
// missing (so that no change published from now on is missed) and the
// stream of the leases.
func New(ctx context.Context, cfg Config) (*Sender, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("webhook: no URL")
	}
	if len(cfg.Secret) == 0 {
		return nil, errors.New("webhook: a secret is required to sign requests")
	}
	if (cfg.Outbox == nil) == (cfg.Stream == nil) {
		return nil, errors.New("webhook: need an outbox or a stream to read the changes from (one of them)")
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
	}
	if cfg.Linger <= 0 {
		cfg.Linger = 100 * time.Millisecond
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 100000
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(30*time.Second, cfg.MinBackoff)
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 2 * time.Second
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 2 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Sender{cfg: cfg, log: cfg.Logger}
	seen := map[string]bool{}
	for _, u := range cfg.URLs {
		k := endpointKey(u)
		if seen[k] {
			return nil, fmt.Errorf("webhook: URL %q given twice", u)
		}
		seen[k] = true
		s.endpoints = append(s.endpoints, &endpoint{s: s, url: u, key: k, wake: make(chan struct{}, 1)})
	}
	var err error
	if cfg.Outbox != nil {
		s.ob, err = openOutbox(ctx, s)
	} else {
		s.st, err = openStream(ctx, s)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

func endpointKey(url string) string {
	h := sha256.Sum256([]byte(url))
	return hex.EncodeToString(h[:8])
}

// Publish queues ev for the outbox (with a Stream the changes come from
// the stream, and Publish does nothing). A change of settings alone is no
// transition of presence and is not sent, nor is a change only the user
// sees (an invisible user's text: presence.Event.SelfOnly). It never blocks.
func (s *Sender) Publish(ev *presence.Event) {
	if ev.SettingsOnly || ev.SelfOnly || s.ob == nil {
		return
	}
	s.ob.push(ev, nil)
}

// PublishRoom queues a join or leave of a room for the outbox, in order
// with the changes (with a Stream the room events come from the stream,
// and PublishRoom does nothing). Confirm waits for it as for a change. It
// never blocks.
func (s *Sender) PublishRoom(ev *presence.RoomEvent) {
	if s.ob == nil {
		return
	}
	s.ob.push(nil, ev)
}

// Confirm waits until every change published before the call is in the
// durable log — in the outbox's file, or in the stream — at most
// ConfirmTimeout, and reports whether it is. A node calls it before it
// answers a client whose request made a change; a change not confirmed
// (NATS down, a failing disk) is counted (Stats.Unconfirmed), and is lost
// if the node dies before it gets there.
func (s *Sender) Confirm(ctx context.Context) bool {
	var c Confirmer
	if s.ob != nil {
		c = s.ob
	} else {
		c = s.cfg.Stream.Confirmer
	}
	mark := c.Mark()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConfirmTimeout)
	defer cancel()
	if c.Wait(ctx, mark) {
		return true
	}
	s.unconfirmed.Add(1)
	s.logLimited("a change was acknowledged before it was durable for the webhooks (counted in presenced_webhook_unconfirmed_total)")
	return false
}

// Stats returns the counters.
func (s *Sender) Stats() Stats {
	var st Stats
	if s.ob != nil {
		st.Queued, st.Dropped = s.ob.stats()
	}
	for _, e := range s.endpoints {
		st.Queued += int(e.held.Load() + e.backlog.Load())
		st.Delivered += e.delivered.Load()
		st.Retried += e.retried.Load()
		st.Dropped += e.dropped.Load()
		st.Rejected += e.rejected.Load()
	}
	st.Unconfirmed = s.unconfirmed.Load()
	return st
}

// Run delivers until ctx is done — one goroutine per endpoint, and with an
// outbox its writer — letting a request under way finish and, with an
// outbox, trying once more to deliver what it holds (DrainTimeout); what
// is left stays in the log.
func (s *Sender) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, e := range s.endpoints {
		if s.ob != nil {
			wg.Go(func() { e.runOutbox(ctx) })
		} else {
			wg.Go(func() { e.runStream(ctx) })
		}
	}
	if s.ob != nil {
		wg.Go(func() { s.ob.run(ctx) })
	}
	wg.Wait()
	if s.ob != nil && s.ob.dirty.Swap(false) {
		// The endpoints' last deliveries (the drain) came after the
		// writer's last record of the cursors.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.DrainTimeout)
		if err := s.ob.saveCursors(sctx); err != nil {
			s.log.Warn("webhook outbox: recording the cursors at shutdown failed; some changes will be sent again", "err", err)
		}
		cancel()
	}
	return nil
}

// logLimited logs msg at warning level at most once a second.
func (s *Sender) logLimited(msg string, args ...any) {
	now := time.Now().UnixNano()
	prev := s.lastLog.Load()
	if now-prev < int64(time.Second) || !s.lastLog.CompareAndSwap(prev, now) {
		return
	}
	s.log.Warn(msg, args...)
}

// encode writes the body of a request: {"events":[…]}, the changes of
// batch in order, and, when batch holds room events, ,"room_events":[…]
// after them, the room events in order. A receiver that knows nothing of
// rooms reads "events" as before.
func encode(b []byte, batch []entry) []byte {
	b = append(b, `{"events":[`...)
	n, rooms := 0, 0
	for i := range batch {
		if isRoomEvent(batch[i].data) {
			rooms++
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = append(b, batch[i].data...)
		n++
	}
	b = append(b, ']')
	if rooms > 0 {
		b = append(b, `,"room_events":[`...)
		n = 0
		for i := range batch {
			if !isRoomEvent(batch[i].data) {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			b = append(b, batch[i].data...)
			n++
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// deliver sends body until it is answered 2xx or refused for good; it
// reports false if ctx ended first. An attempt under way when ctx ends is
// given DrainTimeout to finish, so that a clean stop does not have a batch
// the endpoint got sent again; cut ends it at once (a lease lost).
func (e *endpoint) deliver(ctx, cut context.Context, body []byte, n int) bool {
	backoff := e.s.cfg.MinBackoff
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			e.retried.Add(1)
		}
		wait, err := e.attempt(ctx, cut, body)
		switch {
		case err == nil:
			e.delivered.Add(uint64(n))
			return true
		case errors.Is(err, errRejected):
			e.rejected.Add(uint64(n))
			e.s.log.Error("webhook endpoint refused events for good", "url", e.url, "events", n, "err", err)
			return true
		case ctx.Err() != nil:
			return false
		}
		if attempt == 0 || attempt%10 == 0 {
			e.s.log.Warn("webhook delivery failed; retrying", "url", e.url, "events", n, "attempt", attempt+1, "err", err)
		}
		// Full jitter: anywhere up to the backoff, at least the minimum;
		// a Retry-After the endpoint asked for, within MaxBackoff.
		d := max(e.s.cfg.MinBackoff, time.Duration(rand.Int64N(int64(backoff)+1)))
		if wait > 0 {
			d = min(wait, e.s.cfg.MaxBackoff)
		}
		backoff = min(2*backoff, e.s.cfg.MaxBackoff)
		if !sleep(ctx, d) {
			return false
		}
	}
}

// attempt posts body once, cut short by cut, or DrainTimeout after ctx
// ended.
func (e *endpoint) attempt(ctx, cut context.Context, body []byte) (time.Duration, error) {
	actx, cancel := context.WithCancel(cut)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(e.s.cfg.DrainTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-actx.Done():
		}
	})
	defer stop()
	return e.post(actx, body)
}

// sleep waits d; false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// errRejected is an answer that retrying would not change.
var errRejected = errors.New("refused")

// post sends one request. It returns nil on 2xx, errRejected (wrapped) on
// a 4xx other than 408 and 429, and otherwise an error to retry after,
// with the wait the endpoint asked for in Retry-After, if any.
func (e *endpoint) post(ctx context.Context, body []byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, e.s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errRejected, err)
	}
	ts := e.s.cfg.Clock.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "presenced-webhook")
	req.Header.Set(webhooksig.TimestampHeader, strconv.FormatInt(ts, 10))
	req.Header.Set(webhooksig.SignatureHeader, webhooksig.Sign(e.s.cfg.Secret, ts, body))
	resp, err := e.s.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return 0, nil
	case c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500:
		var wait time.Duration
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		return wait, fmt.Errorf("answered %s", resp.Status)
	default:
		return 0, fmt.Errorf("%w: answered %s", errRejected, resp.Status)
	}
}

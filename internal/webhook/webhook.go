// Package webhook POSTs every change of presence this node makes to the
// app's HTTP endpoints: batched (up to MaxBatch events, or what arrived
// within Linger of the first), signed (client.WebhookSignature: HMAC-SHA256
// over the timestamp and the body), retried with exponential backoff and
// jitter on 5xx, 408, 429, timeouts and refused connections — at least
// once, and in order, since an endpoint has one request in flight at a
// time. Each endpoint has a bounded queue; beyond it events are dropped and
// counted, so a dead endpoint never slows presence.
//
// The body is {"events":[…]}, each event the change as wire.AppendChange
// writes it (user, status, previous status, text, last_seen, version,
// settings). A receiver drops an event whose version is not above the last
// it stored for that user (a retry after a lost answer repeats a batch).
//
// With several nodes each change is sent once: a node sends the changes it
// made (its tracker's Publisher), never those it hears of from others.
package webhook

import (
	"bytes"
	"context"
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

	"github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/wire"
)

// Config configures a Sender. Zero values take the documented defaults.
type Config struct {
	URLs   []string // required
	Secret []byte   // required: the HMAC key receivers verify with
	// MaxBatch bounds the events of one request (default 256); Linger is
	// how long a request waits for more after the first (default 100ms).
	MaxBatch int
	Linger   time.Duration
	// QueueLen bounds the events waiting for one endpoint (default
	// 100,000); beyond it new events are dropped and counted.
	QueueLen int
	// Timeout bounds one request (default 5s).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a retry (defaults
	// 100ms and 30s), doubled after each failure, with full jitter.
	MinBackoff, MaxBackoff time.Duration
	// DrainTimeout bounds the last attempts to deliver what is queued when
	// Run stops (default 2s).
	DrainTimeout time.Duration
	Client       *http.Client // default: one with Timeout
	Clock        clock.Clock
	Logger       *slog.Logger
}

// Stats are a Sender's counters, summed over its endpoints.
type Stats struct {
	Queued    int    // events waiting now
	Delivered uint64 // events answered 2xx
	Retried   uint64 // requests sent again
	Dropped   uint64 // events dropped: a full queue, or still queued at shutdown
	Rejected  uint64 // events an endpoint refused for good (4xx other than 408 and 429)
}

// Sender is a tracker.Publisher that delivers changes to webhooks. Publish
// never blocks; Run delivers.
type Sender struct {
	cfg       Config
	log       *slog.Logger
	endpoints []*endpoint
}

type endpoint struct {
	s   *Sender
	url string

	mu    sync.Mutex
	queue []presence.Event // oldest first; queue[head:] waiting
	head  int
	wake  chan struct{} // one pending wake-up

	delivered, retried, dropped, rejected atomic.Uint64
}

// New returns a Sender for cfg.URLs.
func New(cfg Config) (*Sender, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("webhook: no URL")
	}
	if len(cfg.Secret) == 0 {
		return nil, errors.New("webhook: a secret is required to sign requests")
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
	for _, u := range cfg.URLs {
		s.endpoints = append(s.endpoints, &endpoint{s: s, url: u, wake: make(chan struct{}, 1)})
	}
	return s, nil
}

// Publish queues ev for every endpoint. A change of settings alone is no
// transition of presence and is not sent, nor is a change only the user
// sees (an invisible user's text: presence.Event.SelfOnly).
func (s *Sender) Publish(ev *presence.Event) {
	if ev.SettingsOnly || ev.SelfOnly {
		return
	}
	for _, e := range s.endpoints {
		e.push(ev)
	}
}

func (e *endpoint) push(ev *presence.Event) {
	e.mu.Lock()
	if len(e.queue)-e.head >= e.s.cfg.QueueLen {
		e.mu.Unlock()
		if n := e.dropped.Add(1); n == 1 || n%10000 == 0 {
			e.s.log.Warn("webhook queue full: events dropped", "url", e.url, "queue", e.s.cfg.QueueLen, "dropped_total", n)
		}
		return
	}
	e.queue = append(e.queue, *ev)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// take removes up to n of the oldest events into dst.
func (e *endpoint) take(dst []presence.Event, n int) []presence.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := min(n, len(e.queue)-e.head)
	dst = append(dst, e.queue[e.head:e.head+k]...)
	clear(e.queue[e.head : e.head+k]) // drop the strings
	e.head += k
	if e.head == len(e.queue) {
		e.queue, e.head = e.queue[:0], 0
	} else if e.head > 4096 && e.head*2 > len(e.queue) {
		e.queue = append(e.queue[:0], e.queue[e.head:]...)
		e.head = 0
	}
	return dst
}

func (e *endpoint) waiting() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.queue) - e.head
}

// Stats returns the counters.
func (s *Sender) Stats() Stats {
	var st Stats
	for _, e := range s.endpoints {
		st.Queued += e.waiting()
		st.Delivered += e.delivered.Load()
		st.Retried += e.retried.Load()
		st.Dropped += e.dropped.Load()
		st.Rejected += e.rejected.Load()
	}
	return st
}

// Run delivers until ctx is done, one goroutine per endpoint, then tries
// for DrainTimeout to deliver what is still queued (once a batch) and
// counts the rest as dropped.
func (s *Sender) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, e := range s.endpoints {
		wg.Go(func() { e.run(ctx) })
	}
	wg.Wait()
	return nil
}

func (e *endpoint) run(ctx context.Context) {
	var batch []presence.Event
	var body []byte
	for {
		if e.waiting() == 0 {
			select {
			case <-ctx.Done():
				e.drain()
				return
			case <-e.wake:
			}
		}
		// Linger for more, unless a batch is already full.
		if e.waiting() < e.s.cfg.MaxBatch {
			t := time.NewTimer(e.s.cfg.Linger)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		batch = e.take(batch[:0], e.s.cfg.MaxBatch)
		if len(batch) == 0 {
			continue
		}
		body = encode(body[:0], batch)
		if !e.deliver(ctx, body, len(batch)) {
			// Stopped while retrying: the batch goes first in the drain.
			e.mu.Lock()
			e.queue = append(append(make([]presence.Event, 0, len(batch)+len(e.queue)-e.head), batch...), e.queue[e.head:]...)
			e.head = 0
			e.mu.Unlock()
			e.drain()
			return
		}
	}
}

// encode writes the body of a request: {"events":[…]}.
func encode(b []byte, batch []presence.Event) []byte {
	b = append(b, `{"events":[`...)
	for i := range batch {
		if i > 0 {
			b = append(b, ',')
		}
		b = wire.AppendChange(b, &batch[i])
	}
	return append(b, "]}"...)
}

// deliver sends body until it is answered 2xx or refused for good; it
// reports false if ctx ended first.
func (e *endpoint) deliver(ctx context.Context, body []byte, n int) bool {
	backoff := e.s.cfg.MinBackoff
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			e.retried.Add(1)
		}
		wait, err := e.post(ctx, body)
		switch {
		case err == nil:
			e.delivered.Add(uint64(n))
			return true
		case errors.Is(err, errRejected):
			e.rejected.Add(uint64(n))
			e.s.log.Error("webhook endpoint refused events for good", "url", e.url, "events", n, "err", err)
			return true
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
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
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
	req.Header.Set(client.WebhookTimestampHeader, strconv.FormatInt(ts, 10))
	req.Header.Set(client.WebhookSignatureHeader, client.WebhookSignature(e.s.cfg.Secret, ts, body))
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

// drain makes one attempt per batch to deliver what is queued, within
// DrainTimeout, and counts what is left as dropped.
func (e *endpoint) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), e.s.cfg.DrainTimeout)
	defer cancel()
	var batch []presence.Event
	var body []byte
	for ctx.Err() == nil {
		batch = e.take(batch[:0], e.s.cfg.MaxBatch)
		if len(batch) == 0 {
			return
		}
		body = encode(body[:0], batch)
		if _, err := e.post(ctx, body); err != nil {
			e.dropped.Add(uint64(len(batch)))
			continue
		}
		e.delivered.Add(uint64(len(batch)))
	}
	if n := e.waiting(); n > 0 {
		e.take(nil, n)
		e.dropped.Add(uint64(n))
		e.s.log.Warn("webhook events still queued at shutdown were dropped", "url", e.url, "events", n)
	}
}

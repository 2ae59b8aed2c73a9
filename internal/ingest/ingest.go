// Package ingest feeds presence from an existing connection layer: a
// gateway of some other system that already holds the users' sockets
// publishes session events (session_connected, heartbeat,
// session_disconnected) to NATS JetStream under presence.ingest., and every
// presenced node runs a Consumer that applies them through the tracker, as
// if the devices had sent heartbeats and byes over presenced's own
// WebSocket.
//
// Every node binds to one shared durable pull consumer, so each message is
// applied by one node, in the order of the stream per device, and
// acknowledged only once the tracker took it. Redelivery is harmless:
// stale beats are skipped, and Memory remembers each device's latest
// disconnect so that a connect redelivered after it does not bring the
// device back. Errors the event itself causes terminate it (Refused); any
// other is retried with a growing delay.
//
// Decode, Memory and Refused are shared with package kafka, which applies
// the same events from a Kafka topic. The message format, the guarantees
// and their limits are in docs/operations.md ("Feeding presence from an
// existing connection layer").
package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/loglimit"
	"github.com/presenced/presenced/internal/presence"
)

// Tracker is what the consumer needs of the tracker. *tracker.Tracker
// implements it. Implementations are safe for concurrent use.
type Tracker interface {
	Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error)
	Bye(ctx context.Context, user, device string) (presence.Change, error)
}

// Connector is a Tracker that tells a device's new session from its
// beats: a node that owns the devices of the ingest claims the device
// again at its connect, as at a socket's (another node may have held
// it meanwhile). The consumer calls Connect for session_connected when
// its Tracker implements it, Heartbeat otherwise.
type Connector interface {
	Connect(ctx context.Context, user, device string, active bool) (presence.Change, error)
}

// Config configures a Consumer. Zero values take the documented defaults.
// Every node of a deployment should use the same Stream, Subject, Durable,
// AckWait, MaxDeliver, MaxAge and DuplicateWindow: Open makes the server's
// stream and consumer match its Config.
type Config struct {
	// Conn is the node's shared NATS connection; the Consumer does not
	// close it. Nil: the Consumer dials URL itself and closes that
	// connection with Close.
	Conn       *jsstream.Conn
	URL        string        // nats://…, required without Conn
	Stream     string        // default "PRESENCE_INGEST"
	Subject    string        // default "presence.ingest"; the stream captures Subject+".>"
	Durable    string        // shared durable consumer name, default "presenced-ingest"
	Tracker    Tracker       // required
	Clock      clock.Clock   // default clock.Real{}
	TTL        time.Duration // the heartbeat ttl of the deployment, required (> 0)
	AckWait    time.Duration // default 10s
	MaxDeliver int           // default 10; then the message is given up and counted
	Batch      int           // messages fetched at once, default 256
	Logger     *slog.Logger  // default: discard; the caller names the component

	// MaxSkew is how far in the future of the node's clock an event's at
	// may be. Default 5s.
	MaxSkew time.Duration
	// MaxRemembered bounds the devices whose last disconnect a node
	// remembers. Default 100000.
	MaxRemembered int
	// RetryDelay is the delay of the first redelivery after a tracker
	// error; it doubles with every delivery up to RetryMaxDelay. Defaults
	// 500ms and 30s.
	RetryDelay    time.Duration
	RetryMaxDelay time.Duration
	// Workers is the number of goroutines that apply messages at once.
	// The events of one device always go to the same worker, in order.
	// Default 4.
	Workers int
	// ApplyTimeout bounds the tracker call of one message. Default AckWait/2.
	ApplyTimeout time.Duration
	// FetchWait is how long one pull request waits for messages. Default 5s.
	FetchWait time.Duration
	// MaxAge is how long the stream keeps a message nobody consumed.
	// Default 1h.
	MaxAge time.Duration
	// DuplicateWindow is how long the stream remembers Nats-Msg-Id headers
	// to drop duplicate publishes. Default 2m.
	DuplicateWindow time.Duration
}

// Stats counts what a Consumer did with the messages it received. Every
// message ends in exactly one of the counters but Retried (a message may be
// retried several times before it ends in another).
type Stats struct {
	Applied uint64 // applied through the tracker and acknowledged
	Stale   uint64 // heartbeat or connect older than now − TTL: acknowledged, skipped
	Ignored uint64 // duplicate or out of order: connect/heartbeat at or before a remembered disconnect, or a disconnect before a remembered reconnect
	Invalid uint64 // not a valid event: terminated
	Refused uint64 // the tracker refused it as a client error (too many devices): terminated
	Retried uint64 // negatively acknowledged for redelivery: after a tracker error, or handed back untried while the tracker is failing
	GivenUp uint64 // a tracker error on the last delivery (MaxDeliver): terminated
	// FetchErrors counts failed pulls (connection lost and the like).
	FetchErrors uint64
}

// Consumer applies the events of the ingest stream. Its methods are safe
// for concurrent use; Run runs once at a time.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	conn    *jsstream.Conn // nc and js are its
	ownConn bool           // dialled by Open: Close closes it
	nc      *nats.Conn
	js      jetstream.JetStream
	logs    loglimit.Limiter
	seed    maphash.Seed // picks a device's worker

	// retryAt is when to try the tracker again after an error (Unix ns,
	// wall clock); until then messages are handed back untried.
	retryAt atomic.Int64

	mu      sync.Mutex // guards the fields below
	cons    jetstream.Consumer
	runExit chan struct{} // non-nil while Run runs; closed when it returns
	closed  bool

	closing   context.Context // cancelled by Close
	close     context.CancelFunc
	closeOnce sync.Once

	applied, stale, ignored, invalid, refused atomic.Uint64
	retried, givenUp, fetchErrors             atomic.Uint64
}

// maxAckPending bounds the messages delivered and not yet acknowledged,
// over all nodes.
const maxAckPending = 10000

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("ingest: consumer closed")

// Open connects to NATS, creates the stream and the durable consumer (or
// updates them to cfg), and returns a Consumer that applies nothing until
// Run. Any number of nodes may Open at once.
func Open(ctx context.Context, cfg Config) (*Consumer, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	conn, own := cfg.Conn, false
	if conn == nil {
		var err error
		if conn, err = jsstream.Dial(cfg.URL, "presenced-ingest", cfg.Logger); err != nil {
			return nil, fmt.Errorf("ingest: %w", err)
		}
		own = true
	}
	c := &Consumer{
		cfg:     cfg,
		log:     cfg.Logger.With("stream", cfg.Stream, "consumer", cfg.Durable),
		conn:    conn,
		ownConn: own,
		nc:      conn.NC,
		js:      conn.JS,
		seed:    maphash.MakeSeed(),
	}
	c.closing, c.close = context.WithCancel(context.Background())
	if err := c.ensure(ctx); err != nil {
		if own {
			conn.Close()
		}
		return nil, err
	}
	return c, nil
}

// fill applies the defaults and validates cfg.
func (cfg *Config) fill() error {
	if cfg.URL == "" && cfg.Conn == nil {
		return errors.New("ingest: Config.Conn or Config.URL is required")
	}
	if cfg.Tracker == nil {
		return errors.New("ingest: Config.Tracker is required")
	}
	if cfg.TTL <= 0 {
		return errors.New("ingest: Config.TTL (the heartbeat ttl) is required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if cfg.Stream == "" {
		cfg.Stream = "PRESENCE_INGEST"
	}
	if cfg.Subject == "" {
		cfg.Subject = "presence.ingest"
	}
	if cfg.Durable == "" {
		cfg.Durable = "presenced-ingest"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	def(&cfg.AckWait, 10*time.Second)
	if cfg.MaxDeliver <= 0 {
		cfg.MaxDeliver = 10
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 256
	}
	cfg.Batch = min(cfg.Batch, maxAckPending)
	def(&cfg.MaxSkew, 5*time.Second)
	if cfg.MaxRemembered <= 0 {
		cfg.MaxRemembered = 100000
	}
	def(&cfg.RetryDelay, 500*time.Millisecond)
	def(&cfg.RetryMaxDelay, 30*time.Second)
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	def(&cfg.ApplyTimeout, cfg.AckWait/2)
	def(&cfg.FetchWait, 5*time.Second)
	def(&cfg.MaxAge, time.Hour)
	def(&cfg.DuplicateWindow, 2*time.Minute)
	if cfg.DuplicateWindow > cfg.MaxAge {
		cfg.DuplicateWindow = cfg.MaxAge
	}
	return nil
}

// ensure creates or updates the stream and the durable consumer. Nodes
// may race to do it (see package jsstream).
func (c *Consumer) ensure(ctx context.Context) error {
	scfg := jetstream.StreamConfig{
		Name:       c.cfg.Stream,
		Subjects:   []string{c.cfg.Subject + ".>"},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Discard:    jetstream.DiscardOld,
		MaxAge:     c.cfg.MaxAge,
		Duplicates: c.cfg.DuplicateWindow,
	}
	if err := jsstream.Ensure(ctx, c.js, scfg); err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, c.cfg.Stream, jetstream.ConsumerConfig{
		Durable:       c.cfg.Durable,
		Description:   "presenced: apply session events of the connection layer",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.cfg.AckWait,
		MaxDeliver:    c.cfg.MaxDeliver,
		FilterSubject: c.cfg.Subject + ".>",
		MaxAckPending: maxAckPending,
	})
	if err != nil {
		return fmt.Errorf("ingest: create or update consumer %s on %s: %w", c.cfg.Durable, c.cfg.Stream, err)
	}
	c.mu.Lock()
	c.cons = cons
	c.mu.Unlock()
	return nil
}

// Stats returns the counters so far.
func (c *Consumer) Stats() Stats {
	return Stats{
		Applied:     c.applied.Load(),
		Stale:       c.stale.Load(),
		Ignored:     c.ignored.Load(),
		Invalid:     c.invalid.Load(),
		Refused:     c.refused.Load(),
		Retried:     c.retried.Load(),
		GivenUp:     c.givenUp.Load(),
		FetchErrors: c.fetchErrors.Load(),
	}
}

// Close stops Run (waiting for it to return) and closes the NATS
// connection. It is idempotent.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		exit := c.runExit
		c.mu.Unlock()
		c.close()
		if exit != nil {
			<-exit
		}
		if c.ownConn {
			c.conn.Close()
		}
	})
	return nil
}

// Run fetches batches from the durable consumer and applies them until ctx
// is done (it then returns nil) or Close is called (ErrClosed). Connection
// losses and server restarts are waited out. Calling Run while another Run
// of the same Consumer is in progress is an error.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.runExit != nil {
		c.mu.Unlock()
		return errors.New("ingest: Run is already running")
	}
	exit := make(chan struct{})
	c.runExit = exit
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.runExit = nil
		c.mu.Unlock()
		close(exit)
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.closing, cancel)
	defer stop()

	workers := make([]chan job, c.cfg.Workers)
	var wg sync.WaitGroup
	for i := range workers {
		jobs := make(chan job, c.cfg.Batch)
		workers[i] = jobs
		mem := NewMemory(c.cfg.TTL+c.cfg.AckWait, max(c.cfg.MaxRemembered/c.cfg.Workers, 1))
		wg.Go(func() { c.work(ctx, jobs, mem) })
	}
	defer func() {
		for _, jobs := range workers {
			close(jobs)
		}
		wg.Wait()
	}()

	backoff := time.Duration(0)
	reconnects := c.nc.Stats().Reconnects
	for ctx.Err() == nil {
		if r := c.nc.Stats().Reconnects; r != reconnects {
			// A new server (or the same one restarted) may have lost the
			// stream or the consumer; a pull on a missing consumer just
			// expires, so make sure they exist.
			if err := c.ensure(ctx); err != nil {
				if ctx.Err() != nil {
					break
				}
				c.logs.Warn(c.log, "ensure", "cannot create stream or consumer after a reconnect", "err", err)
				backoff = min(max(2*backoff, 100*time.Millisecond), 2*time.Second)
				sleep(ctx, backoff)
				continue
			}
			reconnects = r
		}
		pause, err := c.fetchOnce(ctx, workers)
		if err == nil {
			backoff = 0
			sleep(ctx, pause)
			continue
		}
		if ctx.Err() != nil {
			break
		}
		c.fetchErrors.Add(1)
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrStreamNotFound) {
			c.logs.Warn(c.log, "fetch", "stream or consumer gone; creating them again", "err", err)
			if err := c.ensure(ctx); err != nil {
				c.logs.Warn(c.log, "ensure", "cannot create stream or consumer", "err", err)
			}
		} else {
			c.logs.Warn(c.log, "fetch", "fetch failed; retrying", "err", err)
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 2*time.Second)
		sleep(ctx, max(backoff, pause))
	}
	if c.closing.Err() != nil {
		return ErrClosed
	}
	return nil
}

// job is one valid message for a worker.
type job struct {
	msg jetstream.Msg
	ev  Event
}

// fetchOnce pulls one batch and hands its messages to the workers (the
// events of one device to the same worker). It returns the error of the
// pull, if any (a pull that expired without messages is not an error), and
// how long to pause before the next pull.
//
// After a tracker error, the messages that follow are not tried until the
// failed one's redelivery delay has passed: they are handed back with the
// rest of that delay, and the consumer pauses before its next pull, so
// that a store that is down is not hammered and a batch does not wait out
// its AckWait behind failing calls.
func (c *Consumer) fetchOnce(ctx context.Context, workers []chan job) (time.Duration, error) {
	c.mu.Lock()
	cons := c.cons
	c.mu.Unlock()
	fctx, cancel := context.WithTimeout(ctx, c.cfg.FetchWait)
	defer cancel()
	batch, err := cons.Fetch(c.cfg.Batch, jetstream.FetchContext(fctx))
	if err != nil {
		return 0, err
	}
	for msg := range batch.Messages() {
		if ctx.Err() != nil {
			// Stopping: hand the rest to another node at once.
			_ = msg.Nak()
			continue
		}
		ev, err := Decode(msg.Data(), c.cfg.Clock.Now(), c.cfg.MaxSkew)
		if err != nil {
			c.invalid.Add(1)
			c.logs.Warn(c.log, "invalid", "invalid event terminated", "subject", msg.Subject(), "err", err)
			_ = msg.Term()
			continue
		}
		if wait := c.retryWait(); wait > 0 && c.deferMsg(msg, wait) {
			continue
		}
		i := maphash.Comparable(c.seed, devKey{ev.User, ev.Device}) % uint64(len(workers))
		workers[i] <- job{msg, ev} // the workers drain their queues until Run ends
	}
	err = batch.Error()
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = nil // the pull expired on our side
	}
	return c.retryWait(), err
}

// retryWait is how long until the tracker may be tried again after an
// error; 0 if it may now.
func (c *Consumer) retryWait() time.Duration {
	return max(time.Until(time.Unix(0, c.retryAt.Load())), 0)
}

// work applies the jobs of one worker until its queue is closed. mem is
// the worker's own memory of disconnects.
func (c *Consumer) work(ctx context.Context, jobs <-chan job, mem *Memory) {
	for j := range jobs {
		if ctx.Err() != nil {
			_ = j.msg.Nak() // stopping: hand it to another node at once
			continue
		}
		if wait := c.retryWait(); wait > 0 && c.deferMsg(j.msg, wait) {
			continue
		}
		if d := c.apply(ctx, mem, j.msg, j.ev); d > 0 {
			c.retryAt.Store(time.Now().Add(d).UnixNano())
		}
	}
}

// deferMsg hands msg back untried, to be redelivered after delay, unless
// this is its last delivery (then it is tried). It reports whether it did.
func (c *Consumer) deferMsg(msg jetstream.Msg, delay time.Duration) bool {
	if md, err := msg.Metadata(); err != nil || md.NumDelivered >= uint64(c.cfg.MaxDeliver) {
		return false
	}
	c.retried.Add(1)
	_ = msg.NakWithDelay(delay)
	return true
}

// apply applies one valid event and acknowledges, terminates or
// negatively acknowledges its message. After a tracker error that will be
// retried, it returns the delay of the redelivery; otherwise 0.
func (c *Consumer) apply(ctx context.Context, mem *Memory, msg jetstream.Msg, ev Event) time.Duration {
	now := c.cfg.Clock.Now()
	var err error
	key := devKey{ev.User, ev.Device}
	switch {
	case !ev.Bye:
		if ev.At.Before(now.Add(-c.cfg.TTL)) {
			c.stale.Add(1)
			_ = msg.Ack()
			return 0
		}
		if !mem.beatAllowed(key, ev.At, now) {
			c.ignored.Add(1)
			_ = msg.Ack()
			return 0
		}
	default:
		if !mem.byeAllowed(key, ev.At, now) {
			c.ignored.Add(1)
			_ = msg.Ack()
			return 0
		}
	}

	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ApplyTimeout)
	if ev.Bye {
		_, err = c.cfg.Tracker.Bye(actx, ev.User, ev.Device)
	} else {
		if cn, ok := c.cfg.Tracker.(Connector); ok && ev.Connect {
			_, err = cn.Connect(actx, ev.User, ev.Device, ev.Active)
		} else {
			_, err = c.cfg.Tracker.Heartbeat(actx, ev.User, ev.Device, ev.Active)
		}
	}
	cancel()

	switch {
	case err == nil:
		if ev.Bye {
			mem.recordBye(key, ev.At, now)
		}
		c.applied.Add(1)
		_ = msg.Ack()
	case Refused(err):
		c.refused.Add(1)
		c.logs.Warn(c.log, "refused", "event refused by the tracker; terminated", "user", ev.User, "device", ev.Device, "err", err)
		_ = msg.Term()
	default:
		delivered := uint64(1)
		if md, merr := msg.Metadata(); merr == nil {
			delivered = md.NumDelivered
		}
		if delivered >= uint64(c.cfg.MaxDeliver) {
			c.givenUp.Add(1)
			c.logs.Warn(c.log, "givenup", "event failed on its last delivery; given up", "user", ev.User, "device", ev.Device, "deliveries", delivered, "err", err)
			_ = msg.Term()
			return 0
		}
		c.retried.Add(1)
		c.logs.Warn(c.log, "retry", "tracker error; event will be redelivered", "user", ev.User, "device", ev.Device, "deliveries", delivered, "err", err)
		d := c.retryDelay(delivered)
		_ = msg.NakWithDelay(d)
		return d
	}
	return 0
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// retryDelay is the redelivery delay after the n-th delivery failed.
func (c *Consumer) retryDelay(n uint64) time.Duration {
	d := c.cfg.RetryDelay
	for i := uint64(1); i < n && d < c.cfg.RetryMaxDelay; i++ {
		d *= 2
	}
	return min(d, c.cfg.RetryMaxDelay)
}

// Refused reports whether a tracker error is about the event itself (too
// many devices, …), so that retrying cannot help.
func Refused(err error) bool {
	return errors.Is(err, presence.ErrTooManyDevices) ||
		errors.Is(err, presence.ErrTooManyContacts) ||
		errors.Is(err, presence.ErrUnknownStatus)
}

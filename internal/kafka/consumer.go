package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/loglimit"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

var (
	_ ingest.Tracker = (*tracker.Tracker)(nil) // what NewConsumer is given
	_ Owner          = (*tracker.Tracker)(nil)
)

// Owner is a tracker that owns the devices whose events reach this node
// through the partitions it consumes, as it owns its sockets' devices:
// with a Redis store their common beat costs Redis nothing, and when a
// partition moves to another node the node hands its devices back to
// the store's rules with their real last beats (HandOffSources), for the
// partition's next consumer to claim as their beats arrive there.
// *tracker.Tracker implements it. A partition p is source p+1.
type Owner interface {
	SourceBeat(ctx context.Context, src uint32, user, device string, active, connect bool) (presence.Change, error)
	HandOffSources(ctx context.Context, srcs ...uint32) error
}

// source is the tracker's source of partition p's devices.
func source(p int32) uint32 { return uint32(p) + 1 }

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("kafka: consumer closed")

// errNotInGroup is a commit that found the client between group sessions.
var errNotInGroup = errors.New("not in the consumer group")

// ConsumerConfig configures a Consumer. Zero values take the documented
// defaults. Every node of a deployment uses the same Topic and Group.
type ConsumerConfig struct {
	Brokers  []string       // host:port of one or more brokers, required
	Topic    string         // default DefaultIngestTopic ("presence.updates")
	Group    string         // consumer group, default DefaultGroup ("presenced")
	ClientID string         // default "presenced"
	Tracker  ingest.Tracker // required
	// Owner, if set, takes the heartbeats instead of Tracker (byes still
	// go to Tracker): the node owns the devices of the partitions it
	// consumes, and hands them off when a partition is revoked or lost.
	Owner  Owner
	TTL    time.Duration // the heartbeat ttl of the deployment, required (> 0)
	Clock  clock.Clock   // default clock.Real{}
	Logger *slog.Logger  // default: discard

	// MaxSkew is how far in the future of the node's clock an event's at
	// may be (default 5s); MaxRemembered bounds the devices whose last
	// disconnect the node remembers (default 100,000). As in package
	// ingest.
	MaxSkew       time.Duration
	MaxRemembered int
	// Batch bounds the records one poll returns (default 1,000).
	Batch int
	// Workers is how many tracker calls run at once (default 8). A
	// user's events are applied in order by one worker.
	Workers int
	// ApplyTimeout bounds one tracker call (default 5s).
	ApplyTimeout time.Duration
	// MaxAttempts is how many times a tracker error is tried before the
	// event is given up and counted (default 10). RetryDelay is the wait
	// after the first failure (default 500ms), doubled after each, at most
	// RetryMaxDelay (default 30s); meanwhile nothing is applied and the
	// partitions with events waiting are paused.
	MaxAttempts   int
	RetryDelay    time.Duration
	RetryMaxDelay time.Duration
	// MaxHold bounds the time one poll's records hold a rebalance back
	// (default 10s): what is not applied by then waits for the next poll,
	// uncommitted.
	MaxHold time.Duration
	// CatchUpWait bounds the wait for the records up to a newly assigned
	// partition's end, to apply them as one window (default 5s).
	CatchUpWait time.Duration
	// MaxWindow bounds the devices of one window (default 65,536).
	MaxWindow int
	// CommitTimeout bounds an offset commit and leaving the group
	// (default 5s).
	CommitTimeout time.Duration
	// SessionTimeout is how long the group waits for a silent member
	// before its partitions move (default 10s; the brokers allow 6s to
	// 30m by default). A node that dies leaves its users' events waiting
	// that long: keep it well below the heartbeat ttl, or their devices
	// expire meanwhile. The member heartbeats every quarter of it.
	SessionTimeout time.Duration
	// ClientOptions are more franz-go options (TLS, SASL, a dialer,
	// session timeouts, …), applied after the Consumer's own.
	ClientOptions []kgo.Opt
}

// ConsumerStats counts what a Consumer did. Every record polled ends in
// one of Applied (with the records Coalesced into it), Stale, Ignored,
// Invalid, Refused or GivenUp — or is left to the next owner of its
// partition when it moves before it was applied.
type ConsumerStats struct {
	Consumed  uint64 // records polled
	Applied   uint64 // tracker calls that succeeded: one per device and window
	Coalesced uint64 // records superseded by a later event of their device in the same window
	Stale     uint64 // beats older than the ttl: skipped
	Ignored   uint64 // beats at or before a remembered disconnect, disconnects before a remembered reconnect: skipped
	Invalid   uint64 // not a valid event: skipped
	Refused   uint64 // refused by the tracker as the event's own fault (too many devices): skipped
	GivenUp   uint64 // failed MaxAttempts times: skipped
	Retried   uint64 // tracker calls that failed and will be tried again

	Commits      uint64 // offset commits that succeeded
	CommitErrors uint64 // offset commits that failed (tried again with the next poll)
	FetchErrors  uint64 // fetches that failed (the client retries)

	// HandOffs counts partitions whose devices were handed off as they
	// left this node (Owner); HandOffErrors those whose hand-off did not
	// finish within CommitTimeout (the rest follows when the store answers).
	HandOffs      uint64
	HandOffErrors uint64

	// Lag is, per partition this node owns, the records not applied yet:
	// the partition's end, as of the last fetch, less the first record
	// not applied. A partition with nothing fetched since it was assigned
	// is missing.
	Lag map[int32]int64
	// Partitions is the number of partitions this node owns.
	Partitions int
}

// Consumer applies the session events of a Kafka topic as a member of a
// consumer group. Its methods are safe for concurrent use; Run runs once.
type Consumer struct {
	cfg  ConsumerConfig
	cl   *kgo.Client
	log  *slog.Logger
	logs loglimit.Limiter

	// Used by Run's goroutine only.
	mem *ingest.Memory
	seq uint64

	hurry   atomic.Bool  // a rebalance waits for this poll's work
	failing atomic.Bool  // a tracker call failed in this poll's work: apply nothing more
	delay   atomic.Int64 // the longest retry delay of this poll's failures

	// mu guards the fields below. Run holds it for a poll's work, the
	// rebalance callbacks for theirs; franz-go never runs a callback
	// during a poll's work (BlockRebalanceOnPoll).
	mu      sync.Mutex
	parts   map[int32]*partition
	retryAt time.Time // no window is applied before: the tracker failed
	started bool
	runExit chan struct{} // closed when Run returns
	closed  bool

	statsMu sync.Mutex // guards lag
	lag     map[int32]int64

	consumed, applied, coalesced, stale, ignored, invalid atomic.Uint64
	refused, givenUp, retried                             atomic.Uint64
	commits, commitErrors, fetchErrors                    atomic.Uint64
	handOffs, handOffErrors                               atomic.Uint64

	closing   context.Context // cancelled by Close
	close     context.CancelFunc
	closeOnce sync.Once
}

// partition is what the consumer holds of one partition it owns.
type partition struct {
	id     int32
	win    *window // records polled and not applied yet
	target int64   // catching up to this offset (the end at assignment); -1: not known yet; 0: caught up
	hwm    int64   // the partition's end, as of the last fetch
	pos    int64   // offset of the first record not applied; -1: unknown
	commit kgo.EpochOffset
	// committed is the offset this node last committed (-1: none).
	committed int64
	paused    bool
}

// NewConsumer returns a Consumer for cfg. The client joins the group and
// starts fetching at once; Run applies what it fetches.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	c := &Consumer{
		cfg:   cfg,
		log:   cfg.Logger,
		mem:   ingest.NewMemory(2*cfg.TTL+cfg.MaxSkew, cfg.MaxRemembered),
		parts: make(map[int32]*partition),
		lag:   make(map[int32]int64),
	}
	c.closing, c.close = context.WithCancel(context.Background())
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.HeartbeatInterval(cfg.SessionTimeout / 4),
		// Partitions that stay with a node are not revoked when another
		// node joins or leaves.
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		// Offsets are committed by Run once what they cover is applied,
		// and before a revoked partition moves.
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { c.hurry.Store(true) }),
		// Events of an aborted transaction never happened.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.WithLogger(kgoLogger{cfg.Logger, &c.logs}),
	}
	opts = append(append(opts, recoveryOpts()...), cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: ingest consumer: %w", err)
	}
	c.cl = cl
	return c, nil
}

// fill applies the defaults and validates cfg.
func (cfg *ConsumerConfig) fill() error {
	if len(cfg.Brokers) == 0 {
		return errors.New("kafka: no broker for the ingest consumer")
	}
	if cfg.Tracker == nil {
		return errors.New("kafka: ConsumerConfig.Tracker is required")
	}
	if cfg.TTL <= 0 {
		return errors.New("kafka: ConsumerConfig.TTL (the heartbeat ttl) is required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n <= 0 {
			*n = v
		}
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultIngestTopic
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "presenced"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	def(&cfg.MaxSkew, 5*time.Second)
	defInt(&cfg.MaxRemembered, 100000)
	defInt(&cfg.Batch, 1000)
	defInt(&cfg.Workers, 8)
	def(&cfg.ApplyTimeout, 5*time.Second)
	defInt(&cfg.MaxAttempts, 10)
	def(&cfg.RetryDelay, 500*time.Millisecond)
	def(&cfg.RetryMaxDelay, 30*time.Second)
	def(&cfg.MaxHold, 10*time.Second)
	def(&cfg.CatchUpWait, 5*time.Second)
	defInt(&cfg.MaxWindow, 65536)
	def(&cfg.CommitTimeout, 5*time.Second)
	def(&cfg.SessionTimeout, 10*time.Second)
	return nil
}

// Stats returns the counters so far.
func (c *Consumer) Stats() ConsumerStats {
	s := ConsumerStats{
		Consumed:     c.consumed.Load(),
		Applied:      c.applied.Load(),
		Coalesced:    c.coalesced.Load(),
		Stale:        c.stale.Load(),
		Ignored:      c.ignored.Load(),
		Invalid:      c.invalid.Load(),
		Refused:      c.refused.Load(),
		GivenUp:      c.givenUp.Load(),
		Retried:      c.retried.Load(),
		Commits:      c.commits.Load(),
		CommitErrors: c.commitErrors.Load(),
		FetchErrors:  c.fetchErrors.Load(),

		HandOffs:      c.handOffs.Load(),
		HandOffErrors: c.handOffErrors.Load(),
	}
	c.statsMu.Lock()
	s.Partitions = len(c.lag)
	s.Lag = make(map[int32]int64, len(c.lag))
	for p, n := range c.lag {
		if n >= 0 {
			s.Lag[p] = n
		}
	}
	c.statsMu.Unlock()
	return s
}

// Topic is the topic consumed.
func (c *Consumer) Topic() string { return c.cfg.Topic }

// Ping reports whether a broker answers.
func (c *Consumer) Ping(ctx context.Context) error { return c.cl.Ping(ctx) }

// Run polls and applies until ctx is done (it then returns nil) or Close
// is called (ErrClosed); then it commits what was applied and leaves the
// group, so its partitions move to the other nodes at once. Broker outages
// are waited out. Run may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.started {
		c.mu.Unlock()
		return errors.New("kafka: Run was already called")
	}
	c.started = true
	exit := make(chan struct{})
	c.runExit = exit
	c.mu.Unlock()
	defer close(exit)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.closing, cancel)
	defer stop()

	for ctx.Err() == nil {
		c.hurry.Store(false) // a rebalance that waits from now on waits for this poll
		pctx, pcancel := context.WithTimeout(ctx, c.pollWait())
		fetches := c.cl.PollRecords(pctx, c.cfg.Batch)
		pcancel()
		if fetches.IsClientClosed() {
			c.cl.AllowRebalance()
			break
		}
		c.poll(ctx, fetches)
		c.cl.AllowRebalance()
	}
	c.finish()
	if c.closing.Err() != nil {
		return ErrClosed
	}
	return nil
}

// pollWait is how long the next poll may wait for records: until a window
// held back is due, at most a second (so that failed commits are retried).
func (c *Consumer) pollWait() time.Duration {
	const least = 10 * time.Millisecond
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	d := time.Second
	for _, st := range c.parts {
		if st.win == nil {
			continue
		}
		var due time.Time
		switch {
		case st.target > 0:
			due = st.win.opened.Add(c.cfg.CatchUpWait)
		case now.Before(c.retryAt):
			due = c.retryAt
		default:
			return least // deferred by MaxHold or a rebalance: go on
		}
		d = min(d, due.Sub(now))
	}
	return max(d, least)
}

// poll folds the records of one poll into their partitions' windows,
// applies the windows that are due, and commits what was applied.
func (c *Consumer) poll(ctx context.Context, fetches kgo.Fetches) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fetches.EachError(func(topic string, p int32, err error) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return // the poll's own wait ended
		}
		c.fetchErrors.Add(1)
		c.logs.Warn(c.log, "fetch", "kafka fetch failed; the client retries", "topic", topic, "partition", p, "err", err)
	})
	now := c.cfg.Clock.Now()
	opened := time.Now()
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if fp.Topic != c.cfg.Topic || len(fp.Records) == 0 {
			return
		}
		st := c.part(fp.Partition)
		if st.target < 0 {
			// The first records since the assignment: everything up to
			// the end now may have been applied by the previous owner.
			st.target = fp.HighWatermark
			if fp.LastStableOffset >= 0 && fp.LastStableOffset < st.target {
				st.target = fp.LastStableOffset
			}
		}
		st.hwm = fp.HighWatermark
		for _, r := range fp.Records {
			c.fold(st, r, now, opened)
		}
	})
	c.work(ctx)
	c.commitApplied(ctx)
	c.updateLag()
}

// part returns the state of partition id, creating it (as newly assigned)
// if needed.
func (c *Consumer) part(id int32) *partition {
	st := c.parts[id]
	if st == nil {
		st = &partition{id: id, target: -1, pos: -1, committed: -1, commit: kgo.EpochOffset{Epoch: -1, Offset: -1}}
		c.parts[id] = st
	}
	return st
}

// fold adds one record to its partition's window.
func (c *Consumer) fold(st *partition, r *kgo.Record, now, opened time.Time) {
	c.consumed.Add(1)
	if st.win == nil {
		st.win = newWindow(r.Offset, opened, st.target != 0)
		if st.pos < 0 {
			st.pos = r.Offset
		}
	}
	w := st.win
	w.next, w.epoch = r.Offset+1, r.LeaderEpoch
	ev, err := ingest.Decode(r.Value, now, c.cfg.MaxSkew)
	if err != nil {
		c.invalid.Add(1)
		c.logs.Warn(c.log, "invalid", "invalid session event skipped", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
		return
	}
	if len(r.Key) > 0 && string(r.Key) != ev.User {
		c.logs.Warn(c.log, "key", "session event not keyed by its user_id: that user's events may be applied out of order",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "user_id", ev.User)
	}
	c.seq++
	switch w.fold(ev, c.seq, now, c.cfg.TTL, c.mem) {
	case coalesced:
		c.coalesced.Add(1)
	case stale:
		c.stale.Add(1)
	case ignored:
		c.ignored.Add(1)
	}
}

// job is the actions of one user in one window, applied in order.
type job []action

// work applies the windows that are due: every action not done, each
// user's in order, users in parallel, until they are done, one fails, MaxHold has
// passed, a rebalance waits or ctx is done. Windows left with ops not done
// stay; after a failure they and every window waiting are paused until
// the retry is due.
func (c *Consumer) work(ctx context.Context) {
	now := time.Now()
	var run []*partition
	for _, st := range c.parts {
		w := st.win
		if w == nil {
			continue
		}
		if st.target > 0 {
			if w.next < st.target && now.Sub(w.opened) < c.cfg.CatchUpWait && len(w.ops) < c.cfg.MaxWindow {
				continue // catching up: the rest of what the previous owner may have applied comes first
			}
			st.target = 0
		}
		if now.Before(c.retryAt) {
			c.pause(st)
			continue
		}
		run = append(run, st)
	}
	if len(run) == 0 {
		return
	}

	var jobs []job
	for _, st := range run {
		users := make(map[string]int)
		for _, a := range st.win.actions() {
			a.part = st.id
			i, ok := users[a.op.user]
			if !ok {
				i = len(jobs)
				users[a.op.user] = i
				jobs = append(jobs, nil)
			}
			jobs[i] = append(jobs[i], a)
		}
	}
	c.failing.Store(false)
	c.delay.Store(0)
	deadline := now.Add(c.cfg.MaxHold)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(c.cfg.Workers, len(jobs)) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(jobs); i = int(next.Add(1)) - 1 {
				for _, a := range jobs[i] {
					if ctx.Err() != nil || c.failing.Load() || c.hurry.Load() || time.Now().After(deadline) {
						break
					}
					if !c.apply(ctx, a) {
						break // the user's later events wait for this one
					}
				}
			}
		})
	}
	wg.Wait()

	failed := c.failing.Load()
	if failed {
		c.retryAt = time.Now().Add(time.Duration(c.delay.Load()))
	}
	for _, st := range run {
		w := st.win
		if w.prune() > 0 {
			if failed {
				c.pause(st) // nothing more of it until the retry
			}
			continue
		}
		st.commit = kgo.EpochOffset{Epoch: w.epoch, Offset: w.next}
		st.pos = w.next
		st.win = nil
		c.resume(st)
	}
}

// apply makes one tracker call of an op. It reports false when the call
// failed and will be tried again.
func (c *Consumer) apply(ctx context.Context, a action) bool {
	o := a.op
	if o.done {
		return true // refused or given up at its beat
	}
	if !a.bye && o.beatAt.Before(c.cfg.Clock.Now().Add(-c.cfg.TTL)) {
		// Went stale while it waited: the device would be dead by now.
		o.beatDone = true
		if !o.bye {
			o.done = true
			c.stale.Add(1)
		}
		return true
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ApplyTimeout)
	var err error
	switch {
	case a.bye:
		_, err = c.cfg.Tracker.Bye(actx, o.user, o.device)
	case c.cfg.Owner != nil:
		_, err = c.cfg.Owner.SourceBeat(actx, source(a.part), o.user, o.device, o.active, o.connect)
	default:
		_, err = c.cfg.Tracker.Heartbeat(actx, o.user, o.device, o.active)
	}
	cancel()
	switch {
	case err == nil:
		if a.bye {
			o.byeDone = true
		} else {
			o.beatDone = true
		}
		if (!o.beat || o.beatDone) && (!o.bye || o.byeDone) {
			o.done = true
			c.applied.Add(1)
		}
		return true
	case ingest.Refused(err):
		o.done = true
		c.refused.Add(1)
		c.logs.Warn(c.log, "refused", "session event refused by the tracker; skipped", "user_id", o.user, "device_id", o.device, "err", err)
		return true
	}
	o.failures++
	if o.failures >= c.cfg.MaxAttempts {
		o.done = true
		c.givenUp.Add(1)
		c.logs.Warn(c.log, "givenup", "session event failed its last attempt; given up", "user_id", o.user, "device_id", o.device, "attempts", o.failures, "err", err)
		return true
	}
	c.retried.Add(1)
	c.failing.Store(true)
	d := int64(c.retryDelay(o.failures))
	for cur := c.delay.Load(); d > cur && !c.delay.CompareAndSwap(cur, d); cur = c.delay.Load() {
	}
	c.logs.Warn(c.log, "retry", "tracker error; session event will be tried again", "user_id", o.user, "device_id", o.device, "attempts", o.failures, "err", err)
	return false
}

// retryDelay is the wait after the n-th failure of an event.
func (c *Consumer) retryDelay(n int) time.Duration {
	d := c.cfg.RetryDelay
	for i := 1; i < n && d < c.cfg.RetryMaxDelay; i++ {
		d *= 2
	}
	return min(d, c.cfg.RetryMaxDelay)
}

func (c *Consumer) pause(st *partition) {
	if !st.paused {
		c.cl.PauseFetchPartitions(map[string][]int32{c.cfg.Topic: {st.id}})
		st.paused = true
	}
}

func (c *Consumer) resume(st *partition) {
	if st.paused {
		c.cl.ResumeFetchPartitions(map[string][]int32{c.cfg.Topic: {st.id}})
		st.paused = false
	}
}

// commitApplied commits the offsets applied and not committed yet.
func (c *Consumer) commitApplied(ctx context.Context) {
	offs := make(map[int32]kgo.EpochOffset)
	for id, st := range c.parts {
		if st.commit.Offset > st.committed {
			offs[id] = st.commit
		}
	}
	c.commit(ctx, offs)
}

// commit commits offs synchronously, within CommitTimeout, and records
// which partitions it committed. What failed is tried again after the
// next poll.
func (c *Consumer) commit(ctx context.Context, offs map[int32]kgo.EpochOffset) {
	if len(offs) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	var failed error
	ok := make(map[int32]bool, len(offs))
	c.cl.CommitOffsetsSync(cctx, map[string]map[int32]kgo.EpochOffset{c.cfg.Topic: offs},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			switch {
			case err != nil:
				failed = err
				return
			case resp == nil:
				failed = errNotInGroup
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						failed = err
						continue
					}
					ok[p.Partition] = true
				}
			}
		})
	for id, off := range offs {
		if st := c.parts[id]; st != nil && ok[id] && off.Offset > st.committed {
			st.committed = off.Offset
		}
	}
	if len(ok) > 0 {
		c.commits.Add(1)
	}
	if failed != nil {
		c.commitErrors.Add(1)
		c.logs.Warn(c.log, "commit", "kafka offset commit failed; tried again later (the events are applied)", "topic", c.cfg.Topic, "err", failed)
	}
}

// assigned starts the partitions given to this node: each catches up
// first (see the package doc).
func (c *Consumer) assigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range m[c.cfg.Topic] {
		delete(c.parts, id) // a stale state of an earlier assignment
		c.part(id)
	}
	if ids := m[c.cfg.Topic]; len(ids) > 0 {
		c.log.Info("kafka partitions assigned", "topic", c.cfg.Topic, "partitions", ids)
	}
	c.updateLag()
}

// revoked commits what was applied of the partitions taken away and
// forgets them; what was not applied is left to their next owner.
func (c *Consumer) revoked(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := m[c.cfg.Topic]
	offs := make(map[int32]kgo.EpochOffset)
	for _, id := range ids {
		if st := c.parts[id]; st != nil && st.commit.Offset > st.committed {
			offs[id] = st.commit
		}
	}
	c.commit(ctx, offs)
	if len(ids) > 0 {
		c.log.Info("kafka partitions revoked", "topic", c.cfg.Topic, "partitions", ids)
	}
	c.handOff(ctx, ids)
	c.forget(ids)
}

// handOff gives the devices of partitions ids back to the store's rules
// (Owner), within CommitTimeout: their next owner claims each as its
// events arrive there. What the store does not take in time is handed
// off when it answers (a device the next owner claimed first stays its).
func (c *Consumer) handOff(ctx context.Context, ids []int32) {
	if c.cfg.Owner == nil || len(ids) == 0 {
		return
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	srcs := make([]uint32, len(ids))
	for i, id := range ids {
		srcs[i] = source(id)
	}
	if err := c.cfg.Owner.HandOffSources(hctx, srcs...); err != nil {
		c.handOffErrors.Add(uint64(len(ids)))
		c.log.Warn("handing off the devices of kafka partitions did not finish; the rest is handed off when the state store answers",
			"topic", c.cfg.Topic, "partitions", ids, "err", err)
		return
	}
	c.handOffs.Add(uint64(len(ids)))
}

// lost forgets the partitions this node lost without a chance to commit
// (its session expired): their next owner reads them from the last commit.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ids := m[c.cfg.Topic]; len(ids) > 0 {
		c.log.Warn("kafka partitions lost (the session expired): their next owner reads them from the last commit", "topic", c.cfg.Topic, "partitions", ids)
	}
	c.handOff(context.Background(), m[c.cfg.Topic])
	c.forget(m[c.cfg.Topic])
}

func (c *Consumer) forget(ids []int32) {
	if len(ids) == 0 {
		return
	}
	for _, id := range ids {
		delete(c.parts, id)
	}
	// Paused partitions stay paused across assignments: resume them, so
	// that the partition is fetched if it comes back.
	c.cl.ResumeFetchPartitions(map[string][]int32{c.cfg.Topic: ids})
	c.updateLag()
}

// updateLag publishes the lag of every partition owned, for Stats.
func (c *Consumer) updateLag() {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	clear(c.lag)
	for id, st := range c.parts {
		n := int64(-1)
		if st.pos >= 0 {
			n = max(st.hwm-st.pos, 0)
		}
		c.lag[id] = n
	}
}

// finish commits what was applied and leaves the group. Run calls it as
// it returns.
func (c *Consumer) finish() {
	c.mu.Lock()
	c.commitApplied(context.Background())
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CommitTimeout)
	defer cancel()
	if err := c.cl.LeaveGroupContext(ctx); err != nil {
		c.log.Warn("leaving the kafka consumer group did not finish; its partitions move after the session timeout", "group", c.cfg.Group, "err", err)
	}
}

// Close stops Run (waiting for it to return), leaves the group and closes
// the client. It is idempotent.
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
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CommitTimeout)
		_ = c.cl.LeaveGroupContext(ctx) // done by Run already, unless it never ran
		cancel()
		c.cl.Close()
	})
	return nil
}

package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/jsstream"
)

// StreamConfig is where a Sender reads the changes with NATS.
type StreamConfig struct {
	Conn *jsstream.Conn // required: the node's NATS connection
	// Stream is the stream of every change (natsbus's, PRESENCE_CHANGES);
	// required.
	Stream string
	// Confirmer says when the changes this node published are in Stream
	// (natsbus.Bus); required.
	Confirmer Confirmer
	// NodeID names the node in its leases (default: random).
	NodeID string
	// AckWait is how long a batch fetched by a node is its own before it
	// is delivered again, unless the node says it is still at it (every
	// AckWait/3 while it retries). Default 3s. A node that takes an
	// endpoint over from one that died with a batch in hand waits until
	// this long after that batch was delivered before its first fetch,
	// so that the batch goes first.
	AckWait time.Duration
	// LeaseTTL is how long an endpoint's lease lives unless renewed (every
	// LeaseTTL/3): a node that dies hands its endpoints over after it.
	// Default 3s.
	LeaseTTL time.Duration
	// LeaseStream and LeaseSubject name the stream of the leases (default
	// "PRESENCE_WEBHOOK_LEASES", "presence.webhook-leases"); the lease of
	// an endpoint is the one message of LeaseSubject.<key>.
	LeaseStream, LeaseSubject string
}

// Defaults of StreamConfig.
const (
	DefaultLeaseStream  = "PRESENCE_WEBHOOK_LEASES"
	DefaultLeaseSubject = "presence.webhook-leases"
	// ConsumerPrefix starts the name of each endpoint's durable consumer
	// of the change stream, followed by the endpoint's key (16 hex digits
	// of the SHA-256 of its URL).
	ConsumerPrefix = "presenced-webhook-"
)

// Tuning of the stream side that is not configurable.
const (
	fetchWait    = time.Second     // a pull that waits for the first change
	setupTimeout = 5 * time.Second // stream and consumer set-up, a lease's publish
)

// stream is the Sender's side of the JetStream change stream.
type stream struct {
	s    *Sender
	cfg  StreamConfig
	js   jetstream.JetStream
	node string
}

func openStream(ctx context.Context, s *Sender) (*stream, error) {
	cfg := *s.cfg.Stream
	if cfg.Conn == nil || cfg.Stream == "" || cfg.Confirmer == nil {
		return nil, errors.New("webhook: StreamConfig needs Conn, Stream and Confirmer")
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 3 * time.Second
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 3 * time.Second
	}
	if cfg.LeaseStream == "" {
		cfg.LeaseStream = DefaultLeaseStream
	}
	if cfg.LeaseSubject == "" {
		cfg.LeaseSubject = DefaultLeaseSubject
	}
	if cfg.NodeID == "" {
		cfg.NodeID = nats.NewInbox()[len(nats.InboxPrefix):]
	}
	st := &stream{s: s, cfg: cfg, js: cfg.Conn.JS, node: cfg.NodeID}
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := st.ensureLeases(ctx); err != nil {
		return nil, err
	}
	// Every node creates the consumers at start, before its tracker
	// publishes anything: no change made from now on is missed.
	for _, e := range s.endpoints {
		if _, err := st.consumer(ctx, e, true); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// ensureLeases creates the stream of the leases: one message a subject,
// gone LeaseTTL after it was published. Nodes may race to do it.
func (st *stream) ensureLeases(ctx context.Context) error {
	err := jsstream.Ensure(ctx, st.js, jetstream.StreamConfig{
		Name:              st.cfg.LeaseStream,
		Description:       "presenced: which node delivers each webhook endpoint's changes (see package webhook)",
		Subjects:          []string{st.cfg.LeaseSubject + ".>"},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		Storage:           jetstream.MemoryStorage,
		MaxMsgsPerSubject: 1,
		MaxAge:            st.cfg.LeaseTTL,
		Duplicates:        st.cfg.LeaseTTL,
		Replicas:          1,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		MaxConsumers:      -1,
	})
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	return nil
}

// consumer binds e's durable consumer of the change stream, creating it
// if it is missing. At start (fresh) a missing consumer is a new
// endpoint's: it is sent the changes from now on. Later a missing
// consumer was lost, and what it had not delivered is not known to the
// server any more, only to this node (endpoint.born, endpoint.acked):
//
//   - with the stream itself — NATS lost its store, or the stream was
//     deleted, and it was created again (another creation time than the
//     stream the consumer was last seen on, or fewer messages than it had
//     acknowledged): nothing of the new stream was delivered, so the new
//     consumer delivers everything it holds;
//   - alone (an operator deleted it): from the first change it had not
//     acknowledged when this node last saw it. Another node may have
//     delivered more since: that is sent again, never skipped.
//
// Acknowledged by stream sequence, not by time: a consumer behind (an
// endpoint down, or slow) had not delivered changes much older than the
// last time it answered.
func (st *stream) consumer(ctx context.Context, e *endpoint, fresh bool) (jetstream.Consumer, error) {
	name := ConsumerPrefix + e.key
	s, err := st.js.Stream(ctx, st.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("webhook: stream %s: %w", st.cfg.Stream, err)
	}
	info := s.CachedInfo()
	c, err := s.Consumer(ctx, name)
	if err == nil {
		e.seen(info.Created, c.CachedInfo())
		return c, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("webhook: consumer %s of %s: %w", name, st.cfg.Stream, err)
	}
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "presenced: the changes for webhook " + redact(e.url),
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       st.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: st.s.cfg.MaxBatch,
	}
	newStream := !info.Created.Equal(e.born) || info.State.LastSeq < e.acked
	switch {
	case fresh:
	case newStream:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	default:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, e.acked+1
	}
	c, err = s.CreateConsumer(ctx, cfg)
	switch {
	case errors.Is(err, jetstream.ErrConsumerExists):
		c, err = s.Consumer(ctx, name) // another node's
	case err == nil && !fresh:
		st.s.log.Warn("webhook: the endpoint's consumer was gone; created again", "url", e.url,
			"stream_created_again", newStream, "from_sequence", c.CachedInfo().Delivered.Stream+1)
	}
	if err != nil {
		return nil, fmt.Errorf("webhook: create consumer %s of %s: %w", name, st.cfg.Stream, err)
	}
	e.seen(info.Created, c.CachedInfo())
	return c, nil
}

// seen records where e's consumer is: on the stream created at born,
// every change up to its ack floor acknowledged — up to the last it
// delivered when none awaits its ack (a consumer that acknowledged
// nothing yet has a floor of 0 on some servers, wherever it started) —
// and on the same stream at least what was acknowledged before (a
// consumer created again from further back by another node delivers
// those again; they were delivered all the same).
func (e *endpoint) seen(born time.Time, ci *jetstream.ConsumerInfo) {
	floor := ci.AckFloor.Stream
	if ci.NumAckPending == 0 {
		floor = max(floor, ci.Delivered.Stream)
	}
	if born.Equal(e.born) {
		floor = max(floor, e.acked)
	}
	e.born, e.acked = born, floor
}

// redact drops what a URL may hold of credentials (user information, the
// query) for the consumer's description.
func redact(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		u = u[:i]
	}
	if i := strings.Index(u, "://"); i >= 0 {
		if j := strings.LastIndex(u[i+3:], "@"); j >= 0 {
			u = u[:i+3] + u[i+3+j+1:]
		}
	}
	return u
}

// lease is a node's hold on an endpoint: ctx ends when it is lost.
type lease struct {
	st     *stream
	subj   string
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{} // closed by release
	done   chan struct{} // closed when the renewal stopped
	seq    uint64        // the lease's message; the renewal's until done
}

// wrongLast reports the answer to a publish whose expected last sequence
// of its subject was not the stream's: another node holds the lease.
func wrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// acquire waits until this node holds e's lease, or ctx ends (nil).
func (st *stream) acquire(ctx context.Context, e *endpoint) *lease {
	subj := st.cfg.LeaseSubject + "." + e.key
	poll := st.cfg.LeaseTTL / 3
	for {
		sent := time.Now()
		pctx, cancel := context.WithTimeout(ctx, setupTimeout)
		ack, err := st.js.PublishMsg(pctx, &nats.Msg{Subject: subj, Data: []byte(st.node)}, jetstream.WithExpectLastSequencePerSubject(0))
		cancel()
		if err == nil {
			l := &lease{st: st, subj: subj, seq: ack.Sequence, stop: make(chan struct{}), done: make(chan struct{})}
			l.ctx, l.cancel = context.WithCancel(context.Background())
			go l.renew(sent, e)
			return l
		}
		if ctx.Err() != nil {
			return nil
		}
		if !wrongLast(err) {
			if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrStreamNotFound) {
				ectx, cancel := context.WithTimeout(ctx, setupTimeout)
				if eerr := st.ensureLeases(ectx); eerr != nil {
					err = eerr
				}
				cancel()
			}
			st.s.logLimited("webhook: taking an endpoint's lease failed; will retry", "url", e.url, "err", err)
		}
		if !sleep(ctx, poll) {
			return nil
		}
	}
}

// renew renews the lease every LeaseTTL/3 until release. The lease counts
// as lost — ctx ends — when another node holds it, or two thirds of
// LeaseTTL after the last renewal that went through was sent (the stream
// forgets it LeaseTTL after it got it), so a running node stops before
// another may take over. A node paused for longer than that (a long GC
// pause, a frozen process) may still have a request under way when
// another took over: receivers drop what they had by user and version.
func (l *lease) renew(sent time.Time, e *endpoint) {
	defer close(l.done)
	ttl := l.st.cfg.LeaseTTL
	expire := time.AfterFunc(ttl*2/3-time.Since(sent), l.cancel)
	defer expire.Stop()
	tick := time.NewTicker(ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-tick.C:
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(l.ctx, ttl/3)
		ack, err := l.st.js.PublishMsg(ctx, &nats.Msg{Subject: l.subj, Data: []byte(l.st.node)}, jetstream.WithExpectLastSequencePerSubject(l.seq))
		cancel()
		switch {
		case err == nil:
			l.seq = ack.Sequence
			expire.Reset(ttl*2/3 - time.Since(sent))
		case wrongLast(err):
			l.st.s.log.Warn("webhook: another node took an endpoint's lease", "url", e.url)
			l.cancel()
			return
		default:
			l.st.s.logLimited("webhook: renewing an endpoint's lease failed", "url", e.url, "err", err)
		}
	}
}

// release stops the renewal and, unless the lease was lost, removes it so
// that another node may take the endpoint at once.
func (l *lease) release() {
	close(l.stop)
	<-l.done
	if l.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		if s, err := l.st.js.Stream(ctx, l.st.cfg.LeaseStream); err == nil {
			_ = s.DeleteMsg(ctx, l.seq)
		}
		cancel()
	}
	l.cancel()
}

// runStream delivers e's changes whenever this node holds e's lease,
// until ctx ends.
func (e *endpoint) runStream(ctx context.Context) {
	for ctx.Err() == nil {
		l := e.s.st.acquire(ctx, e)
		if l == nil {
			return
		}
		e.lead(ctx, l)
		l.release()
	}
}

// lead fetches and delivers e's changes while l holds and ctx lasts.
// When ctx ends, a request under way may finish (deliver); a batch not
// acknowledged is delivered again by the next holder.
func (e *endpoint) lead(ctx context.Context, l *lease) {
	st := e.s.st
	work, cancel := context.WithCancel(l.ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	defer func() { e.held.Store(0); e.backlog.Store(0) }() // another node's to tell now

	var cons jetstream.Consumer
	var last uint64 // the stream sequence of the last message taken
	backoff := e.s.cfg.MinBackoff
	// failed handles an error of the consumer: one that says it is gone
	// (NATS lost its store, or an operator deleted it) has it created
	// again (consumer says from where); others are waited out. It reports
	// false once work ended.
	failed := func(what string, err error) bool {
		if work.Err() != nil {
			return false
		}
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
			errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrNoResponders) {
			c, cerr := st.consumer(work, e, false)
			if cerr == nil {
				cons, last = c, 0
				return true
			}
			err = cerr
		}
		st.s.logLimited("webhook: "+what+"; will retry", "url", e.url, "err", err)
		ok := sleep(work, backoff)
		backoff = min(2*backoff, e.s.cfg.MaxBackoff)
		return ok
	}
	for cons == nil {
		var err error
		if cons, err = st.consumer(work, e, false); err != nil && !failed("binding the consumer failed", err) {
			return
		}
	}
	// A batch another node fetched and did not acknowledge (it died, or
	// lost the lease) goes first: it is delivered again once its AckWait
	// has passed. Until then the consumer would give newer changes.
	if info, err := cons.Info(work); err != nil || info.NumAckPending > 0 {
		if !sleep(work, pendingWait(info, st.cfg.AckWait)) {
			return
		}
	}
	var batch []entry
	var body []byte
	for work.Err() == nil {
		msgs, err := e.fetch(work, cons)
		if err != nil {
			if !failed("fetching changes failed", err) {
				return
			}
			continue
		}
		if len(msgs) == 0 {
			// A pull of a consumer that is gone is not answered: it
			// just expires. Ask after it while there is nothing to do.
			info, err := cons.Info(work)
			if err != nil {
				if !failed("asking after the consumer failed", err) {
					return
				}
				continue
			}
			e.backlog.Store(int64(info.NumPending))
			e.seen(e.born, info) // (another node may have moved it)
			backoff = e.s.cfg.MinBackoff
			continue
		}
		backoff = e.s.cfg.MinBackoff
		e.held.Store(int64(len(msgs)))
		batch, last = e.take(msgs, batch[:0], last)
		if len(batch) > 0 {
			body = encode(body[:0], batch)
			stopKeeping := e.keep(msgs)
			ok := e.deliver(work, l.ctx, body, len(batch))
			stopKeeping()
			if !ok {
				return
			}
		}
		// AckAll: the last message acknowledges the batch (also when the
		// node is stopping, as long as it holds the lease).
		actx, acancel := context.WithTimeout(l.ctx, setupTimeout)
		if err := msgs[len(msgs)-1].DoubleAck(actx); err != nil {
			if l.ctx.Err() == nil {
				st.s.logLimited("webhook: acknowledging a delivered batch failed; it will be delivered again", "url", e.url, "err", err)
			}
		} else if last > e.acked {
			e.acked = last
		}
		acancel()
		e.held.Store(0)
	}
}

// pendingWait is how long until the batch info says is unacknowledged is
// given out again: AckWait after its delivery, as the server's clocks
// tell (a server that does not say: AckWait). A node that kept the batch
// longer (it retried a failing endpoint) may have its batch delivered
// after newer changes.
func pendingWait(info *jetstream.ConsumerInfo, ackWait time.Duration) time.Duration {
	if info == nil || info.Delivered.Last == nil || info.TimeStamp.IsZero() {
		return ackWait
	}
	return min(ackWait, max(0, ackWait-info.TimeStamp.Sub(*info.Delivered.Last))+100*time.Millisecond)
}

// fetch takes what the consumer has, up to MaxBatch; when it has nothing
// it waits (fetchWait) for the first change and Linger for more.
func (e *endpoint) fetch(ctx context.Context, cons jetstream.Consumer) ([]jetstream.Msg, error) {
	max := e.s.cfg.MaxBatch
	msgs, err := collect(cons.FetchNoWait(max))
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	if msgs, err = collect(cons.Fetch(1, jetstream.FetchMaxWait(fetchWait))); err != nil || len(msgs) == 0 {
		return msgs, err
	}
	if max > 1 && sleep(ctx, e.s.cfg.Linger) {
		more, err := collect(cons.FetchNoWait(max - 1))
		msgs = append(msgs, more...)
		if err != nil && len(msgs) == 0 {
			return nil, err
		}
	}
	return msgs, nil
}

func collect(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for m := range b.Messages() {
		msgs = append(msgs, m)
	}
	if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return msgs, err
	}
	return msgs, nil
}

// change is what a Sender reads of a message of the stream.
type change struct {
	UserID       *string `json:"user_id"`
	SettingsOnly bool    `json:"settings_only"`
	SelfOnly     bool    `json:"self_only"`
}

// take appends to batch the changes and room events of msgs a webhook is
// sent (not a change of settings alone, nor one only the user sees, nor a
// message that is neither),
// and counts the changes the stream no longer held (a gap in its
// sequence since last, the sequence of the message before). It returns
// the sequence of the last message.
func (e *endpoint) take(msgs []jetstream.Msg, batch []entry, last uint64) ([]entry, uint64) {
	for _, m := range msgs {
		if md, err := m.Metadata(); err == nil {
			seq := md.Sequence.Stream
			if last != 0 && seq > last+1 {
				n := e.dropped.Add(seq - last - 1)
				e.s.logLimited("webhook: changes were gone from the stream before they were delivered (older than its MaxAge)",
					"url", e.url, "dropped_total", n)
			}
			if seq > last || seq+1 < last {
				last = seq // forward, or a stream created again
			}
			e.backlog.Store(int64(md.NumPending))
		}
		var c change
		if err := json.Unmarshal(m.Data(), &c); err != nil || c.UserID == nil {
			e.dropped.Add(1)
			e.s.logLimited("webhook: a message of the change stream is neither a change nor a room event; skipped", "url", e.url, "subject", m.Subject())
			continue
		}
		if c.SettingsOnly || c.SelfOnly {
			continue
		}
		batch = append(batch, entry{data: m.Data()})
	}
	return batch, last
}

// keep tells the stream every AckWait/3 that msgs are still being
// delivered, until the function it returns is called (which waits for
// its goroutine).
func (e *endpoint) keep(msgs []jetstream.Msg) func() {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(e.s.st.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range msgs {
					_ = m.InProgress()
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

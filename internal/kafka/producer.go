package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/presenced/presenced/internal/loglimit"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
)

var (
	_ tracker.Publisher     = (*Producer)(nil)
	_ tracker.RoomPublisher = (*Producer)(nil)
)

// KindHeader is the header that marks a room event on the changes topic:
// "kind: room" (KindRoom). A change of a user's presence has no header,
// as before rooms.
const (
	KindHeader = "kind"
	KindRoom   = "room"
)

// ProducerConfig configures a Producer. Zero values take the documented
// defaults.
type ProducerConfig struct {
	Brokers  []string // host:port of one or more brokers, required
	Topic    string   // default DefaultChangesTopic ("presence.changes")
	ClientID string   // default "presenced"
	// QueueLen bounds the changes waiting for the brokers (default
	// 65,536); beyond it a change is dropped and counted.
	QueueLen int
	// DrainTimeout bounds the wait for the brokers to take what is queued
	// when the Producer closes (default 5s); what is left then is dropped
	// and counted.
	DrainTimeout time.Duration
	// ClientOptions are more franz-go options (TLS, SASL, a dialer, …),
	// applied after the Producer's own.
	ClientOptions []kgo.Opt
	Logger        *slog.Logger // default: discard
}

// ProducerStats are a Producer's counters.
type ProducerStats struct {
	Produced uint64 // changes the brokers acknowledged
	Queued   int    // changes waiting for the brokers now
	Dropped  uint64 // changes dropped because QueueLen were waiting
	// Failed counts changes the brokers refused for good (the topic does
	// not exist, not authorized, too large) and changes still waiting when
	// the Producer closed.
	Failed uint64
}

// Producer is a tracker.Publisher that writes every change of presence to
// a Kafka topic, keyed by user id, and a tracker.RoomPublisher that writes
// every join and leave of a room to the same topic, keyed by room id, with
// the header "kind: room". Publish and PublishRoom never block and are
// safe for concurrent use; the changes of one user (the events of one
// room) must be published in order, and they reach the topic in that
// order.
type Producer struct {
	cfg  ProducerConfig
	cl   *kgo.Client
	log  *slog.Logger
	logs loglimit.Limiter

	queued                    atomic.Int64
	produced, dropped, failed atomic.Uint64

	closeOnce sync.Once
}

// NewProducer returns a Producer for cfg. It does not contact the brokers:
// changes published before they answer wait in the queue.
func NewProducer(cfg ProducerConfig) (*Producer, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafka: no broker for the changes producer")
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultChangesTopic
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "presenced"
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 65536
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Producer{cfg: cfg, log: cfg.Logger}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.DefaultProduceTopic(cfg.Topic),
		// Keyed records go where the Java client puts them (murmur2 of
		// the key): every producer of the topic agrees on a user's
		// partition.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		// Idempotent writes (franz-go's default) need acks from all
		// in-sync replicas; records are retried without limit, in
		// order, until the brokers take them or refuse them for good.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// The queue is bounded by Publish (QueueLen); the client's own
		// bound stays above it so that it never refuses a record.
		kgo.MaxBufferedRecords(cfg.QueueLen + 1024),
		kgo.WithLogger(kgoLogger{cfg.Logger, &p.logs}),
	}
	opts = append(append(opts, recoveryOpts()...), cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: changes producer: %w", err)
	}
	p.cl = cl
	return p, nil
}

// Publish queues ev for the topic. It never blocks: while QueueLen
// changes wait for the brokers, ev is dropped and counted.
func (p *Producer) Publish(ev *presence.Event) {
	if ev.SelfOnly {
		return // only the user sees it: nothing anyone else sees changed
	}
	if !p.reserve() {
		return
	}
	value := wire.AppendChange(make([]byte, 0, 224+len(ev.UserID)+len(ev.Text)), ev)
	rec := &kgo.Record{Key: []byte(ev.UserID), Value: value}
	if ev.At > 0 {
		rec.Timestamp = time.UnixMilli(ev.At)
	}
	p.cl.TryProduce(context.Background(), rec, p.done)
}

// roomHeaders are the headers of every room event's record.
var roomHeaders = []kgo.RecordHeader{{Key: KindHeader, Value: []byte(KindRoom)}}

// PublishRoom queues a join or leave of a room for the topic, keyed by
// the room's id, its value wire.AppendRoomEvent (as on the NATS stream).
// It shares Publish's queue and bound, and never blocks.
func (p *Producer) PublishRoom(ev *presence.RoomEvent) {
	if !p.reserve() {
		return
	}
	value := wire.AppendRoomEvent(make([]byte, 0, 160+len(ev.Room)+len(ev.UserID)), ev)
	rec := &kgo.Record{Key: []byte(ev.Room), Value: value, Headers: roomHeaders}
	if ev.At > 0 {
		rec.Timestamp = time.UnixMilli(ev.At)
	}
	p.cl.TryProduce(context.Background(), rec, p.done)
}

// reserve takes a place in the queue for one record; false (the record
// dropped and counted) while QueueLen wait for the brokers.
func (p *Producer) reserve() bool {
	if p.queued.Add(1) <= int64(p.cfg.QueueLen) {
		return true
	}
	p.queued.Add(-1)
	if n := p.dropped.Add(1); n == 1 || n%10000 == 0 {
		p.log.Warn("kafka changes queue full: changes dropped", "topic", p.cfg.Topic, "queue", p.cfg.QueueLen, "dropped_total", n)
	}
	return false
}

// done is the promise of every record.
func (p *Producer) done(r *kgo.Record, err error) {
	p.queued.Add(-1)
	switch {
	case err == nil:
		p.produced.Add(1)
	case errors.Is(err, kgo.ErrClientClosed):
		p.failed.Add(1) // still queued at close; counted and logged by Close
	default:
		p.failed.Add(1)
		p.logs.Log(p.log, slog.LevelError, "failed", "a change was refused by Kafka and is lost",
			"topic", p.cfg.Topic, "key", string(r.Key), "room", len(r.Headers) > 0, "err", err)
	}
}

// Stats returns the counters.
func (p *Producer) Stats() ProducerStats {
	return ProducerStats{
		Produced: p.produced.Load(),
		Queued:   int(max(p.queued.Load(), 0)),
		Dropped:  p.dropped.Load(),
		Failed:   p.failed.Load(),
	}
}

// Ping reports whether a broker answers.
func (p *Producer) Ping(ctx context.Context) error { return p.cl.Ping(ctx) }

// Run waits until ctx is done, then closes the Producer: like the NATS bus
// it outlives the tracker, so that the last changes go out.
func (p *Producer) Run(ctx context.Context) error {
	<-ctx.Done()
	p.Close()
	return nil
}

// Close waits at most DrainTimeout for the brokers to take what is queued,
// counts the rest as failed and closes the client. It is idempotent.
// Publish after Close counts the change as failed.
func (p *Producer) Close() {
	p.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DrainTimeout)
		defer cancel()
		if err := p.cl.Flush(ctx); err != nil {
			p.log.Warn("kafka brokers did not take every queued change before shutdown; the rest are dropped",
				"topic", p.cfg.Topic, "changes", p.queued.Load(), "err", err)
		}
		p.cl.Close()
	})
}

// Package natsbus is the bus between presenced nodes, on NATS JetStream:
// every change of presence a node's tracker makes is published once, by
// that node, to presence.changes.<base64url(user)>, which the stream
// PRESENCE_CHANGES captures for other services (and webhooks), and which
// carries the change to the other nodes; joins and leaves of rooms go to
// presence.changes.r.<base64url(room)>, in the same stream and queue.
// Each node subscribes (core NATS) only to what its watchers watch: users
// (on sockets, and as members of watched rooms) and rooms, and hands what
// arrives to its fan-out (Local, Config.Rooms): it receives each change
// it needs once.
//
// Bus is the tracker's Publisher on a scale-out node. Publish never
// blocks: events wait in a bounded queue, are retried until the stream
// acknowledges them, and go out in order per user. Watch and Unwatch keep
// a user's subscription in step with Local.Watched (WatchRooms and
// UnwatchRooms a room's with Config.Rooms), and Watch and WatchRooms flush
// before the caller reads the snapshot, so no change falls between the
// two. With Config.Mirror every change of the other nodes also goes to the
// read replica. Mark and Wait tell whether the stream acknowledged what was
// published before a point (what webhooks confirm); Stream whether it is
// missing.
//
// The subjects, the message and its fields are in docs/operations.md
// ("NATS subjects and streams"); the goroutines, queues and why, in
// docs/internals.md ("The bus's goroutines and queues").
package natsbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/presenced/presenced/internal/jsstream"

	"github.com/presenced/presenced/internal/presence"
)

// Local is the node's own fan-out as the bus needs it (fanout.Hub
// implements it; a node with rooms passes one that also hands the changes
// to the members' rooms). Both methods must be safe for concurrent use
// and must not block for long.
type Local interface {
	// Publish delivers an event that another node published to this node's
	// watchers. The *Event is valid only during the call.
	Publish(ev *presence.Event)
	// Watched reports whether any watcher on this node watches user now.
	Watched(user string) bool
}

// RoomLocal is the node's fan-out of rooms as the bus needs it
// (fanout.RoomHub implements it). Both methods must be safe for
// concurrent use and must not block for long.
type RoomLocal interface {
	// PublishRoom delivers a join or leave that another node published to
	// this node's watchers of the room. The *RoomEvent is valid only
	// during the call.
	PublishRoom(ev *presence.RoomEvent)
	// RoomWatched reports whether any watcher on this node watches room
	// now.
	RoomWatched(room string) bool
}

// Defaults of Config.
const (
	DefaultStream     = "PRESENCE_CHANGES"
	DefaultSubject    = "presence.changes"
	DefaultMaxAge     = 24 * time.Hour
	DefaultDuplicates = 2 * time.Minute
	DefaultQueueSize  = 65536
)

// ackTimeout is how long a publish waits for its ack before it is sent
// again (a variable for tests).
var ackTimeout = 5 * time.Second

// Tuning that is not configurable.
const (
	maxInFlight    = 4096            // async publishes awaiting their ack (the package doc says 4096)
	incomingBuffer = 16384           // the shared channel of all subscriptions
	watchFlushWait = 2 * time.Second // bound of Watch's Flush
	closeFlushWait = 5 * time.Second // bound of Close's flush of the queue
	connectTimeout = 5 * time.Second // dial and stream set-up at Open
	minBackoff     = 50 * time.Millisecond
	maxBackoff     = 2 * time.Second
	maxPendingAnn  = 4096 // contact announcements kept while NATS is down
	numStripes     = 256  // per-user locks of Watch/Unwatch
	nodeHeader     = "Presenced-Node"
	contactsSuffix = "-internal.contacts"
	logEvery       = time.Second // at most one log line per kind per second
)

// Config configures a Bus. Zero values are the documented defaults.
type Config struct {
	// Conn is the node's shared NATS connection; the Bus does not close it.
	// Nil: the Bus dials URL itself and closes that connection with Close.
	Conn       *jsstream.Conn
	URL        string        // nats://host:port, required without Conn
	NodeID     string        // unique per process; default: random
	Stream     string        // JetStream stream name, default "PRESENCE_CHANGES"
	Subject    string        // subject prefix, default "presence.changes"; the stream captures Subject+".>"
	MaxAge     time.Duration // stream retention, default 24h
	Duplicates time.Duration // dedupe window, default 2m
	QueueSize  int           // outgoing events waiting for NATS, default 65536
	Local      Local         // required
	// Rooms, if set, is the node's fan-out of rooms: while it reports a
	// room watched the bus subscribes to the room's subject (WatchRooms,
	// UnwatchRooms) and hands it the joins and leaves of other nodes.
	// Nil: the bus reads no room subject.
	Rooms RoomLocal
	// OnContactsChanged is called (from a goroutine of Run's, one call at a
	// time, never from the dispatcher, so it may read a database) when
	// another node announced a contact-list change of an owner this node
	// watches (Local.Watched(owner)). Announcements of an owner that arrive
	// while one waits are folded into it. May be nil.
	OnContactsChanged func(owner string)
	// OnReconnect is called (from a goroutine of the NATS client) after the
	// connection came back and the subscriptions were sent again, and
	// when nats.go dropped incoming changes because the dispatcher was
	// behind (slow consumer, once per episode and subscription): the
	// node's watchers may have missed changes meanwhile and should get the
	// current state. It must not block. May be nil.
	OnReconnect func()
	// Mirror, if set, is handed every change another node publishes,
	// of every user, watched or not (a node's read replica): the bus
	// then also subscribes to the whole subject tree, into a channel and
	// a goroutine of their own, so that the mirror's traffic never
	// delays the watchers'. It must not block; the *Event is valid only
	// during the call. When nats.go drops messages of that subscription
	// (the mirror fell behind), OnMirrorLost is called (not OnReconnect:
	// the watchers missed nothing); a reconnection calls OnReconnect.
	Mirror       func(ev *presence.Event)
	OnMirrorLost func()
	Logger       *slog.Logger // default: slog.Default()
}

// Stats are the bus's counters since Open.
type Stats struct {
	Published      uint64 // events accepted by Publish and PublishRoom into the queue
	PublishedRooms uint64 // of Published, room events (PublishRoom)
	Acked          uint64 // events the stream acknowledged (duplicates included)
	Retried        uint64 // publishes sent again after an error or a missing ack
	Dropped        uint64 // events dropped because the queue was full
	Queued         int    // events in the queue now
	InFlight       int    // publishes awaiting their ack or a retry now
	Received       uint64 // messages received on user and room subjects
	Delivered      uint64 // events handed to Local.Publish and Rooms.PublishRoom
	DeliveredRooms uint64 // of Delivered, room events (Rooms.PublishRoom)
	Mirrored       uint64 // events of other nodes handed to Config.Mirror
	Duplicates     uint64 // received events of a version recently delivered for the same user or room (dropped)
	SkippedOwn     uint64 // received messages this node had published itself
	Decoding       uint64 // received messages that did not decode (dropped)
	Subscriptions  int    // current per-user subscriptions
	// RoomSubscriptions are the current per-room subscriptions
	// (Config.Rooms).
	RoomSubscriptions int
	SlowConsumer      uint64 // messages nats.go dropped because the incoming channel was full
	Announced         uint64 // contact announcements sent
	AnnounceFailed    uint64 // contact announcements lost (pending list full)
	ContactsIn        uint64 // announcements from other nodes passed to OnContactsChanged
	// ContactsDropped counts announcements dropped because too many waited
	// for OnContactsChanged (a resync was asked for instead).
	ContactsDropped uint64
	// StreamMissing is true while this node found the stream missing
	// (NATS lost its store, or it was deleted) and could not create it
	// again yet: its changes wait, and services reading the stream get
	// none of them.
	StreamMissing bool
	// StreamRecreated counts the times this node found the stream missing
	// and created it again (what it held before is lost).
	StreamRecreated uint64
	// Unacked is how long the stream has acknowledged none of this
	// node's changes while some wait (from the first failed publish
	// since the last acknowledgement); 0 when none waits or the stream
	// keeps up.
	Unacked time.Duration
}

// StreamHealth is what the bus knows of the stream now (see Stats).
type StreamHealth struct {
	Missing bool          // Stats.StreamMissing
	Unacked time.Duration // Stats.Unacked
	Waiting int           // changes accepted and not yet acknowledged
}

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("natsbus: closed")

// Bus is one node's connection to the bus. Its methods are safe for
// concurrent use.
type Bus struct {
	cfg      Config
	log      *slog.Logger
	conn     *jsstream.Conn // nc and js are its
	ownConn  bool           // dialled by Open: Close closes it
	nc       *nats.Conn
	js       jetstream.JetStream
	node     string
	prefix   string // cfg.Subject + "."
	rooms    string // prefix + "r.": the subjects of rooms start with it
	contacts string // the announcement subject

	q            queue
	conf         confirmed      // what the stream acknowledged (Mark, Wait)
	pub          *publisher     // owned by the running publisher, or by Close after Run
	in           chan *nats.Msg // every subscription delivers here
	reconn       chan struct{}  // signalled (cap 1) when the connection comes back
	contSub      *nats.Subscription
	allSub       *nats.Subscription // every change, for Config.Mirror; nil without
	mirrorIn     chan *nats.Msg     // allSub delivers here; nil without
	stripes      [numStripes]sync.Mutex
	subsMu       sync.Mutex             // guards subs, roomSubs, their subjectSub.recent, and retiredDrops
	subs         map[string]*subjectSub // by user
	roomSubs     map[string]*subjectSub // by room (Config.Rooms)
	retiredDrops uint64                 // slow-consumer drops of subscriptions since removed

	contMu     sync.Mutex            // guards contState and contOrder
	contState  map[string]*contEntry // owners queued for or in OnContactsChanged
	contOrder  []string              // announced owners waiting for OnContactsChanged
	contNotify chan struct{}         // cap 1: contOrder grew

	annMu      sync.Mutex // guards annPending
	annPending []string   // announcements to send again once NATS is back
	annNotify  chan struct{}

	runMu   sync.Mutex // guards running, closed, stopRun and runDone
	running bool
	closed  bool
	stopRun context.CancelFunc
	runDone chan struct{}
	shut    atomic.Bool // Close has flushed: Publish drops

	published, acked, retried, dropped        atomic.Uint64
	publishedRooms                            atomic.Uint64
	received, delivered, skippedOwn, decoding atomic.Uint64
	duplicates, mirrored                      atomic.Uint64
	nsubs, nroomSubs                          atomic.Int64
	deliveredRooms                            atomic.Uint64
	announced, announceFailed, contactsIn     atomic.Uint64
	contactsDropped                           atomic.Uint64
	recreated                                 atomic.Uint64
	streamMissing                             atomic.Bool
	failingSince                              atomic.Int64  // unix ns of the first failed publish since the last ack; 0: none
	failedConn                                atomic.Uint64 // nc's Reconnects at the last failed publish (Bus.failing)
	lastDropLog, lastSlowLog, lastDecodeLog   atomic.Int64  // unix ns: rate limits of logLimited
	lastPubLog, lastAnnLog, lastContLog       atomic.Int64
}

// Bus is a tracker.Publisher and a tracker.RoomPublisher (not imported
// here: the tracker does not need to build for the bus to).
var _ interface {
	Publish(*presence.Event)
	PublishRoom(*presence.RoomEvent)
} = (*Bus)(nil)

// Open connects to NATS, creates or updates the stream and subscribes to
// the contact announcements. It fails with a clear error if NATS cannot be
// reached now; once open, the connection reconnects forever. The caller
// then runs Run and, at the end, Close.
func Open(ctx context.Context, cfg Config) (*Bus, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	b := &Bus{
		cfg:        cfg,
		log:        cfg.Logger.With("component", "natsbus", "node", cfg.NodeID),
		node:       cfg.NodeID,
		prefix:     cfg.Subject + ".",
		rooms:      cfg.Subject + "." + roomToken + ".",
		contacts:   cfg.Subject + contactsSuffix,
		in:         make(chan *nats.Msg, incomingBuffer),
		reconn:     make(chan struct{}, 1),
		subs:       make(map[string]*subjectSub),
		roomSubs:   make(map[string]*subjectSub),
		annNotify:  make(chan struct{}, 1),
		contNotify: make(chan struct{}, 1),
	}
	b.q.init(cfg.QueueSize)
	b.pub = newPublisher(b)

	conn := cfg.Conn
	if conn == nil {
		var err error
		if conn, err = jsstream.Dial(cfg.URL, "presenced "+cfg.NodeID, b.log, JetStreamOptions()...); err != nil {
			return nil, fmt.Errorf("natsbus: %w", err)
		}
		b.ownConn = true
	}
	b.conn = conn
	conn.OnReconnect(func() {
		if b.shut.Load() {
			return
		}
		if b.cfg.OnReconnect != nil {
			b.cfg.OnReconnect()
		}
		select {
		case b.reconn <- struct{}{}:
		default:
		}
	})
	conn.OnAsyncError(func(sub *nats.Subscription, err error) {
		if b.shut.Load() {
			return
		}
		if errors.Is(err, nats.ErrSlowConsumer) && sub != nil && sub == b.allSub {
			b.logLimited(&b.lastSlowLog, "changes for the read replica dropped: it is behind (slow consumer); it will be filled again")
			if b.cfg.OnMirrorLost != nil {
				b.cfg.OnMirrorLost()
			}
			return
		}
		if errors.Is(err, nats.ErrSlowConsumer) {
			b.logLimited(&b.lastSlowLog, "incoming messages dropped: the dispatcher is behind (slow consumer); watchers will be resynchronised")
			// Changes were lost for this node's watchers, exactly as
			// while disconnected: they should get the current state.
			if b.cfg.OnReconnect != nil {
				b.cfg.OnReconnect()
			}
			return
		}
		b.log.Warn("NATS error", "err", err)
	})
	nc, js := conn.NC, conn.JS
	b.nc = nc
	fail := func(err error) (*Bus, error) {
		if b.ownConn {
			conn.Close()
		}
		return nil, err
	}
	b.js = js
	if err := b.ensureStream(ctx); err != nil {
		return fail(err)
	}
	var err error
	b.contSub, err = nc.ChanSubscribe(b.contacts, b.in)
	if err != nil {
		return fail(fmt.Errorf("natsbus: subscribe to %s: %w", b.contacts, err))
	}
	if cfg.Mirror != nil {
		b.mirrorIn = make(chan *nats.Msg, incomingBuffer)
		if b.allSub, err = nc.ChanSubscribe(b.prefix+">", b.mirrorIn); err != nil {
			return fail(fmt.Errorf("natsbus: subscribe to %s>: %w", b.prefix, err))
		}
	}
	if err := nc.FlushTimeout(connectTimeout); err != nil {
		return fail(fmt.Errorf("natsbus: flush subscription of %s: %w", b.contacts, err))
	}
	return b, nil
}

// fill applies the defaults and validates c.
func (c *Config) fill() error {
	if c.URL == "" && c.Conn == nil {
		return errors.New("natsbus: Config.Conn or Config.URL is required")
	}
	if c.Local == nil {
		return errors.New("natsbus: Config.Local is required")
	}
	if c.NodeID == "" {
		var r [8]byte
		rand.Read(r[:])
		c.NodeID = hex.EncodeToString(r[:])
	}
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if strings.ContainsAny(c.Stream, ".*> \t\r\n/\\") {
		return fmt.Errorf("natsbus: invalid stream name %q: no '.', '*', '>', '/', '\\' or white space", c.Stream)
	}
	if c.Subject == "" {
		c.Subject = DefaultSubject
	}
	if err := validSubjectPrefix(c.Subject); err != nil {
		return err
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.MaxAge < 0 || c.Duplicates < 0 || c.Duplicates > c.MaxAge {
		return fmt.Errorf("natsbus: need 0 < Duplicates (%v) <= MaxAge (%v)", c.Duplicates, c.MaxAge)
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.QueueSize < 0 {
		return fmt.Errorf("natsbus: negative QueueSize %d", c.QueueSize)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

func validSubjectPrefix(s string) error {
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("natsbus: invalid subject prefix %q: dot-separated non-empty tokens without wildcards or white space", s)
		}
	}
	return nil
}

// JetStreamOptions are the options of the JetStream handle the bus
// publishes through: at most maxInFlight publishes await their ack, each
// for at most ackTimeout.
func JetStreamOptions() []jetstream.JetStreamOpt {
	return []jetstream.JetStreamOpt{
		jetstream.WithPublishAsyncMaxPending(maxInFlight),
		jetstream.WithPublishAsyncTimeout(ackTimeout),
	}
}

// ensureStream creates the stream or updates it to the configuration.
// Several nodes may do this at once (see package jsstream).
func (b *Bus) ensureStream(ctx context.Context) (err error) {
	defer callEnsureStream.Start(ctx).Done(&err)
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	cfg := jetstream.StreamConfig{
		Name:         b.cfg.Stream,
		Description:  "presenced: every change of presence, those only the user sees (self_only) included (see package natsbus)",
		Subjects:     []string{b.cfg.Subject + ".>"},
		Retention:    jetstream.LimitsPolicy,
		Discard:      jetstream.DiscardOld,
		Storage:      jetstream.FileStorage,
		MaxAge:       b.cfg.MaxAge,
		Duplicates:   b.cfg.Duplicates,
		Replicas:     1,
		MaxMsgs:      -1,
		MaxBytes:     -1,
		MaxMsgSize:   -1,
		MaxConsumers: -1,
	}
	if err := jsstream.Ensure(ctx, b.js, cfg); err != nil {
		return fmt.Errorf("natsbus: %w (subjects %s)", err, cfg.Subjects[0])
	}
	return nil
}

// lookUpStream asks the server for the stream: nil if it exists,
// jetstream.ErrStreamNotFound if it does not.
func (b *Bus) lookUpStream(ctx context.Context) (err error) {
	defer callStreamInfo.Start(ctx).Done(&err)
	ctx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	_, err = b.js.Stream(ctx, b.cfg.Stream)
	return err
}

// Stream reports what the bus knows of the stream now, from the
// publisher's last look (no call to NATS). Safe for concurrent use.
func (b *Bus) Stream() StreamHealth {
	h := StreamHealth{Missing: b.streamMissing.Load(), Waiting: b.q.len() + b.pub.held()}
	if since := b.failingSince.Load(); since != 0 && h.Waiting > 0 {
		h.Unacked = max(time.Duration(time.Now().UnixNano()-since), 0)
	}
	return h
}

// Ping reports whether the bus is connected to NATS and the server answers
// (a round trip). It is safe for concurrent use.
func (b *Bus) Ping(ctx context.Context) (err error) {
	defer callPing.Start(ctx).Done(&err)
	if !b.nc.IsConnected() {
		return errors.New("natsbus: not connected to NATS")
	}
	if err := b.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("natsbus: ping: %w", err)
	}
	return nil
}

// NodeID returns the id this bus stamps on its messages.
func (b *Bus) NodeID() string { return b.node }

// StreamName returns the name of the stream of the changes.
func (b *Bus) StreamName() string { return b.cfg.Stream }

// Run owns the bus's goroutines — the outgoing publisher, the incoming
// dispatcher and the contacts goroutine — until ctx is done (it then returns nil) or Close is called
// (ErrClosed). It may be called again after it returned; two at once are an
// error.
func (b *Bus) Run(ctx context.Context) error {
	b.runMu.Lock()
	if b.closed {
		b.runMu.Unlock()
		return ErrClosed
	}
	if b.running {
		b.runMu.Unlock()
		return errors.New("natsbus: Run is already running")
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	b.running, b.stopRun, b.runDone = true, cancel, done
	b.runMu.Unlock()

	var wg sync.WaitGroup
	if b.mirrorIn != nil {
		wg.Go(func() { b.mirror(ctx) })
	}
	wg.Add(3)
	go func() {
		defer wg.Done()
		b.pub.run(ctx, false)
	}()
	go func() {
		defer wg.Done()
		b.dispatch(ctx)
	}()
	go func() {
		defer wg.Done()
		b.contactsLoop(ctx)
	}()
	wg.Wait()
	cancel()

	b.runMu.Lock()
	b.running = false
	closed := b.closed
	b.runMu.Unlock()
	close(done)
	if closed {
		return ErrClosed
	}
	return nil
}

// Close stops Run if it runs, publishes what is still queued (waiting at
// most 5 s for NATS to acknowledge it), flushes and closes the connection.
// Events published after that are dropped (Stats.Dropped). Calling it
// again does nothing.
func (b *Bus) Close() error {
	b.runMu.Lock()
	if b.closed {
		b.runMu.Unlock()
		return nil
	}
	b.closed = true
	stop, done := b.stopRun, b.runDone
	running := b.running
	b.runMu.Unlock()
	if running {
		stop()
		<-done
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeFlushWait)
	left := b.pub.run(ctx, true)
	cancel()
	b.shut.Store(true)
	if left == 0 {
		left = b.q.len() // came in after the flush
	}
	if left > 0 {
		b.log.Warn("closing with events not published", "events", left)
	}
	// Not nc.Drain: it starts a goroutine per subscription (one per
	// watched user) to wait for messages the stopped dispatcher would not
	// read anyway. What matters is that the outgoing bytes leave.
	if b.ownConn {
		b.conn.Close()
		return nil
	}
	// A shared connection stays; the bus's subscriptions go.
	b.subsMu.Lock()
	for _, subs := range []map[string]*subjectSub{b.subs, b.roomSubs} {
		for id, s := range subs {
			_ = s.sub.Unsubscribe()
			delete(subs, id)
		}
	}
	b.subsMu.Unlock()
	_ = b.contSub.Unsubscribe()
	if b.allSub != nil {
		_ = b.allSub.Unsubscribe()
	}
	if err := b.nc.FlushTimeout(closeFlushWait); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		b.log.Warn("flush at close failed", "err", err)
	}
	return nil
}

// Stats returns the bus's counters.
func (b *Bus) Stats() Stats {
	s := Stats{
		Published:         b.published.Load(),
		PublishedRooms:    b.publishedRooms.Load(),
		Acked:             b.acked.Load(),
		Retried:           b.retried.Load(),
		Dropped:           b.dropped.Load(),
		Queued:            b.q.len(),
		InFlight:          b.pub.held(),
		Received:          b.received.Load(),
		Delivered:         b.delivered.Load(),
		DeliveredRooms:    b.deliveredRooms.Load(),
		Mirrored:          b.mirrored.Load(),
		Duplicates:        b.duplicates.Load(),
		SkippedOwn:        b.skippedOwn.Load(),
		Decoding:          b.decoding.Load(),
		Subscriptions:     int(b.nsubs.Load()),
		RoomSubscriptions: int(b.nroomSubs.Load()),
		Announced:         b.announced.Load(),
		AnnounceFailed:    b.announceFailed.Load(),
		ContactsIn:        b.contactsIn.Load(),
		ContactsDropped:   b.contactsDropped.Load(),
		StreamRecreated:   b.recreated.Load(),
	}
	h := b.Stream()
	s.StreamMissing, s.Unacked = h.Missing, h.Unacked
	// Copy the subscriptions under the lock, count outside it: the
	// dispatcher takes the lock for every message, and a scrape must not
	// hold it while asking each subscription for its drops.
	b.subsMu.Lock()
	s.SlowConsumer = b.retiredDrops
	subs := make([]*nats.Subscription, 0, len(b.subs)+len(b.roomSubs))
	for _, us := range b.subs {
		subs = append(subs, us.sub)
	}
	for _, rs := range b.roomSubs {
		subs = append(subs, rs.sub)
	}
	b.subsMu.Unlock()
	for _, sub := range subs {
		if n, err := sub.Dropped(); err == nil {
			s.SlowConsumer += uint64(n)
		}
	}
	if n, err := b.contSub.Dropped(); err == nil {
		s.SlowConsumer += uint64(n)
	}
	if b.allSub != nil {
		if n, err := b.allSub.Dropped(); err == nil {
			s.SlowConsumer += uint64(n)
		}
	}
	return s
}

// logLimited logs msg at warning level unless it was logged less than a
// second ago (last holds the time of the previous line).
func (b *Bus) logLimited(last *atomic.Int64, msg string, args ...any) {
	now := time.Now().UnixNano()
	prev := last.Load()
	if now-prev < int64(logEvery) || !last.CompareAndSwap(prev, now) {
		return
	}
	b.log.Warn(msg, args...)
}

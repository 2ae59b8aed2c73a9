// Package gateway is presenced's WebSocket edge, GET /v1/ws (see
// docs/protocol.md): it authenticates the device, upgrades the connection,
// decodes client messages into tracker calls, subscriptions and watches of
// rooms, and writes what the fan-out hubs deliver through a bounded,
// coalescing per-connection queue. An idle connection owns no goroutine: on
// Linux an epoll loop hands readable sockets to a bounded worker pool, and a
// connection has a writer goroutine only while it has frames queued.
//
// Error codes of {"type":"error"} messages (the connection stays up):
// invalid_json (not one JSON object, unknown or misplaced field, wrong
// type of a field, binary frame), unknown_type, invalid_status,
// invalid_text, invalid_id (user_ids or room missing or invalid),
// too_many_subscriptions (nothing of that request was added),
// too_many_devices, too_many_rooms, too_many_watched_rooms,
// device_not_alive, room_not_allowed, rooms_unavailable, rate_limited (too
// many messages, status changes, joins and leaves, or snapshot ids:
// nothing of that message was done), unavailable (a backend cannot serve
// for now — tracker.Unavailable — or no hub; retry later), internal (the
// detail is in the server log); one of a room message names it (request).
//
// Close codes: 1000 after bye (or echoing the client's close), 1001
// shutdown, 1002 protocol error, 1007 invalid UTF-8, 1008 persistent rate
// abuse, 1009 message over 64 KiB, 4001 idle for one ttl, 4002 slow
// consumer, 4003 the client token expired (not a bye: the device keeps its
// close grace, for the client to reconnect with a fresh token).
package gateway

import (
	"context"
	"errors"
	"github.com/presenced/presenced/internal/admission"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/apierr"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/origin"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/ratelimit"
)

// Tracker is the write side the gateway drives.
type Tracker interface {
	// SocketBeat is a heartbeat through a socket this node holds (with
	// several nodes the node owns the device: tracker.SocketBeat).
	SocketBeat(ctx context.Context, user, device string, active bool) (presence.Change, error)
	// SocketConnect is the first heartbeat of a new socket.
	SocketConnect(ctx context.Context, user, device string) (presence.Change, error)
	SetStatus(ctx context.Context, user string, m presence.Manual, text string) (presence.Change, error)
	Bye(ctx context.Context, user, device string) (presence.Change, error)
	// Disconnect tells that the connection of a device closed without a
	// bye; since is its last beat through that connection (Unix ms).
	Disconnect(ctx context.Context, user, device string, since int64) error
}

// Reader answers privacy-filtered reads (subscription snapshots).
type Reader interface {
	Read(ctx context.Context, viewer string, ids []string, out []privacy.View) error
}

// DefaultMaxSubscribing is Config.MaxSubscribing's default.
const DefaultMaxSubscribing = 16

// The defaults of Config's caps of one user's and one device's sockets.
const (
	DefaultMaxSocketsPerUser   = 64
	DefaultMaxSocketsPerDevice = 8
)

// Config configures a Gateway. Zero values take the documented defaults.
type Config struct {
	Tracker Tracker             // required
	Reader  Reader              // required
	Auth    *auth.Authenticator // required
	Hub     Hub                 // nil: subscribe answers an error
	Clock   clock.Clock
	Logger  *slog.Logger
	// TTL is the heartbeat ttl: welcome announces it, and a connection
	// silent for one ttl is closed 4001. Default 30s.
	TTL time.Duration
	// CloseGrace is announced by welcome: how soon a client must reconnect
	// after its connection closed without a bye for watchers to see
	// nothing (presence.Rules.CloseGrace). Default 5s, cut to TTL;
	// presence.NoCloseGrace (off) is announced as 0.
	CloseGrace time.Duration
	// MaxSubscriptions is the hub's per-connection cap (the hub enforces
	// it; the gateway refuses a larger request before asking and sizes
	// the send queue by it). Default 500.
	MaxSubscriptions int
	// MaxUserSubscriptions caps the users one user watches across all
	// their connections to this node. Default 10 × MaxSubscriptions.
	MaxUserSubscriptions int
	// MaxSocketsPerUser and MaxSocketsPerDevice cap one user's open
	// connections to this node, and those of one of their devices (tabs
	// of one browser share its device). Defaults DefaultMaxSocketsPerUser
	// and DefaultMaxSocketsPerDevice.
	MaxSocketsPerUser   int
	MaxSocketsPerDevice int
	// MaxMessage is the largest client message in bytes. Default 64 KiB.
	MaxMessage int
	// Rate and Burst limit client messages per second. Defaults 20 and 40.
	Rate  int
	Burst int
	// QueueLen bounds the frames queued for one connection. Changes of one
	// user coalesce to the newest, so the default, MaxSubscriptions + 64,
	// holds a change of every watched user at once (a mass expiry after a
	// restart) plus the connection's own messages: a connection is then
	// "behind" when a write does not finish within WriteTimeout.
	QueueLen int
	// WriteTimeout bounds one write to a socket; a connection that cannot
	// take its frames for this long is closed 4002. Default 10s.
	WriteTimeout time.Duration
	// Workers is the number of goroutines reading readable sockets.
	// Default 16.
	Workers int
	// BeatsMayWait says that the Tracker's SocketBeat may wait on a
	// durable write (with webhooks: a change's place in their log). The
	// epoll loop then hands every socket's bytes to a worker; otherwise it
	// applies a read of heartbeats and pings itself, waking no worker.
	BeatsMayWait bool
	// MaxSubscribing bounds the subscribe messages resolved at once: the
	// hub's read of the viewer's relations and the snapshot read of the
	// ids. The others wait for their turn, in their worker. When a node's
	// thousands of clients reconnect to this one at once, each
	// subscribing again, the state and durable stores then see a short
	// queue of such reads, and everyone else's calls (a status change, a
	// batch read) are not stuck behind thousands of them. Default
	// DefaultMaxSubscribing.
	MaxSubscribing int
	// Setup shapes the gate that a WebSocket's handshake (from its
	// authentication to its welcome) and its first subscribe pass before
	// they run (admission): it admits them a few at a time, as many as the
	// process's wake-ups say the CPU can take while the sessions already
	// up stay on time. Zero fields take admission's defaults.
	Setup admission.Config
	// IdleCheck is how often idle connections and expired tokens are
	// looked for: a socket is closed at most this long after its token
	// expires (at once if it sends a message). Default 1s.
	IdleCheck time.Duration
	// NoEpoll serves every connection with its own reading goroutine (the
	// portable path; always used where epoll is not available).
	NoEpoll bool
	// Writes are the per-user buckets of client writes (set_status takes
	// from Writes.Status), shared with the HTTP API so that one user's
	// status changes count once across all their sockets and requests;
	// nil: buckets of the gateway's own.
	Writes *ratelimit.Writes
	// Origins are the browser pages that may open a socket (package
	// origin): an upgrade whose Origin header names another page is
	// refused with 403 origin_not_allowed. nil: the node's own pages only.
	// An upgrade without an Origin header (not from a browser) passes.
	Origins *origin.Policy
	// Rooms is the fan-out of rooms (*fanout.RoomHub) that watch_room and
	// unwatch_room drive; nil: they answer rooms_unavailable. Join and
	// leave need the Tracker's RoomTracker ability instead.
	Rooms RoomHub
}

// Gateway serves GET /v1/ws. It is an http.Handler, safe for concurrent use.
// Run drives it; ServeHTTP refuses upgrades before Run starts and after it
// has shut down.
type Gateway struct {
	cfg     Config
	tracker Tracker
	reader  Reader
	hub     Hub
	auth    *auth.Authenticator
	clock   clock.Clock
	log     *slog.Logger
	ttlMs   int64

	roomHub     RoomHub     // Config.Rooms; nil: none
	roomTracker RoomTracker // the Tracker's RoomTracker ability; nil: none

	// msgLimit bounds a connection's messages (Rate, Burst); strikeLimit
	// its refused messages, at half the rate, before it is closed 1008.
	msgLimit, strikeLimit ratelimit.Limit
	writes                *ratelimit.Writes
	// snapshots bounds the ids a user's subscriptions read, across their
	// sockets (ratelimit.Snapshots of MaxUserSubscriptions).
	snapshots *ratelimit.Keyed
	// roomOps bounds the joins and leaves of one device, across its
	// sockets (ratelimit.Rooms), keyed by user and device.
	roomOps *ratelimit.Keyed
	// subscribing holds a token per subscribe being resolved
	// (Config.MaxSubscribing).
	subscribing chan struct{}
	// setup admits handshakes and subscribes (Config.Setup).
	setup *admission.Gate
	poll  poller // set by Run before it takes connections; nil: a goroutine per connection

	ctx    context.Context // canceled when the gateway is closed
	cancel context.CancelFunc

	ready chan struct{} // closed once Run takes connections

	mu      sync.RWMutex // guards the fields below
	started bool         // Run was called
	running bool         // taking connections
	closing bool
	conns   map[uint64]*conn     // by id (the epoll loop finds a connection by it)
	users   map[string]userConns // user → its connections, counted from the upgrade on

	wg sync.WaitGroup // every goroutine the gateway starts

	idle idleIndex

	stats struct {
		accepted, acceptedTLS, closedIdle, closedSlow, closedRate, closedSize, closedExpired, rateLimited, coalescedBeats, unchanged, loopReads atomic.Uint64
	}
	nextID atomic.Uint64
}

// Stats are the gateway's counters since start.
type Stats struct {
	Connections    int    // open now
	Users          int    // distinct users with at least one connection open now
	Accepted       uint64 // upgrades
	AcceptedTLS    uint64 // of them, over TLS: each read by a goroutine of its own
	ClosedIdle     uint64 // 4001
	ClosedSlow     uint64 // 4002
	ClosedRate     uint64 // 1008
	ClosedTooBig   uint64 // 1009
	ClosedExpired  uint64 // 4003: the client token expired
	RateLimited    uint64 // messages refused with rate_limited
	CoalescedBeats uint64 // heartbeats read together with an identical one and applied once
	LoopReads      uint64 // reads of only heartbeats and pings the epoll loop applied itself, waking no worker
	Unchanged      uint64 // users a subscribe's snapshot left out: the client knew their version
	EpollDisabled  bool
	Setup          admission.Stats // the gate of handshakes and first subscribes (Config.Setup)
}

// New returns a Gateway. It starts nothing; call Run.
func New(cfg Config) (*Gateway, error) {
	if cfg.Tracker == nil || cfg.Reader == nil || cfg.Auth == nil {
		return nil, errors.New("gateway: Tracker, Reader and Auth are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = presence.DefaultTTL
	}
	cfg.CloseGrace = presence.Rules{TTL: cfg.TTL, CloseGrace: cfg.CloseGrace}.WithDefaults().CloseGrace
	if cfg.MaxSubscriptions <= 0 {
		cfg.MaxSubscriptions = presence.DefaultMaxSubscriptions
	}
	if cfg.MaxUserSubscriptions <= 0 {
		cfg.MaxUserSubscriptions = 10 * cfg.MaxSubscriptions
	}
	if cfg.MaxSocketsPerUser <= 0 {
		cfg.MaxSocketsPerUser = DefaultMaxSocketsPerUser
	}
	if cfg.MaxSocketsPerDevice <= 0 {
		cfg.MaxSocketsPerDevice = DefaultMaxSocketsPerDevice
	}
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = 64 << 10
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 20
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 2 * cfg.Rate
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = cfg.MaxSubscriptions + 64
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 16
	}
	if cfg.MaxSubscribing <= 0 {
		cfg.MaxSubscribing = DefaultMaxSubscribing
	}
	if cfg.IdleCheck <= 0 {
		cfg.IdleCheck = time.Second
	}
	if cfg.Writes == nil {
		cfg.Writes = ratelimit.NewWrites()
	}
	g := &Gateway{
		ready:       make(chan struct{}),
		cfg:         cfg,
		msgLimit:    ratelimit.PerSecond(cfg.Rate, cfg.Burst),
		strikeLimit: ratelimit.PerSecond((cfg.Rate+1)/2, cfg.Burst),
		writes:      cfg.Writes,
		snapshots:   ratelimit.NewKeyed(ratelimit.Snapshots(max(cfg.MaxUserSubscriptions, cfg.MaxSubscriptions))),
		tracker:     cfg.Tracker,
		reader:      cfg.Reader,
		hub:         cfg.Hub,
		roomHub:     cfg.Rooms,
		roomOps:     cfg.Writes.Rooms,
		subscribing: make(chan struct{}, cfg.MaxSubscribing),
		setup:       admission.New(cfg.Setup),
		auth:        cfg.Auth,
		clock:       cfg.Clock,
		log:         cfg.Logger,
		ttlMs:       cfg.TTL.Milliseconds(),
		conns:       make(map[uint64]*conn),
		users:       make(map[string]userConns),
	}
	g.roomTracker, _ = cfg.Tracker.(RoomTracker)
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g, nil
}

// Stats returns a copy of the counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	n, users := len(g.conns), len(g.users)
	noEpoll := g.poll == nil
	g.mu.Unlock()
	return Stats{
		Connections:    n,
		Users:          users,
		Accepted:       g.stats.accepted.Load(),
		AcceptedTLS:    g.stats.acceptedTLS.Load(),
		ClosedIdle:     g.stats.closedIdle.Load(),
		ClosedSlow:     g.stats.closedSlow.Load(),
		ClosedRate:     g.stats.closedRate.Load(),
		ClosedTooBig:   g.stats.closedSize.Load(),
		ClosedExpired:  g.stats.closedExpired.Load(),
		RateLimited:    g.stats.rateLimited.Load(),
		CoalescedBeats: g.stats.coalescedBeats.Load(),
		LoopReads:      g.stats.loopReads.Load(),
		Unchanged:      g.stats.unchanged.Load(),
		EpollDisabled:  noEpoll,
		Setup:          g.setup.Stats(),
	}
}

// Ready is closed once Run takes connections; serve HTTP after it, or the
// first upgrades are refused with 503.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// Serving reports whether the gateway takes connections now: Run has
// started and the gateway is not shutting down.
func (g *Gateway) Serving() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.running && !g.closing
}

// Run serves connections until ctx is done, then closes every socket with
// 1001 (going away), waits up to WriteTimeout for the close frames to be
// written, and stops every goroutine it started. Call it once.
func (g *Gateway) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.started {
		g.mu.Unlock()
		return errors.New("gateway: Run called twice")
	}
	g.started = true
	g.mu.Unlock()
	var p poller
	if !g.cfg.NoEpoll {
		var err error
		if p, err = newPoller(g); err != nil {
			g.log.Warn("epoll is not available: one goroutine per WebSocket connection", "err", err)
			p = nil
		}
	}
	if p != nil {
		p.start()
	}
	g.mu.Lock()
	g.poll = p
	g.running = !g.closing
	g.mu.Unlock()
	close(g.ready)
	setupCtx, stopSetup := context.WithCancel(ctx)
	defer stopSetup()
	g.wg.Go(func() { _ = g.setup.Run(setupCtx) })

	tick := time.NewTicker(g.cfg.IdleCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			g.shutdown()
			return nil
		case <-tick.C:
			g.sweepIdle()
		}
	}
}

// shutdown refuses new connections, closes the open ones with 1001, and
// waits for every goroutine.
func (g *Gateway) shutdown() {
	g.mu.Lock()
	g.closing = true
	open := make([]*conn, 0, len(g.conns))
	for _, c := range g.conns {
		open = append(open, c)
	}
	g.mu.Unlock()
	for _, c := range open {
		c.close(closeGoingAway, "server shutting down")
	}
	// Close frames are written by the connections' writers, each bounded by
	// the write timeout; after that, whatever is left is cut.
	done := make(chan struct{})
	go func() { g.waitConns(); close(done) }()
	select {
	case <-done:
	case <-time.After(g.cfg.WriteTimeout + time.Second):
		g.mu.Lock()
		for _, c := range g.conns {
			open = append(open, c)
		}
		g.mu.Unlock()
		for _, c := range open {
			c.teardown()
		}
		<-done
	}
	g.cancel()
	if g.poll != nil {
		g.poll.stop()
	}
	g.wg.Wait()
}

// stopping reports whether the gateway is shutting down.
func (g *Gateway) stopping() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.closing
}

// waitConns waits until every connection is torn down.
func (g *Gateway) waitConns() {
	for {
		g.mu.Lock()
		n := len(g.conns)
		g.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// spawn runs fn in a goroutine the gateway owns, unless it is stopping.
// It takes the read lock only, so writers of many connections start
// side by side during a fan-out.
func (g *Gateway) spawn(fn func()) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closing && len(g.conns) == 0 {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
	return true
}

// polled reports whether the gateway reads its plain connections through
// epoll (set by Run before it takes connections).
func (g *Gateway) polled() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.poll != nil
}

// register adds c to the open connections and returns the poller, or
// reports that the gateway does not take connections now.
func (g *Gateway) register(c *conn) (poller, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.running || g.closing {
		return nil, false
	}
	g.conns[c.id] = c
	return g.poll, true
}

// unregister removes c from the open connections, if it is one, and gives
// back its place and its subscriptions in its user's counts.
func (g *Gateway) unregister(c *conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conns[c.id] != c {
		return
	}
	delete(g.conns, c.id)
	u := g.users[c.user]
	u.subs -= c.subs
	c.subs = 0
	g.users[c.user] = u
	g.releaseLocked(c.user, c.device)
}

// userConns is what one user holds on this node.
type userConns struct {
	n    int32 // connections, counted from the upgrade on
	subs int32 // subscriptions across them
	devs []devConns
}

type devConns struct {
	device string
	n      int32
}

// reserve counts a connection of user's device, before its upgrade, or
// refuses it when the user or the device holds the most it may.
func (g *Gateway) reserve(user, device string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.users[user]
	if int(u.n) >= g.cfg.MaxSocketsPerUser {
		return refuse(http.StatusTooManyRequests, "too_many_sockets",
			"this user holds %d connections to this node, the most one user may hold; close one first", u.n)
	}
	i := slices.IndexFunc(u.devs, func(d devConns) bool { return d.device == device })
	if i >= 0 && int(u.devs[i].n) >= g.cfg.MaxSocketsPerDevice {
		return refuse(http.StatusTooManyRequests, "too_many_sockets",
			"device %q holds %d connections to this node, the most one device may hold; close one first", device, u.devs[i].n)
	}
	if i < 0 {
		u.devs = append(u.devs, devConns{device: device})
		i = len(u.devs) - 1
	}
	u.devs[i].n++
	u.n++
	g.users[user] = u
	return nil
}

// release gives back a place reserve counted, for an upgrade that failed.
func (g *Gateway) release(user, device string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked(user, device)
}

func (g *Gateway) releaseLocked(user, device string) {
	u, ok := g.users[user]
	if !ok {
		return
	}
	if i := slices.IndexFunc(u.devs, func(d devConns) bool { return d.device == device }); i >= 0 {
		if u.devs[i].n--; u.devs[i].n == 0 {
			u.devs = slices.Delete(u.devs, i, i+1)
		}
	}
	if u.n--; u.n <= 0 {
		delete(g.users, user)
		return
	}
	g.users[user] = u
}

// reserveSubs counts n more subscriptions of c (an upper bound of what a
// request adds), or reports that they would take its user past
// MaxUserSubscriptions. A connection no longer registered counts nothing.
func (g *Gateway) reserveSubs(c *conn, n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conns[c.id] != c {
		return true // torn down: the hub forgets it
	}
	u := g.users[c.user]
	if int(u.subs)+n > g.cfg.MaxUserSubscriptions {
		return false
	}
	u.subs += int32(n)
	c.subs += int32(n)
	g.users[c.user] = u
	return true
}

// subsOf returns the subscriptions counted for c.
func (g *Gateway) subsOf(c *conn) int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return int(c.subs)
}

// addSubs changes c's count of subscriptions by delta (negative: given
// back), if c is still registered.
func (g *Gateway) addSubs(c *conn, delta int) {
	if delta == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conns[c.id] != c {
		return
	}
	u := g.users[c.user]
	u.subs += int32(delta)
	c.subs += int32(delta)
	g.users[c.user] = u
}

func (g *Gateway) now() int64 { return g.clock.Now().UnixMilli() }

// ServeHTTP serves GET /v1/ws.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := g.upgrade(w, r); err != nil {
		writeHTTPError(w, err)
	}
}

// refuse is a refused upgrade, written as the API's JSON error.
func refuse(status int, code, format string, args ...any) *apierr.Error {
	return apierr.New(status, code, format, args...)
}

func writeHTTPError(w http.ResponseWriter, err error) {
	if e := apierr.Classify(err); e.Status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", "GET")
	}
	apierr.Write(w, err)
}

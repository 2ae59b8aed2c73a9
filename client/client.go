// Package client is the Go client of presenced's WebSocket protocol
// (docs/protocol.md): one device of one user, holding one socket.
//
// Dial connects, reads the server's welcome and from then on keeps the
// device alive on its own: heartbeats on the server's interval with ±10%
// jitter, reconnects with backoff and jitter as the same device (invisible
// to watchers within the close grace), re-subscriptions, and its rooms
// (Join, WatchRoom) joined and watched again. What the server says arrives
// on Updates as typed values — Event, RoomSnapshot, RoomChange and
// RoomInterval, StateChange, *ServerError; stale or repeated presence is
// dropped by version.
//
//	c, err := client.Dial(ctx, client.Config{URL: "http://127.0.0.1:8080", Token: token})
//	if err != nil { … }
//	defer c.Close()
//	c.Subscribe(ctx, "2", "3")
//	for u := range c.Updates() {
//		switch u := u.(type) {
//		case client.Event:       // u.UserID is u.Status since u.LastSeen
//		case client.StateChange: // connected, disconnected (reconnecting), closed
//		case *client.ServerError:
//		}
//	}
//
// Close leaves the device alive for the close grace; Bye ends it at once.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// Config configures a Client. Zero values take the documented defaults.
type Config struct {
	// URL is the server's base URL: http(s)://host[:port][/prefix] or
	// ws(s)://…; "/v1/ws" is appended unless the path already ends with it.
	URL string

	// Token is the user's HS256 client token, sent as
	// "Authorization: Bearer <token>". TokenFunc, when set, is asked for the
	// token before every connection attempt instead: the server closes a
	// socket whose token expires (CloseTokenExpired), and the client then
	// reconnects with a fresh one as the same device, within the close
	// grace, so nobody watching sees a change. With a fixed Token the
	// client stops when its token expires. Under a -dev server DevUserID
	// may stand in for both.
	Token     string
	TokenFunc func(context.Context) (string, error)
	DevUserID string

	// DeviceID names this device. Empty: the server generates one on the
	// first connection, and the client keeps it for every reconnect.
	DeviceID string

	// Header holds extra HTTP headers for the upgrade request.
	Header http.Header
	// NetDial, when set, opens the TCP connections (proxies, tests).
	NetDial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLSConfig is used for https/wss URLs; nil means the defaults.
	TLSConfig *tls.Config

	// Logger receives connection events; default: discard.
	Logger *slog.Logger

	// MinBackoff and MaxBackoff bound the delay before a reconnect attempt:
	// the n-th failed attempt in a row waits a random duration in
	// [d/2, d] with d = min(MinBackoff·2ⁿ, MaxBackoff). Defaults 250ms and
	// 10s. The first attempts come within the server's close grace (5 s by
	// default), so a dropped connection that comes back at once shows no
	// change to anyone; a longer outage shows the device gone, then back.
	MinBackoff time.Duration
	MaxBackoff time.Duration

	// DialTimeout bounds one connection attempt: TCP, upgrade and welcome.
	// Default 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write to the socket. Default 10s.
	WriteTimeout time.Duration

	// MaxSubscriptions caps the users watched at once; Subscribe beyond it
	// fails with ErrTooManySubscriptions and changes nothing. Keep it at or
	// below the server's -max-subscriptions. Default 500, the server's
	// default.
	MaxSubscriptions int

	// MaxRooms caps the rooms joined at once (Join beyond it fails with
	// ErrTooManyRooms), MaxWatchedRooms the rooms watched (WatchRoom,
	// ErrTooManyWatchedRooms). Keep them at or below the server's
	// -max-rooms and -max-watched-rooms. Defaults 100 and 50, the server's
	// defaults.
	MaxRooms        int
	MaxWatchedRooms int
}

// Defaults of Config.
const (
	DefaultMinBackoff       = 250 * time.Millisecond
	DefaultMaxBackoff       = 10 * time.Second
	DefaultDialTimeout      = 10 * time.Second
	DefaultWriteTimeout     = 10 * time.Second
	DefaultMaxSubscriptions = presence.DefaultMaxSubscriptions
	DefaultMaxRooms         = presence.DefaultMaxRooms
	DefaultMaxWatchedRooms  = 50
)

func (cfg *Config) fill() error {
	if cfg.Token == "" && cfg.TokenFunc == nil && cfg.DevUserID == "" {
		return errors.New("client: no credentials: set Token, TokenFunc or (for -dev servers) DevUserID")
	}
	if cfg.DeviceID != "" {
		if err := presence.ValidateID(cfg.DeviceID); err != nil {
			return fmt.Errorf("client: DeviceID: %w", err)
		}
	}
	if cfg.DevUserID != "" {
		if err := presence.ValidateID(cfg.DevUserID); err != nil {
			return fmt.Errorf("client: DevUserID: %w", err)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		return fmt.Errorf("client: MaxBackoff %s is below MinBackoff %s", cfg.MaxBackoff, cfg.MinBackoff)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.MaxSubscriptions <= 0 {
		cfg.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if cfg.MaxRooms <= 0 {
		cfg.MaxRooms = DefaultMaxRooms
	}
	if cfg.MaxWatchedRooms <= 0 {
		cfg.MaxWatchedRooms = DefaultMaxWatchedRooms
	}
	return nil
}

// endpoint turns the configured base URL into the WebSocket URL of /v1/ws.
func endpoint(base string) (*url.URL, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("client: URL: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	case "ws", "wss":
	default:
		return nil, fmt.Errorf("client: URL %q: scheme must be http, https, ws or wss", base)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("client: URL %q has no host", base)
	}
	if !strings.HasSuffix(u.Path, "/v1/ws") {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/ws"
	}
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return u, nil
}

// Errors callers branch on.
var (
	// ErrClosed: the client was closed (Close, Bye, or a refusal that
	// retrying cannot cure).
	ErrClosed = errors.New("client: closed")
	// ErrTooManySubscriptions: Subscribe would watch more than
	// Config.MaxSubscriptions users.
	ErrTooManySubscriptions = errors.New("client: too many subscriptions")
)

// Client is one connected device. Its methods are safe for concurrent use.
type Client struct {
	cfg      Config
	log      *slog.Logger
	endpoint *url.URL

	ctx       context.Context // canceled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup // the run loop and the pump
	runDone   chan struct{}  // closed when the run loop has ended
	closeOnce sync.Once

	q       *queue
	updates chan Update

	active atomic.Bool
	wake   chan struct{} // cap 1: beat now (the person became active)

	subMu    sync.Mutex // serializes changes of subs with the messages that announce them
	roomMu   sync.Mutex // serializes changes of rooms with the messages that announce them
	roomPace pacer      // spaces room messages below the server's rate

	mu        sync.Mutex // guards the fields below
	welcome   Welcome
	cur       *conn         // nil while disconnected
	connected chan struct{} // closed while cur != nil
	subs      map[string]struct{}
	versions  map[string]uint64    // last version delivered per watched user
	joined    map[string]*conn     // rooms joined → the connection the join went out on (nil: none yet)
	leaving   map[string]struct{}  // rooms left whose leave is still to go out
	watched   map[string]*roomView // rooms watched, as last seen
	state     State
	bye       bool  // Bye was sent: do not reconnect
	err       error // why the client closed itself
}

// Dial connects to the server and returns a Client that keeps the device
// connected until Close or Bye. ctx bounds this first connection only; if it
// fails, Dial returns the error (a *HandshakeError when the server refused
// the upgrade) and nothing is left running.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	ep, err := endpoint(cfg.URL)
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:       cfg,
		log:       cfg.Logger,
		endpoint:  ep,
		runDone:   make(chan struct{}),
		q:         newQueue(),
		updates:   make(chan Update, updatesBuffer),
		wake:      make(chan struct{}, 1),
		connected: make(chan struct{}),
		subs:      make(map[string]struct{}),
		versions:  make(map[string]uint64),
		joined:    make(map[string]*conn),
		leaving:   make(map[string]struct{}),
		watched:   make(map[string]*roomView),
		roomPace:  pacer{every: roomEvery, burst: roomBurst},
		welcome:   Welcome{DeviceID: cfg.DeviceID},
	}
	c.active.Store(true)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	cn, err := c.connect(ctx)
	if err != nil {
		c.cancel()
		return nil, err
	}
	c.setConnected(cn, false)
	c.wg.Add(2)
	go c.run(cn)
	go c.pump()
	return c, nil
}

// Welcome is what the server said when the current (or last) connection
// opened.
type Welcome struct {
	UserID            string
	DeviceID          string
	HeartbeatInterval time.Duration
	TTL               time.Duration
}

// Welcome returns the server's welcome of the current or last connection;
// its DeviceID is the one every reconnect uses.
func (c *Client) Welcome() Welcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.welcome
}

// State reports whether the client is connected right now.
func (c *Client) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// Updates delivers Events, RoomSnapshots, RoomChanges, StateChanges and
// *ServerErrors in the order they happened, starting with
// StateChange{State: Connected}, and is closed once the client has closed
// (after its final StateChange{State: Closed} when the application keeps
// reading).
//
// The client never waits for the application: while it does not read,
// presence of one user coalesces to the newest (one pending Event per user
// at most, keeping the place of the first); a room's changes all wait, up
// to 256 of them, beyond which they give way to one RoomSnapshot of the
// room as it is then; and at most 64 StateChanges and ServerErrors wait,
// the oldest dropped beyond that. A slow reader therefore loses
// intermediate states, never the current one, and never stalls heartbeats
// or the socket.
func (c *Client) Updates() <-chan Update { return c.updates }

// Done is closed when the client has stopped for good: after Close, Bye, or
// a refusal that reconnecting cannot cure; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.runDone }

// Err is the reason the client stopped by itself (nil while running, after
// Close and after a completed Bye).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// SetActive tells whether the person is using the device. Heartbeats of an
// inactive device say "active": false, so the user turns away once idle for
// the server's idle-after; becoming active again beats at once, so the user
// shows online without waiting for the next heartbeat.
func (c *Client) SetActive(active bool) {
	if was := c.active.Swap(active); active && !was {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// Status is a user's presence status as the server shows it.
type Status string

// Statuses. Hidden is what a snapshot shows for a user whose status the
// viewer may not see; Invisible is only ever set (and seen by the user
// themself).
const (
	Hidden    Status = ""
	Online    Status = "online"
	Away      Status = "away"
	Busy      Status = "busy"
	Offline   Status = "offline"
	Invisible Status = "invisible"
)

// SetStatus sets the user's manual status — Online (clears it), Away, Busy
// or Invisible — with an optional text (≤ 140 characters; empty clears it).
// A status or text the server would refuse is an error here and sends
// nothing. While disconnected it waits for the connection until ctx is done.
func (c *Client) SetStatus(ctx context.Context, status Status, text string) error {
	if _, err := presence.ParseManual(string(status)); err != nil {
		return fmt.Errorf("client: status %q: %w", status, err)
	}
	if err := presence.ValidateText(text); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	msg := setStatusMsg{Type: "set_status", Status: string(status)}
	if text != "" {
		msg.Text = &text
	}
	cn, err := c.waitConn(ctx)
	if err != nil {
		return err
	}
	return cn.sendJSON(ctx, msg)
}

// Subscribe watches the given users: one Event with Snapshot set follows for
// each newly watched user whose version is new to the client, then an Event
// for each change. The set of watched users outlives connections: after a
// reconnect the client subscribes again to all of them. While disconnected
// Subscribe only records the ids; an error of the send leaves them recorded
// too, and the reconnect that follows sends them. An id the server would
// refuse is an error, and so is watching more than MaxSubscriptions users
// (ErrTooManySubscriptions); either changes nothing. The server's own
// refusals arrive as *ServerError on Updates.
func (c *Client) Subscribe(ctx context.Context, ids ...string) error {
	return c.watch(ctx, "subscribe", ids, c.addLocked)
}

// Unsubscribe stops watching the given users; no Event about them follows.
// While disconnected it only records the change.
func (c *Client) Unsubscribe(ctx context.Context, ids ...string) error {
	return c.watch(ctx, "unsubscribe", ids, c.removeLocked)
}

// watch changes the set of watched users with change, which runs under mu
// and returns the ids to announce, and announces them as a message of type
// typ — atomically with respect to other changes and to re-subscribing.
func (c *Client) watch(ctx context.Context, typ string, ids []string, change func([]string) ([]string, error)) error {
	if err := validIDs(ids); err != nil {
		return err
	}
	c.subMu.Lock()
	defer c.subMu.Unlock()
	c.mu.Lock()
	if c.isClosedLocked() {
		c.mu.Unlock()
		return ErrClosed
	}
	changed, err := change(ids)
	cn := c.cur
	c.mu.Unlock()
	if err != nil || cn == nil || len(changed) == 0 {
		return err
	}
	return cn.sendJSON(ctx, subscribeMsg{Type: typ, UserIDs: changed})
}

func (c *Client) addLocked(ids []string) ([]string, error) {
	var added []string
	for _, id := range ids {
		if _, ok := c.subs[id]; !ok && !slices.Contains(added, id) {
			added = append(added, id)
		}
	}
	if len(c.subs)+len(added) > c.cfg.MaxSubscriptions {
		return nil, fmt.Errorf("%w: %d watched + %d new > %d", ErrTooManySubscriptions, len(c.subs), len(added), c.cfg.MaxSubscriptions)
	}
	for _, id := range added {
		c.subs[id] = struct{}{}
	}
	return added, nil
}

func (c *Client) removeLocked(ids []string) ([]string, error) {
	var removed []string
	for _, id := range ids {
		if _, ok := c.subs[id]; ok {
			delete(c.subs, id)
			delete(c.versions, id) // a later Subscribe starts afresh
			removed = append(removed, id)
		}
	}
	return removed, nil
}

// Subscriptions returns the watched user ids, sorted.
func (c *Client) Subscriptions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]string, 0, len(c.subs))
	for id := range c.subs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// validIDs refuses ids the server would refuse: one of them would make
// every re-subscribe fail as a whole.
func validIDs(ids []string) error {
	for _, id := range ids {
		if err := presence.ValidateID(id); err != nil {
			return fmt.Errorf("client: user id %q: %w", id, err)
		}
	}
	return nil
}

// Bye ends this device at once — everyone watching sees the user leave if it
// was their last device — and closes the client. While disconnected it waits
// for the connection until ctx is done. The client is closed when Bye
// returns, whatever the outcome.
func (c *Client) Bye(ctx context.Context) error {
	defer c.Close()
	cn, err := c.waitConn(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.bye = true
	c.mu.Unlock()
	if err := cn.sendJSON(ctx, typeMsg{Type: "bye"}); err != nil {
		return fmt.Errorf("client: bye: %w", err)
	}
	// The server closes the socket once the device has ended.
	select {
	case <-c.runDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close disconnects without ending the device (the server keeps it alive
// for its close grace, announced in the welcome, in case it comes back, as
// after a lost connection; see Bye), stops every goroutine of the
// client and waits for them. It is idempotent and always returns nil.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		c.wg.Wait()
	})
	return nil
}

func (c *Client) isClosedLocked() bool { return c.state == Closed || c.ctx.Err() != nil }

// waitConn returns the current connection, waiting for one until ctx is
// done or the client closes.
func (c *Client) waitConn(ctx context.Context) (*conn, error) {
	for {
		c.mu.Lock()
		if c.isClosedLocked() {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		cn, ready := c.cur, c.connected
		c.mu.Unlock()
		if cn != nil {
			return cn, nil
		}
		select {
		case <-ready:
		case <-c.runDone:
			return nil, ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// setConnected makes cn the current connection, announces it, and (after a
// reconnect) subscribes again to every watched user — atomically with
// respect to Subscribe and Unsubscribe, so none of their changes is lost or
// reordered.
func (c *Client) setConnected(cn *conn, resubscribe bool) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	c.mu.Lock()
	c.welcome = cn.welcome
	c.cur = cn
	c.state = Connected
	close(c.connected)
	var ids []string
	var known map[string]uint64
	if resubscribe {
		for id := range c.subs {
			ids = append(ids, id)
		}
		if cn.known && len(c.versions) > 0 {
			known = maps.Clone(c.versions)
		}
	}
	c.mu.Unlock()
	c.log.Info("presence connected", "user_id", cn.welcome.UserID, "device_id", cn.welcome.DeviceID)
	c.q.push(StateChange{State: Connected})
	slices.Sort(ids)
	for len(ids) > 0 {
		n := min(len(ids), subscribeChunk)
		msg := subscribeMsg{Type: "subscribe", UserIDs: ids[:n]}
		for _, id := range msg.UserIDs {
			if v := known[id]; v > 0 { // 0: nothing with a version was shown
				if msg.Known == nil {
					msg.Known = make(map[string]uint64, n)
				}
				msg.Known[id] = v
			}
		}
		if err := cn.sendJSON(c.ctx, msg); err != nil {
			cn.close() // the read loop notices and the run loop reconnects
			return
		}
		ids = ids[n:]
	}
}

// subscribeChunk keeps one re-subscribe message well below the server's
// 64 KiB message limit even with ids of 64 bytes.
const subscribeChunk = 256

func (c *Client) setDisconnected(err error) {
	c.mu.Lock()
	c.cur = nil
	c.state = Disconnected
	c.connected = make(chan struct{})
	c.mu.Unlock()
	c.q.push(StateChange{State: Disconnected, Err: err})
}

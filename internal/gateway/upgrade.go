package gateway

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/apierr"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/origin"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/wire"
)

// upgrade authenticates the request, counts the connection as a heartbeat
// and upgrades it. A refused upgrade returns the JSON error to write.
func (g *Gateway) upgrade(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return refuse(http.StatusMethodNotAllowed, "method_not_allowed", "%s is not allowed on %s (allowed: GET)", r.Method, r.URL.Path)
	}
	// A page of a foreign origin opens nothing (a browser sends its
	// page's Origin on every upgrade and cannot forge it).
	if v, o := g.cfg.Origins.Check(r); v == origin.Refused {
		return origin.Refusal(o)
	}
	g.mu.Lock()
	open := g.running && !g.closing
	g.mu.Unlock()
	if !open {
		return refuse(http.StatusServiceUnavailable, "unavailable", "the node is not taking WebSocket connections")
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return refuse(http.StatusBadRequest, "invalid_query", "malformed query string: %v", err)
	}
	param := func(name string) (string, error) {
		vs := q[name]
		if len(vs) > 1 {
			return "", refuse(http.StatusBadRequest, "invalid_query", "%s is given %d times; give it once", name, len(vs))
		}
		if len(vs) == 0 {
			return "", nil
		}
		return vs[0], nil
	}
	token, err := param("token")
	if err != nil {
		return err
	}
	claimedUser, err := param("user_id")
	if err != nil {
		return err
	}
	claimedDev, err := param("device_id")
	if err != nil {
		return err
	}
	var p auth.Principal
	if token != "" {
		p, err = g.auth.Credential(token)
	} else {
		p, err = g.auth.Request(r)
	}
	if err != nil {
		return err // a 401 (apierr)
	}
	if p.Kind == auth.Backend {
		return refuse(http.StatusForbidden, "forbidden", "the API key is not accepted on a WebSocket: a socket is one user's device; connect with the user's token")
	}
	user, err := p.ActFor(claimedUser)
	if errors.Is(err, auth.ErrNoUser) {
		return refuse(http.StatusBadRequest, "invalid_id", "user_id is required (development mode without a token)")
	}
	if err != nil {
		return err
	}
	var expAt int64 // the token's exp, Unix ms; 0: the credential does not expire
	switch p.Kind {
	case auth.Client:
		if !p.Expires.IsZero() {
			// On a socket exp is exact: the socket would be closed 4003
			// at once, so a token within the leeway after its exp (still
			// taken by HTTP requests) opens none.
			expAt = p.Expires.UnixMilli()
			if g.now() >= expAt {
				return refuse(http.StatusUnauthorized, "unauthorized", "%v: the token expired at %s; connect with a fresh one",
					auth.ErrInvalid, p.Expires.UTC().Format(time.RFC3339))
			}
		}
	default: // Anonymous: only under -dev
		if err := presence.ValidateID(claimedUser); err != nil {
			return refuse(http.StatusBadRequest, "invalid_id", "user_id: %v", err)
		}
		// Every such connection, as every such HTTP request, is logged.
		g.log.Warn("INSECURE development mode: accepted a request without credentials",
			"method", r.Method, "path", r.URL.Path, "user_id", claimedUser, "remote", r.RemoteAddr)
	}
	dev, err := p.DeviceFor(claimedDev)
	if err != nil {
		return err
	}
	if dev == "" {
		dev = newDeviceID()
	} else if err := presence.ValidateID(dev); err != nil {
		return refuse(http.StatusBadRequest, "invalid_id", "device_id: %v", err)
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return refuse(http.StatusUpgradeRequired, "upgrade_required", "%s speaks WebSocket: send a GET with Upgrade: websocket", r.URL.Path)
	}
	// Check the rest of the handshake here, with a JSON answer, so that a
	// handshake the upgrader would refuse never counts as a heartbeat.
	if r.ProtoMajor != 1 || r.ProtoMinor < 1 {
		return refuse(http.StatusHTTPVersionNotSupported, "http_version_not_supported",
			"%s: a WebSocket is opened by an HTTP/1.1 GET (RFC 6455)", r.Proto)
	}
	if err := checkHandshake(r); err != nil {
		return refuse(http.StatusBadRequest, "bad_handshake", "%v", err)
	}
	// The socket keeps its ids for its life: copies, so that it does not
	// keep the request line they were cut from (with a token in the
	// query, hundreds of bytes a socket).
	user, dev = strings.Clone(user), strings.Clone(dev)
	// Its turn among the handshakes and subscribes being set up
	// (Config.Setup), until the welcome: what the client sent with its
	// handshake is fed after, each subscribe taking its own turn.
	if err := g.setup.Enter(r.Context()); err != nil {
		return refuse(http.StatusServiceUnavailable, "unavailable",
			"this node is setting up too many other connections to take this one now; retry in a second")
	}
	leaveSetup := sync.OnceFunc(g.setup.Leave)
	defer leaveSetup()
	// Counted before the heartbeat, so a connection over a cap is none.
	if err := g.reserve(user, dev); err != nil {
		return err
	}
	registered := false
	defer func() {
		if !registered {
			g.release(user, dev)
		}
	}()
	// Connecting is a heartbeat.
	if _, err := g.tracker.SocketConnect(r.Context(), user, dev); err != nil {
		switch e := apierr.Classify(err); {
		case e == apierr.Internal:
			g.log.Error("connect heartbeat failed", "user_id", user, "err", err)
		case e.Status >= 500:
			g.log.Warn("connect heartbeat failed: a backend is unavailable", "user_id", user, "err", err)
		}
		return err
	}

	nc, rw, _, err := ws.HTTPUpgrader{Timeout: g.cfg.WriteTimeout}.Upgrade(r, w)
	if err != nil {
		// The upgrader has answered the handshake error itself.
		if nc != nil {
			nc.Close()
		}
		return nil
	}
	c := &conn{g: g, nc: nc, fd: -1, user: user, device: dev, expAt: expAt, rooms: roomsOf(p), id: g.nextID.Add(1), heapIdx: -1}
	c.idleAt.Store(g.now() + g.ttlMs)
	c.lastBeat.Store(g.now()) // the connect heartbeat
	// What the client sent right after its handshake is already buffered.
	var early []byte
	if n := rw.Reader.Buffered(); n > 0 {
		early, _ = rw.Reader.Peek(n)
		early = append([]byte(nil), early...)
	}
	// Everything a concurrent close may read is set before the connection
	// is registered (and so visible to shutdown). The bytes of a TLS
	// connection on its socket are encrypted: it is read, as it is
	// written, through its tls.Conn, by a goroutine of its own (the
	// portable path); only a plain connection is polled by its socket,
	// which the gateway takes from its net.Conn (detach: an idle socket
	// then costs its conn and the epoll entry, not a netFD, two addresses
	// and a runtime poll descriptor besides).
	_, isTLS := nc.(*tls.Conn)
	if !isTLS && g.polled() {
		c.detach(nc)
	}
	poll, ok := g.register(c)
	if !ok {
		c.closeSocket()
		return nil
	}
	registered = true // unregister gives the place back
	g.stats.accepted.Add(1)
	if isTLS {
		g.stats.acceptedTLS.Add(1)
	}
	c.enqueue(outFrame{op: ws.OpText, data: wire.AppendWelcome(nil, user, dev, presence.SocketBeatInterval(g.cfg.TTL), g.cfg.TTL, g.cfg.CloseGrace)})
	g.idle.push(c.deadline(), c)
	leaveSetup()
	if len(early) > 0 && !c.feed(early) {
		return nil
	}
	if poll != nil && c.hasFD {
		if err := poll.add(c); err != nil {
			g.log.Warn("registering a WebSocket with epoll failed; closing it", "err", err)
			c.teardown()
			return nil
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			// Torn down (shutdown) while being added: forget undid
			// nothing, so undo the add here.
			poll.remove(c)
		}
		return nil
	}
	if c.hasFD || !g.spawn(c.readLoop) {
		c.teardown()
	}
	return nil
}

// newDeviceID is the id of a device whose client brought none: 64 random
// bits in 11 characters (base64url). Short, because a scale-out store
// keeps it with every user online (redisstore's packed users: 11 bytes of
// a ~50-byte user).
func newDeviceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// readLoop is the portable reader: one goroutine per connection.
func (c *conn) readLoop() {
	buf := make([]byte, 4096)
	for {
		n, err := c.nc.Read(buf)
		if n > 0 && !c.feed(buf[:n]) {
			return
		}
		if err != nil {
			c.teardown()
			return
		}
	}
}

var _ net.Conn = (*net.TCPConn)(nil)

// checkHandshake checks what RFC 6455 requires of the opening handshake
// beyond the Upgrade header.
func checkHandshake(r *http.Request) error {
	// The upgrader reads the first Connection field only: so do we.
	if c := r.Header.Values("Connection"); len(c) == 0 || !headerHasToken(http.Header{"Connection": c[:1]}, "Connection", "upgrade") {
		return errors.New(`the (first) Connection header must include "Upgrade"`)
	}
	if r.Host == "" {
		return errors.New("the Host header is missing")
	}
	if v := r.Header.Get("Sec-WebSocket-Version"); v != "13" {
		return fmt.Errorf("Sec-WebSocket-Version %q: only 13 is supported", v)
	}
	key := r.Header.Get("Sec-WebSocket-Key")
	if raw, err := base64.StdEncoding.DecodeString(key); err != nil || len(raw) != 16 {
		return errors.New("Sec-WebSocket-Key must be 16 random bytes in base64")
	}
	return nil
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

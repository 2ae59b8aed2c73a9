package gateway_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tlscert/tlstest"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wsframe"
)

// The tests run real parts — memory store, SQLite, tracker, reader, hub,
// gateway — behind an httptest server on 127.0.0.1, on a fake clock, and
// talk to it over real sockets with a small raw WebSocket client.

const apiKey = "gateway-test-api-key-0123456789abcdef" // as long as a node requires

var (
	secret = []byte("gateway-test-jwt-secret-0123456789abcdef")
	t0     = time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.UTC)
)

type opts struct {
	dev     bool
	ttl     time.Duration
	maxSubs int
	tweak   func(*gateway.Config)
	sndbuf  int // server socket send buffer; 0: the system's
	noHub   bool
	devices int  // max devices per user; 0: the default
	tls     bool // serve HTTPS and WSS with a certificate of a test CA
	// budget serves through a connection budget (connbudget), as a node
	// does; node.budget is it.
	budget bool
	// noRooms runs no room hub (Config.Rooms nil); maxRooms caps the rooms
	// of a device (presence.RoomRules), maxWatched the rooms a connection
	// watches (fanout.RoomConfig); 0: the defaults.
	noRooms              bool
	maxRooms, maxWatched int
}

// smallSendBuffer shrinks the send buffer of accepted sockets, so a slow
// reader fills it quickly.
type smallSendBuffer struct {
	net.Listener
	size int
}

func (l smallSendBuffer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(l.size)
	}
	return c, err
}

type node struct {
	t       testing.TB
	clk     *clock.Fake
	durable *sqlitestore.Store
	tr      *tracker.Tracker
	reader  *query.Reader
	gw      *gateway.Gateway
	hub     hubRunner
	rooms   *fanout.RoomHub // nil with opts.noRooms
	srv     *httptest.Server
	url     string
	stop    context.CancelFunc
	done    chan struct{}
	pubs    *multiPub
	budget  *connbudget.Listener // with opts.budget
	tlsConf *tls.Config          // with opts.tls: trusts the node's certificate
	http    *http.Client         // talks to the node (over TLS with opts.tls)
}

// hubRunner is the fan-out hub as the tests drive it.
type hubRunner interface {
	gateway.Hub
	Publish(*presence.Event)
	ContactsChanged(ctx context.Context, owner string, contacts []string, state fanout.StateFunc)
	Run(ctx context.Context) error
}

type multiPub struct {
	mu    sync.Mutex
	subs  []func(*presence.Event)
	rooms []func(*presence.RoomEvent)
}

// PublishRoom passes a join or leave on (tracker.RoomPublisher).
func (m *multiPub) PublishRoom(ev *presence.RoomEvent) {
	m.mu.Lock()
	rooms := m.rooms
	m.mu.Unlock()
	for _, f := range rooms {
		f(ev)
	}
}

func (m *multiPub) Publish(ev *presence.Event) {
	m.mu.Lock()
	subs := m.subs
	m.mu.Unlock()
	for _, f := range subs {
		f(ev)
	}
}

func newNode(t testing.TB, o opts) *node {
	t.Helper()
	if o.ttl == 0 {
		o.ttl = 30 * time.Second
	}
	ctx := context.Background()
	n := &node{t: t, clk: clock.NewFake(t0), pubs: &multiPub{}, done: make(chan struct{})}
	durable, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(t.TempDir(), "p.db")})
	if err != nil {
		t.Fatal(err)
	}
	n.durable = durable
	epoch, err := durable.NextEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rules := presence.Rules{TTL: o.ttl, IdleAfter: 5 * time.Minute, Epoch: epoch, MaxDevices: o.devices}
	store := memstore.New(memstore.Config{Rules: rules, RoomRules: presence.RoomRules{MaxRooms: o.maxRooms}})
	n.tr, err = tracker.New(tracker.Config{Store: store, Durable: durable, Publisher: n.pubs, Clock: n.clk})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := query.New(query.Config{States: store, Profiles: durable, Contacts: durable, Clock: n.clk, Rooms: roomPages{n.tr}})
	if err != nil {
		t.Fatal(err)
	}
	n.reader = reader
	if !o.noHub {
		n.hub = newHub(t, durable, o.maxSubs)
	}
	if n.hub != nil {
		n.pubs.subs = append(n.pubs.subs, n.hub.Publish)
	}
	if !o.noRooms {
		n.rooms, err = fanout.NewRoomHub(fanout.RoomConfig{Reader: roomSnapshots{reader}, Contacts: durable, MaxWatched: o.maxWatched, Clock: n.clk})
		if err != nil {
			t.Fatal(err)
		}
		n.pubs.subs = append(n.pubs.subs, n.rooms.Publish)
		n.pubs.rooms = append(n.pubs.rooms, n.rooms.PublishRoom)
	}
	cfg := gateway.Config{
		Tracker:          n.tr,
		Reader:           reader,
		Auth:             auth.New(auth.Config{APIKey: apiKey, JWTSecret: secret, Dev: o.dev, Clock: n.clk}),
		Clock:            n.clk,
		TTL:              o.ttl,
		MaxSubscriptions: o.maxSubs,
		IdleCheck:        5 * time.Millisecond,
		WriteTimeout:     2 * time.Second,
	}
	if n.hub != nil {
		cfg.Hub = n.hub
	}
	if n.rooms != nil {
		cfg.Rooms = n.rooms
	}
	if o.tweak != nil {
		o.tweak(&cfg)
	}
	n.gw, err = gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	n.stop = cancel
	var wg sync.WaitGroup
	if n.hub != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _ = n.hub.Run(rctx) }()
	}
	if n.rooms != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _ = n.rooms.Run(rctx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = n.gw.Run(rctx) }()
	go func() { wg.Wait(); close(n.done) }()
	n.srv = httptest.NewUnstartedServer(n.gw)
	if o.sndbuf > 0 {
		n.srv.Listener = smallSendBuffer{n.srv.Listener, o.sndbuf}
	}
	if o.budget {
		n.budget = connbudget.New(n.srv.Listener, connbudget.Config{Max: 1000, PerAddr: 1000, Pending: 100})
		n.srv.Listener, n.srv.Config.ConnState = n.budget, n.budget.ConnState
	}
	n.http = http.DefaultClient
	if o.tls {
		ca := tlstest.NewCA(t)
		cert, err := tls.LoadX509KeyPair(ca.Issue(t, t.TempDir(), "node", 2))
		if err != nil {
			t.Fatal(err)
		}
		n.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		n.srv.StartTLS()
		n.tlsConf = ca.ClientConfig()
		n.http = &http.Client{Transport: &http.Transport{TLSClientConfig: n.tlsConf}}
	} else {
		n.srv.Start()
	}
	n.url = "ws" + strings.TrimPrefix(n.srv.URL, "http")
	// Wait until Run has started.
	testwait.For(t, "gateway running", func() bool {
		resp, err := n.http.Get(n.srv.URL + "/v1/ws?token=x")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode != http.StatusServiceUnavailable
	})
	t.Cleanup(n.close)
	return n
}

func (n *node) close() {
	n.stop()
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		n.t.Error("gateway did not stop")
	}
	n.srv.Close()
	_ = n.durable.Close()
}

func (n *node) token(user, device string) string {
	n.t.Helper()
	tok, err := auth.Sign(secret, user, device, n.clk.Now(), time.Hour)
	if err != nil {
		n.t.Fatal(err)
	}
	return tok
}

// client is a raw WebSocket client.
type client struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
}

// dial connects as user with a token (device may be empty).
func (n *node) dial(user, device string) *client {
	n.t.Helper()
	q := "?token=" + n.token(user, "")
	if device != "" {
		q += "&device_id=" + device
	}
	return n.dialQuery(q, nil)
}

func (n *node) dialQuery(q string, hdr http.Header) *client {
	n.t.Helper()
	d := ws.Dialer{Timeout: 5 * time.Second, TLSConfig: n.tlsConf}
	if hdr != nil {
		d.Header = ws.HandshakeHeaderHTTP(hdr)
	}
	nc, br, _, err := d.Dial(context.Background(), n.url+"/v1/ws"+q)
	if err != nil {
		n.t.Fatalf("dial: %v", err)
	}
	c := &client{t: n.t, nc: nc, r: bufio.NewReader(nc)}
	if br != nil {
		c.r = br
	}
	n.t.Cleanup(func() { nc.Close() })
	return c
}

func (c *client) sendFrame(op ws.OpCode, fin bool, p []byte) {
	c.t.Helper()
	f := ws.NewFrame(op, fin, append([]byte(nil), p...))
	f = ws.MaskFrameInPlace(f)
	_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := ws.WriteFrame(c.nc, f); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *client) send(s string) { c.t.Helper(); c.sendFrame(ws.OpText, true, []byte(s)) }

// frame reads the next frame.
func (c *client) frame(timeout time.Duration) (ws.Frame, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	return wsframe.Read(c.r)
}

// msg reads the next text message and decodes it.
func (c *client) msg() map[string]any {
	c.t.Helper()
	for {
		f, err := c.frame(5 * time.Second)
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		switch f.Header.OpCode {
		case ws.OpPing, ws.OpPong:
			continue
		case ws.OpClose:
			code, reason := ws.ParseCloseFrameData(f.Payload)
			c.t.Fatalf("closed %d %q while waiting for a message", code, reason)
		}
		var m map[string]any
		if err := json.Unmarshal(f.Payload, &m); err != nil {
			c.t.Fatalf("message %q: %v", f.Payload, err)
		}
		return m
	}
}

// msgType reads the next message and checks its type.
func (c *client) msgType(typ string) map[string]any {
	c.t.Helper()
	m := c.msg()
	if m["type"] != typ {
		c.t.Fatalf("got message %v, want type %q", m, typ)
	}
	return m
}

// errorCode reads the next message, which must be an error with code.
func (c *client) errorCode(code string) {
	c.t.Helper()
	m := c.msgType("error")
	if m["code"] != code {
		c.t.Fatalf("got error %v, want code %q", m, code)
	}
	if s, _ := m["message"].(string); s == "" {
		c.t.Fatalf("error %v has no message", m)
	}
}

// closed reads until a close frame and checks its code; the socket must then
// end.
func (c *client) closed(code ws.StatusCode) {
	c.t.Helper()
	for {
		f, err := c.frame(5 * time.Second)
		if err != nil {
			c.t.Fatalf("waiting for close %d: %v", code, err)
		}
		if f.Header.OpCode != ws.OpClose {
			continue
		}
		got, reason := ws.ParseCloseFrameData(f.Payload)
		if got != code {
			c.t.Fatalf("closed %d %q, want %d", got, reason, code)
		}
		_, err = c.frame(5 * time.Second)
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !strings.Contains(errString(err), "reset") {
			c.t.Fatalf("after the close frame: %v, want EOF", err)
		}
		return
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// silent checks that no message arrives within d.
func (c *client) silent(d time.Duration) {
	c.t.Helper()
	f, err := c.frame(d)
	if err == nil {
		c.t.Fatalf("got opcode %d %q, want nothing", f.Header.OpCode, f.Payload)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatalf("want silence, got %v", err)
	}
}

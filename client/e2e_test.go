package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/testwait"
)

// The client against the real server, in process on a loopback port.

// The node's credentials, as long as it requires outside -dev.
var secret = []byte("client-test-jwt-secret-0123456789abcdef")

const apiKey = "client-test-api-key-0123456789abcdef"

// node is one running presenced.
type node struct {
	t    *testing.T
	dir  string
	addr string
	opts []func(*app.Config)
	stop context.CancelFunc
	done chan error
}

// startNode runs presenced on addr ("127.0.0.1:0" for any port) with its
// state in dir, a ttl of 5s and opts applied to its configuration; the test
// stops it at the end unless it did so itself.
func startNode(t *testing.T, dir, addr string, opts ...func(*app.Config)) *node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := app.Config{DataDir: dir, APIKey: apiKey, JWTSecret: secret, TTL: 5 * time.Second, PollInterval: -1}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := app.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var ln net.Listener
	defer func() {
		if ln == nil { // NoErr failed the test
			cancel()
			a.Close()
		}
	}()
	testwait.NoErr(t, "listen on "+addr, func() error { // a restarted node takes its old port back
		ln, err = net.Listen("tcp", addr)
		return err
	})
	n := &node{t: t, dir: dir, addr: ln.Addr().String(), opts: opts, stop: cancel, done: make(chan error, 1)}
	go func() { n.done <- a.Run(ctx, ln) }()
	t.Cleanup(n.shutdown)
	// Run serves HTTP while the gateway is still starting (503 until then).
	probe := n.url() + "/v1/ws?token=" + token(t, "probe")
	testwait.For(t, "the gateway to take connections", func() bool {
		resp, err := http.Get(probe) // no Upgrade header: refused before any heartbeat
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode != http.StatusServiceUnavailable
	})
	return n
}

func (n *node) shutdown() {
	n.stop()
	if err := <-n.done; err != nil {
		n.t.Errorf("node: %v", err)
	}
	n.done <- nil // later calls return at once
}

// restart stops the node and starts a new one on the same port and data.
func (n *node) restart() *node {
	n.shutdown()
	return startNode(n.t, n.dir, n.addr, n.opts...)
}

func (n *node) url() string { return "http://" + n.addr }

func token(t *testing.T, user string) string {
	t.Helper()
	tok, err := auth.Sign(secret, user, "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// dial connects user's device with quick reconnects.
func dial(t *testing.T, n *node, user, device string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{
		URL: n.url(), Token: token(t, user), DeviceID: device,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("dial %s: %v", user, err)
	}
	t.Cleanup(func() { c.Close() })
	if u := next(t, c); u != (client.StateChange{State: client.Connected}) {
		t.Fatalf("first update = %#v, want Connected", u)
	}
	return c
}

func next(t *testing.T, c *client.Client) client.Update {
	t.Helper()
	select {
	case u, ok := <-c.Updates():
		if !ok {
			t.Fatal("Updates closed")
		}
		return u
	case <-time.After(10 * time.Second):
		t.Fatal("no update")
	}
	return nil
}

// nextEvent skips connection state changes.
func nextEvent(t *testing.T, c *client.Client) client.Event {
	t.Helper()
	for {
		switch u := next(t, c).(type) {
		case client.Event:
			return u
		case client.StateChange:
			continue
		default:
			t.Fatalf("update = %#v, want an Event", u)
		}
	}
}

// quiet asserts that c delivers nothing for d.
func quiet(t *testing.T, c *client.Client, d time.Duration) {
	t.Helper()
	select {
	case u := <-c.Updates():
		t.Fatalf("unexpected update %#v", u)
	case <-time.After(d):
	}
}

// debugUser reads why user shows what it shows (GET /v1/debug/users/{id}).
func debugUser(t *testing.T, n *node, user string) (status string, devices []string) {
	t.Helper()
	req, _ := http.NewRequest("GET", n.url()+"/v1/debug/users/"+user, nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var d struct {
		Status  string `json:"status"`
		Devices []struct {
			DeviceID string `json:"device_id"`
			Alive    bool   `json:"alive"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatalf("debug %s: %v: %s", user, err, body)
	}
	for _, dev := range d.Devices {
		if dev.Alive {
			devices = append(devices, dev.DeviceID)
		}
	}
	return d.Status, devices
}

func TestE2EWelcomeAndDevice(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := dial(t, n, "1", "")
	w := c.Welcome()
	if w.UserID != "1" || w.DeviceID == "" || w.TTL != 5*time.Second || w.HeartbeatInterval <= 0 || w.HeartbeatInterval >= w.TTL {
		t.Fatalf("welcome = %+v", w)
	}
	if status, devices := debugUser(t, n, "1"); status != "online" || fmt.Sprint(devices) != "["+w.DeviceID+"]" {
		t.Fatalf("after connecting: %s with devices %v, want online with %s", status, devices, w.DeviceID)
	}
	named := dial(t, n, "1", "phone")
	if got := named.Welcome().DeviceID; got != "phone" {
		t.Fatalf("device id = %q, want phone", got)
	}
	if c.State() != client.Connected {
		t.Fatalf("state = %s", c.State())
	}
}

func TestE2ERefused(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	bad, _ := auth.Sign([]byte("other secret"), "1", "", time.Now(), time.Hour)
	for _, cfg := range []client.Config{
		{URL: n.url(), Token: bad},
		{URL: n.url(), Token: apiKey}, // a backend key is not a device
		{URL: n.url(), DevUserID: "1"},
	} {
		_, err := client.Dial(ctx, cfg)
		var he *client.HandshakeError
		if !errors.As(err, &he) || he.StatusCode/100 != 4 || he.Code == "" {
			t.Errorf("Dial(%+v) = %v, want a 4xx HandshakeError with a code", cfg, err)
		}
	}
}

func TestE2ESetStatusAndBye(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := dial(t, n, "1", "laptop")
	ctx := context.Background()
	if err := c.SetStatus(ctx, client.Busy, "in a meeting"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "busy", func() bool { s, _ := debugUser(t, n, "1"); return s == "busy" })
	if err := c.SetStatus(ctx, "sleeping", ""); err == nil {
		t.Fatal("SetStatus accepted an unknown status")
	}
	if err := c.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	if status, devices := debugUser(t, n, "1"); status != "offline" || len(devices) != 0 {
		t.Fatalf("after bye: %s with devices %v, want offline with none", status, devices)
	}
	if u := next(t, c); u != (client.StateChange{State: client.Closed}) {
		t.Fatalf("update = %#v, want Closed without error", u)
	}
	if _, ok := <-c.Updates(); ok {
		t.Fatal("Updates open after Closed")
	}
	if err := c.SetStatus(ctx, client.Online, ""); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("SetStatus after Bye = %v, want ErrClosed", err)
	}
}

func TestE2EReconnectAfterRestartKeepsDevice(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := dial(t, n, "1", "")
	device := c.Welcome().DeviceID

	n = n.restart() // closes every socket with 1001
	u := next(t, c)
	var ce *client.CloseError
	if sc, ok := u.(client.StateChange); !ok || sc.State != client.Disconnected || !errors.As(sc.Err, &ce) || ce.Code != 1001 {
		t.Fatalf("update = %#v, want Disconnected by 1001", u)
	}
	if u := next(t, c); u != (client.StateChange{State: client.Connected}) {
		t.Fatalf("update = %#v, want Connected", u)
	}
	if got := c.Welcome().DeviceID; got != device {
		t.Fatalf("device after reconnect = %q, want %q", got, device)
	}
	if status, devices := debugUser(t, n, "1"); status != "online" || fmt.Sprint(devices) != "["+device+"]" {
		t.Fatalf("after reconnecting: %s with devices %v, want online with only %s", status, devices, device)
	}
}

// clientGoroutines counts the goroutines running code of package client
// (the server's run in the same process, so runtime.NumGoroutine alone
// would count theirs too).
func clientGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "presenced/client.") {
			count++
		}
	}
	return count
}

func TestE2ECloseStopsEverything(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	testwait.For(t, "the goroutines of earlier tests to end", func() bool { return clientGoroutines() == 0 })
	var cs []*client.Client
	for i := range 5 {
		cs = append(cs, dial(t, n, fmt.Sprint(i), ""))
	}
	cs[0].SetActive(false)
	cs[1].Subscribe(context.Background(), "3")
	if n := clientGoroutines(); n < 2*len(cs) {
		t.Fatalf("only %d goroutines of %d clients: is the count blind?", n, len(cs))
	}
	for _, c := range cs {
		c.Close()
		c.Close() // idempotent
		select {
		case <-c.Done():
		default:
			t.Fatal("Done open after Close")
		}
	}
	testwait.For(t, "the goroutines of the clients to end", func() bool { return clientGoroutines() == 0 })
	// Close leaves the device alive until its ttl, like a lost connection.
	if status, devices := debugUser(t, n, "2"); status != "online" || len(devices) != 1 {
		t.Fatalf("after Close: %s with devices %v, want still online", status, devices)
	}
}

// TestE2ETokenRenewal: the server closes a socket whose token expires
// (4003); a client with a TokenFunc reconnects with a fresh token as the
// same device, and a watcher of the user sees nothing of it.
func TestE2ETokenRenewal(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	watcher := dial(t, n, "w", "")
	ctx := context.Background()
	if err := watcher.Subscribe(ctx, "1"); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, watcher); ev.Status != client.Offline {
		t.Fatalf("snapshot %+v, want offline", ev)
	}

	// Tokens of 2 s: exp is in whole seconds, so each lives 1-2 s.
	var minted atomic.Int32
	c, err := client.Dial(ctx, client.Config{
		URL: n.url(), DeviceID: "phone",
		TokenFunc: func(context.Context) (string, error) {
			minted.Add(1)
			return auth.Sign(secret, "1", "", time.Now(), 2*time.Second)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if ev := nextEvent(t, watcher); ev.Status != client.Online {
		t.Fatalf("event %+v, want online", ev)
	}
	// Two renewals, each a 4003 close and a reconnect as the same device.
	renewals := 0
	for renewals < 2 {
		switch u := next(t, c).(type) {
		case client.StateChange:
			var ce *client.CloseError
			if u.State == client.Disconnected && (!errors.As(u.Err, &ce) || ce.Code != client.CloseTokenExpired) {
				t.Fatalf("disconnected by %v, want a close %d", u.Err, client.CloseTokenExpired)
			}
			if u.State == client.Closed {
				t.Fatalf("closed: %v", u.Err)
			}
			if u.State == client.Connected && minted.Load() > 1 {
				renewals++
			}
		}
	}
	if got := c.Welcome().DeviceID; got != "phone" {
		t.Fatalf("device after renewals %q, want phone", got)
	}
	// A change after the renewals reaches the watcher after anything they
	// caused: the watcher's next event is that change, no offline before.
	if err := c.SetStatus(ctx, client.Busy, ""); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, watcher); ev.Status != client.Busy {
		t.Fatalf("watcher's event after the renewals %+v, want busy (nothing else)", ev)
	}
	if status, devices := debugUser(t, n, "1"); status != "busy" || fmt.Sprint(devices) != "[phone]" {
		t.Fatalf("after renewals: %s with devices %v, want busy with only phone", status, devices)
	}
}

// TestE2ETokenExpiresWithoutTokenFunc: with a fixed token the client stops
// when the server closes for its expiry; the device is left to its close
// grace, as after a lost connection, not ended.
func TestE2ETokenExpiresWithoutTokenFunc(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	tok, err := auth.Sign(secret, "1", "", time.Now(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(context.Background(), client.Config{URL: n.url(), Token: tok, DeviceID: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if u := next(t, c); u != (client.StateChange{State: client.Connected}) {
		t.Fatalf("first update %#v, want Connected", u)
	}
	u, _ := next(t, c).(client.StateChange)
	var ce *client.CloseError
	if u.State != client.Closed || !errors.As(u.Err, &ce) || ce.Code != client.CloseTokenExpired {
		t.Fatalf("update %+v, want Closed by %d (no reconnect with the expired token)", u, client.CloseTokenExpired)
	}
	if ce := new(client.CloseError); !errors.As(c.Err(), &ce) {
		t.Fatalf("Err() = %v, want the CloseError", c.Err())
	}
	if status, devices := debugUser(t, n, "1"); status != "online" || fmt.Sprint(devices) != "[phone]" {
		t.Fatalf("after the expiry: %s with devices %v, want phone alive in its close grace", status, devices)
	}
}

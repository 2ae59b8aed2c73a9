package client_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/app"
)

// cutter dials through the network and can cut every connection it made,
// like a phone that loses signal: the server sees no close frame. While
// held it fails every dial, like a phone out of reach.
type cutter struct {
	mu    sync.Mutex // guards the fields below
	conns []net.Conn
	held  bool
}

func (c *cutter) hold(held bool) {
	c.mu.Lock()
	c.held = held
	c.mu.Unlock()
}

func (c *cutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	if held {
		return nil, errors.New("cutter: no network")
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err == nil {
		c.mu.Lock()
		c.conns = append(c.conns, nc)
		c.mu.Unlock()
	}
	return nc, err
}

func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nc := range c.conns {
		nc.Close()
	}
	c.conns = nil
}

// dialCut is dial with a cutter of the device's connections.
func dialCut(t *testing.T, n *node, user, device string) (*client.Client, *cutter) {
	t.Helper()
	cut := &cutter{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{
		URL: n.url(), Token: token(t, user), DeviceID: device, NetDial: cut.dial,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("dial %s: %v", user, err)
	}
	t.Cleanup(func() { c.Close() })
	if u := next(t, c); u != (client.StateChange{State: client.Connected}) {
		t.Fatalf("first update = %#v, want Connected", u)
	}
	return c, cut
}

// wantPresence takes the next Event and checks it.
func wantPresence(t *testing.T, c *client.Client, user string, status client.Status, snapshot bool) client.Event {
	t.Helper()
	ev := nextEvent(t, c)
	if ev.UserID != user || ev.Status != status || ev.Snapshot != snapshot {
		t.Fatalf("event = %+v, want %s %s (snapshot %v)", ev, user, status, snapshot)
	}
	return ev
}

// isState reports whether u is a change to state s.
func isState(u client.Update, s client.State) bool {
	sc, ok := u.(client.StateChange)
	return ok && sc.State == s
}

// wantReconnected takes Disconnected then Connected.
func wantReconnected(t *testing.T, c *client.Client) {
	t.Helper()
	if u := next(t, c); !isState(u, client.Disconnected) {
		t.Fatalf("update = %#v, want Disconnected", u)
	}
	if u := next(t, c); u != (client.StateChange{State: client.Connected}) {
		t.Fatalf("update = %#v, want Connected", u)
	}
}

func TestE2ESubscribeSnapshotAndChanges(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	w := dial(t, n, "9", "watcher")
	if err := w.Subscribe(ctx, "2"); err != nil {
		t.Fatal(err)
	}
	snap := wantPresence(t, w, "2", client.Offline, true)
	if !snap.LastSeen.IsZero() || snap.StatusText != nil {
		t.Fatalf("snapshot of a user never seen = %+v", snap)
	}

	d := dial(t, n, "2", "phone")
	online := wantPresence(t, w, "2", client.Online, false)
	if online.Version == 0 || online.LastSeen.IsZero() {
		t.Fatalf("online = %+v, want a version and a last_seen", online)
	}
	if err := d.SetStatus(ctx, client.Busy, "in a meeting"); err != nil {
		t.Fatal(err)
	}
	busy := wantPresence(t, w, "2", client.Busy, false)
	if busy.StatusText == nil || *busy.StatusText != "in a meeting" || busy.Version <= online.Version {
		t.Fatalf("busy = %+v after %+v", busy, online)
	}
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	off := wantPresence(t, w, "2", client.Offline, false)
	if off.Version <= busy.Version {
		t.Fatalf("offline = %+v after %+v", off, busy)
	}

	// After Unsubscribe nothing more arrives about the user.
	if err := w.Unsubscribe(ctx, "2"); err != nil {
		t.Fatal(err)
	}
	dial(t, n, "2", "phone")
	quiet(t, w, 300*time.Millisecond)
}

func TestE2EReconnectWithinTTLIsInvisible(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	d, cut := dialCut(t, n, "2", "")
	device := d.Welcome().DeviceID
	w := dial(t, n, "9", "watcher")
	if err := w.Subscribe(ctx, "2"); err != nil {
		t.Fatal(err)
	}
	wantPresence(t, w, "2", client.Online, true)

	cut.cut() // the device loses its connection
	wantReconnected(t, d)
	if got := d.Welcome().DeviceID; got != device {
		t.Fatalf("device after reconnect = %q, want %q", got, device)
	}
	if _, devices := debugUser(t, n, "2"); len(devices) != 1 || devices[0] != device {
		t.Fatalf("devices after reconnect = %v, want only %s", devices, device)
	}
	quiet(t, w, 500*time.Millisecond) // the watcher sees nothing at all

	// The device still works after the reconnect.
	if err := d.SetStatus(ctx, client.Away, ""); err != nil {
		t.Fatal(err)
	}
	wantPresence(t, w, "2", client.Away, false)
}

func TestE2EWatcherReconnectResubscribes(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	d := dial(t, n, "2", "phone")
	w, cut := dialCut(t, n, "9", "watcher")
	if err := w.Subscribe(ctx, "2", "3"); err != nil {
		t.Fatal(err)
	}
	before := wantPresence(t, w, "2", client.Online, true)
	wantPresence(t, w, "3", client.Offline, true)

	cut.cut() // the watcher loses its connection
	wantReconnected(t, w)
	// The re-subscribe's snapshot repeats versions already seen: dropped.
	quiet(t, w, 300*time.Millisecond)

	if err := d.SetStatus(ctx, client.Busy, ""); err != nil {
		t.Fatal(err)
	}
	if ev := wantPresence(t, w, "2", client.Busy, false); ev.Version <= before.Version {
		t.Fatalf("busy = %+v after %+v", ev, before)
	}
}

func TestE2ERestartResubscribesAndCatchesUp(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	w := dial(t, n, "9", "watcher")
	if err := w.Subscribe(ctx, "2"); err != nil {
		t.Fatal(err)
	}
	wantPresence(t, w, "2", client.Offline, true)

	n = n.restart()
	wantReconnected(t, w)
	// A change while the watcher was away shows in the new snapshot.
	d := dial(t, n, "2", "phone")
	if err := d.SetStatus(ctx, client.Busy, ""); err != nil {
		t.Fatal(err)
	}
	for {
		ev := nextEvent(t, w)
		if ev.UserID != "2" {
			t.Fatalf("event = %+v", ev)
		}
		if ev.Status == client.Busy {
			break
		}
	}
}

func TestE2EIdleDeviceTurnsAway(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0", func(c *app.Config) {
		c.TTL = 2 * time.Second // heartbeats every 500ms
		c.IdleAfter = 2 * time.Second
	})
	ctx := context.Background()
	d := dial(t, n, "2", "phone")
	w := dial(t, n, "9", "watcher")
	if err := w.Subscribe(ctx, "2"); err != nil {
		t.Fatal(err)
	}
	wantPresence(t, w, "2", client.Online, true)
	// Heartbeats that count as activity keep the user online past idle-after.
	quiet(t, w, 2500*time.Millisecond)

	d.SetActive(false) // heartbeats now say "active": false
	wantPresence(t, w, "2", client.Away, false)
	d.SetActive(true) // beats at once
	wantPresence(t, w, "2", client.Online, false)
}

func TestE2EServerErrors(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0", func(c *app.Config) { c.MaxSubscriptions = 2 })
	ctx := context.Background()
	w := dial(t, n, "9", "watcher") // the client's own cap is the default 500
	if err := w.Subscribe(ctx, "1", "2", "3"); err != nil {
		t.Fatal(err)
	}
	u := next(t, w)
	if se, ok := u.(*client.ServerError); !ok || se.Code != "too_many_subscriptions" || se.Message == "" {
		t.Fatalf("update = %#v, want the server's too_many_subscriptions", u)
	}
	// The connection stays up.
	if err := w.Subscribe(ctx, "4"); err != nil {
		t.Fatal(err)
	}
	wantPresence(t, w, "4", client.Offline, true)
}

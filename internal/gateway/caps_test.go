package gateway_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/testwait"
)

// upgradeRequest sends a valid WebSocket handshake as user's device and
// returns the answer without upgrading.
func (n *node) upgradeRequest(user, device string) *http.Response {
	n.t.Helper()
	req, err := http.NewRequest("GET", n.srv.URL+"/v1/ws?token="+n.token(user, "")+"&device_id="+device, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	for k, v := range map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatal(err)
	}
	return resp
}

// TestSocketCaps: one device and one user hold a bounded number of
// sockets; one more is refused before the upgrade (429, not a heartbeat),
// and a closed socket gives its place back.
func TestSocketCaps(t *testing.T) {
	n := newNode(t, opts{tweak: func(c *gateway.Config) { c.MaxSocketsPerDevice = 2; c.MaxSocketsPerUser = 3 }})
	a := n.dial("u", "d1")
	a.msgType("welcome")
	n.dial("u", "d1").msgType("welcome")
	wantJSONError(t, "a third socket of d1", n.upgradeRequest("u", "d1"), http.StatusTooManyRequests, "too_many_sockets")
	n.dial("u", "d2").msgType("welcome")
	wantJSONError(t, "a fourth socket of u", n.upgradeRequest("u", "d3"), http.StatusTooManyRequests, "too_many_sockets")
	u, _, _, err := n.tr.Debug(context.Background(), "u")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range u.Devices {
		if d.ID == "d3" {
			t.Fatal("the refused socket of d3 counted as a heartbeat")
		}
	}
	// Another user is not affected.
	n.dial("v", "d1").msgType("welcome")
	// A socket closed: its place is free again.
	a.nc.Close()
	testwait.For(t, "the closed socket's place", func() bool {
		resp := n.upgradeRequest("u", "d3")
		resp.Body.Close()
		return resp.StatusCode == http.StatusSwitchingProtocols
	})
}

// TestUserSubscriptionCap: a user's subscriptions across all their sockets
// are bounded; a request over it adds nothing, and unsubscribing or
// closing a socket gives its subscriptions back.
func TestUserSubscriptionCap(t *testing.T) {
	n := newNode(t, opts{maxSubs: 3, tweak: func(c *gateway.Config) { c.MaxUserSubscriptions = 5 }})
	a, b := n.dial("w", "a"), n.dial("w", "b")
	a.msgType("welcome")
	b.msgType("welcome")
	a.watch("1", "2", "3")
	b.send(`{"type":"subscribe","user_ids":["4","5","6"]}`)
	b.errorCode("too_many_subscriptions")
	if got := n.hub.(*fanout.Hub).Stats().Subscriptions; got != 3 {
		t.Fatalf("%d subscriptions after a refused request, want 3", got)
	}
	b.watch("4", "5")
	a.send(`{"type":"unsubscribe","user_ids":["1","9"]}`) // 9 was never watched
	testwait.For(t, "the unsubscribe", func() bool { return n.hub.(*fanout.Hub).Stats().Subscriptions == 4 })
	b.watch("6")
	// b holds 3, a 2: a closed, another socket may take its 2.
	a.nc.Close()
	testwait.For(t, "a's subscriptions gone", func() bool { return n.hub.(*fanout.Hub).Stats().Subscriptions == 3 })
	c := n.dial("w", "c")
	c.msgType("welcome")
	c.watch("7", "8")
	c.send(`{"type":"subscribe","user_ids":["9"]}`)
	c.errorCode("too_many_subscriptions")
}

// TestDevConnectionsLogged: under -dev every WebSocket opened without
// credentials is logged, as every such HTTP request is.
func TestDevConnectionsLogged(t *testing.T) {
	var logs syncLog
	n := newNode(t, opts{dev: true, tweak: func(c *gateway.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}})
	for _, user := range []string{"a", "b", "a"} {
		n.dialQuery("?user_id="+user, nil).msgType("welcome")
	}
	if got := strings.Count(logs.String(), "INSECURE development mode: accepted a request without credentials"); got != 3 {
		t.Fatalf("%d warnings for 3 connections without credentials:\n%s", got, logs.String())
	}
}

type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

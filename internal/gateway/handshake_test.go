package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
)

// TestBadHandshakeIsNoHeartbeat: a handshake the upgrader would refuse is
// answered with a JSON error and creates no device.
func TestBadHandshakeIsNoHeartbeat(t *testing.T) {
	n := newNode(t, opts{})
	tests := []struct {
		name string
		hdr  map[string]string
	}{
		{"no key", map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"}},
		{"short key", map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "c2hvcnQ="}},
		{"old version", map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "8", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}},
		{"no Connection upgrade", map[string]string{"Upgrade": "websocket", "Connection": "keep-alive", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}},
	}
	for _, tc := range tests {
		req, err := http.NewRequest("GET", n.srv.URL+"/v1/ws?token="+n.token("ghost", ""), nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range tc.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		wantJSONError(t, tc.name, resp, http.StatusBadRequest, "bad_handshake")
	}
	wantNoState(t, n, "ghost")
}

// wantJSONError checks that resp is a JSON error with status and code,
// and closes its body.
func wantJSONError(t *testing.T, what string, resp *http.Response, status int, code string) {
	t.Helper()
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	derr := json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != status || derr != nil || body.Error.Code != code || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("%s: got %d %q (%v), want %d JSON %s", what, resp.StatusCode, body.Error.Code, derr, status, code)
	}
}

// wantNoState checks that refused upgrades left user without a device or
// any state.
func wantNoState(t *testing.T, n *node, user string) {
	t.Helper()
	if _, _, ok, err := n.tr.Debug(context.Background(), user); err != nil || ok {
		t.Errorf("after refused upgrades: %s held=%v err=%v, want no device, no state", user, ok, err)
	}
}

// TestRefusedUpgradeOfAnyVersionIsNoHeartbeat: an upgrade the upgrader
// would refuse for its HTTP version, or for a Connection header it reads
// differently (it reads the first field only), is answered with a JSON
// error before anything counts as a heartbeat.
func TestRefusedUpgradeOfAnyVersionIsNoHeartbeat(t *testing.T) {
	n := newNode(t, opts{})
	addr := strings.TrimPrefix(n.srv.URL, "http://")
	for _, tc := range []struct {
		name, request string
		status        int
		code          string
	}{
		{"HTTP/1.0", "GET /v1/ws?token=%s HTTP/1.0\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", 505, "http_version_not_supported"},
		{"Upgrade in a second Connection field", "GET /v1/ws?token=%s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", 400, "bad_handshake"},
	} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(nc, tc.request, n.token("ghost", "")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		wantJSONError(t, tc.name, resp, tc.status, tc.code)
		nc.Close()
	}
	wantNoState(t, n, "ghost")
}

// TestStatusRate: set_status is a durable write, so one connection gets a
// burst of 5 and then 1 per second; a refusal changes nothing and keeps
// the connection.
func TestStatusRate(t *testing.T) {
	n := newNode(t, opts{})
	c := n.dial("u1", "d1")
	c.msgType("welcome")
	for i := range 5 {
		c.send(`{"type":"set_status","status":"busy","text":"` + strings.Repeat("x", i+1) + `"}`)
	}
	c.send(`{"type":"set_status","status":"away"}`)
	c.errorCode("rate_limited")
	u, _, _, _ := n.tr.Debug(context.Background(), "u1")
	if u.Manual.String() != "busy" || u.Text != "xxxxx" {
		t.Errorf("after a refused set_status: manual %v text %q, want busy xxxxx (unchanged)", u.Manual, u.Text)
	}
	n.clk.Advance(time.Second)
	c.send(`{"type":"set_status","status":"away"}`)
	c.send(`{"type":"heartbeat"}`)
	testwait.For(t, "status away after the bucket refilled", func() bool {
		u, _, _, _ := n.tr.Debug(context.Background(), "u1")
		return u.Manual.String() == "away"
	})
}

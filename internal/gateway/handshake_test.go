package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
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
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		derr := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || derr != nil || body.Error.Code != "bad_handshake" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Errorf("%s: got %d %q (%v), want 400 JSON bad_handshake", tc.name, resp.StatusCode, body.Error.Code, derr)
		}
	}
	if _, _, ok, err := n.tr.Debug(context.Background(), "ghost"); err != nil || ok {
		t.Errorf("after refused handshakes: user held=%v err=%v, want no device, no state", ok, err)
	}
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
	waitFor(t, "status away after the bucket refilled", func() bool {
		u, _, _, _ := n.tr.Debug(context.Background(), "u1")
		return u.Manual.String() == "away"
	})
}

package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/wsframe"
)

// The whole node on a real listener: the WebSocket route, the hub wired
// to the tracker and to contact-list changes, and the shutdown order.

// The credentials of the test nodes: as long as a node requires outside
// -dev (auth.MinSecretLen).
const testKey = "app-test-api-key-0123456789abcdef"

var testSecret = []byte("app-test-jwt-secret-0123456789abcdef")

type wsClient struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func dialWS(t *testing.T, addr, user string) *wsClient {
	t.Helper()
	tok, err := auth.Sign(testSecret, user, "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nc, br, _, err := ws.Dialer{Timeout: 5 * time.Second}.Dial(context.Background(), "ws://"+addr+"/v1/ws?token="+tok)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &wsClient{t: t, nc: nc, r: bufio.NewReader(nc)}
	if br != nil {
		c.r = br
	}
	return c
}

func (c *wsClient) send(s string) {
	c.t.Helper()
	if err := ws.WriteFrame(c.nc, ws.MaskFrameInPlace(ws.NewTextFrame([]byte(s)))); err != nil {
		c.t.Fatal(err)
	}
}

// next returns the next frame's opcode and payload.
func (c *wsClient) next() (ws.OpCode, []byte) {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := wsframe.Read(c.r)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f.Header.OpCode, f.Payload
}

func (c *wsClient) msg(typ string) map[string]any {
	c.t.Helper()
	op, p := c.next()
	var m map[string]any
	if op != ws.OpText || json.Unmarshal(p, &m) != nil || m["type"] != typ {
		c.t.Fatalf("got %v %q, want a %s message", op, p, typ)
	}
	return m
}

func TestWebSocketNode(t *testing.T) {
	a, err := app.New(context.Background(), app.Config{
		DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, ln) }()
	addr := ln.Addr().String()

	// 2 shows their status to contacts only.
	put := func(path, body string) {
		t.Helper()
		req, _ := http.NewRequest("PUT", "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("PUT %s: %d", path, resp.StatusCode)
		}
	}
	put("/v1/users/2/settings", `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`)

	target := dialWS(t, addr, "2")
	target.msg("welcome")
	w := dialWS(t, addr, "1")
	w.msg("welcome")
	// Both sockets were upgraded off the listener (wsaccept), the settings
	// request went on to net/http.
	if st := a.AcceptStats(); st.Upgrades != 2 || st.Passed < 1 {
		t.Errorf("accept stats %+v, want 2 upgrades without net/http and the HTTP request passed", st)
	}
	w.send(`{"type":"subscribe","user_ids":["2"]}`)
	if u := w.msg("snapshot")["users"].(map[string]any)["2"].(map[string]any); u["status"] != nil {
		t.Fatalf("a stranger sees %v", u)
	}
	// 2 adds 1 over HTTP: 1 is sent 2's status at once (it gained sight),
	// and sees the next change.
	put("/v1/users/2/contacts/1", ``)
	if m := w.msg("presence"); m["user_id"] != "2" || m["status"] != "online" {
		t.Fatalf("presence on gaining sight %v", m)
	}
	target.send(`{"type":"set_status","status":"busy"}`)
	if m := w.msg("presence"); m["user_id"] != "2" || m["status"] != "busy" {
		t.Fatalf("presence %v", m)
	}

	// Shutdown closes every socket with 1001.
	stop()
	for _, c := range []*wsClient{target, w} {
		for {
			op, p := c.next()
			if op != ws.OpClose {
				continue
			}
			if code, _ := ws.ParseCloseFrameData(p); code != 1001 {
				t.Fatalf("closed %d, want 1001", code)
			}
			break
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
}

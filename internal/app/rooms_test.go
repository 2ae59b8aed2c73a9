package app_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/ratelimit"
)

// dialRooms opens a socket of user with a token whose rooms claim is
// rooms.
func dialRooms(t *testing.T, addr, user string, rooms ...string) *wsClient {
	t.Helper()
	tok, err := auth.Token{User: user, Rooms: rooms}.Sign(testSecret, time.Now(), time.Hour)
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
	c.msg("welcome")
	return c
}

// roomChange reads the next message, a room_change, as "event user status count".
func (c *wsClient) roomChange() string {
	c.t.Helper()
	m := c.msg("room_change")
	status := "null"
	if s, ok := m["status"].(string); ok {
		status = s
	}
	return strings.Join([]string{m["event"].(string), m["user_id"].(string), status, jsonNum(m["count"])}, " ")
}

func jsonNum(v any) string {
	f, _ := v.(float64)
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// TestRoomsNode: rooms through the whole node, as its clients see them:
// watchers on sockets see joins, statuses as their relation allows,
// invisibility as a leave, and the leave of a socket closed without bye
// once its grace is over; the HTTP API reads the same room.
func TestRoomsNode(t *testing.T) {
	a, err := app.New(context.Background(), app.Config{
		DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		CloseGrace: 300 * time.Millisecond, SweepInterval: 20 * time.Millisecond,
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
	defer func() { stop(); <-done }()
	addr := ln.Addr().String()
	call := func(method, path, body string) string {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 && resp.StatusCode != 204 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return string(b)
	}
	// dave shows his status to contacts only; bob is one, carol is not.
	call("PUT", "/v1/users/dave/settings", `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`)
	call("PUT", "/v1/users/dave/contacts/bob", ``)

	bob := dialRooms(t, addr, "bob", "doc-*")
	carol := dialRooms(t, addr, "carol", "doc-1")
	for _, w := range []*wsClient{bob, carol} {
		w.send(`{"type":"watch_room","room":"doc-1"}`)
		if m := w.msg("room"); m["count"] != 0.0 {
			t.Fatalf("snapshot of an empty room: %v", m)
		}
	}
	dave := dialRooms(t, addr, "dave", "*")
	dave.send(`{"type":"join","room":"doc-1"}`)
	if got := bob.roomChange(); got != "join dave online 1" {
		t.Fatalf("bob, a contact, sees %q", got)
	}
	if got := carol.roomChange(); got != "join dave null 1" {
		t.Fatalf("carol, a stranger, sees %q", got)
	}
	dave.send(`{"type":"set_status","status":"busy"}`)
	if got := bob.roomChange(); got != "status dave busy 1" {
		t.Fatalf("bob sees %q", got)
	}
	if got := call("GET", "/v1/rooms/doc-1?viewer_id=bob", ""); !strings.Contains(got, `"dave":"busy"`) || !strings.Contains(got, `"count":1`) {
		t.Fatalf("GET as bob: %s", got)
	}
	if got := call("GET", "/v1/rooms/doc-1?viewer_id=carol", ""); !strings.Contains(got, `"dave":null`) {
		t.Fatalf("GET as carol: %s", got)
	}
	// Invisible is a leave for everyone (carol is sent nothing of the
	// status change she may not see: her next message is this leave).
	dave.send(`{"type":"set_status","status":"invisible"}`)
	for _, w := range []*wsClient{bob, carol} {
		if got := w.roomChange(); got != "leave dave null 0" {
			t.Fatalf("on invisible: %q", got)
		}
	}
	dave.send(`{"type":"set_status","status":"online"}`)
	if got := bob.roomChange(); got != "join dave online 1" {
		t.Fatalf("bob on dave's return: %q", got)
	}
	if got := carol.roomChange(); got != "join dave null 1" {
		t.Fatalf("carol on dave's return: %q", got)
	}
	// carol's token does not name doc-2.
	carol.send(`{"type":"join","room":"doc-2"}`)
	if m := carol.msg("error"); m["code"] != "room_not_allowed" {
		t.Fatalf("a join outside the claim: %v", m)
	}
	// dave's socket closes without a bye: the leave comes once the close
	// grace is over.
	dave.nc.Close()
	for _, w := range []*wsClient{bob, carol} {
		if got := w.roomChange(); got != "leave dave null 0" {
			t.Fatalf("after dave's socket closed: %q", got)
		}
	}
	if got := call("GET", "/v1/rooms?ids=doc-1,doc-2", ""); got != `{"doc-1":0,"doc-2":0}` && !strings.Contains(got, `"doc-1":0`) {
		t.Fatalf("counts: %s", got)
	}
}

// TestRoomLimitPerDevice: the joins and leaves of one device take from
// one bucket whichever edge they come through: a device that spent its
// burst over HTTP is refused on its socket.
func TestRoomLimitPerDevice(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		Clock: clock.NewFake(time.Now())})
	tok, err := auth.Token{User: "alice", Device: "phone", Rooms: []string{"*"}}.Sign(testSecret, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nc, br, _, err := ws.Dialer{Timeout: 5 * time.Second}.Dial(context.Background(), "ws://"+addr+"/v1/ws?token="+tok)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &wsClient{t: t, nc: nc, r: bufio.NewReader(nc)}
	if br != nil {
		c.r = br
	}
	c.msg("welcome")
	post := func(path string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(`{"user_id":"alice","device_id":"phone"}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range ratelimit.Rooms.Burst / 2 {
		room := "/v1/rooms/r" + strconv.Itoa(i)
		if code := post(room + "/join"); code != 200 {
			t.Fatalf("join %d over HTTP: %d", i, code)
		}
		if code := post(room + "/leave"); code != 200 {
			t.Fatalf("leave %d over HTTP: %d", i, code)
		}
	}
	if code := post("/v1/rooms/x/join"); code != 429 {
		t.Fatalf("a join over HTTP past the burst: %d, want 429", code)
	}
	c.send(`{"type":"join","room":"x"}`)
	if e := c.msg("error"); e["code"] != "rate_limited" {
		t.Fatalf("a join on the socket after the HTTP burst: %v, want rate_limited", e)
	}
}

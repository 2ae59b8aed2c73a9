package app_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/ratelimit"
)

// The per-user limits of a client, at the real edges. The node's clock
// is a fake one that stands still, so no bucket refills during a test
// and the counts are exact.

// until reads c's frames up to and including the first message of type
// typ, and returns the error codes read before it.
func (c *wsClient) until(typ string) []string {
	c.t.Helper()
	var codes []string
	for {
		op, p := c.next()
		var m map[string]any
		if op != ws.OpText || json.Unmarshal(p, &m) != nil {
			c.t.Fatalf("got %v %q while waiting for a %s message", op, p, typ)
		}
		switch m["type"] {
		case typ:
			return codes
		case "error":
			codes = append(codes, m["code"].(string))
		}
	}
}

// clientCall sends a request with user's client token and returns the
// status and error code.
func clientCall(t *testing.T, addr, user, method, path, body string) (int, string) {
	t.Helper()
	tok, err := auth.Sign(testSecret, user, "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		return 200, ""
	}
	return resp.StatusCode, errorCode(t, string(b))
}

// TestStatusLimitPerUser: set_status takes from one bucket per user,
// shared by all the user's sockets and by POST /v1/status. Before, each
// socket had a bucket of its own: a user with 16 sockets had 80 of 240
// status changes in a burst accepted (each a durable write), where HTTP
// took 5.
func TestStatusLimitPerUser(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		Clock: clock.NewFake(time.Now())})
	const sockets, each = 16, 15
	var cs []*wsClient
	for range sockets {
		c := dialWS(t, addr, "alice")
		c.msg("welcome")
		cs = append(cs, c)
	}
	for _, c := range cs {
		for i := range each {
			c.send(`{"type":"set_status","status":"` + [...]string{"busy", "away"}[i%2] + `"}`)
		}
		c.send(`{"type":"subscribe","user_ids":["nobody"]}`) // its snapshot marks the end
	}
	refused := 0
	for _, c := range cs {
		for _, code := range c.until("snapshot") {
			if code != "rate_limited" {
				t.Fatalf("error %s, want rate_limited only", code)
			}
			refused++
		}
	}
	if accepted := sockets*each - refused; accepted != ratelimit.Status.Burst {
		t.Errorf("%d sockets of one user had %d status changes accepted in a burst, want %d (one bucket per user)",
			sockets, accepted, ratelimit.Status.Burst)
	}
	// The same bucket over HTTP: spent.
	if code, ecode := clientCall(t, addr, "alice", "POST", "/v1/status", `{"status":"online"}`); code != 429 || ecode != "rate_limited" {
		t.Errorf("POST /v1/status after the sockets' burst: %d %s, want 429 rate_limited", code, ecode)
	}

	// And the other way: bob spends his burst over HTTP, then his socket
	// is refused.
	for i := range ratelimit.Status.Burst {
		if code, ecode := clientCall(t, addr, "bob", "POST", "/v1/status", `{"status":"busy"}`); code != 200 {
			t.Fatalf("bob's status change %d over HTTP: %d %s", i+1, code, ecode)
		}
	}
	b := dialWS(t, addr, "bob")
	b.msg("welcome")
	b.send(`{"type":"set_status","status":"away"}`)
	if e := b.msg("error"); e["code"] != "rate_limited" || !strings.Contains(e["message"].(string), "for this user") {
		t.Errorf("bob's set_status after his HTTP burst: %v, want rate_limited", e)
	}
	if s := statusOf(t, addr, "bob"); s != "busy" {
		t.Errorf("bob is %s, want busy (the refused change changed nothing)", s)
	}
}

package app_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/app/apptest"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/ratelimit"
	"github.com/presenced/presenced/internal/testwait"
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

// subscribe sends a subscribe of ids and returns the users of its
// snapshot, or the error code that answered it.
func (c *wsClient) subscribe(ids ...string) (users map[string]any, code string) {
	c.t.Helper()
	b, _ := json.Marshal(map[string]any{"type": "subscribe", "user_ids": ids})
	c.send(string(b))
	op, p := c.next()
	var m map[string]any
	if op != ws.OpText || json.Unmarshal(p, &m) != nil {
		c.t.Fatalf("got %v %q, want a snapshot or an error", op, p)
	}
	switch m["type"] {
	case "snapshot":
		return m["users"].(map[string]any), ""
	case "error":
		return nil, m["code"].(string)
	}
	c.t.Fatalf("got %s, want a snapshot or an error", p)
	return nil, ""
}

// TestSnapshotBudget: the ids a user's subscriptions read for their
// snapshots come out of one budget per user, across their sockets: twice
// what they may watch at once (all their devices subscribe their lists
// at connect and again after a reconnect), then ratelimit.SnapshotsPerSecond.
// A re-subscribe of what a socket watches is not charged. Before, a
// client that subscribed 500 fresh ids, unsubscribed and repeated read
// ~58,000 ids a second with one token.
func TestSnapshotBudget(t *testing.T) {
	clk := clock.NewFake(time.Now())
	const perSocket, sockets = 10, 10 // the user may watch 10 × 10 at once
	a, addr, stop := apptest.Start(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		Clock: clk, MaxSubscriptions: perSocket, MaxSocketsPerUser: 2 * sockets})
	t.Cleanup(func() { _ = stop() })
	contacts := make([]string, perSocket)
	for i := range contacts {
		contacts[i] = fmt.Sprintf("c%d", i)
	}
	devices := func() []*wsClient {
		var cs []*wsClient
		for range sockets {
			c := dialWS(t, addr, "alice")
			c.msg("welcome")
			cs = append(cs, c)
		}
		return cs
	}
	// Every device subscribes its list at connect: 100 ids read.
	// Re-subscribing what a socket watches reads nothing and costs nothing.
	cs := devices()
	for i, c := range cs {
		if users, code := c.subscribe(contacts...); len(users) != perSocket {
			t.Fatalf("connect: subscribe answered %v %s", users, code)
		}
		for j := range map[bool]int{true: 3 * sockets}[i == 0] {
			if users, code := c.subscribe(contacts...); code != "" || len(users) != 0 {
				t.Fatalf("re-subscribe %d of socket %d: %v %s, want an empty snapshot", j, i, users, code)
			}
		}
	}
	// All devices reconnect (a network change) and subscribe again.
	for _, c := range cs {
		c.nc.Close()
	}
	testwait.For(t, "the closed sockets gone", func() bool { return a.Gateway().Stats().Connections == 0 })
	cs = devices()
	for i, c := range cs {
		if users, code := c.subscribe(contacts...); len(users) != perSocket {
			t.Fatalf("reconnect: device %d's subscribe answered %v %s", i, users, code)
		}
	}
	// 200 ids read: the budget is spent. Churn is refused, on any socket
	// of the user, and adds nothing.
	cs[0].send(`{"type":"unsubscribe","user_ids":["c0"]}`)
	if users, code := cs[0].subscribe("c0"); code != "rate_limited" {
		t.Fatalf("churn after the budget: %v %s, want rate_limited", users, code)
	}
	cs[1].send(`{"type":"unsubscribe","user_ids":["c9"]}`)
	if users, code := cs[1].subscribe("fresh"); code != "rate_limited" {
		t.Fatalf("another socket after the budget: %v %s, want rate_limited", users, code)
	}
	// Another user has a budget of their own.
	bob := dialWS(t, addr, "bob")
	bob.msg("welcome")
	if users, code := bob.subscribe(contacts...); len(users) != perSocket {
		t.Fatalf("bob: %v %s", users, code)
	}
	// A second later alice may read ratelimit.SnapshotsPerSecond ids more
	// (each socket may send 40 messages in a burst: one batch of ids a
	// message, dropped before the next).
	clk.Advance(time.Second)
	c, prev, n := cs[2], contacts, 0
	for round := 0; ; round++ {
		b, _ := json.Marshal(map[string]any{"type": "unsubscribe", "user_ids": prev})
		c.send(string(b))
		prev = laterIDs(round*perSocket, (round+1)*perSocket)
		users, code := c.subscribe(prev...)
		if code == "rate_limited" {
			break
		}
		if len(users) != perSocket {
			t.Fatalf("round %d: %v %s", round, users, code)
		}
		n += len(users)
	}
	if n != ratelimit.SnapshotsPerSecond {
		t.Errorf("a second after the budget was spent alice read %d ids, want %d", n, ratelimit.SnapshotsPerSecond)
	}
}

func laterIDs(from, to int) []string {
	var ids []string
	for i := from; i < to; i++ {
		ids = append(ids, fmt.Sprintf("later%d", i))
	}
	return ids
}

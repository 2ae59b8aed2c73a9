package app_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/nats-io/nats.go"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wsframe"
)

// TestRoomsOverTheBus: a node with NATS hands its room watchers what
// another node publishes on the bus — a join, with the member's status
// from its header, then the member's change of status once the node
// subscribed to the new member — and sends them fresh snapshots after a
// reconnection to NATS. The other node is this test, publishing as one
// (the rooms of nodes that share a store are the shared store's).
func TestRoomsOverTheBus(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts NATS")
	}
	ns := testsvc.NATS(t)
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		NATSURL: ns.URL, NodeID: "node-b", NoIngest: true})
	nc, err := nats.Connect(ns.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b64 := base64.RawURLEncoding.EncodeToString

	carol := dialRooms(t, addr, "carol", "doc-1")
	carol.send(`{"type":"watch_room","room":"doc-1"}`)
	if m := carol.msg("room"); m["count"] != 0.0 {
		t.Fatalf("snapshot of an empty room: %v", m)
	}
	subs := busSubscriptions(t, addr)
	erin := dialRooms(t, addr, "erin", "*")
	erin.send(`{"type":"join","room":"doc-1"}`)
	m := carol.msg("room_change")
	if m["user_id"] != "erin" || m["count"] != 1.0 {
		t.Fatalf("erin's join on this node: %v", m)
	}
	v := uint64(m["version"].(float64))

	// Another node's join of dave, who shows his status to everyone.
	join := &nats.Msg{Subject: "presence.changes.r." + b64([]byte("doc-1")), Header: nats.Header{},
		Data: fmt.Appendf(nil, `{"room":"doc-1","user_id":"dave","event":"join","reason":"joined","count":2,"version":%d,"at":"2026-11-18T11:06:43.000Z"}`, v+1)}
	join.Header.Set("Presenced-Node", "node-a")
	join.Header.Set("Presenced-Member", "away everyone everyone")
	if err := nc.PublishMsg(join); err != nil {
		t.Fatal(err)
	}
	if got := carol.roomChange(); got != "join dave away 2" {
		t.Fatalf("another node's join: %q", got)
	}
	// The node subscribes to dave (and to erin, a member too) for his
	// changes on other nodes.
	testwait.Forf(t, func() string { return fmt.Sprintf("the bus to subscribe to dave (%d subscriptions before)", subs) }, func() bool {
		return busSubscriptions(t, addr) >= subs+2
	})
	// The bus counts a subscription before its flush reaches the server:
	// the change is sent again (a newer version, the same view: the
	// watcher is sent it once) until it arrives.
	stop := make(chan struct{})
	var sent sync.WaitGroup
	sent.Go(func() {
		for v := 9; ; v++ {
			change := fmt.Sprintf(`{"user_id":"dave","status":"busy","prev":"away","text":"","last_seen":null,"version":%d,`+
				`"at":"2026-11-18T11:06:44.000Z","settings":{"status":"everyone","last_seen":"everyone"}}`, v)
			if err := nc.PublishMsg(&nats.Msg{Subject: "presence.changes." + b64([]byte("dave")), Data: []byte(change),
				Header: nats.Header{"Presenced-Node": {"node-a"}}}); err != nil {
				t.Error(err)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	got := carol.roomChange()
	close(stop)
	sent.Wait()
	if got != "status dave busy 2" {
		t.Fatalf("another node's change of a member: %q", got)
	}

	// Cut off from NATS, the node may have missed events: its room
	// watchers are sent a fresh snapshot, read from its own store (which
	// has erin only: dave's join was this test's).
	if err := ns.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	m = carol.msgWithin("room", 15*time.Second)
	if m["count"] != 1.0 {
		t.Fatalf("the snapshot after the reconnection: %v", m)
	}
}

// busSubscriptions reads the node's presenced_bus_subscriptions: the
// users its bus subscribes to.
func busSubscriptions(t *testing.T, addr string) int {
	t.Helper()
	_, metrics := call(t, addr, "GET", "/metrics", "")
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, "presenced_bus_subscriptions "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			return n
		}
	}
	t.Fatal("no presenced_bus_subscriptions in /metrics")
	return 0
}

// msgWithin reads the next text message, waiting up to d, and wants it
// of type typ.
func (c *wsClient) msgWithin(typ string, d time.Duration) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		_ = c.nc.SetReadDeadline(deadline)
		f, err := wsframe.Read(c.r)
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		if f.Header.OpCode != ws.OpText {
			continue // a ping of the server's
		}
		var m map[string]any
		if json.Unmarshal(f.Payload, &m) != nil || m["type"] != typ {
			c.t.Fatalf("got %q, want a %s message", f.Payload, typ)
		}
		return m
	}
}

// TestRoomsTwoNodes: two nodes on one Redis, PostgreSQL and NATS. A
// watcher of a room on one node sees the joins, the members' changes of
// status and the leaves that users make through the other, each status
// as its relation allows.
func TestRoomsTwoNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	rs, pg, ns := testsvc.Redis(t), testsvc.Postgres(t), testsvc.NATS(t)
	cfg := func(id string) app.Config {
		return app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
			RedisURL: rs.URL, PostgresURL: pg.URL, NATSURL: ns.URL, NodeID: id}
	}
	a, b := runNode(t, cfg("node-a")), runNode(t, cfg("node-b"))
	// dave shows his status to contacts only; bob is one, carol is not.
	mustCall(t, a, "PUT", "/v1/users/dave/settings", `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`)
	mustCall(t, a, "PUT", "/v1/users/dave/contacts/bob", ``)

	bob, carol := dialRooms(t, b, "bob", "doc-*"), dialRooms(t, b, "carol", "doc-1")
	for _, w := range []*wsClient{bob, carol} {
		w.send(`{"type":"watch_room","room":"doc-1"}`)
		if m := w.msg("room"); m["count"] != 0.0 {
			t.Fatalf("snapshot of an empty room: %v", m)
		}
	}
	subs := busSubscriptions(t, b)
	dave := dialRooms(t, a, "dave", "*")
	dave.send(`{"type":"join","room":"doc-1"}`)
	if got := bob.roomChange(); got != "join dave online 1" {
		t.Fatalf("bob, a contact on the other node, sees %q", got)
	}
	if got := carol.roomChange(); got != "join dave null 1" {
		t.Fatalf("carol, a stranger on the other node, sees %q", got)
	}
	// Node b subscribes to dave, a member now, for his changes made on a.
	testwait.Forf(t, func() string { return fmt.Sprintf("node b to subscribe to dave (%d subscriptions before)", subs) }, func() bool {
		return busSubscriptions(t, b) > subs
	})
	dave.send(`{"type":"set_status","status":"busy"}`)
	if got := bob.roomChange(); got != "status dave busy 1" {
		t.Fatalf("bob sees %q", got)
	}
	dave.send(`{"type":"set_status","status":"invisible"}`)
	for _, w := range []*wsClient{bob, carol} {
		if got := w.roomChange(); got != "leave dave null 0" {
			t.Fatalf("dave invisible, %q", got)
		}
	}
}

// TestRoomsMemberChangedBeforeTheSubscription: two nodes on one Redis,
// PostgreSQL and NATS. Node b hears of dave's join from another node and
// subscribes to dave only then, so dave's change made on node a before
// that subscription reached NATS never comes to b on the bus; b reads
// dave again from the shared store once subscribed, and its watcher is
// sent his status as it is, without dave changing again. The join is
// this test's, published as a third node's that took it before dave's
// change (its header shows him online), so that the change lands in the
// window every time.
func TestRoomsMemberChangedBeforeTheSubscription(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	rs, pg, ns := testsvc.Redis(t), testsvc.Postgres(t), testsvc.NATS(t)
	cfg := func(id string) app.Config {
		return app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
			RedisURL: rs.URL, PostgresURL: pg.URL, NATSURL: ns.URL, NodeID: id}
	}
	a, b := runNode(t, cfg("node-a")), runNode(t, cfg("node-b"))
	carol := dialRooms(t, b, "carol", "doc-1")
	carol.send(`{"type":"watch_room","room":"doc-1"}`)
	m := carol.msg("room")
	if m["count"] != 0.0 {
		t.Fatalf("snapshot of an empty room: %v", m)
	}
	v := uint64(m["version"].(float64))

	// dave turns busy on node a; nobody on b watches him.
	mustCall(t, a, "POST", "/v1/heartbeat", `{"user_id":"dave","device_id":"phone","active":true}`)
	mustCall(t, a, "POST", "/v1/status", `{"user_id":"dave","status":"busy"}`)

	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	join := &nats.Msg{Subject: "presence.changes.r." + base64.RawURLEncoding.EncodeToString([]byte("doc-1")), Header: nats.Header{},
		Data: fmt.Appendf(nil, `{"room":"doc-1","user_id":"dave","event":"join","reason":"joined","count":1,"version":%d,"at":"2026-11-18T11:06:43.000Z"}`, v+1)}
	join.Header.Set("Presenced-Node", "node-c")
	join.Header.Set("Presenced-Member", "online everyone everyone")
	if err := nc.PublishMsg(join); err != nil {
		t.Fatal(err)
	}
	if got := carol.roomChange(); got != "join dave online 1" {
		t.Fatalf("the other node's join: %q", got)
	}
	if got := carol.roomChange(); got != "status dave busy 1" {
		t.Fatalf("dave's status as the store has it: %q", got)
	}
}

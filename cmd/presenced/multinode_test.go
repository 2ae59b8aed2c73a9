package main

// Scale-out tests: several presenced processes on loopback sharing one
// Redis, one PostgreSQL and one NATS JetStream, each a private server of
// the test (internal/testsvc) so the fault tests may stop them.

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	wsclient "github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

const (
	clusterSecret = "multinode-test-secret-of-32-bytes-or-more"
	clusterTTL    = 3 * time.Second
)

// backends are the shared servers of one scale-out test.
type backends struct {
	redis, postgres, nats *testsvc.Server
	pgURL                 string
	prefix                string
}

func newBackends(t *testing.T) *backends {
	t.Helper()
	// One after the other, in the test's goroutine, where testsvc may
	// skip the test (under -short, where no server is installed).
	b := &backends{redis: testsvc.Redis(t), postgres: testsvc.Postgres(t), nats: testsvc.NATS(t)}
	b.pgURL = b.postgres.NewDatabase(t)
	b.prefix = "mn" + testsvc.Unique(t) + ":"
	return b
}

// node starts presenced node i on the shared backends.
func (b *backends) node(t *testing.T, i int, more ...string) *proc {
	t.Helper()
	args := []string{
		"-addr", "127.0.0.1:0", "-data", filepath.Join(t.TempDir(), fmt.Sprint("node", i)),
		"-api-key", apiKey, "-jwt-secret", clusterSecret, "-heartbeat-ttl", clusterTTL.String(),
		"-redis-url", b.redis.URL, "-redis-prefix", b.prefix,
		"-postgres-url", b.pgURL, "-nats-url", b.nats.URL, "-node-id", fmt.Sprint("node", i),
	}
	return start(t, nil, append(args, more...)...)
}

// nodes starts nodes 1…n at once, as a deployment's nodes often start,
// racing to declare the NATS streams, each with the flags more. It stops
// the test if one fails.
func (b *backends) nodes(t *testing.T, n int, more ...string) []*proc {
	t.Helper()
	nodes := make([]*proc, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { nodes[i] = b.node(t, i+1, more...) })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return nodes
}

// seen is what one watching client received, per user, in order.
type seen struct {
	mu     sync.Mutex
	events map[string][]seenEvent
}

type seenEvent struct {
	status   wsclient.Status
	snapshot bool
	lastSeen time.Time
	at       time.Time // when the test read it
}

func (e seenEvent) String() string {
	kind := ""
	if e.snapshot {
		kind = " (snapshot)"
	}
	return fmt.Sprintf("%s%s at %s last_seen %s", e.status, kind, e.at.Format("15:04:05.000"), e.lastSeen.Format("15:04:05.000"))
}

// watcher connects user on n, subscribes to ids and records every event.
func watcher(t *testing.T, n *proc, user string, ids ...string) *seen {
	t.Helper()
	c := dial(t, n, user, "")
	s := &seen{events: map[string][]seenEvent{}}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := c.Subscribe(ctx, ids...); err != nil {
		t.Fatal(err)
	}
	go func() {
		for u := range c.Updates() {
			if ev, ok := u.(wsclient.Event); ok {
				s.mu.Lock()
				s.events[ev.UserID] = append(s.events[ev.UserID], seenEvent{ev.Status, ev.Snapshot, ev.LastSeen, time.Now()})
				s.mu.Unlock()
			}
		}
	}()
	// Subscribe only sends the request: wait for each id's snapshot, so
	// what the test does next is seen as a live event, not folded into a
	// snapshot that came late.
	for _, id := range ids {
		testwait.Forf(t, func() string { return fmt.Sprintf("%s: a snapshot of %s (events %+v)", user, id, s.of(id)) },
			func() bool { return slices.ContainsFunc(s.of(id), func(e seenEvent) bool { return e.snapshot }) })
	}
	return s
}

func (s *seen) of(user string) []seenEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenEvent(nil), s.events[user]...)
}

// last is the newest status seen of user ("" if none).
func (s *seen) last(user string) wsclient.Status {
	evs := s.of(user)
	if len(evs) == 0 {
		return ""
	}
	return evs[len(evs)-1].status
}

// count is how many live (non-snapshot) events of user had status st.
func (s *seen) count(user string, st wsclient.Status) int {
	n := 0
	for _, e := range s.of(user) {
		if !e.snapshot && e.status == st {
			n++
		}
	}
	return n
}

// await waits until the newest status seen of user is st.
func (s *seen) await(t *testing.T, who, user string, st wsclient.Status) {
	t.Helper()
	testwait.Forf(t, func() string {
		return fmt.Sprintf("%s: %s to be %q; it is %q (events %+v)", who, user, st, s.last(user), s.of(user))
	}, func() bool { return s.last(user) == st })
}

// checkpointed waits until PostgreSQL holds a last_seen of every one of
// users: a checkpoint wrote them.
func (b *backends) checkpointed(t *testing.T, users ...string) {
	t.Helper()
	conn := pgConnect(t, b.pgURL)
	var n int
	testwait.Forf(t, func() string { return fmt.Sprintf("a checkpoint of %v (%d of them in PostgreSQL)", users, n) }, func() bool {
		err := conn.QueryRow(context.Background(), "SELECT count(*) FROM users WHERE user_id = ANY($1) AND last_seen > 0", users).Scan(&n)
		return err == nil && n == len(users)
	})
}

// dial connects a client of user (with device, or a generated one) to n.
func dial(t *testing.T, n *proc, user, device string) *wsclient.Client {
	t.Helper()
	tok, err := auth.Sign([]byte(clusterSecret), user, "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return dialToken(t, n, user, device, tok)
}

// dialToken connects a client of user with the token tok to n.
func dialToken(t *testing.T, n *proc, user, device, tok string) *wsclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := wsclient.Dial(ctx, wsclient.Config{URL: n.base, Token: tok, DeviceID: device, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("dial %s as %s: %v", n.base, user, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A client on node 1 watches users connected to node 3; node 3 is killed:
// the user who reconnects to node 2 within the ttl shows no offline, the
// one who does not goes offline once, on both surviving nodes.
func TestThreeNodes(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	nodes := b.nodes(t, 3)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]

	w1 := watcher(t, n1, "w1", "bob", "carol", "dave")
	w2 := watcher(t, n2, "w2", "bob", "carol", "dave")
	for _, u := range []string{"bob", "carol", "dave"} {
		w1.await(t, "w1", u, wsclient.Offline) // the snapshots: live changes come after them
		w2.await(t, "w2", u, wsclient.Offline)
	}

	// online → busy → offline, made on node 3, seen on node 1.
	bob := dial(t, n3, "bob", "phone")
	w1.await(t, "w1", "bob", wsclient.Online)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := bob.SetStatus(ctx, wsclient.Busy, "in a meeting"); err != nil {
		t.Fatal(err)
	}
	w1.await(t, "w1", "bob", wsclient.Busy)
	if err := bob.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	w1.await(t, "w1", "bob", wsclient.Offline)
	w2.await(t, "w2", "bob", wsclient.Offline)
	// Node 1 got them over the bus, for the users its watcher watches.
	if got := metric(t, n1.server, "presenced_bus_received_total"); got < 3 {
		t.Errorf("node 1 received %v changes over the bus, want bob's 3 at least", got)
	}
	if got := metric(t, n1.server, "presenced_bus_subscriptions"); got != 3 {
		t.Errorf("node 1 subscribes to %v users on NATS, want 3 (bob, carol, dave)", got)
	}
	for _, w := range []*seen{w1, w2} {
		if n := w.count("bob", wsclient.Busy); n != 1 {
			t.Errorf("bob's busy arrived %d times, want once: %+v", n, w.of("bob"))
		}
	}

	// kill -9 node 3 while carol and dave are connected to it.
	carol := dial(t, n3, "carol", "laptop")
	dial(t, n3, "dave", "tablet")
	for _, w := range []*seen{w1, w2} {
		w.await(t, "w", "carol", wsclient.Online)
		w.await(t, "w", "dave", wsclient.Online)
	}
	n3.signal(t, syscall.SIGKILL)
	n3.wait(t)
	killed := time.Now()
	carol.Close()
	// carol's device comes back through node 2, well within the ttl.
	dial(t, n2, "carol", "laptop")

	// dave's offline: within ttl + 1 s of his last heartbeat (with slack
	// for this shared machine), exactly once on each surviving node.
	w1.await(t, "w1", "dave", wsclient.Offline)
	w2.await(t, "w2", "dave", wsclient.Offline)
	t.Logf("dave offline on both surviving nodes %s after node 3 was killed", time.Since(killed).Round(time.Millisecond))
	testwait.NothingWithin(2*time.Second, "a second offline of dave, or an offline of carol")
	for name, w := range map[string]*seen{"node 1": w1, "node 2": w2} {
		if n := w.count("dave", wsclient.Offline); n != 1 {
			t.Errorf("%s: dave's offline arrived %d times, want once: %+v", name, n, w.of("dave"))
			continue
		}
		for _, e := range w.of("dave") {
			if !e.snapshot && e.status == wsclient.Offline {
				lag := e.at.Sub(e.lastSeen)
				t.Logf("%s: dave offline %s after his last heartbeat (ttl %s)", name, lag.Round(time.Millisecond), clusterTTL)
				if lag > clusterTTL+3*time.Second {
					t.Errorf("%s: dave offline %s after his last heartbeat, want about ttl + 1 s", name, lag)
				}
			}
		}
		if n := w.count("carol", wsclient.Offline); n != 0 {
			t.Errorf("%s: carol, who reconnected within the ttl, went offline: %+v", name, w.of("carol"))
		}
		if w.last("carol") != wsclient.Online {
			t.Errorf("%s: carol is %q, want online", name, w.last("carol"))
		}
	}

	// Metrics true for the cluster: dave came online through node 3 and
	// went offline through node 1's or node 2's sweep. A count of online
	// users from each node's own transitions would now be -1 on that
	// node, so with Redis it is not exported; each node counts the users
	// with a WebSocket open on it (node 1: w1; node 2: w2 and carol).
	for name, c := range map[string]struct {
		n     *proc
		users float64
	}{"node 1": {n1, 1}, "node 2": {n2, 2}} {
		if v, ok := metricMaybe(t, c.n.server, "presenced_online_users"); ok {
			t.Errorf("%s exports presenced_online_users %v with a shared Redis; no node sees every transition", name, v)
		}
		if v := metric(t, c.n.server, "presenced_ws_users"); v != c.users {
			t.Errorf("%s: presenced_ws_users %v, want %v", name, v, c.users)
		}
	}
}

// A socket closed without a bye on one node is seen offline on another
// when the close grace ends, long before the ttl; a device that reconnects
// within the grace, to another node, shows nothing at all.
func TestCloseGraceAcrossNodes(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	const ttl, grace = 10 * time.Second, time.Second
	more := []string{"-heartbeat-ttl", ttl.String(), "-close-grace", grace.String()}
	nodes := b.nodes(t, 2, more...)
	n1, n2 := nodes[0], nodes[1]
	w := watcher(t, n2, "w", "erin", "fred")
	w.await(t, "w", "erin", wsclient.Offline) // the snapshot
	w.await(t, "w", "fred", wsclient.Offline)

	// erin's app is killed: her socket on node 1 closes without a bye.
	erin := dial(t, n1, "erin", "phone")
	w.await(t, "w", "erin", wsclient.Online)
	erin.Close()
	closed := time.Now()
	w.await(t, "w", "erin", wsclient.Offline)
	var off seenEvent
	for _, e := range w.of("erin") {
		if !e.snapshot && e.status == wsclient.Offline {
			off = e
		}
	}
	t.Logf("erin offline on node 2 %s after her socket closed on node 1 (close grace %s, ttl %s)",
		off.at.Sub(closed).Round(time.Millisecond), grace, ttl)
	if lag := off.at.Sub(closed); lag > ttl/2 {
		t.Errorf("erin offline %s after her socket closed: that is the ttl (%s), not the close grace (%s)", lag, ttl, grace)
	}
	if off.lastSeen.After(closed) {
		t.Errorf("erin's last_seen %s is after her socket closed (%s): it must be her last heartbeat", off.lastSeen, closed)
	}

	// fred's network changes: his socket on node 1 closes and the same
	// device is back through node 2 within the grace. On this shared
	// machine a dial can take longer than the grace; such a try proves
	// nothing, and the next user tries again.
	for try := 0; ; try++ {
		user := fmt.Sprint("fred", try)
		wf := watcher(t, n2, "w"+user, user)
		wf.await(t, "w", user, wsclient.Offline) // the snapshot
		fred := dial(t, n1, user, "laptop")
		wf.await(t, "w", user, wsclient.Online)
		fred.Close()
		closed := time.Now()
		dial(t, n2, user, "laptop")
		if took := time.Since(closed); took > grace/2 {
			t.Logf("%s's reconnect took %s, too close to the grace (%s) to judge", user, took, grace)
			if try < 3 {
				continue
			}
			t.Fatalf("no reconnect within half the grace in %d tries", try+1)
		}
		testwait.NothingWithin(3*grace, "an offline of "+user)
		if n := wf.count(user, wsclient.Offline); n != 0 || wf.last(user) != wsclient.Online {
			t.Errorf("%s reconnected within the close grace but watchers saw %+v", user, wf.of(user))
		}
		return
	}
}

// With -close-grace 0 a socket closed without a bye ends its device at
// once: watchers on its node and on another are told right away (the
// 5 s default grace would be far later), and a reconnect is a new
// arrival.
func TestNoCloseGraceAcrossNodes(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	const ttl = 10 * time.Second
	nodes := b.nodes(t, 2, "-heartbeat-ttl", ttl.String(), "-close-grace", "0")
	n1, n2 := nodes[0], nodes[1]
	same, other := watcher(t, n1, "w1", "erin"), watcher(t, n2, "w2", "erin")
	same.await(t, "w1", "erin", wsclient.Offline) // the snapshots
	other.await(t, "w2", "erin", wsclient.Offline)
	erin := dial(t, n1, "erin", "phone")
	same.await(t, "w1", "erin", wsclient.Online)
	other.await(t, "w2", "erin", wsclient.Online)
	erin.Close()
	closed := time.Now()
	for _, w := range []struct {
		name string
		s    *seen
	}{{"w1", same}, {"w2", other}} {
		w.s.await(t, w.name, "erin", wsclient.Offline)
		lag := time.Since(closed)
		t.Logf("%s told erin is offline %s after her socket closed", w.name, lag.Round(time.Millisecond))
		if lag >= presence.DefaultCloseGrace/2 {
			t.Errorf("%s told erin is offline %s after her socket closed: that is a grace, with -close-grace 0", w.name, lag)
		}
	}
	dial(t, n2, "erin", "phone")
	other.await(t, "w2", "erin", wsclient.Online)
	same.await(t, "w1", "erin", wsclient.Online)
}

// A browser tab duplicated with its session storage connects to another
// node with the same device id: both nodes hold the device. The first
// tab closing shows nothing to anyone (the other still holds it); the
// second closing shows offline once, within the close grace.
func TestDuplicatedTabAcrossNodes(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	const ttl, grace = 10 * time.Second, time.Second
	more := []string{"-heartbeat-ttl", ttl.String(), "-close-grace", grace.String()}
	nodes := b.nodes(t, 2, more...)
	n1, n2 := nodes[0], nodes[1]
	// tess closes her first tab first, uma the copy (whose node claimed
	// the device last).
	for _, c := range []struct {
		user       string
		firstFirst bool
	}{{"tess", true}, {"uma", false}} {
		w := watcher(t, n2, "w"+c.user, c.user)
		w.await(t, "w", c.user, wsclient.Offline) // the snapshot
		tab1 := dial(t, n1, c.user, "tab")
		w.await(t, "w", c.user, wsclient.Online)
		// Dial returns with the welcome, which node 2 sends once it has
		// claimed the device.
		tab2 := dial(t, n2, c.user, "tab")
		first, second := tab1, tab2
		if !c.firstFirst {
			first, second = tab2, tab1
		}
		first.Close()
		testwait.NothingWithin(3*grace, "an offline of "+c.user+" while a tab is open")
		if n := w.count(c.user, wsclient.Offline); n != 0 || w.last(c.user) != wsclient.Online {
			t.Fatalf("one of %s's two tabs closed but the watcher saw %+v", c.user, w.of(c.user))
		}
		for i, n := range []*proc{n1, n2} {
			if got := n.call("GET", "/v1/presence/"+c.user, apiKey, nil); got["status"] != "online" {
				t.Errorf("node %d reads %s %v with a tab open", i+1, c.user, got)
			}
		}
		second.Close()
		closed := time.Now()
		w.await(t, "w", c.user, wsclient.Offline)
		if lag := time.Since(closed); lag > ttl/2 {
			t.Errorf("%s offline %s after her last tab closed: the ttl (%s), not the close grace (%s)", c.user, lag, ttl, grace)
		}
		testwait.NothingWithin(grace, "a second offline of "+c.user)
		if n := w.count(c.user, wsclient.Offline); n != 1 {
			t.Errorf("%s announced offline %d times, want once: %+v", c.user, n, w.of(c.user))
		}
	}
}

// On Redis an HTTP heartbeat's answer is read back by the beat's own
// script (no second round trip): it is the user's own view, the same as a
// read of it right after — a first beat, a second device, a beat that
// changes nothing, an invisible user (who sees themself invisible), a
// status text.
func TestHeartbeatAnswerOnRedis(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	n := b.node(t, 1)
	check := func(what string, hb map[string]any, status string, devices float64) {
		t.Helper()
		self := n.call("GET", "/v1/presence/hope?viewer_id=hope", apiKey, nil)
		if hb["status"] != status || hb["devices"] != devices {
			t.Errorf("%s: heartbeat answered %v, want %s with %v devices", what, hb, status, devices)
		}
		for _, k := range []string{"user_id", "status", "devices", "version", "status_text"} {
			if hb[k] != self[k] {
				t.Errorf("%s: the heartbeat answered %s %v, a read right after %v", what, k, hb[k], self[k])
			}
		}
		if hb["last_seen"] == nil || hb["device_id"] == nil || hb["ttl_ms"] == nil {
			t.Errorf("%s: heartbeat answer %v lacks last_seen, device_id or ttl_ms", what, hb)
		}
	}
	check("first beat", n.heartbeat(apiKey, "hope", "phone"), "online", 1)
	check("second device", n.heartbeat(apiKey, "hope", "tab"), "online", 2)
	check("no change", n.heartbeat(apiKey, "hope", "phone"), "online", 2)
	n.call("POST", "/v1/status", apiKey, map[string]any{"user_id": "hope", "status": "busy", "text": "on a call"})
	check("busy", n.heartbeat(apiKey, "hope", "phone"), "busy", 2)
	n.call("POST", "/v1/status", apiKey, map[string]any{"user_id": "hope", "status": "invisible"})
	check("invisible", n.heartbeat(apiKey, "hope", "phone"), "invisible", 2)
}

// Redis hangs (SIGSTOP) or restarts empty for 10 s, longer than the ttl,
// while users keep beating over WebSockets and set a status in the middle
// of it: nobody is ever shown offline, and every watcher ends on the
// status each user set (a version repeated after the fault would be
// dropped by the client, leaving it on an older status).
func TestRedisFaultWhileUsersSetStatus(t *testing.T) {
	for _, how := range []string{"pause", "restart"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := newBackends(t)
			nodes := b.nodes(t, 2)
			n1, n2 := nodes[0], nodes[1]
			users := []string{"u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"}
			w := watcher(t, n2, "w", users...)
			clients := make([]*wsclient.Client, len(users))
			for i, u := range users {
				clients[i] = dial(t, n1, u, "phone")
			}
			for _, u := range users {
				w.await(t, "w", u, wsclient.Online)
			}
			b.checkpointed(t, users...)

			resume := b.redis.Resume
			var err error
			if how == "pause" {
				err = b.redis.Pause()
			} else {
				err, resume = b.redis.Stop(), b.redis.Start
			}
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Second) // the fault: a ttl long before the statuses
			var wg sync.WaitGroup
			for i, c := range clients {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
					defer cancel()
					if err := c.SetStatus(ctx, wsclient.Busy, "in a meeting "+users[i]); err != nil {
						t.Errorf("%s: set_status during the fault: %v", users[i], err)
					}
				})
			}
			wg.Wait()
			time.Sleep(7 * time.Second) // and on, to 10 s in all
			if err := resume(); err != nil {
				t.Fatal(err)
			}
			for _, u := range users {
				w.await(t, "w", u, wsclient.Busy)
			}
			testwait.NothingWithin(clusterTTL+2*time.Second, "a false offline")
			for _, u := range users {
				if n := w.count(u, wsclient.Offline); n != 0 || w.last(u) != wsclient.Busy {
					t.Errorf("%s kept beating and set busy during the fault, but the watcher saw %+v", u, w.of(u))
				}
			}
		})
	}
}

// One node's link to Redis stalls (bytes stop, connections stay up) or is
// cut (connections reset) for 10 s, twice the ttl, while its users beat
// over WebSockets and set a status during it; the other node keeps its
// link. Node 1 owns its users' devices and keeps them alive; node 2 sees
// node 1's lease run out in Redis but hears its beacon on NATS, so it does
// not take node 1 over. Nobody is shown offline, and watchers on the other
// node end on the status each user set.
func TestNodePartitionedFromRedis(t *testing.T) {
	for _, how := range []string{"stall", "cut"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := newBackends(t)
			const ttl = 5 * time.Second
			proxy := testsvc.NewProxy(t, b.redis.Addr)
			var n1, n2 *proc
			var wg sync.WaitGroup
			wg.Go(func() {
				n1 = b.node(t, 1, "-heartbeat-ttl", ttl.String(), "-redis-url", "redis://"+proxy.Addr+"/0")
			})
			wg.Go(func() { n2 = b.node(t, 2, "-heartbeat-ttl", ttl.String()) })
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			users := []string{"p1", "p2", "p3", "p4"}
			w := watcher(t, n2, "w", users...)
			clients := make([]*wsclient.Client, len(users))
			for i, u := range users {
				clients[i] = dial(t, n1, u, "phone")
			}
			for _, u := range users {
				w.await(t, "w", u, wsclient.Online)
			}
			if how == "stall" {
				proxy.Stall()
			} else {
				proxy.Cut()
			}
			time.Sleep(time.Second) // the partition: a second old when the statuses are set
			for i, c := range clients {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
					defer cancel()
					if err := c.SetStatus(ctx, wsclient.Busy, ""); err != nil {
						t.Errorf("%s: set_status while node 1 is cut off from Redis: %v", users[i], err)
					}
				})
			}
			wg.Wait()
			// Meanwhile quinn beats over HTTP through node 2 (into Redis):
			// node 1, cut off, reads her online through node 2, which
			// reads her in Redis for it (package peers), and its own
			// users as they are.
			n2.heartbeat(apiKey, "quinn", "pc")
			for end := time.Now().Add(9 * time.Second); time.Now().Before(end); {
				n2.heartbeat(apiKey, "quinn", "pc")
				// p1 reads busy (node 1's buffered status) — or online
				// while node 1 tries its buffer on Redis again (a replay
				// that fails on the stalled link: reads then go to Redis,
				// which has not seen the status yet) — never offline.
				code, body := n1.do("GET", "/presence/batch?user_ids=p1,quinn", apiKey, nil)
				got := strings.TrimSpace(string(body))
				if code != 200 || (got != `{"p1":"busy","quinn":"online"}` && got != `{"p1":"online","quinn":"online"}`) {
					t.Errorf("node 1 cut off from Redis reads %d %s, want p1 busy and quinn online", code, body)
					break
				}
				time.Sleep(500 * time.Millisecond) // the pace of the reads during the partition
			}
			proxy.Restore()
			for _, u := range users {
				w.await(t, "w", u, wsclient.Busy)
			}
			testwait.NothingWithin(3*time.Second, "a false offline")
			for _, u := range users {
				if n := w.count(u, wsclient.Offline); n != 0 || w.last(u) != wsclient.Busy {
					t.Errorf("%s kept beating on node 1 but the watcher on node 2 saw %+v", u, w.of(u))
				}
			}
			if got := metric(t, n1.server, "presenced_store_outages_total"); got < 1 {
				t.Errorf("node 1 counted %v outages of the state store, want at least 1 (its link was %s)", got, how)
			}
			if got := metric(t, n2.server, "presenced_lease_takeovers_total"); got != 0 {
				t.Errorf("node 2 took over %v leases; node 1 was alive on NATS the whole time", got)
			}
		})
	}
}

// Node 1 is killed (kill -9) while Redis hangs: its users' devices are
// taken over by another node once Redis answers and node 1's lease runs
// out, and each departure is announced exactly once, within ttl + 1 s of
// Redis being back (with slack for this shared machine); the users of the
// surviving nodes, who kept beating, are never shown offline.
func TestNodeKilledDuringRedisOutage(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	nodes := b.nodes(t, 3)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	users := []string{"k1", "k2", "s1", "s2"}
	w2 := watcher(t, n2, "w2", users...)
	w3 := watcher(t, n3, "w3", users...)
	dial(t, n1, "k1", "phone")
	dial(t, n1, "k2", "phone")
	dial(t, n2, "s1", "phone")
	dial(t, n3, "s2", "phone")
	for _, w := range []*seen{w2, w3} {
		for _, u := range users {
			w.await(t, "w", u, wsclient.Online)
		}
	}
	if err := b.redis.Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // Redis hangs for 2 s before node 1 dies…
	n1.signal(t, syscall.SIGKILL)
	n1.wait(t)
	time.Sleep(8 * time.Second) // …and 8 s more: node 1's lease runs out meanwhile
	if err := b.redis.Resume(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	for _, w := range []*seen{w2, w3} {
		for _, u := range []string{"k1", "k2"} {
			w.await(t, "w", u, wsclient.Offline)
		}
	}
	testwait.NothingWithin(clusterTTL+2*time.Second, "a second offline of k1 or k2, or an offline of s1 or s2")
	for name, w := range map[string]*seen{"node 2": w2, "node 3": w3} {
		for _, u := range []string{"k1", "k2"} {
			var offs []seenEvent
			for _, e := range w.of(u) {
				if !e.snapshot && e.status == wsclient.Offline {
					offs = append(offs, e)
				}
			}
			if len(offs) != 1 {
				t.Errorf("%s: %s's offline arrived %d times, want once: %+v", name, u, len(offs), w.of(u))
				continue
			}
			lag := offs[0].at.Sub(back)
			t.Logf("%s: %s offline %s after Redis answered again (ttl %s)", name, u, lag.Round(time.Millisecond), clusterTTL)
			if lag > clusterTTL+3*time.Second {
				t.Errorf("%s: %s offline %s after Redis answered again, want within ttl + 1 s", name, u, lag)
			}
		}
		for _, u := range []string{"s1", "s2"} {
			if n := w.count(u, wsclient.Offline); n != 0 || w.last(u) != wsclient.Online {
				t.Errorf("%s: %s kept beating but was seen %+v", name, u, w.of(u))
			}
		}
	}
	if got := metric(t, n2.server, "presenced_lease_takeovers_total") + metric(t, n3.server, "presenced_lease_takeovers_total"); got != 1 {
		t.Errorf("node 1's lease was taken over %v times, want once", got)
	}
}

// A contact removed through node 1's API stops seeing a contacts-only
// status on node 2 at once: node 1 announces the change on the bus, node 2
// reads the list again and filters its watchers' next events with it.
func TestContactRemovedAcrossNodes(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	nodes := b.nodes(t, 2)
	n1, n2 := nodes[0], nodes[1]
	n1.call("PUT", "/v1/users/olga/settings", apiKey, map[string]string{"status_visibility": "contacts", "last_seen_visibility": "contacts"})
	n1.call("PUT", "/v1/users/olga/contacts", apiKey, map[string][]string{"contacts": {"vera", "wendy"}})
	vera := watcher(t, n2, "vera", "olga")
	wendy := watcher(t, n2, "wendy", "olga")
	olga := dial(t, n1, "olga", "phone")
	vera.await(t, "vera", "olga", wsclient.Online)
	wendy.await(t, "wendy", "olga", wsclient.Online)

	if code, body := n1.do("DELETE", "/v1/users/olga/contacts/vera", apiKey, nil); code != 200 {
		t.Fatalf("removing vera: %d %s", code, body)
	}
	// The announcement and the change travel the bus by separate queues,
	// so the change may overtake it once; a change after it reaches wendy
	// and not vera.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := olga.SetStatus(ctx, wsclient.Busy, ""); err != nil {
		t.Fatal(err)
	}
	wendy.await(t, "wendy", "olga", wsclient.Busy)
	testwait.NothingWithin(500*time.Millisecond, "olga's busy to vera")
	if n := vera.count("olga", wsclient.Busy); n != 0 {
		// The announcement may arrive after the change: then vera saw
		// busy once, and nothing after a second change.
		if err := olga.SetStatus(ctx, wsclient.Away, ""); err != nil {
			t.Fatal(err)
		}
		wendy.await(t, "wendy", "olga", wsclient.Away)
		testwait.NothingWithin(500*time.Millisecond, "olga's away to vera")
		if n := vera.count("olga", wsclient.Away); n != 0 {
			t.Errorf("vera, no longer olga's contact, still sees her status: %+v", vera.of("olga"))
		}
	}
}

// Privacy changes are pushed across nodes: each watcher whose view of olga
// changes — a contact removed or added, her settings changed — is sent its
// new view at once (Hidden where sight is lost), nobody else anything;
// olga's own socket on the other node sees her invisible.
func TestPrivacyChangesPushedAcrossNodes(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	nodes := b.nodes(t, 2)
	n1, n2 := nodes[0], nodes[1]
	n1.call("PUT", "/v1/users/olga/settings", apiKey, map[string]string{"status_visibility": "contacts", "last_seen_visibility": "contacts"})
	n1.call("PUT", "/v1/users/olga/contacts", apiKey, map[string][]string{"contacts": {"vera"}})
	vera := watcher(t, n2, "vera", "olga")
	wendy := watcher(t, n2, "wendy", "olga")
	own := watcher(t, n2, "olga", "olga") // her second device, on the other node
	olga := dial(t, n1, "olga", "phone")
	vera.await(t, "vera", "olga", wsclient.Online)
	own.await(t, "olga's other device", "olga", wsclient.Online)
	live := func(s *seen) int { // live events of olga
		n := 0
		for _, e := range s.of("olga") {
			if !e.snapshot {
				n++
			}
		}
		return n
	}
	quiet := func(who string, s *seen, want int) {
		t.Helper()
		testwait.NothingWithin(300*time.Millisecond, "another live event of olga to "+who)
		if n := live(s); n != want {
			t.Errorf("%s got %d live events of olga, want %d: %+v", who, n, want, s.of("olga"))
		}
	}

	// vera removed: she loses sight at once.
	n1.call("DELETE", "/v1/users/olga/contacts/vera", apiKey, nil)
	vera.await(t, "vera, removed", "olga", wsclient.Hidden)
	// wendy added: she gains it.
	n1.call("POST", "/v1/users/olga/contacts", apiKey, map[string][]string{"contacts": {"wendy"}})
	wendy.await(t, "wendy, added", "olga", wsclient.Online)
	quiet("vera", vera, 2) // online on connect, then hidden
	// Everyone may see: vera gains sight; wendy's view is unchanged and
	// she hears nothing of the change.
	wendyBefore := live(wendy)
	n1.call("PUT", "/v1/users/olga/settings", apiKey, map[string]string{"status_visibility": "everyone", "last_seen_visibility": "everyone"})
	vera.await(t, "vera, everyone", "olga", wsclient.Online)
	quiet("wendy", wendy, wendyBefore)
	// Nobody: both lose sight.
	n1.call("PUT", "/v1/users/olga/settings", apiKey, map[string]string{"status_visibility": "nobody", "last_seen_visibility": "nobody"})
	vera.await(t, "vera, nobody", "olga", wsclient.Hidden)
	wendy.await(t, "wendy, nobody", "olga", wsclient.Hidden)
	quiet("her own device", own, 0) // online since it connected itself, nothing since
	// Her own other device sees her invisible; the others nothing.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := olga.SetStatus(ctx, wsclient.Invisible, ""); err != nil {
		t.Fatal(err)
	}
	own.await(t, "her own device", "olga", wsclient.Invisible)
	quiet("vera", vera, 4)
}

// Redis stops for 10 s while clients beat: the nodes keep answering reads
// — each reads online the users who keep beating on either node (alice on
// a socket of node 1, hank over HTTP on node 2), asking the other node
// what it holds (package peers) — buffer the heartbeats, and converge
// when Redis is back (empty, as it keeps nothing on disk): nobody who kept
// beating went offline, and the last_seen of the outage is kept.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	nodes := b.nodes(t, 2)
	n1, n2 := nodes[0], nodes[1]

	w := watcher(t, n2, "w", "alice", "vic")
	dial(t, n1, "alice", "phone")
	w.await(t, "w", "alice", wsclient.Online)
	n2.heartbeat(apiKey, "hank", "pc")
	// vic beats once before the outage (checkpointed) and never again:
	// Redis comes back without him, and his watcher must learn it.
	n1.heartbeat(apiKey, "vic", "pc")
	w.await(t, "w", "vic", wsclient.Online)
	b.checkpointed(t, "vic")

	if err := b.redis.Stop(); err != nil {
		t.Fatal(err)
	}
	outage := time.Now()
	var lastBeat time.Time
	for time.Since(outage) < 10*time.Second {
		n2.heartbeat(apiKey, "hank", "pc") // insists on 200
		n1.heartbeat(apiKey, "ivan", "pc")
		lastBeat = time.Now()
		// Both keep beating, alice on node 1's socket, hank over HTTP on
		// node 2: each node reads both online, the other's user through
		// what the other node holds (package peers).
		for i, n := range []*proc{n1, n2} {
			code, body := n.do("GET", "/presence/batch?user_ids=alice,hank", apiKey, nil)
			if want := `{"alice":"online","hank":"online"}`; code != 200 || strings.TrimSpace(string(body)) != want {
				t.Fatalf("read on node %d during the outage: %d %s, want %s", i+1, code, body, want)
			}
		}
		time.Sleep(500 * time.Millisecond) // the pace of the beats during the outage
	}
	if err := b.redis.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	n2.heartbeat(apiKey, "hank", "pc")

	// Converged: both users online in the shared state, read on either node.
	const want = `{"alice":"online","hank":"online"}`
	var body1, body2 []byte
	testwait.Forf(t, func() string {
		return fmt.Sprintf("after Redis returned: node 1 %s, node 2 %s, want %s", body1, body2, want)
	}, func() bool {
		n2.heartbeat(apiKey, "hank", "pc")
		_, body1 = n1.do("GET", "/presence/batch?user_ids=alice,hank", apiKey, nil)
		_, body2 = n2.do("GET", "/presence/batch?user_ids=alice,hank", apiKey, nil)
		return strings.TrimSpace(string(body1)) == want && strings.TrimSpace(string(body2)) == want
	})
	w.await(t, "w", "vic", wsclient.Offline) // the resync after recovery
	testwait.NothingWithin(clusterTTL, "a false offline of alice")
	if n := w.count("alice", wsclient.Offline); n != 0 {
		t.Errorf("alice kept beating but her watcher saw offline %d times (Redis back at %s): %+v", n, back.Format("15:04:05.000"), w.of("alice"))
	}
	// ivan beat only during the outage; his last heartbeat was answered
	// before lastBeat and after lastBeat − 500 ms (the loop's pause).
	var got map[string]any
	testwait.Forf(t, func() string { return fmt.Sprintf("ivan offline after the outage: %v", got) }, func() bool {
		got = n2.call("GET", "/v1/presence/ivan", apiKey, nil)
		return got["status"] == "offline"
	})
	ls, err := time.Parse(time.RFC3339Nano, fmt.Sprint(got["last_seen"]))
	if err != nil || ls.Before(lastBeat.Add(-500*time.Millisecond)) || got["status"] != "offline" {
		t.Errorf("ivan after the outage: %v; want offline, last seen at his last heartbeat of the outage (about %s)", got, lastBeat.UTC())
	}
}

// PostgreSQL stops while users beat: heartbeats keep being accepted — also
// the first one of a user no node has loaded, whose profile cannot be read
// (it shows once PostgreSQL is back) — a status change (a synchronous
// durable write) is refused with 503 unavailable, every node stays ready
// (PostgreSQL is shared: readiness only reports it), and every last_seen
// of the outage reaches PostgreSQL once it is back.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	n := b.node(t, 1)
	n2 := b.node(t, 2)
	n.heartbeat(apiKey, "ivy", "pc")

	if err := b.postgres.Stop(); err != nil {
		t.Fatal(err)
	}
	var last map[string]any
	for range 8 {
		last = n.heartbeat(apiKey, "ivy", "pc")
		time.Sleep(250 * time.Millisecond) // beats for 2 s: two checkpoints fail meanwhile
	}
	code, body := n.do("POST", "/v1/status", apiKey, map[string]any{"user_id": "ivy", "status": "busy"})
	if code != 503 || !strings.Contains(string(body), `"code":"unavailable"`) {
		t.Errorf("status change while PostgreSQL is down: %d %s, want 503 unavailable", code, body)
	}
	if got := n2.heartbeat(apiKey, "newcomer", "phone"); got["status"] != nil {
		t.Errorf("first heartbeat of a user while PostgreSQL is down answered %v, want its view null (unknown)", got)
	}
	for _, node := range []*proc{n, n2} {
		code, body := node.do("GET", "/readyz", "", nil)
		if code != 200 || !strings.Contains(string(body), `"postgres":"unavailable"`) {
			t.Errorf("readyz while PostgreSQL is down: %d %s, want 200 reporting postgres unavailable", code, body)
		}
	}
	if err := b.postgres.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.Forf(t, func() string { return fmt.Sprintf("newcomer online after PostgreSQL is back: %d %s", code, body) }, func() bool {
		code, body = n.do("GET", "/v1/presence/newcomer", apiKey, nil)
		return code == 200 && strings.Contains(string(body), `"status":"online"`)
	})

	want, _ := time.Parse(time.RFC3339Nano, last["last_seen"].(string))
	conn := pgConnect(t, b.pgURL)
	var ms int64
	var err error
	testwait.Forf(t, func() string {
		return fmt.Sprintf("ivy's last_seen in PostgreSQL to reach %d: %d (err %v)", want.UnixMilli(), ms, err)
	}, func() bool {
		err = conn.QueryRow(context.Background(), "SELECT last_seen FROM users WHERE user_id = 'ivy'").Scan(&ms)
		return err == nil && ms >= want.UnixMilli()
	})
}

func pgConnect(t *testing.T, raw string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var conn *pgx.Conn
	testwait.NoErr(t, "connecting to PostgreSQL", func() (err error) {
		conn, err = pgx.Connect(ctx, raw)
		return err
	})
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// metric reads one series (name and labels as /metrics writes them) from
// n's /metrics.
func metric(t *testing.T, n *server, name string) float64 {
	t.Helper()
	v, ok := metricMaybe(t, n, name)
	if !ok {
		t.Fatalf("no %s in /metrics", name)
	}
	return v
}

// metricMaybe reads one series from n's /metrics and reports whether it is
// there.
func metricMaybe(t *testing.T, n *server, name string) (float64, bool) {
	t.Helper()
	code, b := n.do("GET", "/metrics", apiKey, nil)
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, b)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return f, true
		}
	}
	return 0, false
}

// A connection layer of another system feeds presence through the ingest
// stream: its session events reach watchers like heartbeats and byes of
// presenced's own clients, and a redelivered connect after the disconnect
// changes nothing.
func TestIngestFromConnectionLayer(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	n := b.node(t, 1)
	w := watcher(t, n, "w", "zoe")
	w.await(t, "w", "zoe", wsclient.Offline)

	nc, err := nats.Connect(b.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	const ms = "2006-01-02T15:04:05.000Z"
	var lastAt string
	event := func(typ string) []byte {
		// Each event in a millisecond of its own: the disconnect is later
		// than the connect.
		testwait.For(t, "a new millisecond", func() bool { return time.Now().UTC().Format(ms) != lastAt })
		lastAt = time.Now().UTC().Format(ms)
		return fmt.Appendf(nil, `{"type":%q,"user_id":"zoe","device_id":"tab-1","at":%q}`, typ, lastAt)
	}
	publish := func(id string, body []byte) {
		t.Helper()
		if _, err := js.Publish(ctx, "presence.ingest.gw1", body, jetstream.WithMsgID(id)); err != nil {
			t.Fatalf("publish %s: %v", body, err)
		}
	}
	connected := event("session_connected")
	publish("gw1-1", connected)
	w.await(t, "w", "zoe", wsclient.Online)
	publish("gw1-2", event("session_disconnected"))
	w.await(t, "w", "zoe", wsclient.Offline)
	// The same connect again, as a redelivery under a new id would bring it.
	publish("gw1-1-again", connected)
	testwait.For(t, "the stale connect ignored", func() bool {
		return metric(t, n.server, `presenced_ingest_events_total{outcome="ignored"}`) >= 1
	})
	if got := metric(t, n.server, `presenced_ingest_events_total{outcome="ignored"}`); got != 1 {
		t.Errorf("the stale connect was not ignored: %v", got)
	}
	if n := w.count("zoe", wsclient.Online); n != 1 || w.last("zoe") != wsclient.Offline {
		t.Errorf("zoe: %+v, want online once, then offline", w.of("zoe"))
	}
}

// NATS stops for a while: each node keeps serving its own watchers; a
// change made on one node reaches the watchers on the other once NATS is
// back (queued and published, or re-read when the bus reconnects).
func TestNATSOutage(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	nodes := b.nodes(t, 2)
	n1, n2 := nodes[0], nodes[1]
	w := watcher(t, n2, "w", "pat")
	n1.heartbeat(apiKey, "pat", "pc")
	w.await(t, "w", "pat", wsclient.Online)

	if err := b.nats.Stop(); err != nil {
		t.Fatal(err)
	}
	n1.call("POST", "/v1/status", apiKey, map[string]any{"user_id": "pat", "status": "busy"})
	n1.heartbeat(apiKey, "pat", "pc")
	testwait.For(t, "node 1 to hold the change for NATS", func() bool {
		return metric(t, n1.server, "presenced_bus_queued")+metric(t, n1.server, "presenced_bus_in_flight") >= 1
	})
	if err := b.nats.Start(); err != nil {
		t.Fatal(err)
	}
	w.await(t, "w", "pat", wsclient.Busy)
}

// The nodes run on a Redis Cluster of three masters with a replica each.
// The master that holds the leases is killed (its replica is promoted a
// few seconds later), then another master is handed over by a manual
// failover, while 40 users beat over WebSockets on node 1 and a watcher on
// node 2 watches them: nobody is shown offline (before nodes owned their
// devices the kill alone sent hundreds of false offlines), every user
// reads online through node 2 afterwards, and no lease is taken over.
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	cl := testsvc.RedisClusterReplicas(t, 3, 1)
	nodes := b.nodes(t, 2, "-redis-url", cl.URL)
	n1, n2 := nodes[0], nodes[1]
	var users []string
	for i := range 40 {
		users = append(users, fmt.Sprint("c", i))
	}
	w := watcher(t, n2, "w", users...)
	rooms := []string{"room-0", "room-1", "room-2", "room-3"}
	rw := roomWatcher(t, n2, "rw", rooms...)
	for i, u := range users {
		c := dialRooms(t, n1, u, "phone")
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		if err := c.Join(ctx, rooms[i%len(rooms)]); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	for _, u := range users {
		w.await(t, "w", u, wsclient.Online)
	}
	for _, r := range rooms {
		testwait.Forf(t, func() string { return fmt.Sprintf("rw: %s at 10 members (%d)", r, rw.count(r)) }, func() bool { return rw.count(r) == 10 })
	}
	// HTTP users beat through node 2 all along: a Redis write per beat,
	// some to the masters taken away.
	var hw []string
	for i := range 20 {
		hw = append(hw, fmt.Sprint("h", i))
	}
	httpBeats, stopBeats := context.WithCancel(context.Background())
	var beatRounds atomic.Int64 // rounds of the 20 HTTP beats done
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		for ; httpBeats.Err() == nil; beatRounds.Add(1) {
			for _, u := range hw {
				if code, body := n2.do("POST", "/v1/heartbeat", apiKey, map[string]any{"user_id": u, "device_id": "pc"}); code != 200 {
					t.Errorf("HTTP heartbeat of %s during the failovers: %d %s", u, code, body)
				}
			}
			time.Sleep(300 * time.Millisecond) // the pace of the HTTP beats
		}
	}()
	defer func() { stopBeats(); <-beating }()
	leases, err := cl.MasterOf(b.prefix + "leases")
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitReplicated(leases, waitTimeout); err != nil {
		t.Fatal(err)
	}
	if err := leases.Kill(); err != nil {
		t.Fatal(err)
	}
	// Until the replica is promoted, reads on node 2 show every user who
	// keeps beating online: those of the killed master's slots read
	// degraded (node 1 says which sockets it holds; node 2's buffer has
	// the HTTP beats), the others from Redis. An HTTP device whose last
	// beat went to the killed master is in no node's memory until it
	// beats again (docs/operations.md): the HTTP users are checked once a
	// whole round of their beats followed the kill.
	killedAt := beatRounds.Load()
	promoted := make(chan error, 1)
	go func() { _, err := cl.WaitPromoted(leases, waitTimeout); promoted <- err }()
	reads := 0
	for waiting := true; waiting; {
		select {
		case err := <-promoted:
			if err != nil {
				t.Fatal(err)
			}
			waiting = false
		case <-time.After(200 * time.Millisecond):
			ids := users
			if beatRounds.Load() > killedAt+1 {
				ids = append(append([]string(nil), users...), hw...)
			}
			code, body := n2.do("GET", "/presence/batch?user_ids="+strings.Join(ids, ","), apiKey, nil)
			if n := strings.Count(string(body), `"online"`); code != 200 || n != len(ids) {
				t.Errorf("node 2 read %d of %d users online during the failover (%d): %s", n, len(ids), code, body)
			}
			reads++
		}
	}
	t.Logf("%d reads on node 2 during the failover", reads)
	testwait.NothingWithin(clusterTTL+2*time.Second, "a false offline after the promotion")
	// A clean handover of another master (one that still has its replica:
	// not the one just promoted).
	var replica *testsvc.Server
	for shard := 0; replica == nil && shard < 256; shard++ {
		m, err := cl.MasterOf(fmt.Sprintf("%s{%d}due", b.prefix, shard))
		if err != nil {
			t.Fatal(err)
		}
		if rs, err := cl.ReplicasOf(m); err == nil && len(rs) > 0 {
			replica = rs[0]
		}
	}
	if replica == nil {
		t.Fatal("no master with a replica left")
	}
	if err := cl.Failover(replica, waitTimeout); err != nil {
		t.Fatal(err)
	}
	testwait.NothingWithin(clusterTTL+2*time.Second, "a false offline after the failover")
	for _, u := range users {
		if n := w.count(u, wsclient.Offline); n != 0 || w.last(u) != wsclient.Online {
			t.Errorf("%s kept beating but the watcher saw %+v", u, w.of(u))
		}
	}
	// The rooms lost nobody: no leave, no count below zero, ten in each.
	for _, r := range rooms {
		for _, c := range rw.of(r) {
			if strings.HasPrefix(c, "leave") {
				t.Errorf("%s during the failovers: %q", r, rw.of(r))
				break
			}
		}
	}
	if len(rw.neg) > 0 {
		t.Errorf("counts below zero: %q", rw.neg)
	}
	if _, body := n1.do("GET", "/v1/rooms?ids="+strings.Join(rooms, ","), apiKey, nil); string(body) != `{"room-0":10,"room-1":10,"room-2":10,"room-3":10}`+"\n" {
		t.Errorf("the rooms after the failovers: %s", body)
	}
	var read []byte
	testwait.Forf(t, func() string { return fmt.Sprintf("node 2 to read every user online after the failovers: %s", read) }, func() bool {
		_, read = n2.do("GET", "/presence/batch?user_ids="+strings.Join(users, ","), apiKey, nil)
		return strings.Count(string(read), `"online"`) == len(users)
	})
	stopBeats()
	<-beating
	_, body := n1.do("GET", "/presence/batch?user_ids="+strings.Join(hw, ","), apiKey, nil)
	if strings.Count(string(body), `"online"`) != len(hw) {
		t.Errorf("node 1 reads the HTTP users after the failovers: %s", body)
	}
	for i, n := range []*proc{n1, n2} {
		if got := metric(t, n.server, "presenced_lease_takeovers_total"); got != 0 {
			t.Errorf("a node took over %v leases; both were alive", got)
		}
		// One master's outage is its users' alone: the store as a whole
		// is never found down.
		if got := metric(t, n.server, "presenced_store_outages_total"); got != 0 {
			t.Errorf("node %d took the whole store for down %v times", i+1, got)
		}
		t.Logf("node %d: parts found down %v times", i+1, metric(t, n.server, "presenced_store_part_outages_total"))
	}
	// After the failovers node 2 hears the device notes again (on the
	// masters that serve their slots now) and answers full views from its
	// replica: a second device of each of a few users shows there.
	testwait.For(t, "node 2 to hear the device notes again", func() bool {
		return metric(t, n2.server, "presenced_replica_notes_heard") == 1
	})
	few := users[:6]
	full := func() map[string]fullView { return fullRead(t, n2, "", few) }
	byReplica := func() float64 { return metric(t, n2.server, `presenced_replica_full_reads_total{source="replica"}`) }
	testwait.For(t, "node 2's replica to answer a full view (and keep it)", func() bool {
		r0 := byReplica()
		for u, v := range full() {
			if v.Devices == nil || *v.Devices != 1 {
				t.Fatalf("%s reads %s on node 2, want one device", u, fullString(v))
			}
		}
		return byReplica() > r0
	})
	for _, u := range few {
		dial(t, n1, u, "laptop")
	}
	var got map[string]fullView
	testwait.Forf(t, func() string { return fmt.Sprintf("node 2 to show two devices of each: %v", got) }, func() bool {
		got = full()
		for _, v := range got {
			if v.Devices == nil || *v.Devices != 2 {
				return false
			}
		}
		return len(got) == len(few)
	})
	if metric(t, n2.server, "presenced_replica_device_notes_total") == 0 {
		t.Error("node 2 heard no device note on the Cluster")
	}
}

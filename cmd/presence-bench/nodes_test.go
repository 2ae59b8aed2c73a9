package main

import (
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
)

// startSharedNodes starts n in-process nodes sharing one Redis (a key
// prefix of the test's own), PostgreSQL (a fresh database) and NATS, and
// returns their ws:// URLs; extra is each node's config besides those.
func startSharedNodes(t *testing.T, n int, extra app.Config) []string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	rs, pg, ns := testsvc.SharedRedis(t), testsvc.SharedPostgres(t), testsvc.SharedNATS(t)
	pgURL, name := pg.NewDatabase(t), testsvc.Unique(t)
	urls := make([]string, n)
	for i := range n {
		cfg := extra
		cfg.RedisURL, cfg.RedisPrefix, cfg.PostgresURL, cfg.NATSURL = rs.URL, name+":", pgURL, ns.URL
		cfg.NodeID = name + "_n" + strconv.Itoa(i+1)
		urls[i] = startNodeWith(t, cfg)
	}
	return urls
}

// Movers and status users on node 1, the watchers on nodes 2 and 3: every
// join, leave and change of status reaches every watcher across nodes.
func TestRoomsAcrossNodes(t *testing.T) {
	urls := startSharedNodes(t, 3, app.Config{})
	var r roomsResult
	runJSON(t, &r, "rooms", "-url", urls[0], "-url", urls[1]+","+urls[2], "-dev", "-api-key", testAPIKey,
		"-watchers", "20", "-movers", "2", "-interval", "200ms", "-duration", "2s")
	if r.URL != urls[0]+"/v1/ws" || len(r.URLs) != 3 || r.URLs[2] != urls[2]+"/v1/ws" {
		t.Errorf("url %q, urls %q", r.URL, r.URLs)
	}
	// The three nodes are this process: one pid, counted once.
	if r.ServerPID != os.Getpid() || !slices.Equal(r.ServerPIDs, []int{os.Getpid()}) || r.ServerCores <= 0 {
		t.Errorf("server pid %d, pids %v, %v cores", r.ServerPID, r.ServerPIDs, r.ServerCores)
	}
	if r.Errors != 0 || r.RateLimited != 0 || r.WatcherDrops != 0 {
		t.Errorf("errors %d (%s), rate limited %d, drops %d", r.Errors, r.FirstError, r.RateLimited, r.WatcherDrops)
	}
	if c := r.RoomChanges; c.Sent < 2 || c.Confirmed != c.Sent || c.Missing != 0 || c.Resyncs != 0 || c.Deliveries != int64(c.Sent)*20 {
		t.Errorf("room: %+v", c)
	}
	if s := r.StatusChange; s.Sent < 2 || s.Confirmed < 1 || s.Expected != int64(s.Confirmed)*20 || s.Deliveries+s.Missing != s.Expected {
		t.Errorf("status: %+v", s)
	}
	if r.RatioP99 <= 0 {
		t.Errorf("ratio %v", r.RatioP99)
	}
}

// A room in interval mode seeded and driven through node 1, watched on
// nodes 2 and 3: each watcher is told the net, the count and every id.
func TestRoomIntervalAcrossNodes(t *testing.T) {
	urls := startSharedNodes(t, 3, app.Config{RoomIntervalAbove: 10, RoomInterval: 300 * time.Millisecond})
	var r roomIntervalResult
	runJSON(t, &r, "room-interval", "-url", urls[0], "-url", urls[1], "-url", urls[2], "-dev", "-api-key", testAPIKey,
		"-members", "40", "-movers", "4", "-watchers", "6", "-rate", "20", "-room-interval", "300ms", "-duration", "2s",
		"-unwatched", "1s", "-seed-concurrency", "8")
	if len(r.URLs) != 3 || !strings.HasPrefix(r.URLs[1], "http://") || !slices.Equal(r.ServerPIDs, []int{os.Getpid()}) {
		t.Errorf("urls %q, pids %v", r.URLs, r.ServerPIDs)
	}
	if r.Mode != "interval" || r.Seeded != 40 || r.Errors != 0 || r.WatcherDrops != 0 {
		t.Errorf("mode %q, seeded %d, errors %d (%s), drops %d", r.Mode, r.Seeded, r.Errors, r.FirstError, r.WatcherDrops)
	}
	if p := r.Watched; p.Sent < 10 || p.Errors != 0 || p.ServerCores <= 0 {
		t.Errorf("watched drive: %+v", p)
	}
	m := r.Messages
	if m.RoomInterval == 0 || m.RoomChange != 0 || m.Resyncs != 0 || m.MaxPerInterval < 1 {
		t.Errorf("messages: %+v", m)
	}
	if m.NetBad != 0 || m.CountBad != 0 || !m.IDsChecked || m.IDErrors != 0 || m.Reported+2*m.CancelledPairs != r.Watched.Sent {
		t.Errorf("told: %+v of %d sent", m, r.Watched.Sent)
	}
	if r.FinalCount != r.WantCount {
		t.Errorf("final count %d, want %d", r.FinalCount, r.WantCount)
	}
}

func TestParseNodes(t *testing.T) {
	t.Setenv(jwtSecretEnv, "")
	for _, args := range [][]string{
		{"-dev", "-url", "ws://127.0.0.1:1", "-url", "ws://10.0.0.1:2"},                              // one not loopback
		{"-dev", "-url", "ws://127.0.0.1:1,ws://127.0.0.1:2,ws://127.0.0.1:3", "-server-pid", "1,2"}, // 2 pids, 3 nodes
		{"-dev", "-server-pid", "x"}, //
		{"-dev", "-url", ","},        // no node
	} {
		if _, err := parseRooms(args, io.Discard); err == nil {
			t.Errorf("rooms %q: accepted", args)
		}
		if _, err := parseRoomInterval(args, io.Discard); err == nil {
			t.Errorf("room-interval %q: accepted", args)
		}
	}
	// One -url: as before, the watchers on the node of the changes.
	c, err := parseRooms([]string{"-dev", "-url", "ws://127.0.0.1:18090", "-server-pid", "7"}, io.Discard)
	if err != nil || len(c.nodes) != 1 || c.serverPID != 7 || c.httpBase != "http://127.0.0.1:18090" || c.nodeURLs(false) != nil {
		t.Fatalf("one url: %v %+v", err, c)
	}
	if w := c.watcherNodes(); len(w) != 1 || w[0].wsURL.Port() != "18090" {
		t.Errorf("watchers of one node on %v", w)
	}
	if pids, err := c.resolvePIDs(); err != nil || !slices.Equal(pids, []int{7}) {
		t.Errorf("pids %v %v", pids, err)
	}
	// None: the default URL.
	if c, err := parseRooms([]string{"-dev"}, io.Discard); err != nil || len(c.nodes) != 1 || c.wsURL.String() != defaultURL+defaultWSPath {
		t.Errorf("default: %v %+v", err, c)
	}
	// Three, repeated and comma-separated: the changes on the first, the
	// watchers on the others; a pid each, the same one counted once.
	ri, err := parseRoomInterval([]string{"-dev", "-url", "http://127.0.0.1:1", "-url", "ws://127.0.0.1:2, ws://127.0.0.1:3",
		"-server-pid", "5,6", "-server-pid", "5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if ri.httpBase != "http://127.0.0.1:1" || ri.serverPID != 5 || len(ri.nodes) != 3 {
		t.Errorf("three urls: %+v", ri)
	}
	if w := ri.watcherNodes(); len(w) != 2 || w[0].wsURL.Port() != "2" || w[1].httpBase != "http://127.0.0.1:3" {
		t.Errorf("watcher nodes %v", w)
	}
	if u := ri.nodeURLs(true); !slices.Equal(u, []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}) {
		t.Errorf("urls %q", u)
	}
	if pids, err := ri.resolvePIDs(); err != nil || !slices.Equal(pids, []int{5, 6}) {
		t.Errorf("pids %v %v", pids, err)
	}
	if got := eachNode([]float64{0.1, 0.25}); got != " (0.100 + 0.250)" || eachNode([]float64{1}) != "" {
		t.Errorf("each node: %q", got)
	}
}

// Without -server-pid each node's pid is the process listening on its
// port: in-process nodes are all this one.
func TestResolvePIDsByPort(t *testing.T) {
	a, b := startNode(t, 0), startNode(t, 0)
	c, err := parseRooms([]string{"-dev", "-url", a, "-url", b}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if pids, err := c.resolvePIDs(); err != nil || !slices.Equal(pids, []int{os.Getpid()}) {
		t.Errorf("pids %v %v, want this process once", pids, err)
	}
	c, err = parseRooms([]string{"-dev", "-url", a, "-url", "ws://127.0.0.1:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.resolvePIDs(); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("a node nobody serves: %v", err)
	}
}

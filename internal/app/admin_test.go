package app_test

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/apicontract"
	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// stats is GET /v1/admin/stats.
type stats struct {
	Nodes []struct {
		ID          string            `json:"id"`
		Lease       uint64            `json:"lease"`
		Self        bool              `json:"self"`
		Health      string            `json:"health"`
		Checks      map[string]string `json:"checks"`
		Detail      string            `json:"detail"`
		BeaconAgeMs *int64            `json:"beacon_age_ms"`
	} `json:"nodes"`
	Metrics map[string]float64 `json:"metrics"`
}

// statsContract checks every answer getStats reads against the API
// description, so the scale-out answers (other nodes by lease and beacon,
// alive, silent, taken over) are validated as well as a lone node's.
var statsContract = sync.OnceValues(apicontract.Load)

func getStats(t testing.TB, addr string) stats {
	t.Helper()
	c, err := statsContract()
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("GET", "http://"+addr+"/v1/admin/stats", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	res, err := (&http.Client{Transport: &apicontract.Transport{Contract: c}}).Do(req)
	if err != nil {
		t.Fatalf("GET /v1/admin/stats: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var s stats
	if res.StatusCode != 200 || json.Unmarshal(body, &s) != nil {
		t.Fatalf("GET /v1/admin/stats: %d %s", res.StatusCode, body)
	}
	return s
}

// TestAdminStatsNode: a running embedded node lists itself ready, and its
// connection and online-user numbers follow a WebSocket client.
func TestAdminStatsNode(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1, NodeID: "solo"})
	s := getStats(t, addr)
	if len(s.Nodes) != 1 {
		t.Fatalf("nodes %+v, want this one", s.Nodes)
	}
	if n := s.Nodes[0]; !n.Self || n.ID != "solo" || n.Health != "ready" || n.Checks["gateway"] != "ok" || n.Checks["sqlite"] != "ok" {
		t.Errorf("this node: %+v, want solo, ready, gateway and sqlite ok", n)
	}
	if s.Metrics["presenced_ws_connections"] != 0 || s.Metrics["presenced_online_users"] != 0 {
		t.Errorf("before any client: %v connections, %v online", s.Metrics["presenced_ws_connections"], s.Metrics["presenced_online_users"])
	}
	c := dialWS(t, addr, "u1")
	c.msg("welcome")
	testwait.For(t, "a connection and an online user", func() bool {
		m := getStats(t, addr).Metrics
		return m["presenced_ws_connections"] == 1 && m["presenced_ws_users"] == 1 && m["presenced_online_users"] == 1
	})
	c.nc.Close()
	testwait.For(t, "no connection", func() bool { return getStats(t, addr).Metrics["presenced_ws_connections"] == 0 })
}

// TestAdminStatsCluster: two nodes sharing Redis, PostgreSQL and NATS
// each list the other by name and lease, alive; a change made on one
// moves its bus counters and the other's; a node that stops is no longer
// listed alive.
func TestAdminStatsCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	rs, pg, ns := testsvc.Redis(t), testsvc.Postgres(t), testsvc.NATS(t)
	cfg := func(id string) app.Config {
		return app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1, TTL: 3 * time.Second,
			RedisURL: rs.URL, PostgresURL: pg.URL, NATSURL: ns.URL, NodeID: id}
	}
	a := runNode(t, cfg("node-a"))
	b, stopB := startNode(t, cfg("node-b"))
	defer stopB()
	peer := func(s stats, id string) (lease uint64, health string) {
		for _, n := range s.Nodes {
			if !n.Self && n.ID == id {
				return n.Lease, n.Health
			}
		}
		return 0, ""
	}
	testwait.For(t, "each node lists the other alive", func() bool {
		la, ha := peer(getStats(t, a), "node-b")
		lb, hb := peer(getStats(t, b), "node-a")
		return la != 0 && lb != 0 && ha == "alive" && hb == "alive"
	})
	sa := getStats(t, a)
	if self := sa.Nodes[0]; !self.Self || self.ID != "node-a" || self.Lease == 0 || self.Health != "ready" ||
		self.Checks["redis"] != "ok" || self.Checks["postgres"] != "ok" || self.Checks["nats"] != "ok" {
		t.Errorf("node-a itself: %+v", self)
	}
	if _, ok := sa.Metrics["presenced_online_users"]; ok {
		t.Error("a node sharing its state in Redis reports the online users it cannot know")
	}

	// bob watches alice on node b; alice's change is made on node a.
	w := dialWS(t, b, "bob")
	w.msg("welcome")
	w.send(`{"type":"subscribe","user_ids":["alice"]}`)
	w.msg("snapshot")
	sb := getStats(t, b)
	mustCall(t, a, "POST", "/v1/heartbeat", `{"user_id":"alice","device_id":"d"}`)
	if m := w.msg("presence"); m["user_id"] != "alice" || m["status"] != "online" {
		t.Fatalf("bob got %v", m)
	}
	if m := getStats(t, a).Metrics; m["presenced_bus_published_total"] <= sa.Metrics["presenced_bus_published_total"] ||
		m["presenced_heartbeats_total"] <= sa.Metrics["presenced_heartbeats_total"] {
		t.Errorf("node a: bus published %v → %v, heartbeats %v → %v: want both up", sa.Metrics["presenced_bus_published_total"],
			m["presenced_bus_published_total"], sa.Metrics["presenced_heartbeats_total"], m["presenced_heartbeats_total"])
	}
	if m := getStats(t, b).Metrics; m["presenced_bus_received_total"] <= sb.Metrics["presenced_bus_received_total"] ||
		m["presenced_fanout_delivered_total"] <= sb.Metrics["presenced_fanout_delivered_total"] {
		t.Errorf("node b: bus received %v → %v, fan-out delivered %v → %v: want both up", sb.Metrics["presenced_bus_received_total"],
			m["presenced_bus_received_total"], sb.Metrics["presenced_fanout_delivered_total"], m["presenced_fanout_delivered_total"])
	}

	w.nc.Close()
	if err := stopB(); err != nil {
		t.Fatalf("node b: %v", err)
	}
	testwait.For(t, "node a no longer lists node b alive", func() bool {
		_, h := peer(getStats(t, a), "node-b")
		return h != "alive"
	})
}

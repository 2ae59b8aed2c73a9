package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// adminStats is GET /v1/admin/stats as the operator page reads it.
type adminStats struct {
	Now   string `json:"now"`
	NowMs int64  `json:"now_ms"`
	Nodes []struct {
		ID     string            `json:"id"`
		Self   bool              `json:"self"`
		Mode   string            `json:"mode"`
		Health string            `json:"health"`
		Checks map[string]string `json:"checks"`
		Detail string            `json:"detail"`
	} `json:"nodes"`
	Metrics map[string]float64 `json:"metrics"`
}

func (e *env) adminStats() adminStats {
	e.t.Helper()
	var s adminStats
	r := e.ok("GET", "/v1/admin/stats", keyHdr, "")
	if err := json.Unmarshal(r.body, &s); err != nil {
		e.t.Fatalf("stats %s: %v", r.body, err)
	}
	return s
}

// TestAdminStatsAuth: the operator page's numbers are for holders of the
// API key only; anything else gets the JSON 401 or 403 every endpoint
// gives.
func TestAdminStatsAuth(t *testing.T) {
	e := newEnv(t, opts{})
	wantError(t, e.do("GET", "/v1/admin/stats", "", ""), http.StatusUnauthorized, "unauthorized", "missing credentials")
	wantError(t, e.do("GET", "/v1/admin/stats", "Bearer not-the-key", ""), http.StatusUnauthorized, "unauthorized", "invalid credentials")
	wantError(t, e.do("GET", "/v1/admin/stats", e.token("alice", ""), ""), http.StatusForbidden, "forbidden", "API key")
	wantError(t, e.do("POST", "/v1/admin/stats", keyHdr, ""), http.StatusMethodNotAllowed, "method_not_allowed")
	e.adminStats()
}

// TestAdminStatsMove: the counters move with real traffic, read from the
// metrics the node already keeps; this node is listed with its checks
// (the gateway is not running in this harness: not ready, and why).
func TestAdminStatsMove(t *testing.T) {
	e := newEnv(t, opts{})
	before := e.adminStats()
	if len(before.Nodes) != 1 || !before.Nodes[0].Self || before.Nodes[0].Mode != "embedded" || before.Nodes[0].ID == "" {
		t.Fatalf("nodes: %+v, want this node alone, embedded, named", before.Nodes)
	}
	n := before.Nodes[0]
	if n.Checks["sqlite"] != "ok" || n.Checks["gateway"] != "unavailable" || n.Health != "not_ready" || !strings.Contains(n.Detail, "gateway") {
		t.Errorf("this node: %+v, want sqlite ok, gateway unavailable, not ready because of the gateway", n)
	}
	for _, name := range []string{"presenced_heartbeats_total", "presenced_online_users", "presenced_ws_connections",
		"presenced_fanout_delivered_total", "process_resident_memory_bytes"} {
		if _, ok := before.Metrics[name]; !ok {
			t.Errorf("metrics lack %s", name)
		}
	}
	if _, ok := before.Metrics["presenced_bus_published_total"]; ok {
		t.Error("an embedded node reports a bus")
	}
	e.beat("alice", "phone", true)
	e.beat("alice", "phone", true)
	e.beat("bob", "web", true)
	e.setStatus("bob", "busy", "")
	after := e.adminStats()
	if after.NowMs < before.NowMs {
		t.Errorf("now_ms went back: %d then %d", before.NowMs, after.NowMs)
	}
	for _, c := range []struct {
		name string
		diff float64
	}{
		{"presenced_heartbeats_total", 3},
		{"presenced_online_users", 2},
		{`presenced_transitions_total{from="offline",to="online"}`, 2},
		{`presenced_transitions_total{from="online",to="busy"}`, 1},
		{`presenced_http_requests_total{code="200",route="heartbeat"}`, 3},
	} {
		if got := after.Metrics[c.name] - before.Metrics[c.name]; got != c.diff {
			t.Errorf("%s moved by %v, want %v (before %v, after %v)", c.name, got, c.diff, before.Metrics[c.name], after.Metrics[c.name])
		}
	}
	// A labelled family also appears as the sum of its series.
	var sum float64
	for k, v := range after.Metrics {
		if strings.HasPrefix(k, "presenced_transitions_total{") {
			sum += v
		}
	}
	if got := after.Metrics["presenced_transitions_total"]; got != sum || sum < 3 {
		t.Errorf("presenced_transitions_total = %v, want the sum of its series %v", got, sum)
	}
}

// debugWithViewer is the viewer part of GET /v1/debug/users/{id}?viewer_id=.
type debugWithViewer struct {
	Viewer *struct {
		ViewerID string `json:"viewer_id"`
		Relation string `json:"relation"`
		Sees     struct {
			Status   *string `json:"status"`
			LastSeen *string `json:"last_seen"`
		} `json:"sees"`
		Why string `json:"why"`
	} `json:"viewer"`
}

// TestDebugViewer: the debug view of a user tells what a chosen viewer
// sees — exactly what that viewer's read answers — and why: the user's
// settings, whether the viewer is a contact, invisibility.
func TestDebugViewer(t *testing.T) {
	e := newEnv(t, opts{})
	e.setSettings("alice", "contacts", "contacts")
	e.setContacts("alice", "bob")
	e.beat("alice", "phone", true)
	get := func(viewer string) debugWithViewer {
		t.Helper()
		var d debugWithViewer
		r := e.ok("GET", "/v1/debug/users/alice?viewer_id="+viewer, keyHdr, "")
		if err := json.Unmarshal(r.body, &d); err != nil || d.Viewer == nil {
			t.Fatalf("debug %s: %v", r.body, err)
		}
		return d
	}
	str := func(p *string) string {
		if p == nil {
			return "null"
		}
		return *p
	}
	for _, c := range []struct {
		viewer, relation, status string
		why                      []string
	}{
		{"bob", "contact", "online", []string{"alice shows their status to their contacts", "bob is in alice's contact list", "bob sees online"}},
		{"carol", "other", "null", []string{"carol is not in alice's contact list", "no status"}},
		{"alice", "self", "online", []string{"themselves"}},
	} {
		d := get(c.viewer)
		v := d.Viewer
		if v.ViewerID != c.viewer || v.Relation != c.relation || str(v.Sees.Status) != c.status {
			t.Errorf("viewer %s: %+v, want relation %s, status %s", c.viewer, v, c.relation, c.status)
		}
		for _, w := range c.why {
			if !strings.Contains(v.Why, w) {
				t.Errorf("viewer %s: why %q lacks %q", c.viewer, v.Why, w)
			}
		}
		// What the debug view says the viewer sees is what the viewer's own read answers.
		want := c.status
		if want != "null" {
			want = `"` + want + `"`
		}
		if got := e.getView("alice", keyHdr, c.viewer); show(got.Status) != want {
			t.Errorf("viewer %s: a read answers %s, the debug view says %s", c.viewer, show(got.Status), c.status)
		}
	}
	e.setStatus("alice", "invisible", "")
	if v := get("bob").Viewer; str(v.Sees.Status) != "offline" || !strings.Contains(v.Why, "invisible") {
		t.Errorf("bob of invisible alice: %+v, want offline and why invisible", v)
	}
	// Without viewer_id (or an empty one) there is no viewer part; a bad
	// one changes nothing and says why.
	for _, path := range []string{"/v1/debug/users/alice", "/v1/debug/users/alice?viewer_id="} {
		if r := e.ok("GET", path, keyHdr, ""); strings.Contains(string(r.body), `"viewer"`) {
			t.Errorf("%s: a viewer part without a viewer: %s", path, r.body)
		}
	}
	wantError(t, e.do("GET", "/v1/debug/users/alice?viewer_id=a%20b", keyHdr, ""), http.StatusBadRequest, "invalid_id", "viewer_id")
	wantError(t, e.do("GET", "/v1/debug/users/alice?viewer_id=bob&viewer_id=carol", keyHdr, ""), http.StatusBadRequest, "invalid_query", "viewer_id")
}

package app_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// TestInvisibleTextStaysHidden runs two nodes on Redis, PostgreSQL and
// NATS. An invisible user changes their text: their own sockets, on both
// nodes, are told; watchers on both nodes are sent nothing, and
// /v1/public and a viewer's read on both nodes show the text and version
// of when the user vanished; once the user is visible again everyone is
// sent the new state, at a version above everything.
func TestInvisibleTextStaysHidden(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	rs, pg, ns := testsvc.Redis(t), testsvc.Postgres(t), testsvc.NATS(t)
	cfg := func(id string) app.Config {
		return app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1, TTL: time.Minute,
			RedisURL: rs.URL, PostgresURL: pg.URL, NATSURL: ns.URL, NodeID: id}
	}
	nodes := []string{runNode(t, cfg("node-a")), runNode(t, cfg("node-b"))}
	phone, laptop := newWatcher(t, nodes[0], "u"), newWatcher(t, nodes[1], "u")
	watchers := []*watcher{newWatcher(t, nodes[0], "wa"), newWatcher(t, nodes[1], "wb")}
	for _, w := range append([]*watcher{phone, laptop}, watchers...) {
		w.send(t, `{"type":"subscribe","user_ids":["u"]}`)
		testwait.For(t, w.name+"'s snapshot", func() bool { return w.count() >= 1 })
	}
	phone.send(t, `{"type":"set_status","status":"invisible","text":"lunch"}`)
	for _, w := range watchers {
		w.wait(t, 0, "u", `"offline" "lunch"`)
	}
	laptop.wait(t, 0, "u", `"invisible" "lunch"`)
	gone := watchers[0].since(watchers[0].count() - 1)[0]
	public := func(addr string) (text any, version float64) {
		t.Helper()
		code, body := call(t, addr, "GET", "/v1/public/u", "")
		var v map[string]any
		if code != 200 || json.Unmarshal([]byte(body), &v) != nil {
			t.Fatalf("GET /v1/public/u: %d %s", code, body)
		}
		version, _ = v["version"].(float64)
		return v["status_text"], version
	}

	from := []int{watchers[0].count(), watchers[1].count()}
	phone.send(t, `{"type":"set_status","status":"invisible","text":"gone fishing"}`)
	laptop.wait(t, 0, "u", `"invisible" "gone fishing"`)
	phone.wait(t, 0, "u", `"invisible" "gone fishing"`)
	for _, addr := range nodes {
		if text, v := public(addr); text != "lunch" || uint64(v) != gone.version {
			t.Errorf("/v1/public/u on %s while invisible: text %v version %v, want %q at %d", addr, text, uint64(v), "lunch", gone.version)
		}
		code, body := call(t, addr, "GET", "/v1/presence/u?viewer_id=wa", "")
		if code != 200 || !strings.Contains(body, `"status_text":"lunch"`) || strings.Contains(body, "gone fishing") {
			t.Errorf("a viewer's read on %s: %d %s, want the text of when u vanished", addr, code, body)
		}
	}

	phone.send(t, `{"type":"set_status","status":"online","text":"back"}`)
	for i, w := range watchers {
		w.wait(t, from[i], "u", `"online" "back"`)
		got := w.since(from[i])
		if len(got) != 1 || got[0].version <= gone.version {
			t.Errorf("%s read %+v after u vanished, want only u online %q at a version above %d", w.name, got, "back", gone.version)
		}
	}
}

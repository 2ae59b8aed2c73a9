package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wsframe"
)

// runNode runs an app on 127.0.0.1 until the end of the test.
func runNode(t testing.TB, cfg app.Config) string {
	t.Helper()
	addr, stop := startNode(t, cfg)
	t.Cleanup(func() { _ = stop() })
	return addr
}

// call sends a request with the API key testKey and returns the status and body.
func call(t testing.TB, addr, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusServiceUnavailable && path != "/readyz" && resp.Header.Get("Retry-After") == "" {
		t.Errorf("%s %s: 503 without Retry-After", method, path)
	}
	return resp.StatusCode, string(b)
}

func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct{ Error struct{ Code string } }
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	return e.Error.Code
}

// TestPostgresStopsUnderANode runs a node on a private PostgreSQL and stops
// it while writes are in flight: those answer 503 `unavailable` over HTTP
// and `unavailable` over WebSocket (SQLSTATE 57P01, never 500 `internal`);
// while it is down the node stays ready (PostgreSQL is shared by every
// node) and says so in /readyz, heartbeats of users it never loaded are
// accepted — over HTTP and as a WebSocket's connect — and show nothing;
// once PostgreSQL is back those users read online.
func TestPostgresStopsUnderANode(t *testing.T) {
	pg := testsvc.Postgres(t)
	url := pg.NewDatabase(t)
	addr := runNode(t, app.Config{
		DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1, PostgresURL: url,
	})
	for _, u := range []string{"held", "ws"} {
		if code, body := call(t, addr, "POST", "/v1/status", `{"user_id":"`+u+`","status":"away"}`); code != 200 {
			t.Fatalf("status of %s: %d %s", u, code, body)
		}
	}
	w := dialWS(t, addr, "ws")
	w.msg("welcome")

	// Another session locks both rows: the writes wait in PostgreSQL.
	ctx := t.Context()
	locker, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	watch, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM users WHERE user_id IN ('held', 'ws') FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		body string
	}
	httpDone := make(chan answer, 1)
	go func() {
		code, body := call(t, addr, "POST", "/v1/status", `{"user_id":"held","status":"busy"}`)
		httpDone <- answer{code, body}
	}()
	w.send(`{"type":"set_status","status":"busy"}`)
	testwait.For(t, "both writes waiting on the row locks", func() bool {
		var n int
		// From outside the locking transaction, which would see one
		// snapshot of the statistics for its whole life.
		err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n >= 2 // a checkpoint may wait on the locks too
	})
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	switch a := <-httpDone; {
	case a.code == 200:
		// The shutdown ended the locking session first, and the write
		// committed before its own session was ended (seen under load):
		// a success, not a failure.
		t.Logf("the HTTP status change committed before the shutdown ended its session: %s", a.body)
	case a.code != 503 || errorCode(t, a.body) != "unavailable":
		t.Errorf("HTTP status change in flight at the shutdown: %d %s, want 503 unavailable", a.code, a.body)
	}
	// The same race for the socket's write: committed, it is answered
	// nothing (a set_status that succeeds has no answer).
	_ = w.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if f, err := wsframe.Read(w.r); err != nil {
		if s := statusOf(t, addr, "ws"); s != "busy" {
			t.Errorf("WebSocket set_status in flight at the shutdown: no answer (%v), and ws is %s: neither unavailable nor done", err, s)
		} else {
			t.Logf("the WebSocket status change committed before the shutdown ended its session")
		}
	} else if m := map[string]any{}; json.Unmarshal(f.Payload, &m) != nil || m["type"] != "error" || m["code"] != "unavailable" {
		t.Errorf("WebSocket set_status in flight at the shutdown: %s, want an error unavailable", f.Payload)
	}

	// PostgreSQL is down.
	code, body := call(t, addr, "GET", "/readyz", "")
	if code != 200 || !strings.Contains(body, `"postgres":"unavailable"`) || !strings.Contains(body, `"status":"ready"`) {
		t.Errorf("readyz while PostgreSQL is down: %d %s, want 200 reporting postgres unavailable", code, body)
	}
	if code, body := call(t, addr, "POST", "/v1/status", `{"user_id":"held","status":"busy"}`); code != 503 || errorCode(t, body) != "unavailable" {
		t.Errorf("status change while PostgreSQL is down: %d %s, want 503 unavailable", code, body)
	}
	code, body = call(t, addr, "POST", "/v1/heartbeat", `{"user_id":"cold","device_id":"d"}`)
	if code != 200 || !strings.Contains(body, `"status":null`) {
		t.Errorf("first heartbeat of a user while PostgreSQL is down: %d %s, want 200 with a null view", code, body)
	}
	c := dialWS(t, addr, "coldws") // connecting is a heartbeat
	c.msg("welcome")
	if code, body := call(t, addr, "GET", "/v1/presence/cold", ""); code != 503 || errorCode(t, body) != "unavailable" {
		t.Errorf("read of a user whose profile cannot be read: %d %s, want 503 unavailable", code, body)
	}

	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"cold", "coldws"} {
		testwait.For(t, u+" online", func() bool {
			code, body := call(t, addr, "GET", "/v1/presence/"+u, "")
			return code == 200 && strings.Contains(body, `"status":"online"`)
		})
	}
	// (A ping may first meet a pooled connection that died with the
	// restart; the pool drops it.)
	testwait.For(t, "readyz to report postgres ok", func() bool {
		code, body := call(t, addr, "GET", "/readyz", "")
		return code == 200 && strings.Contains(body, `"postgres":"ok"`)
	})
}

package app_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/natsbus"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// TestWebhooks: a node with a webhook URL POSTs each change it makes,
// signed, with the change's version — a heartbeat's online, a status, a
// bye's offline — and nothing for a change of settings alone.
func TestWebhooks(t *testing.T) {
	secret := []byte("app-test-webhook-secret-0123456789")
	type change struct {
		UserID, Status string
		Version        uint64
	}
	var (
		mu  sync.Mutex
		got []change
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := client.VerifyWebhook(secret, r.Header, body, time.Now(), time.Minute); err != nil {
			t.Errorf("webhook signature: %v", err)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var b struct {
			Events []struct {
				UserID  string `json:"user_id"`
				Status  string `json:"status"`
				Version uint64 `json:"version"`
			} `json:"events"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			t.Errorf("webhook body: %v: %s", err, body)
		}
		mu.Lock()
		for _, e := range b.Events {
			got = append(got, change{e.UserID, e.Status, e.Version})
		}
		mu.Unlock()
	}))
	defer recv.Close()
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		WebhookURLs: []string{recv.URL + "/presence"}, WebhookSecret: secret})
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/v1/heartbeat", `{"user_id":"ann","device_id":"phone"}`},
		{"POST", "/v1/status", `{"user_id":"ann","status":"busy"}`},
		{"PUT", "/v1/users/ann/settings", `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`},
		{"POST", "/v1/bye", `{"user_id":"ann","device_id":"phone"}`},
	} {
		if code, body := call(t, addr, req.method, req.path, req.body); code != 200 {
			t.Fatalf("%s %s: %d %s", req.method, req.path, code, body)
		}
	}
	testwait.For(t, "three changes", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 3 })
	testwait.NothingWithin(300*time.Millisecond, "a fourth change (the settings alone), which would come within a linger")
	mu.Lock()
	defer mu.Unlock()
	want := []string{"online", "busy", "offline"}
	if len(got) != len(want) {
		t.Fatalf("webhook changes %+v, want %v (a change of settings alone is not sent)", got, want)
	}
	for i, c := range got {
		if c.UserID != "ann" || c.Status != want[i] || (i > 0 && c.Version <= got[i-1].Version) {
			t.Errorf("change %d: %+v, want ann %s with a rising version", i, c, want[i])
		}
	}
}

// deadURL is a webhook URL where nothing listens: what a node keeps for it
// stays in its log.
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return "http://" + ln.Addr().String() + "/presence"
}

// heartbeatWhileHeld sends a first heartbeat of user (a change: online)
// while hold keeps the webhooks' log from taking writes, until the answer
// comes or a second passes; inLog, called before the hold is released
// when the answer came during it, and else after the answer, says whether
// the change is in the log. The answer must come only once the change is
// in the log, or count it as unconfirmed (it was not in time).
func heartbeatWhileHeld(t *testing.T, addr, user string, hold func(), release func(), inLog func(version uint64) bool) {
	t.Helper()
	type answer struct {
		code int
		body string
	}
	answered := make(chan answer, 1)
	hold()
	go func() {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/heartbeat", strings.NewReader(`{"user_id":"`+user+`","device_id":"phone"}`))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{0, err.Error()}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- answer{resp.StatusCode, string(body)}
	}()
	var a answer
	var during bool
	select {
	case a = <-answered:
		during = true
	case <-time.After(time.Second):
	}
	version := func() uint64 {
		var v struct{ Version uint64 }
		if err := json.Unmarshal([]byte(a.body), &v); a.code != 200 || err != nil {
			t.Fatalf("heartbeat: %d %s", a.code, a.body)
		}
		return v.Version
	}
	if during {
		in := inLog(version())
		release()
		if !in && getStats(t, addr).Metrics["presenced_webhook_unconfirmed_total"] == 0 {
			t.Fatalf("the heartbeat was answered while the log took no writes, its change not in it nor counted unconfirmed")
		}
		return
	}
	release()
	a = <-answered
	if !inLog(version()) && getStats(t, addr).Metrics["presenced_webhook_unconfirmed_total"] == 0 {
		t.Fatalf("the heartbeat was answered before its change was in the log, and it was not counted unconfirmed")
	}
}

// TestAcknowledgedChangeIsInTheLog: a change is answered only once it is
// in the log the webhooks are delivered from — the embedded node's
// outbox, while another connection holds SQLite's write lock; the NATS
// stream, while the node's link to NATS is stalled — or, if that takes
// longer than the confirmation allows, counted as unconfirmed.
func TestAcknowledgedChangeIsInTheLog(t *testing.T) {
	t.Run("outbox", func(t *testing.T) {
		dir := t.TempDir()
		addr := runNode(t, app.Config{DataDir: dir, APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
			WebhookURLs: []string{deadURL(t)}, WebhookSecret: []byte("app-test-webhook-secret-0123456789")})
		dsn := "file:" + filepath.Join(dir, "presenced.db") + "?_pragma=busy_timeout(10000)&_txlock=immediate"
		db, err := sql.Open("sqlite", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var tx *sql.Tx
		heartbeatWhileHeld(t, addr, "ann",
			func() {
				if tx, err = db.Begin(); err != nil { // BEGIN IMMEDIATE: the write lock
					t.Fatal(err)
				}
			},
			func() { tx.Rollback() },
			func(version uint64) bool {
				rows, err := db.Query(`SELECT data FROM webhook_outbox`)
				if err != nil {
					t.Fatal(err)
				}
				defer rows.Close()
				for rows.Next() {
					var d string
					if err := rows.Scan(&d); err != nil {
						t.Fatal(err)
					}
					if strings.Contains(d, `"user_id":"ann"`) && strings.Contains(d, fmt.Sprintf(`"version":%d,`, version)) {
						return true
					}
				}
				return false
			})
	})
	t.Run("stream", func(t *testing.T) {
		ns := testsvc.NATS(t)
		proxy := testsvc.NewProxy(t, ns.Addr)
		addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
			NATSURL: "nats://" + proxy.Addr, NoIngest: true,
			WebhookURLs: []string{deadURL(t)}, WebhookSecret: []byte("app-test-webhook-secret-0123456789")})
		nc, err := nats.Connect(ns.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		heartbeatWhileHeld(t, addr, "bob", proxy.Stall, proxy.Restore, func(version uint64) bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s, err := js.Stream(ctx, natsbus.DefaultStream)
			if err != nil {
				t.Fatal(err)
			}
			m, err := s.GetLastMsgForSubject(ctx, natsbus.DefaultSubject+".Ym9i") // base64url("bob")
			if err != nil {
				return false
			}
			return m.Header.Get("Nats-Msg-Id") == fmt.Sprintf("bob:%d", version)
		})
	})
}

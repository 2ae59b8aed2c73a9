package app_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/app"
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
	waitUntil(t, "three changes", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 3 })
	time.Sleep(300 * time.Millisecond) // anything more would come within a linger
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

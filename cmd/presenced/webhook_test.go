package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	wsclient "github.com/presenced/presenced/client"
)

// Two nodes with the same webhook URL: each change is POSTed once, by the
// node that made it — alice's on node 1, where her socket is, bob's on
// node 2, where his HTTP beats go — although node 2 watches alice and
// node 1 bob (the changes cross the bus).
func TestWebhooksAcrossNodes(t *testing.T) {
	t.Parallel()
	secret := []byte("multinode-webhook-secret-0123456789")
	type change struct {
		user, status string
		version      uint64
	}
	var (
		mu  sync.Mutex
		got []change
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := wsclient.VerifyWebhook(secret, r.Header, body, time.Now(), time.Minute); err != nil {
			t.Errorf("signature: %v", err)
			w.WriteHeader(http.StatusUnauthorized)
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
			t.Errorf("body: %v", err)
		}
		mu.Lock()
		for _, e := range b.Events {
			got = append(got, change{e.UserID, e.Status, e.Version})
		}
		mu.Unlock()
	}))
	defer recv.Close()
	b := newBackends(t)
	nodes := b.nodes(t, 2, "-webhook-url", recv.URL+"/hook", "-webhook-secret", string(secret))
	n1, n2 := nodes[0], nodes[1]
	onN2 := watcher(t, n2, "w2", "alice")
	onN1 := watcher(t, n1, "w1", "bob")

	alice := dial(t, n1, "alice", "phone")
	onN2.await(t, "w2", "alice", wsclient.Online)
	n2.heartbeat(apiKey, "bob", "pc")
	onN1.await(t, "w1", "bob", wsclient.Online)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := alice.SetStatus(ctx, wsclient.Busy, ""); err != nil {
		t.Fatal(err)
	}
	onN2.await(t, "w2", "alice", wsclient.Busy)
	n2.call("POST", "/v1/bye", apiKey, map[string]string{"user_id": "bob", "device_id": "pc"})
	onN1.await(t, "w1", "bob", wsclient.Offline)

	deadline := time.Now().Add(waitTimeout)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a duplicate would come within a linger
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]int{}
	statuses := map[string][]string{}
	for _, c := range got {
		seen[fmt.Sprintf("%s@%d", c.user, c.version)]++
		statuses[c.user] = append(statuses[c.user], c.status)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s was POSTed %d times, want once", k, n)
		}
	}
	if fmt.Sprint(statuses["alice"]) != "[online busy]" || fmt.Sprint(statuses["bob"]) != "[online offline]" {
		t.Errorf("webhook changes %v, want alice online, busy and bob online, offline", statuses)
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	wsclient "github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/testwait"
)

// Two nodes with the same webhook URL: each change is POSTed once (by the
// node that holds the URL's lease, from the stream of changes) — alice's
// made on node 1, where her socket is, bob's on node 2, where his HTTP
// beats go.
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

	testwait.For(t, "the webhook to get the four changes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 4
	})
	testwait.NothingWithin(500*time.Millisecond, "a duplicate POST (it would come within a linger)")
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

// hookReceiver is a webhook endpoint that records every event it is sent
// (signed with hookSecret), per user, in order.
type hookReceiver struct {
	t   *testing.T
	url string
	mu  sync.Mutex
	got map[string][]hookEvent
}

type hookEvent struct {
	Status  string `json:"status"`
	Version uint64 `json:"version"`
}

const hookSecret = "process-webhook-secret-0123456789abcdef"

func newHookReceiver(t *testing.T) *hookReceiver {
	r := &hookReceiver{t: t, got: map[string][]hookEvent{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if err := wsclient.VerifyWebhook([]byte(hookSecret), req.Header, body, time.Now(), time.Minute); err != nil {
			t.Errorf("signature: %v", err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var b struct {
			Events []struct {
				UserID string `json:"user_id"`
				hookEvent
			} `json:"events"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			t.Errorf("body: %v", err)
		}
		r.mu.Lock()
		for _, e := range b.Events {
			r.got[e.UserID] = append(r.got[e.UserID], e.hookEvent)
		}
		r.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/presence"
	return r
}

func (r *hookReceiver) flags() []string {
	return []string{"-webhook-url", r.url, "-webhook-secret", hookSecret}
}

// has reports whether user's change to status (at version, unless 0)
// arrived.
func (r *hookReceiver) has(user, status string, version uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.got[user], func(e hookEvent) bool {
		return e.Status == status && (version == 0 || e.Version == version)
	})
}

// ackedChanges makes changes on n and collects what the node acknowledged:
// over WebSockets, a socket's first beat (answered by the welcome) and a
// busy status (answered by the node moving on to the next message, a
// subscribe, whose snapshot comes back); over HTTP, users' first
// heartbeat (online), then — all at once, the last thing before the
// caller kills the node — a busy status of each, every answer with its
// version. It returns user → status → version (0: not told).
func ackedChanges(t *testing.T, n *proc, users int) map[string]map[string]uint64 {
	t.Helper()
	acked := map[string]map[string]uint64{}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for i := range users {
		ws := fmt.Sprint("ws", i)
		c := dial(t, n, ws, "phone") // the welcome: the connect was taken
		if err := c.SetStatus(ctx, wsclient.Busy, ""); err != nil {
			t.Fatal(err)
		}
		if err := c.Subscribe(ctx, "nobody-"+ws); err != nil {
			t.Fatal(err)
		}
	wait:
		for {
			select {
			case u := <-c.Updates():
				if ev, ok := u.(wsclient.Event); ok && ev.Snapshot {
					break wait // set_status was handled before the subscribe
				}
			case <-ctx.Done():
				t.Fatalf("%s: no snapshot after the subscribe", ws)
			}
		}
		acked[ws] = map[string]uint64{"online": 0, "busy": 0}
	}
	for i := range users {
		h := fmt.Sprint("http", i)
		v, _ := n.heartbeat(apiKey, h, "pc")["version"].(float64)
		if v == 0 {
			t.Fatalf("%s: heartbeat answered without a version", h)
		}
		acked[h] = map[string]uint64{"online": uint64(v)}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range users {
		h := fmt.Sprint("http", i)
		wg.Go(func() {
			code, b := n.do("POST", "/v1/status", apiKey, map[string]any{"user_id": h, "status": "busy"})
			var answer struct{ Version uint64 }
			if err := json.Unmarshal(b, &answer); code != http.StatusOK || err != nil || answer.Version == 0 {
				t.Errorf("%s: status answered %d %s", h, code, b)
				return
			}
			mu.Lock()
			acked[h]["busy"] = answer.Version
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return acked
}

// awaitAcked waits until r got every change of acked.
func (r *hookReceiver) awaitAcked(t *testing.T, acked map[string]map[string]uint64) {
	t.Helper()
	deadline := time.Now().Add(2 * waitTimeout)
	for {
		var missing []string
		for user, changes := range acked {
			for status, v := range changes {
				if !r.has(user, status, v) {
					missing = append(missing, fmt.Sprintf("%s %s@%d", user, status, v))
				}
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			slices.Sort(missing)
			r.mu.Lock()
			t.Fatalf("%d acknowledged changes never reached the webhook: %v (got %v)", len(missing), missing, r.got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The embedded node is killed (SIGKILL) right after it acknowledged
// changes: every one of them reaches the webhook, from the outbox in its
// SQLite file, once it is started again.
func TestWebhooksSurviveSIGKILL(t *testing.T) {
	t.Parallel()
	r := newHookReceiver(t)
	args := baseArgs(t.TempDir(), append([]string{"-api-key", apiKey, "-jwt-secret", clusterSecret}, r.flags()...)...)
	p := start(t, nil, args...)
	acked := ackedChanges(t, p, 10)
	p.signal(t, syscall.SIGKILL)
	p.wait(t)

	start(t, nil, args...)
	r.awaitAcked(t, acked)
}

// Three nodes share Redis, PostgreSQL and NATS; the one where clients
// make their changes is killed (SIGKILL) right after it acknowledged
// them: every one reaches the webhook, from the stream of changes,
// delivered by whichever node holds the URL's lease — the killed one's
// takes over if it held it.
func TestWebhooksSurviveSIGKILLOfANode(t *testing.T) {
	t.Parallel()
	r := newHookReceiver(t)
	b := newBackends(t)
	nodes := b.nodes(t, 3, r.flags()...)
	n3 := nodes[2]
	acked := ackedChanges(t, n3, 10)
	n3.signal(t, syscall.SIGKILL)
	killed := time.Now()
	n3.wait(t)
	r.awaitAcked(t, acked)
	t.Logf("every acknowledged change arrived %s after the kill", time.Since(killed).Round(10*time.Millisecond))
}

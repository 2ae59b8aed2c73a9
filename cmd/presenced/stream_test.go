package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	wsclient "github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/testwait"
)

// streamChanges returns "user status" of every change the stream
// PRESENCE_CHANGES holds, oldest first, or an error if it cannot be read
// (it is missing).
func streamChanges(js jetstream.JetStream) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "PRESENCE_CHANGES")
	if err != nil {
		return nil, err
	}
	info := s.CachedInfo()
	var out []string
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, err
		}
		var ev struct {
			UserID string `json:"user_id"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			return nil, fmt.Errorf("message %d: %v", seq, err)
		}
		out = append(out, ev.UserID+" "+ev.Status)
	}
	return out, nil
}

// readyNATS returns the state of the nats check in n's /readyz.
func readyNATS(t *testing.T, n *proc) string {
	t.Helper()
	code, b := n.do("GET", "/readyz", "", nil)
	var r struct{ Checks map[string]string }
	if err := json.Unmarshal(b, &r); err != nil || code != 200 {
		t.Fatalf("GET /readyz: %d %s (%v)", code, b, err)
	}
	return r.Checks["nats"]
}

// NATS is killed, its store directory removed — PRESENCE_CHANGES with it
// — and NATS started again on the same port, while watchers on every
// node watch the users whose statuses change (so each node subscribes to
// their subjects, and a publish to the lost stream times out instead of
// being refused). The stream comes back and holds the changes made while
// NATS was down and after it came back; the nodes count the re-creation.
// Then the stream is deleted and another stream holds one of its subjects,
// so that it cannot be created again: the node that publishes says so in
// /readyz and /metrics until the other stream is gone, and its change
// then lands.
func TestNATSLosesItsStore(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	nodes := b.nodes(t, 3)
	users := []string{"u1", "u2", "u3"}
	var watchers []*seen
	for i, n := range nodes {
		dial(t, n, users[i], "d")
		watchers = append(watchers, watcher(t, n, fmt.Sprint("w", i+1), users...))
	}
	for i, w := range watchers {
		for _, u := range users {
			w.await(t, fmt.Sprint("w", i+1), u, wsclient.Online)
		}
	}
	setStatus := func(n *proc, user, status string) {
		t.Helper()
		n.call("POST", "/v1/status", apiKey, map[string]any{"user_id": user, "status": status})
	}

	if err := b.nats.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(b.nats.Dir, "jetstream")); err != nil {
		t.Fatal(err)
	}
	setStatus(nodes[0], "u1", "busy") // while NATS is down
	time.Sleep(time.Second)           // the nodes try to reconnect meanwhile
	if err := b.nats.Start(); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	var got []string
	testwait.Forf(t, func() string { return fmt.Sprintf("the stream back with u1's change: %v, %v", got, err) }, func() bool {
		got, err = streamChanges(js)
		return err == nil && slices.Contains(got, "u1 busy")
	})
	t.Logf("%v after NATS came back, the stream holds %v", time.Since(restarted).Round(time.Millisecond), got)
	// Every node is back on NATS (and subscribed again) before the next
	// change, so that its watchers see it live.
	testwait.Forf(t, func() string { return "every node's NATS check ok" }, func() bool {
		for _, n := range nodes {
			if readyNATS(t, n) != "ok" {
				return false
			}
		}
		return true
	})
	setStatus(nodes[1], "u2", "busy") // after the restart
	for i, w := range watchers {
		w.await(t, fmt.Sprint("w", i+1), "u2", wsclient.Busy)
	}
	testwait.Forf(t, func() string { return fmt.Sprintf("the stream with u1's and u2's changes: %v, %v", got, err) }, func() bool {
		got, err = streamChanges(js)
		return err == nil && slices.Contains(got, "u1 busy") && slices.Contains(got, "u2 busy")
	})
	t.Logf("the stream holds after the restart: %v", got)
	recreated := 0.0
	for _, n := range nodes {
		recreated += metric(t, n.server, "presenced_bus_stream_recreated_total")
		if m := metric(t, n.server, "presenced_bus_stream_missing"); m != 0 {
			t.Errorf("%s: presenced_bus_stream_missing %v after the re-creation", n.base, m)
		}
	}
	if recreated == 0 {
		t.Errorf("no node counted the stream's re-creation")
	}

	// The stream is deleted and a stream of another service holds one
	// of its subjects: it cannot be created again.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := js.DeleteStream(ctx, "PRESENCE_CHANGES"); err != nil {
		t.Fatal(err)
	}
	other := jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"presence.changes." + base64.RawURLEncoding.EncodeToString([]byte("x"))}}
	if _, err := js.CreateStream(ctx, other); err != nil {
		t.Fatal(err)
	}
	setStatus(nodes[2], "u3", "away")
	changed := time.Now()
	for i, w := range watchers {
		w.await(t, fmt.Sprint("w", i+1), "u3", wsclient.Away)
	}
	testwait.Forf(t, func() string { return "node 3 reports the stream missing" }, func() bool {
		return readyNATS(t, nodes[2]) == "stream_missing" && metric(t, nodes[2].server, "presenced_bus_stream_missing") == 1
	})
	t.Logf("node 3 reports the stream missing %v after u3's change", time.Since(changed).Round(time.Millisecond))
	if v := metric(t, nodes[2].server, "presenced_bus_unacked_seconds"); v <= 0 {
		t.Errorf("presenced_bus_unacked_seconds %v while u3's change waits", v)
	}
	nodes[2].awaitLog("readiness check fails", "check=nats", "state=stream_missing")
	if err := js.DeleteStream(ctx, "OTHER"); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	testwait.Forf(t, func() string { return fmt.Sprintf("u3's change in the stream: %v, %v", got, err) }, func() bool {
		got, err = streamChanges(js)
		return err == nil && slices.Contains(got, "u3 away")
	})
	t.Logf("u3's change in the stream %v after the other stream was deleted: %v", time.Since(freed).Round(time.Millisecond), got)
	testwait.Forf(t, func() string { return "node 3's NATS check ok" }, func() bool { return readyNATS(t, nodes[2]) == "ok" })
	if m := metric(t, nodes[2].server, "presenced_bus_stream_missing"); m != 0 {
		t.Errorf("presenced_bus_stream_missing %v after the re-creation", m)
	}
	if strings.Contains(nodes[2].logs.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", nodes[2].logs)
	}
}

package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// A node is frozen (SIGSTOP) while a /readyz probe waits for PostgreSQL
// and NATS, whose links stall a moment (held bytes flow on when the node
// is frozen); the probe's caller gives up after 1 s, the node resumes 4 s
// later. PostgreSQL and NATS were fine: the node must not log them as
// failing. Redis, stopped before, did fail: its check is named, with why.
func TestReadinessWhileFrozen(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	pg := testsvc.NewProxy(t, b.postgres.Addr)
	nt := testsvc.NewProxy(t, b.nats.Addr)
	n := start(t, nil,
		"-addr", "127.0.0.1:0", "-data", filepath.Join(t.TempDir(), "node"),
		"-api-key", apiKey, "-jwt-secret", clusterSecret, "-heartbeat-ttl", clusterTTL.String(),
		"-redis-url", b.redis.URL, "-redis-prefix", b.prefix,
		"-postgres-url", strings.Replace(b.pgURL, b.postgres.Addr, pg.Addr, 1),
		"-nats-url", "nats://"+nt.Addr, "-node-id", "frozen")
	checks := func() map[string]string {
		code, body := n.do("GET", "/readyz", "", nil)
		if code != 200 {
			t.Fatalf("GET /readyz: %d %s", code, body)
		}
		m := map[string]string{}
		for _, c := range []string{"postgres", "redis", "nats"} {
			switch {
			case strings.Contains(string(body), fmt.Sprintf(`"%s":"ok"`, c)):
				m[c] = "ok"
			case strings.Contains(string(body), fmt.Sprintf(`"%s":"unavailable"`, c)):
				m[c] = "unavailable"
			}
		}
		return m
	}
	if err := b.redis.Stop(); err != nil {
		t.Fatal(err)
	}
	testwait.Forf(t, func() string { return fmt.Sprintf("redis unavailable: %v", checks()) }, func() bool {
		c := checks()
		return c["redis"] == "unavailable" && c["postgres"] == "ok" && c["nats"] == "ok"
	})

	pg.Stall()
	nt.Stall()
	probed := make(chan error, 1)
	go func() {
		c := &http.Client{Timeout: time.Second} // a load balancer's probe
		resp, err := c.Get(n.base + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		probed <- err
	}()
	time.Sleep(300 * time.Millisecond) // the probe's checks wait on the stalled links
	n.signal(t, syscall.SIGSTOP)
	pg.Restore()
	nt.Restore()
	time.Sleep(4 * time.Second) // frozen: longer than the probe's 2 s
	n.signal(t, syscall.SIGCONT)
	if err := <-probed; err == nil {
		t.Error("the probe was answered while the node was frozen")
	}
	testwait.Forf(t, func() string { return fmt.Sprintf("postgres and nats ok: %v", checks()) }, func() bool {
		c := checks()
		return c["postgres"] == "ok" && c["nats"] == "ok"
	})
	logs := n.logs.String()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "readiness check fails") && (strings.Contains(line, "check=postgres") || strings.Contains(line, "check=nats")) {
			t.Errorf("a check that was fine logged as failing: %s", line)
		}
	}
	n.awaitLog("readiness check fails", "check=redis", "the state store is down")
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "readiness checks not judged") {
			t.Logf("%s", line)
		}
	}
}

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	wsclient "github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/auth"
)

// A node whose file limit is 1,024 — its connection caps derived from it —
// is flooded from eight source addresses with 2,000 connections that only
// hold a place (half idle after one request, half never sending a byte):
// it never runs out of files, and /healthz (on the clients' listener, once
// the silent ones stalled, and on -health-addr), a client's heartbeat and
// a WebSocket still get through.
func TestConnectionFlood(t *testing.T) {
	t.Parallel()
	key, secret := apiKey, clusterSecret
	cmd := exec.Command("/bin/sh", "-c", `ulimit -n 1024 && exec "$0" "$@"`, binary(t))
	cmd.Args = append(cmd.Args, baseArgs(t.TempDir(), "-api-key", key, "-jwt-secret", secret, "-health-addr", "127.0.0.1:0")...)
	p := startCmd(t, cmd, nil)
	p.server = awaitReady(t, p.cmd.Stderr.(*syncBuffer), p.exited)
	line := p.awaitLog("connection budget")
	if !strings.Contains(line, "max=924") || !strings.Contains(line, "per_address=231") || !strings.Contains(line, "pending=115") {
		t.Fatalf("caps not derived from the file limit of 1024: %s", line)
	}
	m := regexp.MustCompile(`msg="health checks listening" addr=(\S+)`).FindStringSubmatch(p.awaitLog("health checks listening"))
	if m == nil {
		t.Fatalf("no health listener in the logs:\n%s", p.logs)
	}
	health := "http://" + m[1]
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(p.base, "http://"))

	var (
		mu    sync.Mutex
		flood []net.Conn
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range flood {
			c.Close()
		}
	})
	var wg sync.WaitGroup
	for a := 2; a <= 9; a++ {
		wg.Go(func() {
			src := fmt.Sprintf("127.0.0.%d", a)
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
			for i := range 250 {
				c, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
				if err != nil {
					continue // refused or reset: the node defends itself
				}
				mu.Lock()
				flood = append(flood, c)
				mu.Unlock()
				if i%2 == 0 {
					// One request, then idle on a keep-alive connection.
					c.SetDeadline(time.Now().Add(5 * time.Second))
					fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
					if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}
		})
	}
	wg.Wait()

	// A newcomer takes the place of a connection that only holds one
	// once it stalled (one silent since it connected: after a tenth of
	// -header-timeout); until then, the node answers it 503 with
	// Retry-After, and it does as told.
	for _, base := range []string{p.base, health} {
		deadline := time.Now().Add(waitTimeout)
		for {
			resp, err := http.Get(base + "/healthz")
			if err != nil {
				t.Fatalf("%s/healthz under the flood: %v", base, err)
			}
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
			if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || time.Now().After(deadline) {
				t.Fatalf("%s/healthz under the flood: %d, Retry-After %q", base, resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			time.Sleep(100 * time.Millisecond) // less than Retry-After: the test has no time to lose
		}
	}
	p.heartbeat(key, "alice", "phone")
	if got := p.call("GET", "/v1/presence/alice", key, nil)["status"]; got != "online" {
		t.Fatalf("alice is %v after her heartbeat", got)
	}
	tok, err := auth.Sign([]byte(secret), "bob", "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	ws, err := wsclient.Dial(ctx, wsclient.Config{URL: p.base, Token: tok, DeviceID: "laptop"})
	if err != nil {
		t.Fatalf("a WebSocket under the flood: %v", err)
	}
	defer ws.Close()
	if got := p.call("GET", "/v1/presence/bob", key, nil)["status"]; got != "online" {
		t.Fatalf("bob is %v with his socket open", got)
	}
	code, body := p.do("GET", "/v1/presence/batch?"+strings.Repeat("x", 40<<10), key, nil)
	if code != 431 || !strings.Contains(string(body), `"headers_too_large"`) {
		t.Fatalf("a 40 KiB request line: %d %s", code, body)
	}
	opened := metric(t, p.server, "process_open_fds")
	if opened >= 1024 {
		t.Fatalf("%v files open: the node reached its limit", opened)
	}
	if evicted := metric(t, p.server, "presenced_connections_evicted_total"); evicted == 0 {
		t.Fatal("no connection was evicted: the flood did not reach the caps")
	}
	if strings.Contains(p.logs.String(), "too many open files") {
		t.Fatalf("the node ran out of files:\n%s", p.logs)
	}
}

// TestConnCapsFollowMaxConns: the per-address and pending caps default to
// a quarter and an eighth of the -max-conns in force, given as a flag or
// as its variable; one given is taken as it is, 0 is no cap.
func TestConnCapsFollowMaxConns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"flag", nil, []string{"-max-conns", "100"}, "max=100 per_address=25 pending=16 "},
		{"variable", map[string]string{envName("max-conns"): "2000"}, nil, "max=2000 per_address=500 pending=250 "},
		{"per-address cap given", nil, []string{"-max-conns", "2000", "-max-conns-per-ip", "30"}, "max=2000 per_address=30 pending=250 "},
		{"no per-address cap", map[string]string{envName("max-conns-per-ip"): "0"}, []string{"-max-conns", "2000"}, "max=2000 per_address=0 pending=250 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startInProcess(t, tc.env, append(baseArgs(t.TempDir(), "-api-key", apiKey), tc.args...)...)
			if line := s.awaitLog("connection budget"); !strings.Contains(line, tc.want) {
				t.Errorf("%s\nwant %q", line, tc.want)
			}
		})
	}
}

package app_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testwait"
)

// DNS rebinding: a page at http://evil.example:PORT whose name the
// attacker points at the node's address sends Host and Origin both
// evil.example:PORT — to the origin check, the node's own page. The node
// answers only the Host names it is configured for. Tested with raw
// requests on real sockets, as a browser sends them.

// exchange sends the raw requests reqs on one connection to addr, one
// after the other (keep-alive), and returns the status and body of each
// answer.
func exchange(t *testing.T, addr string, reqs ...string) (codes []int, bodies []string) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	for _, req := range reqs {
		if _, err := io.WriteString(nc, req); err != nil {
			t.Fatal(err)
		}
		method, _, _ := strings.Cut(req, " ")
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("reading the answer to %q: %v", req, err)
		}
		b := []byte(nil)
		if resp.StatusCode != http.StatusSwitchingProtocols {
			b, _ = io.ReadAll(resp.Body)
		}
		resp.Body.Close()
		codes, bodies = append(codes, resp.StatusCode), append(bodies, string(b))
	}
	return codes, bodies
}

// rebound is a request of the page at http://host (port included), as
// the browser sends it once the name host points at the node.
func rebound(method, path, host, extra string) string {
	body := ""
	if method == "POST" {
		body = `{"user_id":"victim","status":"invisible"}`
	}
	return method + " " + path + " HTTP/1.1\r\nHost: " + host + "\r\nOrigin: http://" + host + "\r\n" + extra +
		"Content-Type: application/json\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n" + body
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

const upgradeHeaders = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"

// TestDNSRebinding: on a -dev node (no credentials needed) a rebound page
// gets 421 host_not_allowed on every route — writes, the debug and admin
// reads, /metrics, the demo and operator pages, and the WebSocket both
// where it is read off the listener and where net/http serves it — and
// changes nothing; the health checks answer any Host. The node's own
// names (loopback addresses, localhost) are served as before.
func TestDNSRebinding(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), Dev: true, APIKey: testKey, PollInterval: -1})
	_, port, _ := net.SplitHostPort(addr)
	evil := "evil.example:" + port
	mustCall(t, addr, "POST", "/v1/heartbeat", `{"user_id":"victim","device_id":"d"}`)

	for _, path := range []string{"/v1/debug/users/victim", "/v1/admin/stats", "/metrics", "/", "/admin", "/static/presence.js",
		"/v1/presence/victim", "/presence/batch?user_ids=victim", "/v1/openapi.json", "/nowhere"} {
		codes, bodies := exchange(t, addr, rebound("GET", path, evil, ""))
		if codes[0] != http.StatusMisdirectedRequest || errorCode(t, bodies[0]) != "host_not_allowed" {
			t.Errorf("GET %s from the rebound page: %d %s, want 421 host_not_allowed", path, codes[0], bodies[0])
		}
	}
	for _, path := range []string{"/v1/status", "/v1/bye", "/v1/heartbeat"} {
		codes, bodies := exchange(t, addr, rebound("POST", path, evil, ""))
		if codes[0] != http.StatusMisdirectedRequest || errorCode(t, bodies[0]) != "host_not_allowed" {
			t.Errorf("POST %s from the rebound page: %d %s, want 421", path, codes[0], bodies[0])
		}
	}
	// The WebSocket: the first request of a connection is read off the
	// listener (wsaccept); a later one on a keep-alive connection goes
	// through net/http.
	ws := rebound("GET", "/v1/ws?user_id=victim&device_id=evil", evil, upgradeHeaders)
	for name, reqs := range map[string][]string{
		"off the listener": {ws},
		"through net/http": {rebound("GET", "/healthz", evil, ""), ws},
	} {
		codes, bodies := exchange(t, addr, reqs...)
		if last := len(codes) - 1; codes[last] != http.StatusMisdirectedRequest || errorCode(t, bodies[last]) != "host_not_allowed" {
			t.Errorf("WebSocket %s from the rebound page: %d %s, want 421", name, codes[last], bodies[last])
		}
	}
	// Nothing changed: victim online with one device, the rebound page's
	// device never connected.
	if s := statusOf(t, addr, "victim"); s != "online" {
		t.Errorf("victim is %s after the rebound page's requests, want online", s)
	}
	if _, body := call(t, addr, "GET", "/v1/debug/users/victim", ""); strings.Contains(body, `"evil"`) {
		t.Errorf("the rebound page's socket counted: %s", body)
	}

	// Probes may send any Host.
	for _, path := range []string{"/healthz", "/readyz"} {
		if codes, bodies := exchange(t, addr, rebound("GET", path, evil, "")); codes[0] != 200 {
			t.Errorf("GET %s with Host %s: %d %s, want 200", path, evil, codes[0], bodies[0])
		}
	}
	// The node's own names: its loopback address (and any IP address),
	// localhost — pages and sockets as before.
	for _, host := range []string{addr, "localhost:" + port, "[::1]:" + port, "127.0.0.1"} {
		codes, bodies := exchange(t, addr, rebound("GET", "/v1/debug/users/victim", host, ""), rebound("POST", "/v1/status", host, ""))
		if codes[0] != 200 || codes[1] != 200 {
			t.Errorf("Host %s: %v %v, want 200s", host, codes, bodies)
		}
		codes, bodies = exchange(t, addr, rebound("GET", "/v1/ws?user_id=u&device_id=d", host, upgradeHeaders))
		if codes[0] != http.StatusSwitchingProtocols {
			t.Errorf("Host %s: upgrade %d %s, want 101", host, codes[0], bodies[0])
		}
	}
}

// TestAllowedHosts: a node that is not local (it listens on every
// address, without -dev) answers every Host unless -allowed-hosts lists
// them, as behind a proxy that forwards its public name; a node on a
// loopback address is local even without -dev; -allowed-hosts adds
// names to either.
func TestAllowedHosts(t *testing.T) {
	run := func(cfg app.Config, listen string) string {
		t.Helper()
		cfg.DataDir, cfg.APIKey, cfg.PollInterval = t.TempDir(), testKey, -1
		a, err := app.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx, ln) }()
		t.Cleanup(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		addr := "127.0.0.1:" + port
		testwait.For(t, "the node ready", func() bool { code, _ := call(t, addr, "GET", "/readyz", ""); return code == 200 })
		return addr
	}
	get := func(addr, host string) int {
		t.Helper()
		codes, _ := exchange(t, addr, "GET /v1/presence/u HTTP/1.1\r\nHost: "+host+"\r\nAuthorization: Bearer "+testKey+"\r\n\r\n")
		return codes[0]
	}
	for _, tc := range []struct {
		name   string
		cfg    app.Config
		listen string
		ok     []string
		bad    []string
	}{
		{"every address, no list", app.Config{}, "0.0.0.0:0",
			[]string{"presence.example.com", "evil.example:8080", "10.0.0.5:8080"}, nil},
		{"every address, a list", app.Config{AllowedHosts: []string{"presence.example.com", "*.presence.example.net"}}, "0.0.0.0:0",
			[]string{"presence.example.com", "eu.presence.example.net:443", "10.0.0.5:8080", "localhost"},
			[]string{"evil.example:8080", "presence.example.net"}},
		{"every address, *", app.Config{AllowedHosts: []string{"*"}}, "0.0.0.0:0",
			[]string{"evil.example"}, nil},
		{"loopback, no list", app.Config{}, "127.0.0.1:0",
			[]string{"127.0.0.1", "localhost:1"},
			[]string{"evil.example", "presence.example.com"}},
		{"loopback, a list", app.Config{AllowedHosts: []string{"presence.example.com"}}, "127.0.0.1:0",
			[]string{"presence.example.com", "127.0.0.1"},
			[]string{"evil.example"}},
	} {
		addr := run(tc.cfg, tc.listen)
		for _, h := range tc.ok {
			if code := get(addr, h); code != 200 {
				t.Errorf("%s: Host %s: %d, want 200", tc.name, h, code)
			}
		}
		for _, h := range tc.bad {
			if code := get(addr, h); code != http.StatusMisdirectedRequest {
				t.Errorf("%s: Host %s: %d, want 421", tc.name, h, code)
			}
		}
	}
	if _, err := app.New(context.Background(), app.Config{DataDir: t.TempDir(), APIKey: testKey, AllowedHosts: []string{"https://x.example"}}); err == nil ||
		!strings.Contains(err.Error(), "allowed hosts") {
		t.Errorf("a bad -allowed-hosts entry: %v, want an error", err)
	}
}

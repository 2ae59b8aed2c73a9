package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	wsclient "github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/tlscert/tlstest"
)

// originDo sends method path with an Origin and extra headers.
func originDo(t *testing.T, s *server, method, path, origin string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, s.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", origin)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// wantOriginRefused checks a 403 origin_not_allowed JSON answer.
func wantOriginRefused(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &body); err != nil || resp.StatusCode != http.StatusForbidden || body.Error.Code != "origin_not_allowed" {
		t.Errorf("%s: %d %s, want 403 origin_not_allowed", what, resp.StatusCode, b)
	}
}

// TestAllowedOriginsFlag: -allowed-origins (here from its environment
// variable) reaches the HTTP API and the WebSocket gateway.
func TestAllowedOriginsFlag(t *testing.T) {
	t.Parallel()
	s := startInProcess(t, map[string]string{envName("allowed-origins"): "https://app.example.com, https://*.example.org"},
		baseArgs(t.TempDir(), "-api-key", apiKey)...)
	for _, o := range []string{"https://app.example.com", "https://x.example.org"} {
		resp := originDo(t, s, "OPTIONS", "/v1/heartbeat", o, map[string]string{"Access-Control-Request-Method": "POST"})
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != o {
			t.Errorf("preflight from %s: %d, Allow-Origin %q", o, resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
		}
	}
	wantOriginRefused(t, "heartbeat from a foreign page", originDo(t, s, "POST", "/v1/heartbeat", "https://evil.example",
		map[string]string{"Authorization": "Bearer " + apiKey}))
	wantOriginRefused(t, "upgrade from a foreign page", originDo(t, s, "GET", "/v1/ws", "https://evil.example",
		map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}))
	// The node's own pages are always allowed.
	resp := originDo(t, s, "GET", "/v1/public/u1", s.base, nil)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("same-origin read: %d", resp.StatusCode)
	}
}

// TestAllowedHostsFlag: -allowed-hosts (here from its environment
// variable) adds names to what a node on a loopback address answers to;
// a Host of another name is refused 421 on the API and the WebSocket,
// and the health checks answer any.
func TestAllowedHostsFlag(t *testing.T) {
	t.Parallel()
	s := startInProcess(t, map[string]string{envName("allowed-hosts"): "presence.example.com, *.presence.example.net"},
		baseArgs(t.TempDir(), "-api-key", apiKey)...)
	do := func(path, host string, hdr map[string]string) int {
		t.Helper()
		req, err := http.NewRequest("GET", s.base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+apiKey)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	ws := map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
	for host, want := range map[string]int{
		"presence.example.com": 200, "eu.presence.example.net:8080": 200, strings.TrimPrefix(s.base, "http://"): 200, "localhost": 200,
		"evil.example": http.StatusMisdirectedRequest, "presence.example.net": http.StatusMisdirectedRequest,
	} {
		if got := do("/v1/presence/u1", host, nil); got != want {
			t.Errorf("GET /v1/presence/u1 with Host %s: %d, want %d", host, got, want)
		}
	}
	if got := do("/v1/ws", "evil.example", ws); got != http.StatusMisdirectedRequest {
		t.Errorf("upgrade with Host evil.example: %d, want 421", got)
	}
	if got := do("/healthz", "evil.example", nil); got != 200 {
		t.Errorf("GET /healthz with Host evil.example: %d, want 200", got)
	}
}

// --- TLS ---

var (
	listeningTLSRE = regexp.MustCompile(`msg="presenced listening" addr=(\S+) tls=true`)
	healthRE       = regexp.MustCompile(`msg="health checks listening" addr=(\S+)`)
)

// tlsNode is a node serving HTTPS, with a client that trusts its CA.
type tlsNode struct {
	*proc
	base, health string // https://…, http://… (the health listener)
	https        *http.Client
	ca           *tlstest.CA
	certFile     string
	keyFile      string
}

// startTLS starts the binary with -tls-cert and -tls-key of a certificate
// with serial 2 and waits until /readyz answers over HTTPS.
func startTLS(t *testing.T, args ...string) *tlsNode {
	t.Helper()
	n := &tlsNode{ca: tlstest.NewCA(t)}
	n.certFile, n.keyFile = n.ca.Issue(t, t.TempDir(), "node", 2)
	n.https = &http.Client{Timeout: waitTimeout, Transport: &http.Transport{TLSClientConfig: n.ca.ClientConfig()}}
	t.Cleanup(n.https.CloseIdleConnections)
	args = append(baseArgs(t.TempDir(), "-api-key", apiKey, "-jwt-secret", testSecret, "-tls-cert", n.certFile, "-tls-key", n.keyFile), args...)
	n.proc = startNoWait(t, nil, args...)
	logs := n.cmd.Stderr.(*syncBuffer)
	n.server = &server{t: t, logs: logs}
	// With -health-addr, its listener is logged after the main one's: wait
	// for both.
	wantHealth := slices.Contains(args, "-health-addr")
	deadline := time.Now().Add(waitTimeout)
	for {
		if m := listeningTLSRE.FindStringSubmatch(logs.String()); m != nil {
			n.base = "https://" + m[1]
			if h := healthRE.FindStringSubmatch(logs.String()); h != nil {
				n.health = "http://" + h[1]
			}
			if resp, err := n.https.Get(n.base + "/readyz"); err == nil && (n.health != "" || !wantHealth) {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return n
				}
			}
		}
		select {
		case <-n.exited:
			t.Fatalf("presenced exited; logs:\n%s", logs)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("presenced not ready over HTTPS within %s; logs:\n%s", waitTimeout, logs)
		}
	}
}

// serial is the serial number of the certificate a new TLS handshake
// with the node sees.
func (n *tlsNode) serial(t *testing.T) int64 {
	t.Helper()
	c, err := tls.Dial("tcp", strings.TrimPrefix(n.base, "https://"), n.ca.ClientConfig())
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer c.Close()
	return tlstest.Serial(c.ConnectionState())
}

func (n *tlsNode) dial(t *testing.T, user string) *wsclient.Client {
	t.Helper()
	tok, err := auth.Sign([]byte(testSecret), user, "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := wsclient.Dial(ctx, wsclient.Config{URL: n.base, Token: tok, TLSConfig: n.ca.ClientConfig()})
	if err != nil {
		t.Fatalf("WSS dial as %s: %v", user, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// awaitStatus waits for an event of user with status on c.
func awaitStatus(t *testing.T, c *wsclient.Client, user string, status wsclient.Status) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		select {
		case u := <-c.Updates():
			if ev, ok := u.(wsclient.Event); ok && ev.UserID == user && ev.Status == status {
				return
			}
		case <-timeout:
			t.Fatalf("no %s %s within %s", user, status, waitTimeout)
		}
	}
}

// TestTLS: with -tls-cert and -tls-key the binary serves HTTPS and WSS
// (a presence round trip through the Go client), answers a plain request
// on its port with JSON 400 https_required, keeps -health-addr plain HTTP,
// and on SIGHUP presents a renewed certificate to new connections — while
// open sockets stay up — or, given a bad pair, keeps the one in use.
func TestTLS(t *testing.T) {
	t.Parallel()
	n := startTLS(t, "-health-addr", "127.0.0.1:0")
	if got := n.serial(t); got != 2 {
		t.Fatalf("serial %d, want 2", got)
	}

	// HTTPS: the API with the key.
	req, _ := http.NewRequest("GET", n.base+"/v1/presence/alice", nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := n.https.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		t.Fatalf("GET over HTTPS: %d (TLS %v)", resp.StatusCode, resp.TLS != nil)
	}
	// A plain request on the TLS port.
	resp, err = client.Get(strings.Replace(n.base, "https://", "http://", 1) + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"https_required"`) {
		t.Errorf("plain HTTP on the TLS port: %d %s, want 400 https_required", resp.StatusCode, b)
	}
	// The health listener stays plain HTTP.
	if n.health == "" {
		t.Fatalf("no health listener logged:\n%s", n.logs)
	}
	resp, err = client.Get(n.health + "/readyz")
	if err != nil {
		t.Fatalf("plain HTTP on -health-addr: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("-health-addr /readyz: %d", resp.StatusCode)
	}

	// WSS: bob watches alice, who sets her status.
	bob := n.dial(t, "bob")
	alice := n.dial(t, "alice")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := bob.Subscribe(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	awaitStatus(t, bob, "alice", wsclient.Online)
	if err := alice.SetStatus(ctx, wsclient.Busy, "over TLS"); err != nil {
		t.Fatal(err)
	}
	awaitStatus(t, bob, "alice", wsclient.Busy)

	// Renewal: serial 3 in the same files, then SIGHUP.
	c3, k3 := n.ca.Issue(t, t.TempDir(), "renewed", 3)
	tlstest.Replace(t, c3, n.certFile)
	tlstest.Replace(t, k3, n.keyFile)
	n.signal(t, syscall.SIGHUP)
	n.awaitLog("TLS certificate reloaded", "serial=3")
	if got := n.serial(t); got != 3 {
		t.Fatalf("after SIGHUP: serial %d, want 3", got)
	}
	// The sockets opened before are still up.
	if err := alice.SetStatus(ctx, wsclient.Away, ""); err != nil {
		t.Fatal(err)
	}
	awaitStatus(t, bob, "alice", wsclient.Away)

	// A bad pair (the key of another certificate): kept serial 3.
	_, k4 := n.ca.Issue(t, t.TempDir(), "other", 4)
	tlstest.Replace(t, k4, n.keyFile)
	n.signal(t, syscall.SIGHUP)
	n.awaitLog("TLS certificate not reloaded", "private key does not match public key")
	if got := n.serial(t); got != 3 {
		t.Fatalf("after a bad pair: serial %d, want 3 (kept)", got)
	}
	n.signal(t, syscall.SIGTERM)
	if code := n.wait(t); code != 0 {
		t.Fatalf("exit code %d; logs:\n%s", code, n.logs)
	}
}

// TestTLSFlagErrors: a pair that does not load, or one flag without the
// other, is refused at start with a message naming the files and the
// reason, before anything is written.
func TestTLSFlagErrors(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, _ := ca.Issue(t, dir, "a", 2)
	_, otherKey := ca.Issue(t, dir, "b", 3)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"mismatched key", []string{"-tls-cert", certFile, "-tls-key", otherKey},
			[]string{"-tls-cert/-tls-key", certFile, otherKey, "private key does not match public key"}},
		{"missing certificate", []string{"-tls-cert", filepath.Join(dir, "none.crt"), "-tls-key", otherKey},
			[]string{"none.crt", "no such file"}},
		{"certificate without key", []string{"-tls-cert", certFile}, []string{"-tls-cert and -tls-key go together"}},
		{"key without certificate", []string{"-tls-key", otherKey}, []string{"-tls-cert and -tls-key go together"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			_, _, err := runQuick(t, nil, baseArgs(data, append([]string{"-api-key", apiKey}, tc.args...)...)...)
			if err == nil {
				t.Fatal("started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v lacks %q", err, w)
				}
			}
			if ents, _ := os.ReadDir(data); len(ents) != 0 {
				t.Errorf("the data directory was written: %v", ents)
			}
		})
	}
}

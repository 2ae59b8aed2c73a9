package main

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
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

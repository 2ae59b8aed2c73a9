package app_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/app"
)

// Both edges read a JSON object by one rule (package strictjson): what
// the decoders take is tested at the real edges, a node on a socket.

// statusOf reads user's status as the API key sees it.
func statusOf(t *testing.T, addr, user string) string {
	t.Helper()
	code, body := call(t, addr, "GET", "/v1/presence/"+user, "")
	var v struct {
		Status *string `json:"status"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil || v.Status == nil {
		t.Fatalf("GET /v1/presence/%s: %d %s", user, code, body)
	}
	return *v.Status
}

// TestMessagesDecodeLikeBodies: a WebSocket message whose field names
// differ in case from the protocol's, or that gives a field twice, is an
// error frame and changes nothing — as the same body is a 400 over HTTP.
// (encoding/json alone matches keys without regard to case and keeps the
// last of two: the first made alice invisible, the second ended her
// device.)
func TestMessagesDecodeLikeBodies(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1})
	c := dialWS(t, addr, "alice")
	c.msg("welcome")
	c.send(`{"type":"set_status","status":"busy"}`)
	waitUntil(t, "alice busy", func() bool { return statusOf(t, addr, "alice") == "busy" })

	for _, m := range []struct{ msg, body, word string }{
		{`{"type":"set_status","status":"busy","Status":"invisible"}`, `{"user_id":"alice","status":"busy","Status":"invisible"}`, `"Status"`},
		{`{"type":"set_status","status":"invisible","STATUS":"busy"}`, `{"user_id":"alice","status":"invisible","STATUS":"busy"}`, `"STATUS"`},
		{`{"type":"set_status","status":"busy","status":"invisible"}`, `{"user_id":"alice","status":"busy","status":"invisible"}`, "twice"},
		{`{"Type":"set_status","status":"invisible"}`, `{"User_id":"alice","status":"invisible"}`, ``},
		{`{"type":"heartbeat","type":"bye"}`, ``, "twice"},
		{`{"type":"bye","TYPE":"heartbeat"}`, ``, `"TYPE"`},
	} {
		c.send(m.msg)
		e := c.msg("error")
		if e["code"] != "invalid_json" || !strings.Contains(e["message"].(string), m.word) {
			t.Errorf("%s: got %v, want invalid_json naming %s", m.msg, e, m.word)
		}
		if m.body != "" {
			if code, body := call(t, addr, "POST", "/v1/status", m.body); code != 400 || errorCode(t, body) != "invalid_json" {
				t.Errorf("POST /v1/status %s: %d %s, want 400 invalid_json", m.body, code, body)
			}
		}
	}
	// Nothing changed: alice is busy, her device alive, the socket open.
	c.send(`{"type":"subscribe","user_ids":["alice"]}`)
	u := c.msg("snapshot")["users"].(map[string]any)["alice"].(map[string]any)
	if u["status"] != "busy" {
		t.Errorf("after refused messages alice's own socket sees %v, want busy", u)
	}
	if s := statusOf(t, addr, "alice"); s != "busy" {
		t.Errorf("after refused messages alice is %s, want busy", s)
	}
}

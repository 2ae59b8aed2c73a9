package app_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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

// rawToken signs the JSON texts header and claims as they are (HS256,
// testSecret).
func rawToken(header, claims string) string {
	b64 := base64.RawURLEncoding.EncodeToString
	in := b64([]byte(header)) + "." + b64([]byte(claims))
	m := hmac.New(sha256.New, testSecret)
	m.Write([]byte(in))
	return in + "." + b64(m.Sum(nil))
}

// upgrade asks for a WebSocket with query and returns the answer's status
// and error code.
func upgrade(t *testing.T, addr, query string, header http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/ws"+query, nil)
	for k, v := range map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="} {
		req.Header.Set(k, v)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return resp.StatusCode, "" // the socket closes with the body
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, errorCode(t, string(b))
}

// TestTokenClaimsStrict: a token whose claims name the user twice (or
// in other case), give exp as a string, or were issued in the future is
// refused 401 by the HTTP API and the WebSocket alike, and acts for
// nobody. Before, {"sub":"alice","SUB":"admin"} set admin's status.
func TestTokenClaimsStrict(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1})
	now, exp := time.Now().Unix(), time.Now().Add(time.Hour).Unix()
	hs := `{"alg":"HS256","typ":"JWT"}`
	for _, tc := range []struct{ name, header, claims string }{
		{"SUB beside sub", hs, fmt.Sprintf(`{"sub":"alice","SUB":"admin","exp":%d}`, exp)},
		{"sub twice", hs, fmt.Sprintf(`{"sub":"alice","sub":"admin","exp":%d}`, exp)},
		{"Exp", hs, fmt.Sprintf(`{"sub":"admin","Exp":%d}`, exp)},
		{"exp a string", hs, fmt.Sprintf(`{"sub":"admin","exp":"%d"}`, exp)},
		{"iat 10⁹ s ahead", hs, fmt.Sprintf(`{"sub":"admin","exp":%d,"iat":%d}`, exp, now+1e9)},
		{"alg twice", `{"alg":"HS256","alg":"HS256"}`, fmt.Sprintf(`{"sub":"admin","exp":%d}`, exp)},
	} {
		tok := rawToken(tc.header, tc.claims)
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/status", strings.NewReader(`{"status":"busy"}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(b), "invalid credentials") {
			t.Errorf("%s: POST /v1/status %d %s, want 401", tc.name, resp.StatusCode, b)
		}
		if code, ecode := upgrade(t, addr, "?token="+tok, nil); code != 401 || ecode != "unauthorized" {
			t.Errorf("%s: upgrade %d %s, want 401 unauthorized", tc.name, code, ecode)
		}
	}
	for _, u := range []string{"alice", "admin"} {
		if s := statusOf(t, addr, u); s != "offline" {
			t.Errorf("%s is %s after refused tokens, want offline", u, s)
		}
	}
	// The same claims written plainly are taken.
	tok := rawToken(hs, fmt.Sprintf(`{"sub":"alice","exp":%d,"iat":%d,"app_claim":{"sub":"x"}}`, exp, now))
	if code, _ := upgrade(t, addr, "?token="+tok, nil); code != http.StatusSwitchingProtocols {
		t.Errorf("a plain token: upgrade %d, want 101", code)
	}
}

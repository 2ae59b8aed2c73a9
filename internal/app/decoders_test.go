package app_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testwait"
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
	testwait.For(t, "alice busy", func() bool { return statusOf(t, addr, "alice") == "busy" })

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

// TestIDsInNFC: an id that is not in Unicode NFC — "café" with a
// combining accent, the Kelvin sign — is refused with invalid_id at every
// edge (HTTP bodies, paths and queries, WebSocket messages and the
// upgrade, a token's sub), where it was another user than its NFC twin.
// Other look-alikes (full-width, Cyrillic) are other ids, and are taken.
func TestIDsInNFC(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1})
	const nfc, nfd, kelvin = "caf\u00e9", "cafe\u0301", "\u212a"
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/heartbeat", `{"user_id":"cafe\u0301","device_id":"d"}`},
		{"POST", "/v1/heartbeat", `{"user_id":"x","device_id":"\u212a"}`},
		{"POST", "/v1/status", `{"user_id":"\u212a","status":"busy"}`},
		{"GET", "/presence/batch?user_ids=" + url.QueryEscape(nfc+","+nfd), ""},
		{"POST", "/v1/presence/batch", `{"user_ids":["caf\u00e9","cafe\u0301"]}`},
		{"GET", "/v1/presence/" + url.PathEscape(nfd), ""},
		{"PUT", "/v1/users/" + url.PathEscape(nfc) + "/contacts", `{"contacts":["cafe\u0301"]}`},
		{"PUT", "/v1/users/" + url.PathEscape(kelvin) + "/settings", `{"status_visibility":"nobody","last_seen_visibility":"nobody"}`},
	} {
		code, body := call(t, addr, r.method, r.path, r.body)
		if code != 400 || errorCode(t, body) != "invalid_id" || !strings.Contains(body, "NFC") {
			t.Errorf("%s %s %s: %d %s, want 400 invalid_id naming NFC", r.method, r.path, r.body, code, body)
		}
	}
	// The token of an NFD subject acts for nobody, on either edge.
	tok := rawToken(`{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"cafe\u0301","exp":%d}`, time.Now().Add(time.Hour).Unix()))
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/heartbeat", strings.NewReader(`{"device_id":"d"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(string(b), "NFC") {
		t.Errorf("a token for %+q: %d %s, want 401 naming NFC", nfd, resp.StatusCode, b)
	}
	if code, ecode := upgrade(t, addr, "?token="+tok, nil); code != 401 || ecode != "unauthorized" {
		t.Errorf("a token for %+q: upgrade %d %s, want 401", nfd, code, ecode)
	}
	if code, ecode := upgrade(t, addr, "?token="+rawToken(`{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"u","exp":%d}`, time.Now().Add(time.Hour).Unix()))+"&device_id="+url.QueryEscape(kelvin), nil); code != 400 || ecode != "invalid_id" {
		t.Errorf("device %+q: upgrade %d %s, want 400 invalid_id", kelvin, code, ecode)
	}
	// Over a socket: subscribe refuses the NFD id and adds nothing.
	c := dialWS(t, addr, nfc)
	c.msg("welcome")
	c.send(`{"type":"subscribe","user_ids":["caf\u00e9","cafe\u0301"]}`)
	if e := c.msg("error"); e["code"] != "invalid_id" || !strings.Contains(e["message"].(string), "NFC") {
		t.Errorf("subscribe of an NFD id: %v, want invalid_id naming NFC", e)
	}
	// NFC ids and other look-alikes are ids like any: one user each.
	c.send(`{"type":"subscribe","user_ids":["caf\u00e9","\uff43afe","\u0441afe","K"]}`)
	if users := c.msg("snapshot")["users"].(map[string]any); len(users) != 4 || users[nfc].(map[string]any)["status"] != "online" {
		t.Errorf("snapshot %v, want 4 users, café online", users)
	}
	if code, body := call(t, addr, "GET", "/presence/batch?user_ids="+url.QueryEscape(nfc), ""); code != 200 || !strings.Contains(body, `"online"`) {
		t.Errorf("GET /presence/batch?user_ids=%s: %d %s", nfc, code, body)
	}
}

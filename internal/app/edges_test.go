package app_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
)

// TestEdgesDecideAlike: the HTTP API and the WebSocket gateway give the
// same answer to the same decision on the caller — a client token acting
// for another user, a token bound to another device, a missing or forged
// credential — because both ask package auth and apierr.
func TestEdgesDecideAlike(t *testing.T) {
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1})
	tok := func(device string) string {
		s, err := auth.Sign(testSecret, "alice", device, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	answer := func(req *http.Request) (int, string, string) {
		t.Helper()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%s %s: not JSON: %s", req.Method, req.URL.Path, b)
		}
		return resp.StatusCode, e.Error.Code, e.Error.Message
	}
	for _, tc := range []struct {
		name               string
		cred, user, device string
		status             int
	}{
		{"another user", tok(""), "bob", "phone", 403},
		{"another device", tok("phone"), "alice", "tablet", 403},
		{"no credentials", "", "alice", "phone", 401},
		{"a forged token", tok("")[:20] + "x", "alice", "phone", 401},
	} {
		hb, _ := http.NewRequest("POST", "http://"+addr+"/v1/heartbeat",
			strings.NewReader(`{"user_id":"`+tc.user+`","device_id":"`+tc.device+`"}`))
		up, _ := http.NewRequest("GET", "http://"+addr+"/v1/ws?user_id="+tc.user+"&device_id="+tc.device, nil)
		for k, v := range map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="} {
			up.Header.Set(k, v)
		}
		for _, r := range []*http.Request{hb, up} {
			if tc.cred != "" {
				r.Header.Set("Authorization", "Bearer "+tc.cred)
			}
		}
		s1, c1, m1 := answer(hb)
		s2, c2, m2 := answer(up)
		if s1 != tc.status || s1 != s2 || c1 != c2 || m1 != m2 {
			t.Errorf("%s: HTTP %d %s %q, WebSocket %d %s %q; want both %d alike", tc.name, s1, c1, m1, s2, c2, m2, tc.status)
		}
	}
}

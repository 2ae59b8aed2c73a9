package httpapi_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// signClaims signs arbitrary claims with method and key.
func signClaims(t *testing.T, method jwt.SigningMethod, key any, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, c).SignedString(key)
	if err != nil {
		t.Fatalf("signing: %v", err)
	}
	return s
}

func TestAuthRequired(t *testing.T) {
	e := newEnv(t, opts{})
	now := e.clk.Now()
	good := e.token("1", "")

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	claims := func(sub string) jwt.MapClaims {
		return jwt.MapClaims{"sub": sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	}
	parts := strings.Split(strings.TrimPrefix(good, "Bearer "), ".")
	flip := func(s string) string { // change one character of the signature
		b := []byte(s)
		if b[3] == 'A' {
			b[3] = 'B'
		} else {
			b[3] = 'A'
		}
		return string(b)
	}
	exp := now.Add(time.Hour).Unix()
	otherPayload := b64([]byte(`{"sub":"2","iat":` + jsonInt(now.Unix()) + `,"exp":` + jsonInt(exp) + `}`))

	creds := []struct {
		name, authz string
	}{
		{"no header", ""},
		{"empty bearer", "Bearer "},
		{"bad key", "Bearer " + apiKey + "k"},
		{"other key", "Bearer x"},
		{"basic scheme", "Basic " + b64([]byte(apiKey+":"))},
		{"key without scheme", apiKey},
		{"garbage token", "Bearer a.b.c"},
		{"other secret", "Bearer " + signClaims(t, jwt.SigningMethodHS256, []byte("not-the-secret-of-the-node-0123456789"), claims("1"))},
		{"expired", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret,
			jwt.MapClaims{"sub": "1", "exp": now.Add(-time.Minute).Unix()})},
		{"not yet valid", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret,
			jwt.MapClaims{"sub": "1", "nbf": now.Add(time.Minute).Unix(), "exp": exp})},
		// A token that never expires could never be revoked.
		{"no expiry", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "1"})},
		{"no expiry, issued now", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "1", "iat": now.Unix()})},
		{"alg none", "Bearer " + b64([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + b64([]byte(`{"sub":"1","exp":`+jsonInt(exp)+`}`)) + "."},
		{"alg none via library", "Bearer " + signClaims(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("1"))},
		{"RS256", "Bearer " + signClaims(t, jwt.SigningMethodRS256, rsaKey, claims("1"))},
		{"HS512 with the right secret", "Bearer " + signClaims(t, jwt.SigningMethodHS512, secret, claims("1"))},
		{"wrong signature", "Bearer " + parts[0] + "." + parts[1] + "." + flip(parts[2])},
		{"tampered payload", "Bearer " + parts[0] + "." + otherPayload + "." + parts[2]},
		{"no subject", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"iat": now.Unix(), "exp": exp})},
		{"subject too long", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret, claims(strings.Repeat("x", 65)))},
		{"subject with a comma", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret, claims("1,2"))},
		{"bad device claim", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret,
			jwt.MapClaims{"sub": "1", "device": "a b", "exp": exp})},
		{"device claim with an override", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret,
			jwt.MapClaims{"sub": "1", "device": "d\u202e", "exp": exp})},
		{"subject with a C1 control", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret, claims("1\u0085"))},
		// Longer than the maximum token lifetime (24h by default), from now
		// or from iat, and extensions this server does not understand.
		{"exp in 100 years", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret,
			jwt.MapClaims{"sub": "1", "exp": now.AddDate(100, 0, 0).Unix()})},
		{"exp in the year 3000", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret,
			jwt.MapClaims{"sub": "1", "exp": time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC).Unix()})},
		{"a 48h token with an hour left", "Bearer " + signClaims(t, jwt.SigningMethodHS256, secret,
			jwt.MapClaims{"sub": "1", "iat": now.Add(-47 * time.Hour).Unix(), "exp": exp})},
		{"crit header", "Bearer " + func() string {
			tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims("1"))
			tok.Header["crit"] = []string{"exp"}
			s, err := tok.SignedString(secret)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}()},
	}
	endpoints := []struct{ method, path, body string }{
		{"GET", "/presence/batch?user_ids=1", ""},
		{"GET", "/v1/presence/1", ""},
		{"POST", "/v1/presence/batch", `{"user_ids":["1"]}`},
		{"POST", "/v1/heartbeat", `{"user_id":"1","device_id":"d"}`},
		{"POST", "/v1/status", `{"user_id":"1","status":"busy"}`},
		{"POST", "/v1/bye", `{"user_id":"1","device_id":"d"}`},
		{"GET", "/v1/users/1/settings", ""},
		{"PUT", "/v1/users/1/settings", `{"status_visibility":"nobody","last_seen_visibility":"nobody"}`},
		{"GET", "/v1/users/1/contacts", ""},
		{"PUT", "/v1/users/1/contacts", `{"contacts":["x"]}`},
		{"POST", "/v1/users/1/contacts", `{"contacts":["x"]}`},
		{"PUT", "/v1/users/1/contacts/x", ""},
		{"DELETE", "/v1/users/1/contacts/x", ""},
		{"GET", "/v1/debug/users/1", ""},
		{"GET", "/v1/admin/stats", ""},
		{"GET", "/metrics", ""},
	}
	for _, c := range creds {
		t.Run(c.name, func(t *testing.T) {
			for _, ep := range endpoints {
				r := e.do(ep.method, ep.path, c.authz, ep.body)
				if r.code != http.StatusUnauthorized {
					t.Errorf("%s %s: got %d %s, want 401", ep.method, ep.path, r.code, r.body)
					continue
				}
				wantError(t, r, http.StatusUnauthorized, "unauthorized")
			}
		})
	}
	// Nothing changed: user 1 was never seen, has default settings and no
	// contacts.
	if got := string(e.ok("GET", "/presence/batch?user_ids=1", keyHdr, "").body); got != `{"1":"offline"}`+"\n" {
		t.Errorf("user 1: got %q", got)
	}
	if got := string(e.ok("GET", "/v1/users/1/settings", keyHdr, "").body); got != `{"status_visibility":"everyone","last_seen_visibility":"everyone"}`+"\n" {
		t.Errorf("settings: got %q", got)
	}
	if got := string(e.ok("GET", "/v1/users/1/contacts", keyHdr, "").body); got != `{"contacts":[]}`+"\n" {
		t.Errorf("contacts: got %q", got)
	}

	// The good credentials work, including a token within the clock-skew
	// leeway, and the scheme name in any case (RFC 7235).
	for _, authz := range []string{
		keyHdr, good, "bearer " + apiKey, "BEARER " + apiKey, "Bearer  " + apiKey + " ",
		"Bearer " + signClaims(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "1", "exp": now.Add(-10 * time.Second).Unix()}),
		"Bearer " + signClaims(t, jwt.SigningMethodHS256, secret, claims("1")),
	} {
		e.ok("GET", "/presence/batch?user_ids=1", authz, "")
	}
	// Tokens expire with the clock.
	tok := e.token("1", "")
	e.ok("GET", "/v1/users/1/settings", tok, "")
	e.clk.Advance(time.Hour + time.Minute)
	wantError(t, e.do("GET", "/v1/users/1/settings", tok, ""), http.StatusUnauthorized, "unauthorized")

	// Open endpoints need nothing; /metrics needs the API key.
	for _, p := range []string{"/healthz", "/v1/public/1"} {
		e.ok("GET", p, "", "")
	}
	// (The harness runs no gateway: the node answers, but not ready.)
	if r := e.do("GET", "/readyz", "", ""); r.code != http.StatusServiceUnavailable || !strings.Contains(string(r.body), `"reason":"gateway"`) {
		t.Errorf("GET /readyz without credentials: %d %s", r.code, r.body)
	}
	e.ok("GET", "/metrics", keyHdr, "")
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestDebugNeedsAPIKey(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "phone", true)
	e.advance(4 * time.Second)
	e.beat("1", "laptop", false)

	wantError(t, e.do("GET", "/v1/debug/users/1", e.token("1", ""), ""), http.StatusForbidden, "forbidden", "API key")
	wantError(t, e.do("GET", "/v1/debug/users/1", e.token("2", ""), ""), http.StatusForbidden, "forbidden")

	r := e.ok("GET", "/v1/debug/users/1", keyHdr, "")
	var d struct {
		UserID       string  `json:"user_id"`
		InMemory     bool    `json:"in_memory"`
		Known        bool    `json:"known"`
		Status       string  `json:"status"`
		NextDeadline *string `json:"next_deadline"`
		Devices      []struct {
			DeviceID  string `json:"device_id"`
			LastBeat  string `json:"last_beat"`
			ExpiresAt string `json:"expires_at"`
			Alive     bool   `json:"alive"`
			Active    bool   `json:"active"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(r.body, &d); err != nil {
		t.Fatalf("debug body %s: %v", r.body, err)
	}
	if d.UserID != "1" || !d.InMemory || !d.Known || d.Status != "online" || len(d.Devices) != 2 {
		t.Fatalf("debug: got %s", r.body)
	}
	// The next deadline is the phone's ttl running out.
	if want := fmtTime(t0.Add(30 * time.Second)); show(d.NextDeadline) != jstr(want) {
		t.Errorf("next_deadline: got %s, want %s", show(d.NextDeadline), want)
	}
	byID := map[string]int{}
	for i, dv := range d.Devices {
		byID[dv.DeviceID] = i
	}
	phone, laptop := d.Devices[byID["phone"]], d.Devices[byID["laptop"]]
	if phone.LastBeat != fmtTime(t0) || phone.ExpiresAt != fmtTime(t0.Add(30*time.Second)) || !phone.Alive || !phone.Active {
		t.Errorf("phone: got %+v", phone)
	}
	if laptop.LastBeat != fmtTime(t0.Add(4*time.Second)) || !laptop.Alive || laptop.Active {
		t.Errorf("laptop: got %+v", laptop)
	}
	// The phone beats again: the next change is now the laptop's ttl
	// running out, not the phone's first deadline (which the sweep's
	// schedule may still hold).
	e.advance(5 * time.Second)
	e.beat("1", "phone", true)
	r = e.ok("GET", "/v1/debug/users/1", keyHdr, "")
	if err := json.Unmarshal(r.body, &d); err != nil {
		t.Fatalf("debug body %s: %v", r.body, err)
	}
	if want := fmtTime(t0.Add(34 * time.Second)); show(d.NextDeadline) != jstr(want) {
		t.Errorf("next_deadline after a second beat: got %s, want %s (the laptop's end)", show(d.NextDeadline), want)
	}
	// A user never seen is known to nobody.
	r = e.ok("GET", "/v1/debug/users/ghost", keyHdr, "")
	if !strings.Contains(string(r.body), `"known": false`) || !strings.Contains(string(r.body), `"devices": []`) {
		t.Errorf("ghost: got %s", r.body)
	}
}

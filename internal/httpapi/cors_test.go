package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

const (
	appOrigin  = "https://app.example.com"
	evilOrigin = "https://evil.example"
)

// doOrigin sends a request with the given headers (Origin among them).
func (e *env) doOrigin(method, path string, hdr map[string]string, body string) *resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return &resp{code: res.StatusCode, header: res.Header, body: b}
}

// wantNoCORS checks that r carries no CORS header at all.
func wantNoCORS(t *testing.T, what string, r *resp) {
	t.Helper()
	for k := range r.header {
		if strings.HasPrefix(k, "Access-Control-") {
			t.Errorf("%s: has %s: %q, want no CORS header", what, k, r.header.Get(k))
		}
	}
}

func varies(r *resp, name string) bool {
	for _, v := range r.header.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), name) {
				return true
			}
		}
	}
	return false
}

func held(t *testing.T, e *env, user string) bool {
	t.Helper()
	_, _, ok, err := e.a.Tracker().Debug(context.Background(), user)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestCORSPreflight: a preflight of an allowed origin on a client
// endpoint is answered 204 with the origin, the path's methods, the
// headers a client sends and a max age.
func TestCORSPreflight(t *testing.T) {
	e := newEnv(t, opts{origins: []string{appOrigin, "https://*.example.org"}})
	for _, tc := range []struct {
		path, origin, method, methods string
	}{
		{"/v1/heartbeat", appOrigin, "POST", "POST"},
		{"/v1/presence/batch", appOrigin, "POST", "GET, POST"}, // GET: the user named batch
		{"/v1/presence/u2", appOrigin, "GET", "GET"},
		{"/presence/batch", appOrigin, "GET", "GET"},
		{"/v1/public/u2", appOrigin, "GET", "GET"},
		{"/v1/users/u1/settings", "https://tenant.example.org", "PUT", "GET, PUT"},
		{"/v1/users/u1/contacts", appOrigin, "POST", "GET, POST, PUT"},
		{"/v1/users/u1/contacts/u2", "https://a.b.example.org", "DELETE", "PUT, DELETE"},
	} {
		r := e.doOrigin("OPTIONS", tc.path, map[string]string{
			"Origin":                         tc.origin,
			"Access-Control-Request-Method":  tc.method,
			"Access-Control-Request-Headers": "authorization,content-type",
		}, "")
		what := "preflight " + tc.path + " from " + tc.origin
		if r.code != http.StatusNoContent {
			t.Errorf("%s: %d %s, want 204", what, r.code, r.body)
			continue
		}
		h := r.header
		if got := h.Get("Access-Control-Allow-Origin"); got != tc.origin {
			t.Errorf("%s: Allow-Origin %q, want %q", what, got, tc.origin)
		}
		if got := h.Get("Access-Control-Allow-Methods"); got != tc.methods {
			t.Errorf("%s: Allow-Methods %q, want %q", what, got, tc.methods)
		}
		if got := h.Get("Access-Control-Allow-Headers"); got != "Authorization, Content-Type" {
			t.Errorf("%s: Allow-Headers %q", what, got)
		}
		if got := h.Get("Access-Control-Max-Age"); got != "3600" {
			t.Errorf("%s: Max-Age %q, want 3600", what, got)
		}
		if h.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("%s: Allow-Credentials set: tokens are not cookies", what)
		}
		if !varies(r, "Origin") {
			t.Errorf("%s: Vary %q lacks Origin", what, h.Values("Vary"))
		}
	}
}

// TestCORSRefusedOrigin: a page of an origin not allowed gets 403
// origin_not_allowed on a preflight and on every request, even with a
// valid token, and nothing changes.
func TestCORSRefusedOrigin(t *testing.T) {
	e := newEnv(t, opts{origins: []string{appOrigin}})
	tok := e.token("u1", "d1")
	for _, tc := range []struct {
		method, path string
		hdr          map[string]string
		body         string
	}{
		{"OPTIONS", "/v1/heartbeat", map[string]string{"Access-Control-Request-Method": "POST"}, ""},
		{"POST", "/v1/heartbeat", map[string]string{"Authorization": tok, "Content-Type": "application/json"}, `{}`},
		{"POST", "/v1/status", map[string]string{"Authorization": tok, "Content-Type": "application/json"}, `{"status":"busy"}`},
		{"GET", "/v1/presence/u2", map[string]string{"Authorization": tok}, ""},
		{"GET", "/v1/public/u2", nil, ""},
		{"GET", "/v1/debug/users/u1", map[string]string{"Authorization": keyHdr}, ""},
		{"GET", "/healthz", nil, ""},
	} {
		for _, o := range []string{evilOrigin, "http://app.example.com", "https://app.example.com.evil.example", "null"} {
			hdr := map[string]string{"Origin": o}
			for k, v := range tc.hdr {
				hdr[k] = v
			}
			r := e.doOrigin(tc.method, tc.path, hdr, tc.body)
			wantError(t, r, http.StatusForbidden, "origin_not_allowed", o)
			wantNoCORS(t, tc.method+" "+tc.path+" from "+o, r)
		}
	}
	if held(t, e, "u1") {
		t.Error("a request of a refused origin changed u1")
	}
}

// TestCORSDevSimpleRequest: under -dev (no credentials needed) a page of a
// foreign origin cannot write presence with a "simple" request, which a
// browser sends without a preflight: it is refused before it is read.
func TestCORSDevSimpleRequest(t *testing.T) {
	e := newEnv(t, opts{dev: true})
	r := e.doOrigin("POST", "/v1/heartbeat", map[string]string{"Origin": evilOrigin, "Content-Type": "text/plain"},
		`{"user_id":"victim","device_id":"d1"}`)
	wantError(t, r, http.StatusForbidden, "origin_not_allowed")
	if held(t, e, "victim") {
		t.Error("a foreign page's simple request made a heartbeat")
	}
	// The demo page, served by the node itself, still works.
	r = e.doOrigin("POST", "/v1/heartbeat", map[string]string{"Origin": e.srv.URL, "Content-Type": "application/json"},
		`{"user_id":"me","device_id":"d1"}`)
	if r.code != http.StatusOK {
		t.Fatalf("same-origin heartbeat under -dev: %d %s", r.code, r.body)
	}
}

// TestCORSAllowedRequest: an allowed origin's request with a client token
// is served with its origin in Access-Control-Allow-Origin, Retry-After
// exposed, and Vary: Origin.
func TestCORSAllowedRequest(t *testing.T) {
	e := newEnv(t, opts{origins: []string{appOrigin}})
	tok := e.token("u1", "d1")
	r := e.doOrigin("POST", "/v1/heartbeat", map[string]string{"Origin": appOrigin, "Authorization": tok, "Content-Type": "application/json"}, `{}`)
	if r.code != http.StatusOK {
		t.Fatalf("heartbeat from %s: %d %s", appOrigin, r.code, r.body)
	}
	if got := r.header.Get("Access-Control-Allow-Origin"); got != appOrigin {
		t.Errorf("Allow-Origin %q, want %q", got, appOrigin)
	}
	if got := r.header.Get("Access-Control-Expose-Headers"); got != "Retry-After" {
		t.Errorf("Expose-Headers %q, want Retry-After", got)
	}
	if !varies(r, "Origin") {
		t.Errorf("Vary %q lacks Origin", r.header.Values("Vary"))
	}
	if !held(t, e, "u1") {
		t.Error("the allowed heartbeat was not recorded")
	}
	// An error answer carries the CORS headers too, so the page can read it.
	r = e.doOrigin("POST", "/v1/status", map[string]string{"Origin": appOrigin, "Authorization": tok, "Content-Type": "application/json"}, `{"status":"nonsense"}`)
	wantError(t, r, http.StatusBadRequest, "")
	if got := r.header.Get("Access-Control-Allow-Origin"); got != appOrigin {
		t.Errorf("error answer: Allow-Origin %q, want %q", got, appOrigin)
	}
	// /v1/public varies by Origin even when none is sent: a CDN caching it
	// must not hand a page the answer of a request without one.
	r = e.doOrigin("GET", "/v1/public/u1", nil, "")
	if r.code != http.StatusOK || !varies(r, "Origin") || r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("public read without Origin: %d, Vary %q, Allow-Origin %q", r.code, r.header.Values("Vary"), r.header.Get("Access-Control-Allow-Origin"))
	}
}

// TestCORSAPIKeyEndpoints: the API-key-only endpoints answer no page of
// another origin with CORS headers (their preflight fails), and the API
// key itself is refused from such a page on every endpoint.
func TestCORSAPIKeyEndpoints(t *testing.T) {
	e := newEnv(t, opts{origins: []string{appOrigin}})
	e.beat("u1", "d1", true)
	for _, path := range []string{"/v1/debug/users/u1", "/metrics"} {
		r := e.doOrigin("OPTIONS", path, map[string]string{"Origin": appOrigin, "Access-Control-Request-Method": "GET",
			"Access-Control-Request-Headers": "authorization"}, "")
		if r.code == http.StatusNoContent || r.code == http.StatusOK {
			t.Errorf("preflight of %s: %d, want a refusal", path, r.code)
		}
		wantNoCORS(t, "preflight of "+path, r)
		r = e.doOrigin("GET", path, map[string]string{"Origin": appOrigin, "Authorization": keyHdr}, "")
		wantError(t, r, http.StatusForbidden, "forbidden", "API key")
		wantNoCORS(t, "GET "+path+" with the API key", r)
	}
	// On a client endpoint the key is refused from another origin too.
	r := e.doOrigin("POST", "/v1/presence/batch", map[string]string{"Origin": appOrigin, "Authorization": keyHdr, "Content-Type": "application/json"},
		`{"user_ids":["u1"]}`)
	wantError(t, r, http.StatusForbidden, "forbidden", "API key")
	// From the node's own pages (an operator page) and from backends
	// (no Origin) the key works.
	for _, hdr := range []map[string]string{{"Origin": e.srv.URL, "Authorization": keyHdr}, {"Authorization": keyHdr}} {
		r := e.doOrigin("GET", "/v1/debug/users/u1", hdr, "")
		if r.code != http.StatusOK {
			t.Errorf("debug with %v: %d %s, want 200", hdr, r.code, r.body)
		}
		wantNoCORS(t, "debug", r)
	}
}

// TestCORSNoOrigin: requests without an Origin (backends, curl) are
// served as before, without CORS headers; so are the node's own pages.
func TestCORSNoOrigin(t *testing.T) {
	e := newEnv(t, opts{})
	tok := e.token("u1", "d1")
	for _, hdr := range []map[string]string{
		{"Authorization": tok, "Content-Type": "application/json"},
		{"Authorization": tok, "Content-Type": "application/json", "Origin": e.srv.URL},
	} {
		r := e.doOrigin("POST", "/v1/heartbeat", hdr, `{}`)
		if r.code != http.StatusOK {
			t.Fatalf("heartbeat with %v: %d %s", hdr, r.code, r.body)
		}
		if r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("heartbeat with %v: Allow-Origin %q, want none", hdr, r.header.Get("Access-Control-Allow-Origin"))
		}
	}
	// Without an Origin an OPTIONS is no preflight: the usual 405.
	r := e.doOrigin("OPTIONS", "/v1/heartbeat", map[string]string{"Access-Control-Request-Method": "POST"}, "")
	wantError(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
	wantNoCORS(t, "OPTIONS without Origin", r)
	if !slices.Contains([]int{200}, e.doOrigin("GET", "/healthz", nil, "").code) {
		t.Error("healthz without Origin")
	}
}

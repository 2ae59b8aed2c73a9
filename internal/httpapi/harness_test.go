package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
)

// The end-to-end tests run a whole node in process: the real tracker,
// memory store, SQLite durable store, reader and HTTP API, on a fake clock,
// behind an httptest server. Expiry is played with Sweep and the clock, never
// with sleeps.

const (
	apiKey = "httpapi-test-api-key-0123456789abcdef" // as long as a node requires
	keyHdr = "Bearer " + apiKey
)

var (
	secret = []byte("httpapi-test-jwt-secret-0123456789abcdef")
	// t0 has milliseconds, so every last_seen shows the wire format in full.
	t0 = time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.UTC)
)

// opts configures a test node. Zero values: not dev, poll throttle disabled,
// ttl 30s, idle 5m, the default device cap, a fresh data directory.
type opts struct {
	dev        bool
	poll       time.Duration // 0: disabled (the throttle tests set it)
	ttl        time.Duration
	idle       time.Duration
	maxDevices int
	dir        string
	clk        *clock.Fake
	origins    []string // -allowed-origins
}

type env struct {
	t   *testing.T
	a   *app.App
	srv *httptest.Server
	clk *clock.Fake
	dir string
	o   opts
}

func newEnv(t *testing.T, o opts) *env {
	t.Helper()
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	if o.clk == nil {
		o.clk = clock.NewFake(t0)
	}
	if o.poll == 0 {
		o.poll = -1
	}
	if o.ttl == 0 {
		o.ttl = 30 * time.Second
	}
	if o.idle == 0 {
		o.idle = 5 * time.Minute
	}
	a, err := app.New(context.Background(), app.Config{
		DataDir:      o.dir,
		APIKey:       apiKey,
		JWTSecret:    secret,
		Dev:          o.dev,
		Clock:        o.clk,
		TTL:          o.ttl,
		IdleAfter:    o.idle,
		PollInterval: o.poll,
		MaxDevices:   o.maxDevices,

		AllowedOrigins: o.origins,
	})
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	e := &env{t: t, a: a, clk: o.clk, dir: o.dir, o: o}
	t.Cleanup(func() { e.close() })
	e.srv = httptest.NewServer(a.Handler())
	t.Cleanup(e.srv.Close) // runs before e.close: LIFO
	return e
}

// close stops the node (idempotent), writing its last checkpoint.
func (e *env) close() {
	e.t.Helper()
	if e.srv != nil {
		e.srv.Close()
	}
	if err := e.a.Close(); err != nil {
		e.t.Errorf("app.Close: %v", err)
	}
}

// restart closes the node and opens a new one on the same data directory
// and clock.
func (e *env) restart() *env {
	e.t.Helper()
	e.close()
	return newEnv(e.t, e.o)
}

// token signs a client token for user (and device, if not empty) valid for
// an hour of fake time.
func (e *env) token(user, device string) string {
	e.t.Helper()
	tok, err := auth.Sign(secret, user, device, e.clk.Now(), time.Hour)
	if err != nil {
		e.t.Fatalf("auth.Sign: %v", err)
	}
	return "Bearer " + tok
}

type resp struct {
	code   int
	header http.Header
	body   []byte
}

func (r *resp) String() string { return string(r.body) }

// do sends a request. authz is the whole Authorization header ("" for none).
func (e *env) do(method, path, authz, body string) *resp {
	e.t.Helper()
	return e.doBytes(method, path, authz, []byte(body))
}

func (e *env) doBytes(method, path, authz string, body []byte) *resp {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatalf("NewRequest %s %s: %v", method, path, err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return &resp{code: res.StatusCode, header: res.Header, body: b}
}

// ok sends a request and fails the test unless it answers 200.
func (e *env) ok(method, path, authz, body string) *resp {
	e.t.Helper()
	r := e.do(method, path, authz, body)
	if r.code != http.StatusOK {
		e.t.Fatalf("%s %s %s: got %d %s, want 200", method, path, body, r.code, r.body)
	}
	return r
}

// beat sends a heartbeat for user on device with the API key.
func (e *env) beat(user, device string, active bool) {
	e.t.Helper()
	body := `{"user_id":` + jstr(user) + `,"device_id":` + jstr(device) + `}`
	if !active {
		body = `{"user_id":` + jstr(user) + `,"device_id":` + jstr(device) + `,"active":false}`
	}
	e.ok("POST", "/v1/heartbeat", keyHdr, body)
}

// setStatus sets a manual status and text for user with the API key.
func (e *env) setStatus(user, status, text string) {
	e.t.Helper()
	body := `{"user_id":` + jstr(user) + `,"status":` + jstr(status) + `,"text":` + jstr(text) + `}`
	e.ok("POST", "/v1/status", keyHdr, body)
}

func (e *env) setSettings(user, status, lastSeen string) {
	e.t.Helper()
	e.ok("PUT", "/v1/users/"+user+"/settings", keyHdr,
		`{"status_visibility":`+jstr(status)+`,"last_seen_visibility":`+jstr(lastSeen)+`}`)
}

func (e *env) setContacts(user string, contacts ...string) {
	e.t.Helper()
	b, _ := json.Marshal(map[string][]string{"contacts": contacts})
	e.ok("PUT", "/v1/users/"+user+"/contacts", keyHdr, string(b))
}

// sweep applies the deadlines due at the fake now.
func (e *env) sweep() {
	e.t.Helper()
	if _, err := e.a.Tracker().Sweep(context.Background()); err != nil {
		e.t.Fatalf("Sweep: %v", err)
	}
}

// advance moves the fake clock and sweeps, as the running node would.
func (e *env) advance(d time.Duration) {
	e.t.Helper()
	e.clk.Advance(d)
	e.sweep()
}

// view is the rich view of one user as the /v1 reads answer it. Pointers
// tell null from a zero value.
type view struct {
	UserID     string  `json:"user_id"`
	Status     *string `json:"status"`
	LastSeen   *string `json:"last_seen"`
	StatusText *string `json:"status_text"`
	Devices    *int    `json:"devices"`
	Version    *uint64 `json:"version"`
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown
// fields, so a test pins the whole shape of a response.
func decodeStrict(t *testing.T, b []byte, v any) {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	if d.More() {
		t.Fatalf("decoding %s: trailing data", b)
	}
}

// getView reads GET /v1/presence/{id}.
func (e *env) getView(id, authz, viewer string) view {
	e.t.Helper()
	path := "/v1/presence/" + id
	if viewer != "" {
		path += "?viewer_id=" + viewer
	}
	r := e.ok("GET", path, authz, "")
	var v view
	decodeStrict(e.t, r.body, &v)
	return v
}

// batchViews reads POST /v1/presence/batch.
func (e *env) batchViews(ids []string, authz, viewer string) map[string]view {
	e.t.Helper()
	req := map[string]any{"user_ids": ids}
	if viewer != "" {
		req["viewer_id"] = viewer
	}
	b, _ := json.Marshal(req)
	r := e.ok("POST", "/v1/presence/batch", authz, string(b))
	out := map[string]view{}
	decodeStrict(e.t, r.body, &out)
	return out
}

// seed reads GET /presence/batch and returns the raw map of statuses.
func (e *env) seed(ids []string, authz, viewer string) map[string]*string {
	e.t.Helper()
	path := "/presence/batch?user_ids=" + strings.Join(ids, ",")
	if viewer != "" {
		path += "&viewer_id=" + viewer
	}
	r := e.ok("GET", path, authz, "")
	out := map[string]*string{}
	decodeStrict(e.t, r.body, &out)
	return out
}

// apiError is the JSON error body.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// wantError checks that r is an error with the given status whose JSON body
// has the code and a message containing every one of words.
func wantError(t *testing.T, r *resp, code int, errCode string, words ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("got status %d %s, want %d", r.code, r.body, code)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type: got %q, want application/json", ct)
	}
	var e apiError
	decodeStrict(t, r.body, &e)
	if errCode != "" && e.Error.Code != errCode {
		t.Errorf("error code: got %q, want %q (body %s)", e.Error.Code, errCode, r.body)
	}
	if e.Error.Message == "" {
		t.Errorf("error message is empty: %s", r.body)
	}
	for _, w := range words {
		if !strings.Contains(e.Error.Message, w) {
			t.Errorf("error message %q does not mention %q", e.Error.Message, w)
		}
	}
}

func jstr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func ptr[T any](v T) *T { return &v }

func fmtTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// show renders a nullable field for messages.
func show[T any](p *T) string {
	if p == nil {
		return "null"
	}
	b, _ := json.Marshal(*p)
	return string(b)
}

func eq[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

type asyncResp struct {
	resp
	err error
}

// doAsync is do for other goroutines: it reports errors instead of failing
// the test from a goroutine that is not the test's.
func (e *env) doAsync(method, path, authz, body string) asyncResp {
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return asyncResp{err: err}
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		return asyncResp{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return asyncResp{resp: resp{code: res.StatusCode, header: res.Header, body: b}, err: err}
}

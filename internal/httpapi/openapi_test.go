package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/apicontract"
	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/app/apptest"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/testsvc"
)

// The API description (openapi.json, served at GET /v1/openapi.json) is
// checked three ways: it is a valid OpenAPI 3.1 document; its operations
// are exactly the node's routes (App.Patterns, what the code registers)
// and the CORS preflights of the browser endpoints' paths
// (App.BrowserPatterns; ServeHTTP answers them, no route), whose answers
// alone declare the CORS headers;
// and the real answers of a real node — every documented status of every
// operation, success and error, but the few listed in unexercised — are
// valid against it (kin-openapi, whose 3.1 documents are validated with a
// JSON Schema 2020-12 validator).

// loadSpec loads and validates the embedded description.
func loadSpec(t *testing.T) *apicontract.Contract {
	t.Helper()
	c, err := apicontract.Load()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// specPath turns a net/http pattern into the method and OpenAPI path it
// must be described as: "GET /{$}" is "/" exactly, and a subtree
// ("GET /static/") is its files, "/static/{file}".
func specPath(pattern string) (method, path string) {
	method, path, _ = strings.Cut(pattern, " ")
	path = strings.TrimSuffix(path, "{$}")
	if len(path) > 1 && strings.HasSuffix(path, "/") {
		path += "{file}"
	}
	return strings.ToUpper(method), path
}

func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	spec := loadSpec(t)
	e := newEnv(t, opts{})
	served := map[string]bool{}
	for _, p := range e.a.Patterns() {
		m, path := specPath(p)
		served[m+" "+path] = true
	}
	if len(served) < 20 {
		t.Fatalf("the node reports %d routes (%v): Patterns lost some", len(served), e.a.Patterns())
	}
	// The preflights are no routes of the mux (ServeHTTP answers them):
	// every path of a browser endpoint has one, and no other path.
	browser := map[string]bool{} // "METHOD /path" of the browser endpoints
	for _, p := range e.a.BrowserPatterns() {
		m, path := specPath(p)
		if !served[m+" "+path] {
			t.Errorf("BrowserPatterns lists %s, which Patterns does not", p)
		}
		browser[m+" "+path] = true
		served["OPTIONS "+path] = true
	}
	if len(browser) < 10 {
		t.Fatalf("the node reports %d browser endpoints (%v): BrowserPatterns lost some", len(browser), e.a.BrowserPatterns())
	}
	described := map[string]bool{}
	for r := range spec.Operations() {
		described[r] = true
	}
	for r := range served {
		if !described[r] {
			t.Errorf("the node serves %s, which openapi.json does not describe", r)
		}
	}
	for r := range described {
		if !served[r] {
			t.Errorf("openapi.json describes %s, which the node does not serve", r)
		}
	}
	checkCORSHeaders(t, spec, browser)

	// The node serves the description itself, unauthenticated.
	r := e.ok("GET", "/v1/openapi.json", "", "")
	if !bytes.Equal(r.body, httpapi.OpenAPI()) {
		t.Errorf("GET /v1/openapi.json: the body is not the embedded openapi.json")
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET /v1/openapi.json: Content-Type %q", ct)
	}
}

func TestSpecPath(t *testing.T) {
	for _, tc := range []struct{ pattern, method, path string }{
		{"GET /v1/presence/{user_id}", "GET", "/v1/presence/{user_id}"},
		{"GET /{$}", "GET", "/"},
		{"GET /static/", "GET", "/static/{file}"},
		{"DELETE /v1/users/{user_id}/contacts/{contact_id}", "DELETE", "/v1/users/{user_id}/contacts/{contact_id}"},
	} {
		if m, p := specPath(tc.pattern); m != tc.method || p != tc.path {
			t.Errorf("specPath(%q) = %s %s, want %s %s", tc.pattern, m, p, tc.method, tc.path)
		}
	}
}

// checkCORSHeaders checks where the description declares the CORS
// headers: on every answer of the browser endpoints (Vary required, but
// where the answer may be a refusal of the origin, which has none; a
// refusal alone declares none), on no answer of any other operation, and
// the preflight's on the 204 of every OPTIONS operation.
func checkCORSHeaders(t *testing.T, spec *apicontract.Contract, browser map[string]bool) {
	t.Helper()
	codes := documentedCodes(t)
	cors := []string{"Vary", "Access-Control-Allow-Origin", "Access-Control-Expose-Headers"}
	for path, item := range spec.Doc.Paths.Map() {
		for m, op := range item.Operations() {
			for status, r := range op.Responses.Map() {
				h := r.Value.Headers
				what := fmt.Sprintf("%s %s %s", m, path, status)
				answered := codes[op.OperationID+" "+status]
				refusal := slices.Contains(answered, "origin_not_allowed")
				switch {
				case m == http.MethodOptions && status == "204":
					for _, n := range []string{"Access-Control-Allow-Origin", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers",
						"Access-Control-Max-Age", "Vary"} {
						if h[n] == nil || !h[n].Value.Required {
							t.Errorf("%s: the preflight's %s is not declared required", what, n)
						}
					}
				case browser[m+" "+path] && !(refusal && len(answered) == 1) && status != "304":
					for _, n := range cors {
						if h[n] == nil {
							t.Errorf("%s: the answer of a browser endpoint does not declare %s", what, n)
						}
					}
					if h["Vary"] != nil && h["Vary"].Value.Required == refusal {
						t.Errorf("%s: Vary required %v, want %v (a refusal of the origin has none)", what, h["Vary"].Value.Required, !refusal)
					}
				default:
					for _, n := range cors {
						if h[n] != nil {
							t.Errorf("%s: declares %s, which only the answers of browser endpoints carry", what, n)
						}
					}
				}
			}
		}
	}
}

// unexercised are the documented answers the contract test does not
// provoke, each with the reason. The test fails if one of them is
// exercised after all or is no longer documented, so the list stays true.
var unexercised = map[string]string{
	"heartbeat 503": "only while Redis is down and the node's outage buffer is full; with the durable store down a heartbeat is taken " +
		"(200, the view's fields null), which the test checks",
	"bye 503":       "as heartbeat 503",
	"websocket 500": "needs the state store to fail for good under a running gateway; a stopped PostgreSQL is transient (the connect is taken)",
	"roomJoin 500": "the rooms of the embedded store are in its memory and do not fail, and a failing Redis store " +
		"fails the user's write first (503); only a failure nobody expects answers it",
	"roomLeave 500":     "as roomJoin 500",
	"getRoomCounts 500": "as roomJoin 500",
	"roomJoin 501": "every state store of presenced has rooms: only a node built with a store without them answers it " +
		"(tracker.ErrRoomsUnsupported; the httpapi tests provoke it)",
	"roomLeave 501": "as roomJoin 501",
	"roomJoin 503": "needs the Redis of a running node down (the contract test's Redis node keeps its Redis); " +
		"app TestRoomsThroughARedisHang checks a join refused with unavailable while Redis hangs",
	"roomLeave 503":     "as roomJoin 503",
	"getRoomCounts 503": "as roomJoin 503",
	"getRoom 501":       "as roomJoin 501",
	"getRoomCounts 501": "as roomJoin 501",
}

// unexercisedCodes are the documented error codes the contract test does
// not provoke ("operationId status code"), each with the reason.
var unexercisedCodes = map[string]string{
	"putContacts 503 busy":   "needs 17 contact-list writes waiting at once for a blocked durable writer (writegate's queue; see its tests)",
	"addContacts 503 busy":   "as putContacts 503 busy",
	"addContact 503 busy":    "as putContacts 503 busy",
	"removeContact 503 busy": "as putContacts 503 busy",
}

// documentedCodes returns, for every "operationId status" whose answer
// names its error codes (an enum or a const of error.code next to the
// Error schema), those codes, read from the raw document.
func documentedCodes(t *testing.T) map[string][]string {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(httpapi.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	get := func(v any, keys ...string) any {
		for _, k := range keys {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		}
		return v
	}
	out := map[string][]string{}
	for _, item := range get(doc, "paths").(map[string]any) {
		for _, op := range item.(map[string]any) {
			id, _ := get(op, "operationId").(string)
			responses, _ := get(op, "responses").(map[string]any)
			for status, r := range responses {
				if ref, ok := get(r, "$ref").(string); ok {
					r = get(doc, "components", "responses", strings.TrimPrefix(ref, "#/components/responses/"))
				}
				code := get(r, "content", "application/json", "schema", "properties", "error", "properties", "code")
				if c, ok := get(code, "const").(string); ok {
					out[id+" "+status] = []string{c}
				}
				if enum, ok := get(code, "enum").([]any); ok {
					for _, c := range enum {
						out[id+" "+status] = append(out[id+" "+status], c.(string))
					}
				}
			}
		}
	}
	if len(out) < 50 {
		t.Fatalf("found error codes for only %d answers: is the walk right?", len(out))
	}
	return out
}

// contract validates exchanges with nodes against the description.
type contract struct {
	t     *testing.T
	spec  *apicontract.Contract
	codes map[string]bool // "operationId status code" of every error answered
}

func newContract(t *testing.T) *contract {
	return &contract{t: t, spec: loadSpec(t), codes: map[string]bool{}}
}

// check validates one exchange: the response always, the request too
// when validateReq (a request the node accepted must be one the
// description allows).
func (c *contract) check(req *http.Request, reqBody []byte, res *http.Response, resBody []byte, validateReq bool) {
	c.t.Helper()
	if validateReq {
		if _, err := c.spec.CheckRequest(req, reqBody); err != nil {
			c.t.Errorf("the node accepted a request openapi.json does not allow: %v", err)
		}
	}
	id, err := c.spec.CheckResponse(req, res.StatusCode, res.Header, resBody)
	if err != nil {
		c.t.Error(err)
	}
	var e apiError
	if res.StatusCode >= 400 && json.Unmarshal(resBody, &e) == nil {
		c.codes[fmt.Sprintf("%s %d %s", id, res.StatusCode, e.Error.Code)] = true
	}
}

// call is one request of the contract test.
type call struct {
	method, path string
	authz        string            // the whole Authorization header, "" for none
	body         string            // "" for none
	header       map[string]string // more headers
	want         int
}

// do sends cl to the node at base, validates the exchange and returns the
// answer. It fails the test unless the status is cl.want.
func (c *contract) do(base string, cl call) *resp {
	c.t.Helper()
	var rd io.Reader
	if cl.body != "" {
		rd = strings.NewReader(cl.body)
	}
	req, err := http.NewRequest(cl.method, base+cl.path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if cl.authz != "" {
		req.Header.Set("Authorization", cl.authz)
	}
	if cl.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range cl.header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", cl.method, cl.path, err)
	}
	var b []byte
	if res.StatusCode == http.StatusSwitchingProtocols {
		// A WebSocket: open until the end of the test (before its node
		// stops: cleanups run last first).
		c.t.Cleanup(func() { res.Body.Close() })
	} else {
		b, err = io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			c.t.Fatalf("%s %s: reading: %v", cl.method, cl.path, err)
		}
	}
	if res.StatusCode != cl.want {
		c.t.Errorf("%s %.120s %.80s: got %d %.300s, want %d", cl.method, cl.path, cl.body, res.StatusCode, b, cl.want)
	}
	c.check(req, []byte(cl.body), res, b, res.StatusCode < 400)
	return &resp{code: res.StatusCode, header: res.Header, body: b}
}

// raw sends a request written by hand (what net/http's client will not
// send) and validates the answer as that of req.
func (c *contract) raw(base string, req *http.Request, text string, want int) {
	c.t.Helper()
	nc, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	if _, err := io.WriteString(nc, text); err != nil {
		c.t.Fatal(err)
	}
	if req.ContentLength > 0 {
		// The body is shorter than its Content-Length: end it here.
		_ = nc.(*net.TCPConn).CloseWrite()
	}
	res, err := http.ReadResponse(bufio.NewReader(nc), req)
	if err != nil {
		c.t.Fatalf("reading the answer to %q: %v", text, err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != want {
		c.t.Errorf("%q: got %d %s, want %d", text, res.StatusCode, b, want)
	}
	c.check(req, nil, res, b, false)
}

// covered fails the test unless every documented status of every
// operation was answered, but those in unexercised, and unless every one
// of those is documented and was not answered.
func (c *contract) covered() {
	c.t.Helper()
	for _, key := range c.spec.Unseen(unexercised) {
		c.t.Errorf("documented but never answered in the contract test: %s", key)
	}
	documented := documentedCodes(c.t)
	for key, codes := range documented {
		for _, code := range codes {
			k := key + " " + code
			_, excused := unexercisedCodes[k]
			if _, ok := unexercised[key]; ok {
				continue // the status is never answered: nor are its codes
			}
			switch {
			case c.codes[k] && excused:
				c.t.Errorf("%s was answered: take it out of unexercisedCodes", k)
			case !c.codes[k] && !excused:
				c.t.Errorf("documented but never answered in the contract test: the error code %s", k)
			}
		}
	}
	for k := range unexercisedCodes {
		id, rest, _ := strings.Cut(k, " ")
		status, code, _ := strings.Cut(rest, " ")
		if !slices.Contains(documented[id+" "+status], code) {
			c.t.Errorf("unexercisedCodes lists %s, which openapi.json does not document", k)
		}
	}
	ids := map[string]bool{}
	for _, id := range c.spec.Operations() {
		ids[id] = true
	}
	for key := range unexercised {
		id, status, _ := strings.Cut(key, " ")
		code, err := strconv.Atoi(status)
		switch {
		case err != nil || !ids[id]:
			c.t.Errorf("unexercised lists %s: no such operation and status", key)
		case c.spec.Seen(id, code):
			c.t.Errorf("%s was answered: take it out of unexercised", key)
		case len(c.spec.Unseen(nil)) == 0 || !slices.Contains(c.spec.Unseen(nil), key):
			c.t.Errorf("unexercised lists %s, which openapi.json does not document", key)
		}
	}
}

// runningNode runs a whole node on a listener (the WebSocket gateway
// serves only while Run runs) until the end of the test.
func runningNode(t *testing.T, cfg app.Config) string {
	t.Helper()
	addr := apptest.Run(t, cfg)
	apptest.WaitReady(t, addr)
	return "http://" + addr
}

func wsHeaders() map[string]string {
	return map[string]string{
		"Connection":            "Upgrade",
		"Upgrade":               "websocket",
		"Sec-WebSocket-Version": "13",
		"Sec-WebSocket-Key":     "dGhlIHNhbXBsZSBub25jZQ==",
	}
}

// concrete fills the parameters of an OpenAPI path with values a node
// accepts.
func concrete(path string) string {
	return strings.NewReplacer("{user_id}", "u1", "{contact_id}", "u2", "{room}", "r1", "{file}", "presence.js").Replace(path)
}

// origins is the part of the contract test about browser pages, on a node
// that allows appOrigin: every operation refuses a page of another origin;
// every preflight answers appOrigin, and is no preflight without an
// Origin; the browser endpoints answer appOrigin (successes and errors)
// with the CORS headers the description declares; the API-key-only
// endpoints refuse the key from its pages.
func origins(t *testing.T, c *contract) {
	t.Helper()
	e := newEnv(t, opts{origins: []string{appOrigin}})
	base := e.srv.URL
	tok := e.token("u1", "")
	e.beat("u2", "phone", true)
	e.beat("u1", "tab", true)
	rtok := e.roomToken("u1", "tab", "r*")

	ops := c.spec.Operations()
	if len(ops) < 30 {
		t.Fatalf("openapi.json has %d operations", len(ops))
	}
	for op := range ops {
		method, path, _ := strings.Cut(op, " ")
		hdr := map[string]string{"Origin": evilOrigin}
		switch {
		case method == http.MethodOptions:
			hdr["Access-Control-Request-Method"] = "GET"
		case path == "/v1/ws":
			maps.Copy(hdr, wsHeaders())
		}
		r := c.do(base, call{method, concrete(path), keyHdr, "", hdr, 403})
		var ae apiError
		if json.Unmarshal(r.body, &ae) != nil || ae.Error.Code != "origin_not_allowed" {
			t.Errorf("%s from %s: %s, want origin_not_allowed", op, evilOrigin, r.body)
		}
		if r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s from %s: Access-Control-Allow-Origin %q", op, evilOrigin, r.header.Get("Access-Control-Allow-Origin"))
		}
		if method != http.MethodOptions {
			continue
		}
		// The preflight of an allowed page, and an OPTIONS that is none.
		for _, m := range []string{"GET", "POST", "PUT", "DELETE"} {
			c.do(base, call{method, concrete(path), "", "", map[string]string{"Origin": appOrigin,
				"Access-Control-Request-Method": m, "Access-Control-Request-Headers": "authorization,content-type"}, 204})
		}
		c.do(base, call{method, concrete(path), "", "", map[string]string{"Access-Control-Request-Method": "GET"}, 405})
		c.do(base, call{method, concrete(path), "", "", map[string]string{"Origin": base, "Access-Control-Request-Method": "GET"}, 405})
	}

	// A page of appOrigin calls the browser endpoints with a client
	// token: every answer carries the CORS headers, valid against the
	// description.
	from := func(more map[string]string) map[string]string {
		h := map[string]string{"Origin": appOrigin}
		maps.Copy(h, more)
		return h
	}
	for _, cl := range []call{
		{"GET", "/presence/batch?user_ids=u1,u2", tok, "", nil, 200},
		{"GET", "/presence/batch?user_ids=u1&viewer_id=u2", tok, "", nil, 403},
		{"GET", "/v1/presence/u2", tok, "", nil, 200},
		{"GET", "/v1/presence/a%20b", tok, "", nil, 400},
		{"POST", "/v1/presence/batch", tok, `{"user_ids":["u1","u2"]}`, nil, 200},
		{"POST", "/v1/presence/batch", "Bearer not-a-token", `{"user_ids":["u1"]}`, nil, 401},
		{"GET", "/v1/public/u2", "", "", nil, 200},
		{"GET", "/v1/public/a,b", "", "", nil, 400},
		{"POST", "/v1/heartbeat", tok, `{"device_id":"web"}`, nil, 200},
		{"POST", "/v1/heartbeat", tok, `{"user_id":"u2","device_id":"web"}`, nil, 403},
		{"POST", "/v1/status", tok, `{"status":"busy","text":"from a page"}`, nil, 200},
		{"POST", "/v1/status", tok, `{"status":"offline"}`, nil, 400},
		{"POST", "/v1/bye", tok, `{"device_id":"web"}`, nil, 200},
		{"GET", "/v1/users/u1/settings", tok, "", nil, 200},
		{"PUT", "/v1/users/u1/settings", tok, `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`, nil, 200},
		{"PUT", "/v1/users/u2/settings", tok, `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`, nil, 403},
		{"GET", "/v1/users/u1/contacts", tok, "", nil, 200},
		{"PUT", "/v1/users/u1/contacts", tok, `{"contacts":["u2"]}`, nil, 200},
		{"POST", "/v1/users/u1/contacts", tok, `{"contacts":["u3"]}`, nil, 200},
		{"POST", "/v1/users/u1/contacts", tok, `{"contacts":["a b"]}`, nil, 400},
		{"PUT", "/v1/users/u1/contacts/u4", tok, "", nil, 200},
		{"DELETE", "/v1/users/u1/contacts/u4", tok, "", nil, 200},
		{"DELETE", "/v1/users/u2/contacts/u4", tok, "", nil, 403},
		{"POST", "/v1/rooms/r1/join", rtok, `{}`, nil, 200},
		{"POST", "/v1/rooms/s1/join", rtok, `{}`, nil, 403},
		{"POST", "/v1/rooms/r1/leave", rtok, `{}`, nil, 200},
		{"GET", "/v1/rooms/r1", rtok, "", nil, 200},
		{"GET", "/v1/rooms/r1", keyHdr, "", nil, 403}, // the API key from a page
		{"GET", "/v1/rooms?ids=r1,r2", rtok, "", nil, 200},
		{"GET", "/v1/rooms?ids=r1", keyHdr, "", nil, 403},
		{"POST", "/v1/rooms/r1/join", keyHdr, `{"user_id":"u2","device_id":"phone"}`, nil, 403},
		{"POST", "/v1/rooms/r1/leave", keyHdr, `{"user_id":"u2","device_id":"phone"}`, nil, 403},
	} {
		cl.header = from(cl.header)
		r := c.do(base, cl)
		if got := r.header.Get("Access-Control-Allow-Origin"); got != appOrigin {
			t.Errorf("%s %s from %s: Access-Control-Allow-Origin %q, want %q", cl.method, cl.path, appOrigin, got, appOrigin)
		}
		if !varies(r, "Origin") || r.header.Get("Access-Control-Expose-Headers") == "" {
			t.Errorf("%s %s from %s: Vary %q, Expose-Headers %q", cl.method, cl.path, appOrigin, r.header.Values("Vary"),
				r.header.Get("Access-Control-Expose-Headers"))
		}
	}
	// The API key's endpoints: the key is refused from the allowed page,
	// with no CORS header.
	for _, p := range []string{"/v1/admin/stats", "/v1/debug/users/u1", "/metrics"} {
		r := c.do(base, call{"GET", p, keyHdr, "", from(nil), 403})
		wantNoCORS(t, p+" from "+appOrigin, r)
	}
}

func TestOpenAPIContract(t *testing.T) {
	c := newContract(t)
	big := `{"user_ids":["` + strings.Repeat("a", 1<<20) + `"]}`
	bigContacts := `{"contacts":["` + strings.Repeat("a", 1<<20) + `"]}`

	// A node as the other tests run it: not running (its gateway refuses
	// sockets, it is not ready), the client read throttle off.
	e := newEnv(t, opts{})
	base := e.srv.URL
	tok := e.token("1", "")
	e.beat("2", "phone", true)
	e.setContacts("2", "1")
	for _, cl := range []call{
		{"GET", "/presence/batch?user_ids=1,2", keyHdr, "", nil, 200},
		{"GET", "/presence/batch?user_ids=1,2&viewer_id=1", tok, "", nil, 200},
		{"GET", "/presence/batch?user_ids=", keyHdr, "", nil, 400},
		{"GET", "/presence/batch?user_ids=1&user_ids=2", keyHdr, "", nil, 400},
		{"GET", "/presence/batch?user_ids=" + strings.Repeat("x,", 1000) + "x", keyHdr, "", nil, 400},
		{"GET", "/presence/batch?user_ids=1", "", "", nil, 401},
		{"GET", "/presence/batch?user_ids=1&viewer_id=2", tok, "", nil, 403},

		{"GET", "/v1/presence/2", keyHdr, "", nil, 200},
		{"GET", "/v1/presence/2?viewer_id=1", keyHdr, "", nil, 200},
		{"GET", "/v1/presence/a%20b", keyHdr, "", nil, 400},
		{"GET", "/v1/presence/2", "Bearer not-a-credential", "", nil, 401},
		{"GET", "/v1/presence/2?viewer_id=3", tok, "", nil, 403},

		{"POST", "/v1/presence/batch", keyHdr, `{"user_ids":["1","2"],"viewer_id":"1"}`, nil, 200},
		{"POST", "/v1/presence/batch", keyHdr, `{}`, nil, 400},
		{"POST", "/v1/presence/batch", keyHdr, `{"user_ids":["1"],"User_IDs":["2"]}`, nil, 400},
		{"POST", "/v1/presence/batch", "", `{"user_ids":["1"]}`, nil, 401},
		{"POST", "/v1/presence/batch", tok, `{"user_ids":["1"],"viewer_id":"2"}`, nil, 403},
		{"POST", "/v1/presence/batch", keyHdr, big, nil, 413},

		{"GET", "/v1/public/2", "", "", nil, 200},
		{"GET", "/v1/public/nobody-ever", "", "", nil, 200},
		{"GET", "/v1/public/a,b", "", "", nil, 400},

		{"POST", "/v1/heartbeat", keyHdr, `{"user_id":"3","device_id":"web","active":false}`, nil, 200},
		{"POST", "/v1/heartbeat", tok, `{"device_id":"web"}`, nil, 200},
		{"POST", "/v1/heartbeat", keyHdr, `{"user_id":"3"}`, nil, 400},
		{"POST", "/v1/heartbeat", keyHdr, `[]`, nil, 400},
		{"POST", "/v1/heartbeat", "", `{"user_id":"3","device_id":"web"}`, nil, 401},
		{"POST", "/v1/heartbeat", tok, `{"user_id":"3","device_id":"web"}`, nil, 403},
		{"POST", "/v1/heartbeat", keyHdr, big, nil, 413},

		{"POST", "/v1/status", keyHdr, `{"user_id":"3","status":"busy","text":"in a meeting"}`, nil, 200},
		{"POST", "/v1/status", tok, `{"status":"invisible"}`, nil, 200},
		{"POST", "/v1/status", keyHdr, `{"user_id":"3","status":"offline"}`, nil, 400},
		{"POST", "/v1/status", keyHdr, `{"user_id":"3","status":"away","text":"` + strings.Repeat("x", 141) + `"}`, nil, 400},
		{"POST", "/v1/status", "", `{"user_id":"3","status":"away"}`, nil, 401},
		{"POST", "/v1/status", tok, `{"user_id":"3","status":"away"}`, nil, 403},
		{"POST", "/v1/status", keyHdr, big, nil, 413},

		{"POST", "/v1/bye", keyHdr, `{"user_id":"3","device_id":"web"}`, nil, 200},
		{"POST", "/v1/bye", tok, `{"device_id":"web"}`, nil, 200},
		{"POST", "/v1/bye", keyHdr, `{"user_id":"3","device_id":"a b"}`, nil, 400},
		{"POST", "/v1/bye", "Basic eDp5", `{"user_id":"3","device_id":"web"}`, nil, 401},
		{"POST", "/v1/bye", tok, `{"user_id":"3","device_id":"web"}`, nil, 403},
		{"POST", "/v1/bye", keyHdr, big, nil, 413},

		{"GET", "/v1/users/2/settings", keyHdr, "", nil, 200},
		{"GET", "/v1/users/1/settings", tok, "", nil, 200},
		{"GET", "/v1/users/a%20b/settings", keyHdr, "", nil, 400},
		{"GET", "/v1/users/2/settings", "", "", nil, 401},
		{"GET", "/v1/users/2/settings", tok, "", nil, 403},
		{"PUT", "/v1/users/2/settings", keyHdr, `{"status_visibility":"contacts","last_seen_visibility":"nobody"}`, nil, 200},
		{"PUT", "/v1/users/2/settings", keyHdr, `{"status_visibility":"friends","last_seen_visibility":"nobody"}`, nil, 400},
		{"PUT", "/v1/users/2/settings", "", `{"status_visibility":"everyone","last_seen_visibility":"nobody"}`, nil, 401},
		{"PUT", "/v1/users/2/settings", tok, `{"status_visibility":"everyone","last_seen_visibility":"nobody"}`, nil, 403},
		{"PUT", "/v1/users/2/settings", keyHdr, big, nil, 413},

		{"GET", "/v1/users/2/contacts", keyHdr, "", nil, 200},
		{"GET", "/v1/users/a%20b/contacts", keyHdr, "", nil, 400},
		{"GET", "/v1/users/2/contacts", "", "", nil, 401},
		{"GET", "/v1/users/2/contacts", tok, "", nil, 403},
		{"PUT", "/v1/users/2/contacts", keyHdr, `{"contacts":["1","4","4"]}`, nil, 200},
		{"PUT", "/v1/users/1/contacts", tok, `{"contacts":[]}`, nil, 200},
		{"PUT", "/v1/users/2/contacts", keyHdr, `{}`, nil, 400},
		{"PUT", "/v1/users/2/contacts", "", `{"contacts":[]}`, nil, 401},
		{"PUT", "/v1/users/2/contacts", tok, `{"contacts":[]}`, nil, 403},
		{"PUT", "/v1/users/2/contacts", keyHdr, bigContacts, nil, 413},
		{"POST", "/v1/users/2/contacts", keyHdr, `{"contacts":["5"]}`, nil, 200},
		{"POST", "/v1/users/2/contacts", keyHdr, `{"contacts":["a b"]}`, nil, 400},
		{"POST", "/v1/users/2/contacts", "", `{"contacts":["5"]}`, nil, 401},
		{"POST", "/v1/users/2/contacts", tok, `{"contacts":["5"]}`, nil, 403},
		{"POST", "/v1/users/2/contacts", keyHdr, bigContacts, nil, 413},
		{"PUT", "/v1/users/2/contacts/6", keyHdr, "", nil, 200},
		{"PUT", "/v1/users/2/contacts/a%20b", keyHdr, "", nil, 400},
		{"PUT", "/v1/users/2/contacts/6", "", "", nil, 401},
		{"PUT", "/v1/users/2/contacts/6", tok, "", nil, 403},
		{"DELETE", "/v1/users/2/contacts/6", keyHdr, "", nil, 200},
		{"DELETE", "/v1/users/2/contacts/a%20b", keyHdr, "", nil, 400},
		{"DELETE", "/v1/users/2/contacts/6", "", "", nil, 401},
		{"DELETE", "/v1/users/2/contacts/6", tok, "", nil, 403},

		{"GET", "/v1/debug/users/2", keyHdr, "", nil, 200},
		{"GET", "/v1/debug/users/nobody-ever", keyHdr, "", nil, 200},
		{"GET", "/v1/debug/users/a%20b", keyHdr, "", nil, 400},
		{"GET", "/v1/debug/users/2", "", "", nil, 401},
		{"GET", "/v1/debug/users/2", tok, "", nil, 403},
		{"GET", "/v1/debug/users/2?viewer_id=", keyHdr, "", nil, 200},
		{"GET", "/v1/debug/users/2?viewer_id=a%20b", keyHdr, "", nil, 400},

		{"GET", "/v1/admin/stats", keyHdr, "", nil, 200},
		{"GET", "/v1/admin/stats", "", "", nil, 401},
		{"GET", "/v1/admin/stats", tok, "", nil, 403},

		{"GET", "/healthz", "", "", nil, 200},
		{"GET", "/readyz", "", "", nil, 503}, // the gateway does not run
		{"GET", "/metrics", keyHdr, "", nil, 200},
		{"GET", "/metrics", "", "", nil, 401},
		{"GET", "/metrics", tok, "", nil, 403},
		{"GET", "/v1/openapi.json", "", "", nil, 200},
		{"GET", "/v1/ws?token=" + strings.TrimPrefix(tok, "Bearer "), "", "", wsHeaders(), 503},

		{"GET", "/static/presence.js", "", "", nil, 200},
		{"GET", "/static/style.css", "", "", nil, 200},
		{"GET", "/static/no-such-file.js", "", "", nil, 404},
	} {
		c.do(base, cl)
	}
	// Every error code each answer documents.
	tooMany := make([]string, 10001)
	for i := range tooMany {
		tooMany[i] = strconv.Itoa(i)
	}
	tooManyContacts, _ := json.Marshal(map[string][]string{"contacts": tooMany})
	tooManyIDs, _ := json.Marshal(map[string][]string{"user_ids": tooMany[:1001]})
	full, _ := json.Marshal(map[string][]string{"contacts": tooMany[:10000]})
	for _, cl := range []call{
		{"GET", "/presence/batch?user_ids=1,a%20b", keyHdr, "", nil, 400},
		{"GET", "/v1/presence/2?viewer_id=1&viewer_id=3", keyHdr, "", nil, 400},
		{"GET", "/v1/debug/users/2?viewer_id=1&viewer_id=3", keyHdr, "", nil, 400},
		{"POST", "/v1/presence/batch", keyHdr, string(tooManyIDs), nil, 400},
		{"POST", "/v1/presence/batch", keyHdr, `{"user_ids":["1",""]}`, nil, 400},
		{"POST", "/v1/status", keyHdr, `{"user_id":"3","status":"away"`, nil, 400},
		{"POST", "/v1/status", keyHdr, `{"user_id":"a b","status":"away"}`, nil, 400},
		{"POST", "/v1/bye", keyHdr, `{"user_id":"3","device_id":"web","user_id":"4"}`, nil, 400},
		{"PUT", "/v1/users/a%20b/settings", keyHdr, `{"status_visibility":"everyone","last_seen_visibility":"nobody"}`, nil, 400},
		{"PUT", "/v1/users/2/settings", keyHdr, `null`, nil, 400},
		{"PUT", "/v1/users/a%20b/contacts", keyHdr, `{"contacts":[]}`, nil, 400},
		{"PUT", "/v1/users/2/contacts", keyHdr, `{"contacts":"1"}`, nil, 400},
		{"PUT", "/v1/users/2/contacts", keyHdr, string(tooManyContacts), nil, 400},
		{"POST", "/v1/users/2/contacts", keyHdr, "\xff", nil, 400},
		{"POST", "/v1/users/2/contacts", keyHdr, `{"contacts":null}`, nil, 400},
		{"POST", "/v1/users/2/contacts", keyHdr, string(tooManyContacts), nil, 400},
		{"PUT", "/v1/users/full/contacts", keyHdr, string(full), nil, 200},
		{"PUT", "/v1/users/full/contacts/one-more", keyHdr, "", nil, 400},
	} {
		c.do(base, cl)
	}
	// Rooms.
	e.beat("ra", "d", true)
	e.beat("1", "web", true)
	rtok := e.roomToken("1", "web", "r*")
	for _, cl := range []call{
		{"POST", "/v1/rooms/r1/join", keyHdr, `{"user_id":"ra","device_id":"d"}`, nil, 200},
		{"POST", "/v1/rooms/r1/join", rtok, `{}`, nil, 200},
		{"POST", "/v1/rooms/r1/join", keyHdr, `{"user_id":"ra"}`, nil, 400},
		{"POST", "/v1/rooms/r1/join", keyHdr, `{"user_id":"ra","device_id":"d","room":"r1"}`, nil, 400},
		{"POST", "/v1/rooms/a,b/join", keyHdr, `{"user_id":"ra","device_id":"d"}`, nil, 400},
		{"POST", "/v1/rooms/r1/join", "", `{"user_id":"ra","device_id":"d"}`, nil, 401},
		{"POST", "/v1/rooms/r1/join", rtok, `{"user_id":"ra"}`, nil, 403},
		{"POST", "/v1/rooms/s1/join", rtok, `{}`, nil, 403},
		{"POST", "/v1/rooms/r1/join", keyHdr, `{"user_id":"ra","device_id":"gone"}`, nil, 409},
		{"POST", "/v1/rooms/r1/join", keyHdr, big, nil, 413},

		{"POST", "/v1/rooms/r2/leave", keyHdr, `{"user_id":"ra","device_id":"d"}`, nil, 200},
		{"POST", "/v1/rooms/r1/leave", keyHdr, `{"user_id":"ra","device_id":"a b"}`, nil, 400},
		{"POST", "/v1/rooms/r1/leave", keyHdr, `[]`, nil, 400},
		{"POST", "/v1/rooms/r1/leave", "", `{"user_id":"ra","device_id":"d"}`, nil, 401},
		{"POST", "/v1/rooms/r1/leave", rtok, `{"device_id":"other"}`, nil, 403},
		{"POST", "/v1/rooms/s1/leave", rtok, `{}`, nil, 403},
		{"POST", "/v1/rooms/r1/leave", keyHdr, big, nil, 413},

		{"GET", "/v1/rooms/r1", keyHdr, "", nil, 200},
		{"GET", "/v1/rooms/r1?viewer_id=1&limit=1", keyHdr, "", nil, 200},
		{"GET", "/v1/rooms/r1?limit=1000&after=1", rtok, "", nil, 200},
		{"GET", "/v1/rooms/a%20b", keyHdr, "", nil, 400},
		{"GET", "/v1/rooms/r1?limit=0", keyHdr, "", nil, 400},
		{"GET", "/v1/rooms/r1", "", "", nil, 401},
		{"GET", "/v1/rooms/r1?viewer_id=2", rtok, "", nil, 403},
		{"GET", "/v1/rooms/s1", rtok, "", nil, 403},

		{"GET", "/v1/rooms?ids=r1,s1", keyHdr, "", nil, 200},
		{"GET", "/v1/rooms?ids=r1,r2", rtok, "", nil, 200},
		{"GET", "/v1/rooms?ids=", keyHdr, "", nil, 400},
		{"GET", "/v1/rooms?ids=a&ids=b", keyHdr, "", nil, 400},
		{"GET", "/v1/rooms?ids=" + strings.Repeat("x,", 1000) + "x", keyHdr, "", nil, 400},
		{"GET", "/v1/rooms?ids=a,a%20b", keyHdr, "", nil, 400},
		{"GET", "/v1/rooms?ids=r1", "", "", nil, 401},
		{"GET", "/v1/rooms?ids=r1,s1", rtok, "", nil, 403},
	} {
		c.do(base, cl)
	}
	for i := range 99 { // ra/d is in r1: 99 more fill its 100
		e.roomOp("join", "full"+strconv.Itoa(i), keyHdr, "ra", "d")
	}
	c.do(base, call{"POST", "/v1/rooms/one-more/join", keyHdr, `{"user_id":"ra","device_id":"d"}`, nil, 409})

	// A body that ends before its Content-Length: invalid_body.
	for _, p := range []struct{ method, path string }{
		{"POST", "/v1/presence/batch"}, {"POST", "/v1/heartbeat"}, {"POST", "/v1/status"}, {"POST", "/v1/bye"},
		{"PUT", "/v1/users/2/settings"}, {"PUT", "/v1/users/2/contacts"}, {"POST", "/v1/users/2/contacts"},
		{"POST", "/v1/rooms/r1/join"}, {"POST", "/v1/rooms/r1/leave"},
	} {
		req, _ := http.NewRequest(p.method, base+p.path, strings.NewReader("{"))
		req.ContentLength = 100
		c.raw(base, req, p.method+" "+p.path+" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "+keyHdr+
			"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", 400)
	}

	for _, p := range []string{"/", "/admin", "/static/presence.js"} {
		r := c.do(base, call{"GET", p, "", "", nil, 200})
		c.do(base, call{"GET", p, "", "", map[string]string{"If-None-Match": r.header.Get("ETag")}, 304})
	}
	// The debug view with a viewer: its viewer part, validated above
	// against DebugViewer, is really there (and absent without one).
	for viewer, want := range map[string]bool{"1": true, "2": true, "": false} {
		r := c.do(base, call{"GET", "/v1/debug/users/2?viewer_id=" + viewer, keyHdr, "", nil, 200})
		var d struct {
			Viewer *struct {
				ViewerID string `json:"viewer_id"`
			} `json:"viewer"`
		}
		if err := json.Unmarshal(r.body, &d); err != nil || (d.Viewer != nil) != want || (want && d.Viewer.ViewerID != viewer) {
			t.Errorf("debug of 2 as %q: %s, want a viewer part %v", viewer, r.body, want)
		}
	}

	origins(t, c)

	// Client limits: reads once per poll interval, durable writes 1/s
	// with bursts of 5 (fake clock: nothing refills).
	lim := newEnv(t, opts{poll: 30 * time.Second})
	ltok := lim.token("1", "")
	for _, cl := range []call{
		{"GET", "/presence/batch?user_ids=2", ltok, "", nil, 200},
		{"GET", "/presence/batch?user_ids=2", ltok, "", nil, 429},
		{"GET", "/v1/presence/2", ltok, "", nil, 429},
		{"POST", "/v1/presence/batch", ltok, `{"user_ids":["2"]}`, nil, 429},
	} {
		c.do(lim.srv.URL, cl)
	}
	burst := func(cl call) {
		t.Helper()
		for range 5 {
			c.do(lim.srv.URL, cl)
		}
		cl.want = 429
		r := c.do(lim.srv.URL, cl)
		if r.header.Get("Retry-After") == "" {
			t.Errorf("%s %s: 429 without Retry-After", cl.method, cl.path)
		}
	}
	burst(call{"POST", "/v1/status", ltok, `{"status":"away"}`, nil, 200})
	burst(call{"PUT", "/v1/users/1/settings", ltok, `{"status_visibility":"everyone","last_seen_visibility":"everyone"}`, nil, 200})
	burst(call{"PUT", "/v1/users/1/contacts", ltok, `{"contacts":["2"]}`, nil, 200})
	c.do(lim.srv.URL, call{"POST", "/v1/users/1/contacts", ltok, `{"contacts":["2"]}`, nil, 429})
	c.do(lim.srv.URL, call{"PUT", "/v1/users/1/contacts/2", ltok, "", nil, 429})
	c.do(lim.srv.URL, call{"DELETE", "/v1/users/1/contacts/2", ltok, "", nil, 429})
	// Rooms: reads share the poll throttle; joins and leaves are
	// ratelimit.Rooms per device.
	lrtok := lim.roomToken("1", "d", "*")
	c.do(lim.srv.URL, call{"GET", "/v1/rooms/r1", lrtok, "", nil, 429})
	c.do(lim.srv.URL, call{"GET", "/v1/rooms?ids=r1", lrtok, "", nil, 429})
	lim.beat("1", "d", true)
	for i := range 200 {
		op := "join"
		if i%2 == 1 {
			op = "leave"
		}
		lim.roomOp(op, "r1", lrtok, "", "")
	}
	for _, op := range []string{"join", "leave"} {
		if r := c.do(lim.srv.URL, call{"POST", "/v1/rooms/r1/" + op, lrtok, `{}`, nil, 429}); r.header.Get("Retry-After") == "" {
			t.Errorf("%s: 429 without Retry-After", op)
		}
	}

	// One device per user.
	one := newEnv(t, opts{maxDevices: 1})
	c.do(one.srv.URL, call{"POST", "/v1/heartbeat", keyHdr, `{"user_id":"1","device_id":"a"}`, nil, 200})
	c.do(one.srv.URL, call{"POST", "/v1/heartbeat", keyHdr, `{"user_id":"1","device_id":"b"}`, nil, 409})

	// A running node: ready, and its gateway upgrades or refuses.
	node := runningNode(t, app.Config{DataDir: t.TempDir(), APIKey: apiKey, JWTSecret: secret, PollInterval: -1,
		MaxDevices: 1, MaxSocketsPerDevice: 1})
	sign := func(user, dev string) string {
		tok, err := auth.Sign(secret, user, dev, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	c.do(node, call{"GET", "/readyz", "", "", nil, 200})
	ws := "/v1/ws?token=" + sign("w", "d1")
	// The socket stays open (the client holds it) until the node stops.
	c.do(node, call{"GET", ws, "", "", wsHeaders(), 101})
	for _, cl := range []call{
		{"GET", ws, "", "", wsHeaders(), 429},                                                                                     // a second socket of the device
		{"GET", "/v1/ws?token=" + sign("w", "d2"), "", "", wsHeaders(), 409},                                                      // a second device of the user
		{"GET", "/v1/ws?token=x&token=y", "", "", wsHeaders(), 400},                                                               // invalid_query
		{"GET", "/v1/ws?device_id=a%20b&token=" + sign("v", ""), "", "", wsHeaders(), 400},                                        // invalid_id
		{"GET", "/v1/ws?token=" + sign("v", ""), "", "", map[string]string{"Upgrade": "websocket", "Connection": "Upgrade"}, 400}, // bad_handshake
		{"GET", "/v1/ws?token=not-a-token", "", "", wsHeaders(), 401},
		{"GET", "/v1/ws", keyHdr, "", wsHeaders(), 403},
		{"GET", "/v1/ws?token=" + sign("v", ""), "", "", nil, 426},
	} {
		c.do(node, cl)
	}
	req, _ := http.NewRequest("GET", node+"/v1/ws", nil)
	c.raw(node, req, "GET /v1/ws?token="+sign("v", "")+" HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", 505)

	// Failures of the stores, with every route that reads or writes
	// them: a closed SQLite store is a failure of the server (500
	// internal); PostgreSQL stopped is a backend that does not answer (503
	// unavailable), but for heartbeats and byes, which are taken and
	// answered with the view's fields null, and for the connect heartbeat
	// of a WebSocket.
	outage := func(base string, want, beats int) {
		t.Helper()
		for _, cl := range []call{
			{"GET", "/presence/batch?user_ids=o1", keyHdr, "", nil, want},
			{"GET", "/v1/presence/o2", keyHdr, "", nil, want},
			{"POST", "/v1/presence/batch", keyHdr, `{"user_ids":["o3"]}`, nil, want},
			{"GET", "/v1/public/o4", "", "", nil, want},
			{"POST", "/v1/status", keyHdr, `{"user_id":"o6","status":"away"}`, nil, want},
			{"GET", "/v1/users/o8/settings", keyHdr, "", nil, want},
			{"PUT", "/v1/users/o9/settings", keyHdr, `{"status_visibility":"everyone","last_seen_visibility":"everyone"}`, nil, want},
			{"GET", "/v1/users/o10/contacts", keyHdr, "", nil, want},
			{"PUT", "/v1/users/o11/contacts", keyHdr, `{"contacts":["1"]}`, nil, want},
			{"POST", "/v1/users/o12/contacts", keyHdr, `{"contacts":["1"]}`, nil, want},
			{"PUT", "/v1/users/o13/contacts/1", keyHdr, "", nil, want},
			{"DELETE", "/v1/users/o14/contacts/1", keyHdr, "", nil, want},
			{"GET", "/v1/debug/users/o15", keyHdr, "", nil, want},
			{"POST", "/v1/heartbeat", keyHdr, `{"user_id":"o5","device_id":"d"}`, nil, beats},
			{"POST", "/v1/bye", keyHdr, `{"user_id":"o7","device_id":"d"}`, nil, beats},
		} {
			c.do(base, cl)
		}
	}
	closed := newEnv(t, opts{})
	closed.beat("rm", "d", true)
	closed.roomOp("join", "r1", keyHdr, "rm", "d")
	closed.setSettings("rm", "contacts", "contacts") // a member whose read needs the durable store
	if err := closed.a.Close(); err != nil {
		t.Fatal(err)
	}
	outage(closed.srv.URL, 500, 500)
	c.do(closed.srv.URL, call{"GET", "/v1/rooms/r1", keyHdr, "", nil, 500})

	pg := testsvc.Postgres(t)
	pgNode := runningNode(t, app.Config{DataDir: t.TempDir(), APIKey: apiKey, JWTSecret: secret, PollInterval: -1,
		PostgresURL: pg.NewDatabase(t)})
	for _, cl := range []call{
		{"POST", "/v1/heartbeat", keyHdr, `{"user_id":"rm","device_id":"d"}`, nil, 200},
		{"POST", "/v1/rooms/r1/join", keyHdr, `{"user_id":"rm","device_id":"d"}`, nil, 200},
		{"PUT", "/v1/users/rm/settings", keyHdr, `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`, nil, 200},
	} {
		c.do(pgNode, cl)
	}
	// A node whose state store is Redis has the same rooms.
	_, redisAddr, stopRedisNode := apptest.Start(t, app.Config{DataDir: t.TempDir(), APIKey: apiKey, JWTSecret: secret, PollInterval: -1,
		PostgresURL: pg.NewDatabase(t), RedisURL: testsvc.Redis(t).URL})
	apptest.WaitReady(t, redisAddr)
	redisNode := "http://" + redisAddr
	for _, cl := range []call{
		{"POST", "/v1/rooms/r1/join", keyHdr, `{"user_id":"rm","device_id":"d"}`, nil, 409},
		{"POST", "/v1/heartbeat", keyHdr, `{"user_id":"rm","device_id":"d"}`, nil, 200},
		{"POST", "/v1/rooms/r1/join", keyHdr, `{"user_id":"rm","device_id":"d"}`, nil, 200},
		{"GET", "/v1/rooms/r1", keyHdr, "", nil, 200},
		{"GET", "/v1/rooms?ids=r1", keyHdr, "", nil, 200},
		{"POST", "/v1/rooms/r1/leave", keyHdr, `{"user_id":"rm","device_id":"d"}`, nil, 200},
	} {
		c.do(redisNode, cl)
	}
	if err := stopRedisNode(); err != nil { // before PostgreSQL stops under its checkpoint
		t.Fatal(err)
	}
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	outage(pgNode, 503, 200)
	c.do(pgNode, call{"GET", "/v1/rooms/r1", keyHdr, "", nil, 503})
	c.do(pgNode, call{"GET", "/v1/ws?token=" + sign("o16", ""), "", "", wsHeaders(), 101})
	c.do(pgNode, call{"GET", "/readyz", "", "", nil, 200}) // PostgreSQL is shared: reported, still ready
	// PostgreSQL back, for the last checkpoint of rm's beat when the node stops.
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}

	c.covered()
}

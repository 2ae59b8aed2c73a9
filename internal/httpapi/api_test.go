package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// --- 1. the seed endpoint ---

func TestSeedBatchExactBytes(t *testing.T) {
	e := newEnv(t, opts{idle: time.Minute})
	e.beat("1", "d1", true)
	// 2 beats actively, then only inactively past idle_after: away.
	e.beat("2", "d1", true)
	for range 3 {
		e.advance(25 * time.Second)
		e.beat("2", "d1", false)
		e.beat("1", "d1", true)
	}
	// 3 never seen.
	r := e.ok("GET", "/presence/batch?user_ids=1,2,3", keyHdr, "")
	if got, want := string(r.body), `{"1":"online","2":"away","3":"offline"}`+"\n"; got != want {
		t.Fatalf("body: got %q, want %q", got, want)
	}
	if got := r.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type: got %q, want application/json", got)
	}
	if got := r.header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control: got %q, want no-store", got)
	}

	// Order follows the request; duplicates are answered once.
	r = e.ok("GET", "/presence/batch?user_ids=3,1,3,2,1", keyHdr, "")
	if got, want := string(r.body), `{"3":"offline","1":"online","2":"away"}`+"\n"; got != want {
		t.Errorf("reordered: got %q, want %q", got, want)
	}

	// Past the ttl with no beat, everybody is offline (1 expired, not gone).
	e.advance(31 * time.Second)
	r = e.ok("GET", "/presence/batch?user_ids=1,2,3", keyHdr, "")
	if got, want := string(r.body), `{"1":"offline","2":"offline","3":"offline"}`+"\n"; got != want {
		t.Errorf("after ttl: got %q, want %q", got, want)
	}
}

func TestSeedBatchHiddenIsNull(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "d", true)
	e.beat("2", "d", true)
	e.setSettings("2", "nobody", "everyone")
	r := e.ok("GET", "/presence/batch?user_ids=1,2", keyHdr, "")
	if got, want := string(r.body), `{"1":"online","2":null}`+"\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	// viewer_id applies that viewer's view: 2 sees itself.
	r = e.ok("GET", "/presence/batch?user_ids=1,2&viewer_id=2", keyHdr, "")
	if got, want := string(r.body), `{"1":"online","2":"online"}`+"\n"; got != want {
		t.Fatalf("viewer 2: got %q, want %q", got, want)
	}
}

func TestSeedBatchLimits(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("u7", "d", true)

	ids := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = "u" + strconv.Itoa(i)
		}
		return strings.Join(s, ",")
	}
	// 1,000 ids are fine, and every one is answered.
	r := e.ok("GET", "/presence/batch?user_ids="+ids(1000), keyHdr, "")
	var m map[string]*string
	decodeStrict(t, r.body, &m)
	if len(m) != 1000 {
		t.Fatalf("1000 ids: got %d answers", len(m))
	}
	if got := show(m["u7"]); got != `"online"` {
		t.Errorf("u7: got %s, want online", got)
	}
	// 1,000 ids of the longest allowed length.
	long := make([]string, 1000)
	for i := range long {
		long[i] = fmt.Sprintf("%064d", i)
	}
	r = e.ok("GET", "/presence/batch?user_ids="+strings.Join(long, ","), keyHdr, "")
	m = nil
	decodeStrict(t, r.body, &m)
	if len(m) != 1000 {
		t.Fatalf("1000 long ids: got %d answers", len(m))
	}
	// Letters beyond ASCII are fine, and so are the neighbours of the
	// refused ranges (U+00A1 after the C1 controls, U+2027 before the line
	// separators, U+2030 after the overrides).
	fine := []string{"zoë", "¡hola", "名前", "a‧b", "a‰b"}
	r = e.ok("GET", "/presence/batch?user_ids="+url.QueryEscape(strings.Join(fine, ",")), keyHdr, "")
	m = nil
	decodeStrict(t, r.body, &m)
	for _, id := range fine {
		if show(m[id]) != `"offline"` {
			t.Errorf("id %q: got %s, want it answered offline", id, r.body)
		}
	}

	tests := []struct {
		name  string
		query string
		code  string
		words []string
	}{
		{"1001 ids", "user_ids=" + ids(1001), "too_many_ids", []string{"1001", "1000"}},
		{"missing", "", "invalid_ids", []string{"user_ids", "required"}},
		{"empty", "user_ids=", "invalid_ids", []string{"user_ids"}},
		{"empty id in the middle", "user_ids=1,,2", "invalid_id", []string{"user_ids[1]", "empty"}},
		{"trailing comma", "user_ids=1,2,", "invalid_id", []string{"user_ids[2]", "empty"}},
		{"65 bytes", "user_ids=1," + strings.Repeat("x", 65), "invalid_id", []string{"user_ids[1]", "65 bytes"}},
		{"space", "user_ids=1,a%20b", "invalid_id", []string{"user_ids[1]", "forbidden character"}},
		{"control char", "user_ids=a%01b", "invalid_id", []string{"user_ids[0]", "forbidden character"}},
		{"tab", "user_ids=a%09", "invalid_id", []string{"forbidden character"}},
		{"DEL", "user_ids=a%7F", "invalid_id", []string{"forbidden character"}},
		{"invalid utf-8", "user_ids=a%FFb", "invalid_id", []string{"UTF-8"}},
		// Characters that would let two ids look alike or reorder a line.
		{"right-to-left override U+202E", "user_ids=1,a%E2%80%AEb", "invalid_id", []string{"user_ids[1]", "forbidden character", "U+202E"}},
		{"left-to-right embedding U+202A", "user_ids=a%E2%80%AA", "invalid_id", []string{"U+202A"}},
		{"isolate U+2066", "user_ids=a%E2%81%A6", "invalid_id", []string{"U+2066"}},
		{"pop isolate U+2069", "user_ids=a%E2%81%A9", "invalid_id", []string{"U+2069"}},
		{"C1 control U+0085", "user_ids=a%C2%85b", "invalid_id", []string{"forbidden character", "U+0085"}},
		{"C1 control U+0080", "user_ids=%C2%80", "invalid_id", []string{"U+0080"}},
		{"C1 control U+009F", "user_ids=%C2%9F", "invalid_id", []string{"U+009F"}},
		{"line separator U+2028", "user_ids=a%E2%80%A8", "invalid_id", []string{"U+2028"}},
		{"paragraph separator U+2029", "user_ids=a%E2%80%A9", "invalid_id", []string{"U+2029"}},
		{"replacement character U+FFFD", "user_ids=a%EF%BF%BD", "invalid_id", []string{"forbidden character", "U+FFFD"}},
		{"bad viewer U+202E", "user_ids=1&viewer_id=%E2%80%AE", "invalid_id", []string{"viewer_id"}},
		{"malformed query", "user_ids=%zz", "invalid_query", []string{"malformed"}},
		{"malformed other parameter", "user_ids=1&x=%zz", "invalid_query", []string{"malformed"}},
		{"twice", "user_ids=1&user_ids=2", "invalid_query", []string{"user_ids", "2 times"}},
		{"viewer twice", "user_ids=1&viewer_id=a&viewer_id=b", "invalid_query", []string{"viewer_id", "2 times"}},
		{"bad viewer", "user_ids=1&viewer_id=a%20b", "invalid_id", []string{"viewer_id"}},
		{"long viewer", "user_ids=1&viewer_id=" + strings.Repeat("v", 65), "invalid_id", []string{"viewer_id"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("GET", "/presence/batch?"+tc.query, keyHdr, "")
			wantError(t, r, http.StatusBadRequest, tc.code, tc.words...)
		})
	}
}

// --- 2. the /v1 reads ---

func TestV1PresenceGetShape(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "phone", true)
	e.advance(1500 * time.Millisecond)
	e.beat("1", "laptop", true)
	e.setStatus("1", "busy", "in a \"meeting\" ☕")

	r := e.ok("GET", "/v1/presence/1", keyHdr, "")
	var v view
	decodeStrict(t, r.body, &v)
	wantLast := fmtTime(t0.Add(1500 * time.Millisecond)) // 2026-01-02T03:04:07.178Z
	if wantLast != "2026-01-02T03:04:07.178Z" {
		t.Fatalf("test clock: %s", wantLast)
	}
	if v.UserID != "1" || show(v.Status) != `"busy"` || show(v.LastSeen) != jstr(wantLast) ||
		show(v.StatusText) != jstr("in a \"meeting\" ☕") || show(v.Devices) != "2" || v.Version == nil || *v.Version == 0 {
		t.Fatalf("got %s, want user 1 busy, last_seen %s, text, 2 devices, a version", r.body, wantLast)
	}
	// Field order is part of the contract of the hand-written encoder.
	if !strings.HasPrefix(string(r.body), `{"user_id":"1","status":"busy","last_seen":"2026-01-02T03:04:07.178Z","status_text":`) ||
		!strings.HasSuffix(string(r.body), "}\n") {
		t.Errorf("body %q: unexpected layout", r.body)
	}

	// A never-seen user: offline, never seen, nothing else.
	v = e.getView("nobody-here", keyHdr, "")
	if show(v.Status) != `"offline"` || v.LastSeen != nil || v.StatusText != nil || show(v.Devices) != "0" || v.Version != nil {
		t.Errorf("never seen: got %+v, want offline, null last_seen/text/version, 0 devices", v)
	}

	// The batch answers the same objects keyed by id.
	got := e.batchViews([]string{"1", "nobody-here"}, keyHdr, "")
	if len(got) != 2 {
		t.Fatalf("batch: got %d entries, want 2", len(got))
	}
	if one := e.getView("1", keyHdr, ""); !sameView(got["1"], one) {
		t.Errorf("batch[1] = %+v, single read = %+v", got["1"], one)
	}

	// Version grows on a visible change and stays on a plain beat.
	before := *e.getView("1", keyHdr, "").Version
	e.advance(time.Second)
	e.beat("1", "phone", true)
	if v := e.getView("1", keyHdr, ""); *v.Version != before {
		t.Errorf("version after a plain beat: got %d, want %d", *v.Version, before)
	}
	e.setStatus("1", "online", "")
	if v := e.getView("1", keyHdr, ""); *v.Version <= before || show(v.Status) != `"online"` || v.StatusText != nil {
		t.Errorf("after clearing the status: got %+v, want online, no text, version > %d", v, before)
	}
}

func sameView(a, b view) bool {
	return a.UserID == b.UserID && eq(a.Status, b.Status) && eq(a.LastSeen, b.LastSeen) &&
		eq(a.StatusText, b.StatusText) && eq(a.Devices, b.Devices) && eq(a.Version, b.Version)
}

func TestV1BatchValidation(t *testing.T) {
	e := newEnv(t, opts{})
	many := make([]string, 1001)
	for i := range many {
		many[i] = strconv.Itoa(i)
	}
	b1001, _ := json.Marshal(map[string]any{"user_ids": many})
	tests := []struct {
		name, body, code string
		words            []string
	}{
		{"missing ids", `{}`, "invalid_ids", []string{"user_ids"}},
		{"null ids", `{"user_ids":null}`, "invalid_ids", []string{"user_ids"}},
		{"empty ids", `{"user_ids":[]}`, "invalid_ids", []string{"empty"}},
		{"1001 ids", string(b1001), "too_many_ids", []string{"1001"}},
		{"empty id", `{"user_ids":["1",""]}`, "invalid_id", []string{"user_ids[1]"}},
		{"65-byte id", `{"user_ids":["` + strings.Repeat("a", 65) + `"]}`, "invalid_id", []string{"65 bytes"}},
		{"comma in id", `{"user_ids":["a,b"]}`, "invalid_id", []string{"forbidden"}},
		{"newline in id", `{"user_ids":["a\nb"]}`, "invalid_id", []string{"forbidden"}},
		{"right-to-left override in id", `{"user_ids":["1","a\u202eb"]}`, "invalid_id", []string{"user_ids[1]", "U+202E"}},
		{"C1 control in id", `{"user_ids":["a\u0085b"]}`, "invalid_id", []string{"U+0085"}},
		{"U+FFFD in id", `{"user_ids":["a\ufffd"]}`, "invalid_id", []string{"U+FFFD"}},
		// JSON decoding turns invalid bytes into U+FFFD, so "a\xffb" and
		// "a\xfeb" would otherwise both become the id "a\ufffdb": the body
		// is refused first.
		{"invalid bytes in id", "{\"user_ids\":[\"a\xffb\"]}", "invalid_json", []string{"UTF-8"}},
		{"zero-width space in id", `{"user_ids":["ali\u200bce"]}`, "invalid_id", []string{"U+200B"}},
		{"line separator in viewer", `{"user_ids":["1"],"viewer_id":"v\u2028"}`, "invalid_id", []string{"viewer_id", "U+2028"}},
		{"bad viewer", `{"user_ids":["1"],"viewer_id":" "}`, "invalid_id", []string{"viewer_id"}},
		{"ids not strings", `{"user_ids":[1,2]}`, "invalid_json", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do("POST", "/v1/presence/batch", keyHdr, tc.body), http.StatusBadRequest, tc.code, tc.words...)
		})
	}
	if got := e.batchViews(many[:1000], keyHdr, ""); len(got) != 1000 {
		t.Errorf("1000 ids: got %d answers", len(got))
	}
	// Duplicates are answered once.
	if got := e.batchViews([]string{"a", "a", "b"}, keyHdr, ""); len(got) != 2 {
		t.Errorf("duplicates: got %d answers, want 2", len(got))
	}
}

// --- 3. writes ---

func TestHeartbeatStatusBye(t *testing.T) {
	e := newEnv(t, opts{})
	// The answer to a write is the user's own view plus timing.
	r := e.ok("POST", "/v1/heartbeat", keyHdr, `{"user_id":"1","device_id":"d1"}`)
	var self struct {
		view
		DeviceID   string `json:"device_id"`
		TTLms      int64  `json:"ttl_ms"`
		IntervalMs int64  `json:"heartbeat_interval_ms"`
	}
	decodeStrict(t, r.body, &self)
	// Clients are told to beat every ttl/4: with +10% jitter, two lost beats
	// still leave the third well inside the ttl.
	if show(self.Status) != `"online"` || self.DeviceID != "d1" || self.TTLms != 30000 || self.IntervalMs != 7500 ||
		show(self.LastSeen) != jstr(fmtTime(t0)) || show(self.Devices) != "1" {
		t.Fatalf("heartbeat answer: got %s", r.body)
	}

	tests := []struct {
		name, status, text string
		want               string // what others see
	}{
		{"busy", "busy", "deep work", "busy"},
		{"away", "away", "", "away"},
		{"invisible", "invisible", "", "offline"},
		{"online clears", "online", "back", "online"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.setStatus("1", tc.status, tc.text)
			v := e.getView("1", keyHdr, "")
			if show(v.Status) != jstr(tc.want) {
				t.Errorf("status: got %s, want %q", show(v.Status), tc.want)
			}
			wantText := "null"
			if tc.text != "" {
				wantText = jstr(tc.text)
			}
			if show(v.StatusText) != wantText {
				t.Errorf("status_text: got %s, want %s", show(v.StatusText), wantText)
			}
		})
	}

	// The longest text is 140 characters, not bytes.
	text140 := strings.Repeat("é", 140)
	e.setStatus("1", "busy", text140)
	if v := e.getView("1", keyHdr, ""); show(v.StatusText) != jstr(text140) {
		t.Errorf("140-char text: got %s", show(v.StatusText))
	}
	before := e.getView("1", keyHdr, "")

	bad := []struct {
		name, body, code string
		words            []string
	}{
		{"unknown status", `{"user_id":"1","status":"sleeping"}`, "invalid_status", []string{"sleeping"}},
		{"offline is not settable", `{"user_id":"1","status":"offline"}`, "invalid_status", nil},
		{"missing status", `{"user_id":"1"}`, "invalid_status", []string{"required"}},
		{"141-char text", `{"user_id":"1","status":"online","text":"` + strings.Repeat("a", 141) + `"}`, "invalid_text", []string{"141"}},
		{"control char text", `{"user_id":"1","status":"online","text":"a\u0007b"}`, "invalid_text", []string{"control"}},
		{"C1 control text U+0085", `{"user_id":"1","status":"online","text":"a\u0085b"}`, "invalid_text", []string{"control", "U+0085"}},
		{"C1 control text U+009B", `{"user_id":"1","status":"online","text":"\u009b31m red"}`, "invalid_text", []string{"control", "U+009B"}},
		{"missing user", `{"status":"online"}`, "invalid_id", []string{"user_id"}},
		{"bad user", `{"user_id":"a b","status":"online"}`, "invalid_id", []string{"user_id"}},
		{"user with an override", `{"user_id":"1\u202e","status":"online"}`, "invalid_id", []string{"user_id", "U+202E"}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do("POST", "/v1/status", keyHdr, tc.body), http.StatusBadRequest, tc.code, tc.words...)
			if after := e.getView("1", keyHdr, ""); !sameView(after, before) {
				t.Errorf("a refused status changed the user: before %+v, after %+v", before, after)
			}
		})
	}

	// Bye ends the device at once; a second device keeps the user present.
	e.setStatus("1", "online", "")
	e.beat("1", "d2", true)
	e.ok("POST", "/v1/bye", keyHdr, `{"user_id":"1","device_id":"d1"}`)
	if v := e.getView("1", keyHdr, ""); show(v.Status) != `"online"` || show(v.Devices) != "1" {
		t.Errorf("after bye of d1: got %+v, want online with 1 device", v)
	}
	e.advance(2 * time.Second)
	e.ok("POST", "/v1/bye", keyHdr, `{"user_id":"1","device_id":"d2"}`)
	if v := e.getView("1", keyHdr, ""); show(v.Status) != `"offline"` || show(v.Devices) != "0" ||
		show(v.LastSeen) != jstr(fmtTime(e.clk.Now())) {
		t.Errorf("after bye of d2: got %+v, want offline, 0 devices, last_seen at the bye", v)
	}
	// Bye of a device that is not there, or of an unknown user, is harmless.
	e.ok("POST", "/v1/bye", keyHdr, `{"user_id":"1","device_id":"d9"}`)
	e.ok("POST", "/v1/bye", keyHdr, `{"user_id":"ghost","device_id":"d9"}`)
	wantError(t, e.do("POST", "/v1/bye", keyHdr, `{"user_id":"1"}`), http.StatusBadRequest, "invalid_id", "device_id")
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, `{"user_id":"1"}`), http.StatusBadRequest, "invalid_id", "device_id")
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, `{"device_id":"d"}`), http.StatusBadRequest, "invalid_id", "user_id")
	// Ids that could pass for others are refused on writes too, and
	// create nothing.
	for _, body := range []string{
		`{"user_id":"1","device_id":"d\u202e"}`,
		`{"user_id":"1","device_id":"\u0085"}`,
		`{"user_id":"1","device_id":"d\ufffd"}`,
		`{"user_id":"1\u2066","device_id":"d"}`,
	} {
		wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, body), http.StatusBadRequest, "invalid_id", "forbidden character")
	}
	if v := e.getView("1", keyHdr, ""); show(v.Devices) != "0" {
		t.Errorf("after refused heartbeats: got %+v, want no device", v)
	}
}

func TestClientTokenActsOnlyForItself(t *testing.T) {
	e := newEnv(t, opts{})
	alice := e.token("alice", "")
	alicePhone := e.token("alice", "phone")

	tests := []struct {
		name, path, authz, body string
		code                    int
	}{
		{"beat for itself, user implied", "/v1/heartbeat", alice, `{"device_id":"web"}`, 200},
		{"beat for itself, user named", "/v1/heartbeat", alice, `{"user_id":"alice","device_id":"web"}`, 200},
		{"beat for bob", "/v1/heartbeat", alice, `{"user_id":"bob","device_id":"web"}`, 403},
		{"beat without device", "/v1/heartbeat", alice, `{}`, 400},
		{"device from the token", "/v1/heartbeat", alicePhone, `{}`, 200},
		{"device matches the token", "/v1/heartbeat", alicePhone, `{"device_id":"phone"}`, 200},
		{"device differs from the token", "/v1/heartbeat", alicePhone, `{"device_id":"laptop"}`, 403},
		{"status for itself", "/v1/status", alice, `{"status":"busy"}`, 200},
		{"status for bob", "/v1/status", alice, `{"user_id":"bob","status":"invisible"}`, 403},
		{"bye for bob", "/v1/bye", alice, `{"user_id":"bob","device_id":"web"}`, 403},
		{"bye of another device than the token's", "/v1/bye", alicePhone, `{"device_id":"web"}`, 403},
		{"null body is not an object", "/v1/heartbeat", alicePhone, `null`, 400},
		{"array body", "/v1/heartbeat", alicePhone, `[]`, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("POST", tc.path, tc.authz, tc.body)
			if r.code != tc.code {
				t.Fatalf("got %d %s, want %d", r.code, r.body, tc.code)
			}
			if tc.code != 200 {
				wantError(t, r, tc.code, "")
			}
		})
	}
	// Nothing of the refused requests reached bob or alice's laptop.
	if v := e.getView("bob", keyHdr, ""); show(v.Status) != `"offline"` || v.LastSeen != nil {
		t.Errorf("bob: got %+v, want never seen", v)
	}
	r := e.ok("GET", "/v1/debug/users/alice", keyHdr, "")
	if strings.Contains(string(r.body), "laptop") {
		t.Errorf("a refused beat created device laptop: %s", r.body)
	}
	if v := e.getView("alice", keyHdr, ""); show(v.Status) != `"busy"` || show(v.Devices) != "2" {
		t.Errorf("alice: got %+v, want busy with web and phone", v)
	}
	// Bye of the token's own device works.
	e.ok("POST", "/v1/bye", alicePhone, `{}`)
	if v := e.getView("alice", keyHdr, ""); show(v.Devices) != "1" {
		t.Errorf("alice after bye: got %+v, want 1 device", v)
	}
}

func TestDevModeTrustsBareUserID(t *testing.T) {
	e := newEnv(t, opts{dev: true})
	e.ok("POST", "/v1/heartbeat", "", `{"user_id":"1","device_id":"d"}`)
	e.ok("POST", "/v1/status", "", `{"user_id":"1","status":"busy","text":"dev"}`)
	wantError(t, e.do("POST", "/v1/heartbeat", "", `{"device_id":"d"}`), http.StatusBadRequest, "invalid_id", "user_id")
	r := e.ok("GET", "/presence/batch?user_ids=1,2", "", "")
	if got, want := string(r.body), `{"1":"busy","2":"offline"}`+"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Credentials still count in dev mode: a bad key is refused, not ignored.
	wantError(t, e.do("GET", "/presence/batch?user_ids=1", "Bearer wrong", ""), http.StatusUnauthorized, "unauthorized")
	// And a client token still acts only for its user.
	r = e.do("POST", "/v1/heartbeat", e.token("2", ""), `{"user_id":"1","device_id":"d"}`)
	wantError(t, r, http.StatusForbidden, "forbidden")
	// Dev mode may read the debug view.
	e.ok("GET", "/v1/debug/users/1", "", "")
	e.ok("POST", "/v1/bye", "", `{"user_id":"1","device_id":"d"}`)
	if v := e.getView("1", "", ""); show(v.Status) != `"offline"` {
		t.Errorf("after bye: got %+v", v)
	}
}

// TestInvisible checks that an invisible user reads exactly like one who said
// bye at the moment they went invisible — last_seen frozen at that moment,
// not at their last beat — while they keep beating; and that they see
// themselves as invisible.
func TestInvisible(t *testing.T) {
	e := newEnv(t, opts{})
	e.setContacts("1", "friend")
	e.beat("1", "d", true)
	e.advance(10 * time.Second)
	e.beat("1", "d", true)
	e.advance(1234 * time.Millisecond)
	frozen := fmtTime(e.clk.Now())
	e.setStatus("1", "invisible", "")
	verBefore := e.getView("1", keyHdr, "").Version

	for i := range 5 { // keep beating well past the ttl
		e.advance(20 * time.Second)
		e.beat("1", "d", true)
		for _, viewer := range []string{"", "friend", "stranger"} {
			v := e.getView("1", keyHdr, viewer)
			if show(v.Status) != `"offline"` || show(v.Devices) != "0" || show(v.LastSeen) != jstr(frozen) || !eq(v.Version, verBefore) {
				t.Fatalf("beat %d, viewer %q: got %+v, want offline, 0 devices, last_seen %s, version %d",
					i, viewer, v, frozen, *verBefore)
			}
		}
		if got := e.seed([]string{"1"}, keyHdr, "friend"); show(got["1"]) != `"offline"` {
			t.Fatalf("seed: got %s, want offline", show(got["1"]))
		}
		self := e.getView("1", keyHdr, "1")
		if show(self.Status) != `"invisible"` || show(self.Devices) != "1" || show(self.LastSeen) != jstr(fmtTime(e.clk.Now())) {
			t.Fatalf("self view: got %+v, want invisible, 1 device, true last_seen", self)
		}
		// The public view is the same.
		if v := e.ok("GET", "/v1/public/1", "", ""); !strings.Contains(string(v.body), `"status":"offline","last_seen":"`+frozen+`"`) {
			t.Fatalf("public: got %s", v.body)
		}
	}
	// A client token sees itself invisible in the write answer too.
	r := e.ok("POST", "/v1/heartbeat", e.token("1", "d"), `{}`)
	if !strings.Contains(string(r.body), `"status":"invisible"`) {
		t.Errorf("own heartbeat answer: got %s, want invisible", r.body)
	}
	// Coming back: online again, last_seen moves.
	e.advance(time.Second)
	e.setStatus("1", "online", "")
	if v := e.getView("1", keyHdr, ""); show(v.Status) != `"online"` || show(v.LastSeen) == jstr(frozen) {
		t.Errorf("back online: got %+v", v)
	}
}

// TestInvisibleReadsLikeBye plays two users with the same history: at one
// moment "b" says bye and "i" goes invisible. Every read any other viewer
// can make of them is the same, byte for byte but for the id — at that
// moment, while "i" goes on beating, and after a restart.
func TestInvisibleReadsLikeBye(t *testing.T) {
	e := newEnv(t, opts{})
	for _, u := range []string{"b", "i"} {
		e.setContacts(u, "friend")
		e.beat(u, "d", true)
	}
	e.advance(10 * time.Second)
	for _, u := range []string{"b", "i"} {
		e.beat(u, "d", true)
		e.setStatus(u, "online", "lunch")
	}
	e.advance(2345 * time.Millisecond)
	moment := fmtTime(e.clk.Now())
	e.ok("POST", "/v1/bye", keyHdr, `{"user_id":"b","device_id":"d"}`)
	e.setStatus("i", "invisible", "lunch")

	// reads returns every read of id by others, with id replaced by "ID".
	reads := func(e *env, id string) []string {
		t.Helper()
		var out []string
		add := func(r *resp) {
			out = append(out, strings.ReplaceAll(string(r.body), jstr(id), `"ID"`))
		}
		friend := e.token("friend", "")
		for _, authz := range []string{keyHdr, friend} {
			add(e.ok("GET", "/v1/presence/"+id, authz, ""))
			add(e.ok("POST", "/v1/presence/batch", authz, `{"user_ids":[`+jstr(id)+`]}`))
			add(e.ok("GET", "/presence/batch?user_ids="+id, authz, ""))
		}
		for _, viewer := range []string{"friend", "stranger"} {
			add(e.ok("GET", "/v1/presence/"+id+"?viewer_id="+viewer, keyHdr, ""))
		}
		add(e.ok("GET", "/v1/public/"+id, "", ""))
		return out
	}
	same := func(e *env, phase string) {
		t.Helper()
		b, i := reads(e, "b"), reads(e, "i")
		for k := range b {
			if b[k] != i[k] {
				t.Errorf("%s: read %d: the bye user reads %s, the invisible user %s", phase, k, b[k], i[k])
			}
		}
		if v := e.getView("i", keyHdr, "friend"); show(v.Status) != `"offline"` || show(v.LastSeen) != jstr(moment) || show(v.StatusText) != `"lunch"` {
			t.Errorf("%s: i reads %s, want offline, last_seen %s (the moment), text", phase, fmtView(v), moment)
		}
	}
	same(e, "at the moment")
	for i := range 5 {
		e.advance(20 * time.Second)
		e.beat("i", "d", i%2 == 0)
		same(e, fmt.Sprintf("beat %d while invisible", i))
	}
	// Long enough for the memory store to drop "b" (no device) while "i"
	// (beating) stays: reads of one come from the durable store, of the
	// other from memory, and still agree.
	for range 40 {
		e.advance(20 * time.Second)
		e.beat("i", "d", true)
		if err := e.a.Tracker().Checkpoint(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	e.sweep()
	if r := e.ok("GET", "/v1/debug/users/b", keyHdr, ""); !strings.Contains(string(r.body), `"in_memory": false`) {
		t.Fatalf("b is still in memory: %s", r.body)
	}
	if r := e.ok("GET", "/v1/debug/users/i", keyHdr, ""); !strings.Contains(string(r.body), `"in_memory": true`) {
		t.Fatalf("i is not in memory: %s", r.body)
	}
	same(e, "with b evicted from memory")
	e = e.restart()
	same(e, "after a restart")
	e.beat("i", "d", true)
	same(e, "after the first beat after the restart")
}

// --- 4. settings and contacts ---

func TestSettings(t *testing.T) {
	e := newEnv(t, opts{})
	r := e.ok("GET", "/v1/users/1/settings", keyHdr, "")
	if got, want := string(r.body), `{"status_visibility":"everyone","last_seen_visibility":"everyone"}`+"\n"; got != want {
		t.Fatalf("default: got %q, want %q", got, want)
	}
	r = e.ok("PUT", "/v1/users/1/settings", keyHdr, `{"status_visibility":"contacts","last_seen_visibility":"nobody"}`)
	want := `{"status_visibility":"contacts","last_seen_visibility":"nobody"}` + "\n"
	if string(r.body) != want {
		t.Fatalf("PUT answer: got %q, want %q", r.body, want)
	}
	if r = e.ok("GET", "/v1/users/1/settings", keyHdr, ""); string(r.body) != want {
		t.Fatalf("GET after PUT: got %q, want %q", r.body, want)
	}

	bad := []struct {
		name, body, code string
		words            []string
	}{
		{"bad status visibility", `{"status_visibility":"friends","last_seen_visibility":"nobody"}`, "invalid_settings", []string{"status_visibility", "friends"}},
		{"bad last_seen visibility", `{"status_visibility":"everyone","last_seen_visibility":"Everyone"}`, "invalid_settings", []string{"last_seen_visibility"}},
		{"missing one", `{"status_visibility":"everyone"}`, "invalid_settings", []string{"last_seen_visibility"}},
		{"null one", `{"status_visibility":"everyone","last_seen_visibility":null}`, "invalid_settings", nil},
		{"number", `{"status_visibility":0,"last_seen_visibility":"nobody"}`, "invalid_json", nil},
		{"unknown field", `{"status_visibility":"everyone","last_seen_visibility":"nobody","x":1}`, "invalid_json", []string{"x"}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do("PUT", "/v1/users/1/settings", keyHdr, tc.body), http.StatusBadRequest, tc.code, tc.words...)
			if r := e.ok("GET", "/v1/users/1/settings", keyHdr, ""); string(r.body) != want {
				t.Errorf("a refused PUT changed the settings: %s", r.body)
			}
		})
	}

	// A client manages only itself.
	one, two := e.token("1", ""), e.token("2", "")
	e.ok("GET", "/v1/users/1/settings", one, "")
	e.ok("PUT", "/v1/users/1/settings", one, `{"status_visibility":"nobody","last_seen_visibility":"nobody"}`)
	want = `{"status_visibility":"nobody","last_seen_visibility":"nobody"}` + "\n"
	wantError(t, e.do("GET", "/v1/users/1/settings", two, ""), http.StatusForbidden, "forbidden")
	wantError(t, e.do("PUT", "/v1/users/1/settings", two, `{"status_visibility":"everyone","last_seen_visibility":"everyone"}`), http.StatusForbidden, "forbidden")
	if r := e.ok("GET", "/v1/users/1/settings", keyHdr, ""); string(r.body) != want {
		t.Errorf("after a forbidden PUT: got %q, want %q", r.body, want)
	}
	wantError(t, e.do("GET", "/v1/users/"+strings.Repeat("x", 65)+"/settings", keyHdr, ""), http.StatusBadRequest, "invalid_id", "user_id")
}

func TestContacts(t *testing.T) {
	e := newEnv(t, opts{})
	get := func(authz string) string {
		t.Helper()
		return string(e.ok("GET", "/v1/users/1/contacts", authz, "").body)
	}
	if got := get(keyHdr); got != `{"contacts":[]}`+"\n" {
		t.Fatalf("empty list: got %q", got)
	}
	steps := []struct {
		name, method, path, body, want string
	}{
		{"replace", "PUT", "/v1/users/1/contacts", `{"contacts":["c","a","b","a"]}`, `["a","b","c"]`},
		{"add", "POST", "/v1/users/1/contacts", `{"contacts":["d","a"]}`, `["a","b","c","d"]`},
		{"add one", "PUT", "/v1/users/1/contacts/e", "", `["a","b","c","d","e"]`},
		{"add one again", "PUT", "/v1/users/1/contacts/e", "", `["a","b","c","d","e"]`},
		{"remove one", "DELETE", "/v1/users/1/contacts/b", "", `["a","c","d","e"]`},
		{"remove absent", "DELETE", "/v1/users/1/contacts/zz", "", `["a","c","d","e"]`},
		{"replace again", "PUT", "/v1/users/1/contacts", `{"contacts":["x"]}`, `["x"]`},
		{"add nothing", "POST", "/v1/users/1/contacts", `{"contacts":[]}`, `["x"]`},
		{"clear", "PUT", "/v1/users/1/contacts", `{"contacts":[]}`, `[]`},
		{"set", "PUT", "/v1/users/1/contacts", `{"contacts":["a","b"]}`, `["a","b"]`},
	}
	for _, s := range steps {
		r := e.ok(s.method, s.path, keyHdr, s.body)
		want := `{"contacts":` + s.want + "}\n"
		if string(r.body) != want {
			t.Fatalf("%s: answer %q, want %q", s.name, r.body, want)
		}
		if got := get(keyHdr); got != want {
			t.Fatalf("%s: GET %q, want %q", s.name, got, want)
		}
	}
	const final = `{"contacts":["a","b"]}` + "\n"

	bad := []struct {
		name, method, path, body, code string
	}{
		{"missing list", "PUT", "/v1/users/1/contacts", `{}`, "invalid_contacts"},
		{"null list", "POST", "/v1/users/1/contacts", `{"contacts":null}`, "invalid_contacts"},
		{"bad id in list", "PUT", "/v1/users/1/contacts", `{"contacts":["ok","not ok"]}`, "invalid_id"},
		{"long id in list", "POST", "/v1/users/1/contacts", `{"contacts":["` + strings.Repeat("q", 65) + `"]}`, "invalid_id"},
		{"bad contact id in path", "PUT", "/v1/users/1/contacts/" + strings.Repeat("q", 65), "", "invalid_id"},
		{"bad user id in path", "PUT", "/v1/users/a%20b/contacts", `{"contacts":[]}`, "invalid_id"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do(tc.method, tc.path, keyHdr, tc.body), http.StatusBadRequest, tc.code)
			if got := get(keyHdr); got != final {
				t.Errorf("a refused write changed the list: %q", got)
			}
		})
	}

	// A client manages only its own list.
	one, two := e.token("1", ""), e.token("2", "")
	if got := get(one); got != final {
		t.Errorf("own list: got %q", got)
	}
	forbidden := []struct{ method, path, body string }{
		{"GET", "/v1/users/1/contacts", ""},
		{"PUT", "/v1/users/1/contacts", `{"contacts":["2"]}`},
		{"POST", "/v1/users/1/contacts", `{"contacts":["2"]}`},
		{"PUT", "/v1/users/1/contacts/2", ""},
		{"DELETE", "/v1/users/1/contacts/a", ""},
	}
	for _, f := range forbidden {
		wantError(t, e.do(f.method, f.path, two, f.body), http.StatusForbidden, "forbidden")
	}
	if got := get(keyHdr); got != final {
		t.Errorf("after forbidden writes: got %q, want %q", got, final)
	}
	e.ok("PUT", "/v1/users/1/contacts/c", one, "")
	if got := get(keyHdr); got != `{"contacts":["a","b","c"]}`+"\n" {
		t.Errorf("own add: got %q", got)
	}
}

// --- 7. the poll throttle ---

func TestPollThrottle(t *testing.T) {
	e := newEnv(t, opts{poll: 30 * time.Second})
	e.beat("2", "d", true)
	tok := e.token("1", "")
	reads := []struct{ name, method, path, body string }{
		{"seed", "GET", "/presence/batch?user_ids=2", ""},
		{"single", "GET", "/v1/presence/2", ""},
		{"batch", "POST", "/v1/presence/batch", `{"user_ids":["2"]}`},
	}
	for _, rd := range reads {
		t.Run(rd.name, func(t *testing.T) {
			e.ok(rd.method, rd.path, tok, rd.body)
			e.advance(10 * time.Second)
			r := e.do(rd.method, rd.path, tok, rd.body)
			wantError(t, r, http.StatusTooManyRequests, "rate_limited", "retry in 20s")
			if got := r.header.Get("Retry-After"); got != "20" {
				t.Errorf("Retry-After: got %q, want 20", got)
			}
			// A fraction of a second is rounded up.
			e.clk.Advance(19*time.Second + 500*time.Millisecond)
			r = e.do(rd.method, rd.path, tok, rd.body)
			if got := r.header.Get("Retry-After"); r.code != 429 || got != "1" {
				t.Errorf("0.5s before: got %d Retry-After %q, want 429 and 1", r.code, got)
			}
			// Backends are never throttled.
			for range 5 {
				e.ok(rd.method, rd.path, keyHdr, rd.body)
			}
			// Another client has its own allowance.
			e.ok(rd.method, rd.path, e.token("3", ""), rd.body)
			e.clk.Advance(500 * time.Millisecond)
			e.ok(rd.method, rd.path, tok, rd.body)
			e.advance(30 * time.Second) // the next subtest starts with a fresh allowance
		})
	}
	// Writes are not reads: heartbeats are never throttled.
	for range 3 {
		e.ok("POST", "/v1/heartbeat", e.token("1", "d"), `{}`)
	}
}

// --- 8. bad input ---

func TestBadInputChangesNothing(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "d", true)
	e.setStatus("1", "busy", "before")
	e.setSettings("1", "everyone", "everyone")
	e.setContacts("1", "a")
	snapshot := func() string {
		t.Helper()
		var b strings.Builder
		b.Write(e.ok("GET", "/v1/presence/1?viewer_id=1", keyHdr, "").body)
		b.Write(e.ok("GET", "/v1/users/1/settings", keyHdr, "").body)
		b.Write(e.ok("GET", "/v1/users/1/contacts", keyHdr, "").body)
		b.Write(e.ok("GET", "/v1/debug/users/1", keyHdr, "").body)
		return b.String()
	}
	before := snapshot()
	big := `{"user_id":"1","device_id":"` + strings.Repeat("x", 1<<20) + `"}`

	writes := []struct{ method, path string }{
		{"POST", "/v1/heartbeat"},
		{"POST", "/v1/status"},
		{"POST", "/v1/bye"},
		{"PUT", "/v1/users/1/settings"},
		{"PUT", "/v1/users/1/contacts"},
		{"POST", "/v1/users/1/contacts"},
		{"POST", "/v1/presence/batch"},
	}
	bodies := []struct {
		name, body string
		code       int
		errCode    string
	}{
		{"malformed", `{"user_id":"1",`, 400, "invalid_json"},
		{"not json", `user_id=1`, 400, "invalid_json"},
		{"unknown field", `{"user_id":"1","device_id":"d","status":"away","contacts":[],"bogus":true}`, 400, "invalid_json"},
		{"trailing data", `{"user_id":"1","device_id":"d"} {}`, 400, "invalid_json"},
		{"trailing garbage", `{"user_id":"1","device_id":"d"}x`, 400, "invalid_json"},
		{"empty", ``, 400, "invalid_json"},
		{"whitespace", " \n\t", 400, "invalid_json"},
		{"array", `[]`, 400, "invalid_json"},
		{"string", `"x"`, 400, "invalid_json"},
		{"null", `null`, 400, ""},
		{"wrong types", `{"user_id":1,"device_id":true}`, 400, "invalid_json"},
		{"too large", big, 413, "body_too_large"},
	}
	for _, w := range writes {
		for _, b := range bodies {
			t.Run(w.method+" "+w.path+" "+b.name, func(t *testing.T) {
				r := e.do(w.method, w.path, keyHdr, b.body)
				wantError(t, r, b.code, b.errCode)
			})
		}
	}
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, `{"user_id":"1"`), 400, "invalid_json", "not valid JSON")
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, ``), 400, "invalid_json", "empty")
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, `{"user_id":"1","device_id":"d"}{}`), 400, "invalid_json", "after the JSON object")
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, `{"user_id":"1","device_id":"d","x":1}`), 400, "invalid_json", `"x"`)
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, big), 413, "body_too_large", "1048576")

	if after := snapshot(); after != before {
		t.Errorf("refused writes changed state:\nbefore %s\nafter  %s", before, after)
	}
}

func TestRoutingErrorsAreJSON(t *testing.T) {
	e := newEnv(t, opts{})
	tests := []struct {
		method, path string
		code         int
		errCode      string
		allow        string
	}{
		{"GET", "/nope", 404, "not_found", ""},
		{"GET", "/v1/presence/", 404, "not_found", ""},
		{"GET", "/v1/users/1/contacts/2", 405, "method_not_allowed", "DELETE, PUT"},
		{"GET", "/v1/heartbeat", 405, "method_not_allowed", "POST"},
		{"DELETE", "/v1/users/1/settings", 405, "method_not_allowed", "GET, HEAD, PUT"},
		{"POST", "/presence/batch", 405, "method_not_allowed", "GET, HEAD"},
		{"PATCH", "/v1/presence/1", 405, "method_not_allowed", "GET, HEAD"},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := e.do(tc.method, tc.path, keyHdr, "")
			words := []string{tc.path}
			if tc.allow != "" {
				words = append(words, tc.method, tc.allow)
				if got := r.header.Get("Allow"); got != tc.allow {
					t.Errorf("Allow: got %q, want %q", got, tc.allow)
				}
			}
			wantError(t, r, tc.code, tc.errCode, words...)
		})
	}
}

// --- 9. health and metrics ---

func TestHealthReadyMetrics(t *testing.T) {
	e := newEnv(t, opts{})
	if r := e.ok("GET", "/healthz", "", ""); string(r.body) != `{"status":"ok"}` {
		t.Errorf("healthz: got %q", r.body)
	}
	// The harness serves the handler without running the node: its
	// WebSocket gateway takes no connections, so the node is not ready.
	if r := e.do("GET", "/readyz", "", ""); r.code != http.StatusServiceUnavailable ||
		string(r.body) != `{"status":"not_ready","reason":"gateway","checks":{"gateway":"unavailable","sqlite":"ok"}}`+"\n" {
		t.Errorf("readyz: got %d %q", r.code, r.body)
	}
	e.beat("1", "d", true)
	e.advance(31 * time.Second) // one transition each way
	e.ok("GET", "/presence/batch?user_ids=1", keyHdr, "")
	// Even counters can give an invisible user away on a quiet node, so
	// metrics are for holders of the API key (Prometheus sends it as a
	// bearer token).
	wantError(t, e.do("GET", "/metrics", "", ""), http.StatusUnauthorized, "unauthorized")
	wantError(t, e.do("GET", "/metrics", "Bearer wrong", ""), http.StatusUnauthorized, "unauthorized")
	wantError(t, e.do("GET", "/metrics", e.token("1", ""), ""), http.StatusForbidden, "forbidden", "API key")
	r := e.ok("GET", "/metrics", keyHdr, "")
	body := string(r.body)
	for _, want := range []string{
		"presenced_heartbeats_total 1",
		`presenced_transitions_total{from="offline",to="online"} 1`,
		`presenced_transitions_total{from="online",to="offline"} 1`,
		"presenced_online_users 0",
		`presenced_http_request_duration_seconds_bucket{route="batch_seed"`,
		`presenced_http_request_duration_seconds_count{route="heartbeat"} 1`,
		"presenced_ws_connections 0",
		`presenced_ws_closed_total{reason="slow_consumer"} 0`,
		"presenced_fanout_subscriptions 0",
		"presenced_fanout_withheld_total 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// In development mode anonymous access passes; a bad key still does not.
	d := newEnv(t, opts{dev: true})
	if r := d.ok("GET", "/metrics", "", ""); !strings.Contains(string(r.body), "presenced_heartbeats_total") {
		t.Errorf("dev metrics: got %s", r.body)
	}
	wantError(t, d.do("GET", "/metrics", "Bearer wrong", ""), http.StatusUnauthorized, "unauthorized")
	d.ok("GET", "/metrics", keyHdr, "")
}

// TestCleanPathRedirect checks that the mux's redirect of an unclean path
// stays a plain redirect, not a redirect dressed as a not_found error.
func TestCleanPathRedirect(t *testing.T) {
	e := newEnv(t, opts{})
	c := *e.srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, tc := range []struct{ path, location string }{
		{"/nope//x", "/nope/x"},
		{"/v1//presence/1", "/v1/presence/1"},
	} {
		req, _ := http.NewRequest("GET", e.srv.URL+tc.path, nil)
		req.Header.Set("Authorization", keyHdr)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusTemporaryRedirect || res.Header.Get("Location") != tc.location {
			t.Errorf("%s: got %d Location %q, want 307 to %s", tc.path, res.StatusCode, res.Header.Get("Location"), tc.location)
		}
		if strings.Contains(string(b), "not_found") {
			t.Errorf("%s: a redirect carries an error body: %s", tc.path, b)
		}
		// Its body is JSON like everything else (the mux writes HTML).
		if want := `{"location":"` + tc.location + `"}`; string(b) != want || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: body %q (%s), want %s as JSON", tc.path, b, res.Header.Get("Content-Type"), want)
		}
	}
	// A file the demo page does not have is a JSON 404 too.
	wantError(t, e.do("GET", "/static/nope.js", "", ""), http.StatusNotFound, "not_found", "/static/nope.js")
	// Followed, the unknown path ends in a JSON 404.
	wantError(t, e.do("GET", "/nope//x", keyHdr, ""), http.StatusNotFound, "not_found", "/nope/x")
}

func TestContactListLimit(t *testing.T) {
	e := newEnv(t, opts{})
	list := make([]string, 10001)
	for i := range list {
		list[i] = "c" + strconv.Itoa(i)
	}
	body := func(ids []string) string {
		b, _ := json.Marshal(map[string][]string{"contacts": ids})
		return string(b)
	}
	contacts := func() []string {
		t.Helper()
		r := e.ok("GET", "/v1/users/1/contacts", keyHdr, "")
		var got struct{ Contacts []string }
		decodeStrict(t, r.body, &got)
		return got.Contacts
	}
	const limitMsg = "a contact list may hold at most 10000 users"
	wantError(t, e.do("PUT", "/v1/users/1/contacts", keyHdr, body(list)), http.StatusBadRequest, "too_many_contacts", "10001", "10000")
	if got := contacts(); len(got) != 0 {
		t.Fatalf("a refused PUT wrote %d contacts", len(got))
	}
	e.ok("PUT", "/v1/users/1/contacts", keyHdr, body(list[:9999]))
	// Adding one that is already there is fine; adding two new ones is not,
	// and adds neither.
	e.ok("POST", "/v1/users/1/contacts", keyHdr, body([]string{"c0", "c9998"}))
	r := e.do("POST", "/v1/users/1/contacts", keyHdr, body([]string{"c9999", "c10000"}))
	wantError(t, r, http.StatusBadRequest, "too_many_contacts")
	if msg := string(r.body); !strings.Contains(msg, `"message":"`+limitMsg+`"`) {
		t.Errorf("refused addition: got %s, want the message %q", msg, limitMsg)
	}
	if got := contacts(); len(got) != 9999 || slices.Contains(got, "c9999") || slices.Contains(got, "c10000") {
		t.Fatalf("a refused POST changed the list: %d contacts", len(got))
	}
	// Replacing the list by a smaller one with other ids is fine; a
	// replacement that dedupes to the limit is too.
	e.ok("PUT", "/v1/users/1/contacts", keyHdr, body(append(list[1:10000], "c1")))
	if got := contacts(); len(got) != 9999 || slices.Contains(got, "c0") {
		t.Fatalf("after a PUT with a duplicate: %d contacts", len(got))
	}
	e.ok("PUT", "/v1/users/1/contacts/c0", keyHdr, "")
	wantError(t, e.do("PUT", "/v1/users/1/contacts/c10000", keyHdr, ""), http.StatusBadRequest, "too_many_contacts", limitMsg)
	if got := contacts(); len(got) != 10000 || slices.Contains(got, "c10000") {
		t.Errorf("got %d contacts, want 10000 without c10000", len(got))
	}
	// At the limit, adding one already there is still fine, and removing
	// makes room.
	e.ok("PUT", "/v1/users/1/contacts/c5", keyHdr, "")
	e.ok("DELETE", "/v1/users/1/contacts/c5", keyHdr, "")
	e.ok("PUT", "/v1/users/1/contacts/c10000", keyHdr, "")
}

// TestTTLBoundary pins the state model's boundary: a device is alive while
// now < last_beat + ttl, so at exactly last_beat + ttl the user is offline,
// and a sweep at exactly the deadline terminates.
func TestTTLBoundary(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "d", true)
	seed := func() string {
		t.Helper()
		return string(e.ok("GET", "/presence/batch?user_ids=1", keyHdr, "").body)
	}
	e.advance(30*time.Second - time.Millisecond)
	if got := seed(); got != `{"1":"online"}`+"\n" {
		t.Errorf("1ms before the ttl runs out: got %q, want online", got)
	}
	e.advance(time.Millisecond) // sweeps at exactly the deadline
	if got := seed(); got != `{"1":"offline"}`+"\n" {
		t.Errorf("at last_beat + ttl: got %q, want offline", got)
	}
	if v := e.getView("1", keyHdr, ""); show(v.LastSeen) != jstr(fmtTime(t0)) || show(v.Devices) != "0" {
		t.Errorf("after expiry: got %s, want last_seen %s, 0 devices", fmtView(v), fmtTime(t0))
	}
}

// TestInvisibleTextRefused: a status text with a character that renders
// as nothing or reorders what follows is refused with 400, like an id with
// one, and changes nothing; invalid UTF-8 in the body too (the JSON
// decoder would have made it U+FFFD silently).
func TestInvisibleTextRefused(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "d", true)
	e.setStatus("1", "busy", "before")
	for _, body := range []string{
		`{"user_id":"1","status":"busy","text":"\u202eright to left"}`,
		`{"user_id":"1","status":"busy","text":"line\u2028para"}`,
		`{"user_id":"1","status":"busy","text":"a\u200bb"}`,
		`{"user_id":"1","status":"busy","text":"\ufffd"}`,
	} {
		wantError(t, e.do("POST", "/v1/status", keyHdr, body), http.StatusBadRequest, "invalid_text")
	}
	wantError(t, e.do("POST", "/v1/status", keyHdr, "{\"user_id\":\"1\",\"status\":\"busy\",\"text\":\"a\xffb\"}"),
		http.StatusBadRequest, "invalid_json", "UTF-8")
	if v := e.getView("1", keyHdr, ""); show(v.StatusText) != `"before"` {
		t.Errorf("after refused texts: %s", fmtView(v))
	}
}

// TestJSONKeysExact: a field name that differs in case, or a field given
// twice, is refused (encoding/json would take the one and keep the last
// of the other), so a proxy in front reads a body as the server does.
func TestJSONKeysExact(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "d", true)
	e.setStatus("1", "busy", "before")
	for _, tc := range []struct{ body, word string }{
		{`{"User_ID":"1","status":"away"}`, "User_ID"},
		{`{"user_id":"1","STATUS":"away"}`, "STATUS"},
		{`{"user_id":"1","status":"online","status":"away"}`, "twice"},
		{`{"user_id":"2","user_id":"1","status":"away"}`, "twice"},
		{`{"user_id":"1","status":"away","text":"x","text":"y"}`, "twice"},
	} {
		wantError(t, e.do("POST", "/v1/status", keyHdr, tc.body), http.StatusBadRequest, "invalid_json", tc.word)
	}
	if v := e.getView("1", keyHdr, ""); show(v.Status) != `"busy"` || show(v.StatusText) != `"before"` {
		t.Errorf("after refused bodies: %s", fmtView(v))
	}
	// An escaped key that decodes to the exact name is that name.
	e.ok("POST", "/v1/status", keyHdr, `{"user\u005fid":"1","status":"away","text":"a, \"quoted\" [text]"}`)
	if v := e.getView("1", keyHdr, ""); show(v.Status) != `"away"` {
		t.Errorf("escaped key: %s", fmtView(v))
	}
	// Strings holding quotes and brackets are no keys.
	e.ok("POST", "/v1/presence/batch", keyHdr, `{"user_ids":["1","x]\"{y:"],"viewer_id":"1"}`)
}

// TestStatusTextRoundTrips checks that any valid text comes back exactly,
// through the hand-written encoder, on every path that shows it.
func TestStatusTextRoundTrips(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "d", true)
	for _, text := range []string{
		`quote " backslash \ slash /`, "</script><b>&amp;</b>",
		"👩‍👩‍👧 family", "é", "\u00a0no-break", "שלום", strings.Repeat("🙂", 140),
	} {
		e.setStatus("1", "busy", text)
		if v := e.getView("1", keyHdr, ""); !eq(v.StatusText, &text) {
			t.Errorf("GET: text %q came back as %s", text, show(v.StatusText))
		}
		if v := e.batchViews([]string{"1"}, keyHdr, "")["1"]; !eq(v.StatusText, &text) {
			t.Errorf("batch: text %q came back as %s", text, show(v.StatusText))
		}
		r := e.ok("GET", "/v1/public/1", "", "")
		if strings.ContainsAny(string(r.body), "\u2028\u2029") {
			t.Errorf("raw line separators in %q", r.body)
		}
	}
}

// TestConcurrentUse runs writers and readers of every kind at once, for the
// race detector: pooled buffers, the throttle, the stores.
func TestConcurrentUse(t *testing.T) {
	e := newEnv(t, opts{poll: time.Second})
	const workers, rounds = 6, 25
	done := make(chan struct{})
	for w := range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			user := "w" + strconv.Itoa(w)
			tok := e.token(user, "dev")
			for i := range rounds {
				reqs := []struct{ method, path, authz, body string }{
					{"POST", "/v1/heartbeat", tok, `{}`},
					{"POST", "/v1/status", keyHdr, `{"user_id":"` + user + `","status":"busy","text":"r` + strconv.Itoa(i) + `"}`},
					{"GET", "/presence/batch?user_ids=w0,w1,w2,w3,w4,w5", tok, ""},
					{"POST", "/v1/presence/batch", keyHdr, `{"user_ids":["w0","w1","w2","w3","w4","w5"],"viewer_id":"` + user + `"}`},
					{"GET", "/v1/presence/w0?viewer_id=" + user, keyHdr, ""},
					{"PUT", "/v1/users/" + user + "/settings", tok, `{"status_visibility":"contacts","last_seen_visibility":"everyone"}`},
					{"PUT", "/v1/users/" + user + "/contacts/w" + strconv.Itoa((w+1)%workers), tok, ""},
					{"POST", "/v1/bye", tok, `{}`},
				}
				for _, rq := range reqs {
					r := e.doAsync(rq.method, rq.path, rq.authz, rq.body)
					if r.err != nil {
						t.Errorf("%s %s: %v", rq.method, rq.path, r.err)
						return
					}
					if r.code != 200 && r.code != 429 {
						t.Errorf("%s %s: got %d %s", rq.method, rq.path, r.code, r.body)
					}
				}
			}
		}()
	}
	for w := 0; w < workers; w++ {
		if w == 0 {
			e.advance(time.Second) // sweeps race with the requests
		}
		<-done
	}
}

// --- 10. limits ---

// TestDeviceCap: a heartbeat of a new device while MaxDevices are alive is a
// 409 too_many_devices and changes nothing; the known devices keep beating,
// and a bye or a dead device frees a slot.
func TestDeviceCap(t *testing.T) {
	e := newEnv(t, opts{maxDevices: 2})
	e.beat("1", "d1", true)
	e.beat("1", "d2", true)
	e.beat("2", "d1", true)
	e.advance(time.Second)
	snapshot := func() string {
		t.Helper()
		return string(e.ok("GET", "/v1/presence/1?viewer_id=1", keyHdr, "").body) +
			string(e.ok("GET", "/v1/debug/users/1", keyHdr, "").body)
	}
	before := snapshot()
	for _, rq := range []struct{ authz, body string }{
		{keyHdr, `{"user_id":"1","device_id":"d3"}`},
		{keyHdr, `{"user_id":"1","device_id":"d3","active":false}`},
		{e.token("1", "d3"), `{}`},
		{e.token("1", ""), `{"device_id":"d4"}`},
	} {
		wantError(t, e.do("POST", "/v1/heartbeat", rq.authz, rq.body), http.StatusConflict, "too_many_devices")
	}
	if after := snapshot(); after != before {
		t.Errorf("refused heartbeats changed the user:\nbefore %s\nafter  %s", before, after)
	}

	// Known devices keep beating; another user has its own cap.
	e.beat("1", "d1", true)
	e.beat("1", "d2", false)
	e.beat("2", "d2", true)
	if v := e.getView("2", keyHdr, ""); show(v.Devices) != "2" {
		t.Errorf("user 2: got %s, want 2 devices", fmtView(v))
	}
	// A bye frees a slot.
	e.ok("POST", "/v1/bye", keyHdr, `{"user_id":"1","device_id":"d2"}`)
	e.beat("1", "d3", true)
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, `{"user_id":"1","device_id":"d4"}`), http.StatusConflict, "too_many_devices")
	// So does a device whose ttl ran out, swept or not.
	e.clk.Advance(30 * time.Second)
	e.beat("1", "d4", true)
	e.beat("1", "d5", true)
	if v := e.getView("1", keyHdr, "1"); show(v.Devices) != "2" || show(v.Status) != `"online"` {
		t.Errorf("after the devices died: got %s, want online with 2 devices", fmtView(v))
	}
}

// TestDefaultDeviceCap: without a setting, 32 devices may be alive.
func TestDefaultDeviceCap(t *testing.T) {
	e := newEnv(t, opts{})
	for i := range 32 {
		e.beat("1", "d"+strconv.Itoa(i), true)
	}
	wantError(t, e.do("POST", "/v1/heartbeat", keyHdr, `{"user_id":"1","device_id":"d32"}`), http.StatusConflict, "too_many_devices")
	if v := e.getView("1", keyHdr, ""); show(v.Devices) != "32" {
		t.Errorf("got %s, want 32 devices", fmtView(v))
	}
}

// TestInternalErrorsHideDetails: an unexpected failure is a 500 whose body
// says where to look, not what went wrong (that is for the server log).
func TestInternalErrorsHideDetails(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "d", true)
	if err := e.a.Close(); err != nil { // the durable store is gone
		t.Fatal(err)
	}
	for _, rq := range []struct{ method, path, body string }{
		{"PUT", "/v1/users/2/settings", `{"status_visibility":"nobody","last_seen_visibility":"nobody"}`},
		{"GET", "/v1/users/1/contacts", ""},
		{"PUT", "/v1/users/1/contacts", `{"contacts":["a"]}`},
		{"POST", "/v1/status", `{"user_id":"1","status":"busy"}`},
		{"GET", "/v1/presence/never-seen", ""},
	} {
		r := e.do(rq.method, rq.path, keyHdr, rq.body)
		wantError(t, r, http.StatusInternalServerError, "internal", "internal error (details are in the server log)")
		for _, detail := range []string{"sql", "closed", "database", "sqlite"} {
			if strings.Contains(strings.ToLower(string(r.body)), detail) {
				t.Errorf("%s %s: the error body tells %q: %s", rq.method, rq.path, detail, r.body)
			}
		}
	}
}

// TestMalformedQuery: a query string that does not parse is a 400
// invalid_query on every read that takes parameters, not a silently
// ignored parameter.
func TestMalformedQuery(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("1", "d", true)
	for _, path := range []string{
		"/presence/batch?user_ids=%zz",
		"/presence/batch?user_ids=1&viewer_id=%zz",
		"/presence/batch?user_ids=1&%zz",
		"/v1/presence/1?viewer_id=%zz",
		"/v1/presence/1?%zz=1",
		"/v1/presence/1?viewer_id=1&x=%",
	} {
		wantError(t, e.do("GET", path, keyHdr, ""), http.StatusBadRequest, "invalid_query", "malformed")
	}
}

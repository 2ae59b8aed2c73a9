package httpapi_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// write is one kind of durable write a client makes over HTTP.
type write struct {
	name, method, path, body string
}

// statusWrites, settingsWrites and contactWrites are the writes of user 1
// under each limit; the writes of one limit share its bucket.
var (
	statusWrites = []write{
		{"status", "POST", "/v1/status", `{"status":"busy"}`},
	}
	settingsWrites = []write{
		{"settings", "PUT", "/v1/users/1/settings", `{"status_visibility":"contacts","last_seen_visibility":"everyone"}`},
	}
	contactWrites = []write{
		{"replace contacts", "PUT", "/v1/users/1/contacts", `{"contacts":["a","b"]}`},
		{"add contacts", "POST", "/v1/users/1/contacts", `{"contacts":["c"]}`},
		{"add a contact", "PUT", "/v1/users/1/contacts/d", ""},
		{"remove a contact", "DELETE", "/v1/users/1/contacts/d", ""},
	}
)

// TestWriteLimits: a client token's user may make 5 durable writes of
// each kind at once and then one a second, as over WebSocket; beyond that
// a write is refused with 429, Retry-After and a message that says the
// limit, and changes nothing. Backends are not limited; each user and
// each kind of write has its own allowance.
func TestWriteLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []write
		what   string
	}{
		{"status", statusWrites, "too many status changes for this user: at most 1 per second, bursts of 5; retry in 1s"},
		{"settings", settingsWrites, "too many changes of settings for this user: at most 1 per second, bursts of 5; retry in 1s"},
		{"contacts", contactWrites, "too many changes of the contact list for this user: at most 1 per second, bursts of 5; retry in 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, opts{})
			e.beat("1", "phone", true)
			tok := e.token("1", "phone")
			next := func(i int) write { return tc.writes[i%len(tc.writes)] }

			// Refused requests (bad input, acting for another user) take
			// nothing from the allowance.
			for range 10 {
				w := next(0)
				if r := e.do(w.method, w.path, tok, "{"); r.code == http.StatusOK {
					t.Fatalf("%s with a broken body: 200", w.name)
				}
			}
			if r := e.do("POST", "/v1/status", tok, `{"user_id":"2","status":"busy"}`); r.code != http.StatusForbidden {
				t.Fatalf("status for another user: %d %s", r.code, r.body)
			}
			if r := e.do("PUT", "/v1/users/2/contacts", tok, `{"contacts":[]}`); r.code != http.StatusForbidden {
				t.Fatalf("contacts of another user: %d %s", r.code, r.body)
			}

			for i := range 5 {
				w := next(i)
				e.ok(w.method, w.path, tok, w.body)
			}
			before := e.state()
			for i := range len(tc.writes) {
				w := next(5 + i)
				r := e.do(w.method, w.path, tok, w.body)
				wantError(t, r, http.StatusTooManyRequests, "rate_limited", tc.what)
				if got := r.header.Get("Retry-After"); got != "1" {
					t.Errorf("%s: Retry-After %q, want 1", w.name, got)
				}
			}
			if after := e.state(); after != before {
				t.Errorf("a refused write changed the user:\nbefore %s\nafter  %s", before, after)
			}

			// Another device of the same user has the same allowance.
			w := next(0)
			wantError(t, e.do(w.method, w.path, e.token("1", "laptop"), w.body), http.StatusTooManyRequests, "rate_limited")
			// Half a second later: still nothing; Retry-After rounds up.
			e.clk.Advance(500 * time.Millisecond)
			r := e.do(w.method, w.path, tok, w.body)
			if r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
				t.Errorf("0.5 s later: %d, Retry-After %q; want 429 and 1", r.code, r.header.Get("Retry-After"))
			}
			// A second after the burst: one more, and only one.
			e.clk.Advance(500 * time.Millisecond)
			e.ok(w.method, w.path, tok, w.body)
			wantError(t, e.do(w.method, w.path, tok, w.body), http.StatusTooManyRequests, "rate_limited")

			// The API key is not limited, for the same user or any other.
			for i := range 20 {
				w := next(i)
				e.ok(w.method, w.path, keyHdr, withUser(w, "1"))
			}
			// Another user has an allowance of their own.
			e.ok("POST", "/v1/status", e.token("2", ""), `{"status":"away"}`)
		})
	}
}

// TestWriteLimitsApart: each kind of write has its own allowance: a user
// whose status changes are used up may still change settings and
// contacts, and the other way round.
func TestWriteLimitsApart(t *testing.T) {
	e := newEnv(t, opts{})
	tok := e.token("1", "")
	kinds := [][]write{statusWrites, settingsWrites, contactWrites}
	for i, used := range kinds {
		for range 5 {
			e.ok(used[0].method, used[0].path, tok, used[0].body)
		}
		if r := e.do(used[0].method, used[0].path, tok, used[0].body); r.code != http.StatusTooManyRequests {
			t.Fatalf("%s beyond the burst: %d", used[0].name, r.code)
		}
		for j, other := range kinds {
			if j > i { // not used up yet
				e.ok(other[0].method, other[0].path, tok, other[0].body)
				e.clk.Advance(time.Second) // the one it took comes back
			}
		}
	}
}

// withUser is w's body for a backend, which names the user it acts for
// (only the status write has one in its body).
func withUser(w write, user string) string {
	if w.path != "/v1/status" {
		return w.body
	}
	return fmt.Sprintf(`{"user_id":%s,%s`, jstr(user), w.body[1:])
}

// state is what the API key reads of user 1: status, settings, contacts.
func (e *env) state() string {
	e.t.Helper()
	return e.ok("GET", "/v1/presence/1", keyHdr, "").String() +
		e.ok("GET", "/v1/users/1/settings", keyHdr, "").String() +
		e.ok("GET", "/v1/users/1/contacts", keyHdr, "").String()
}

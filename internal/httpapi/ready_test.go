package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/httpapi"
)

// deps satisfies the interfaces a Server needs; /readyz calls none of them.
type deps struct {
	httpapi.Tracker
	httpapi.Reader
	httpapi.ContactBook
	httpapi.Profiles
}

// TestReadiness: /readyz says whether this node can serve. A failing part
// of the node itself (its gateway, its SQLite file) makes it 503; a
// failing shared backend (PostgreSQL, Redis, NATS — down for every node at
// once) is reported in the body but leaves it 200, so a load balancer
// never takes the whole cluster out; draining is 503. Errors stay in the
// log.
func TestReadiness(t *testing.T) {
	var gatewayDown, sqliteDown, pgDown, redisDown atomic.Bool
	check := func(b *atomic.Bool) func(context.Context) error {
		return func(context.Context) error {
			if b.Load() {
				return errors.New("secret detail: dial tcp 10.0.0.7:5432: connection refused")
			}
			return nil
		}
	}
	var d deps
	srv, err := httpapi.New(httpapi.Config{
		Tracker: d, Reader: d, Contacts: d, Profiles: d, Auth: auth.New(auth.Config{APIKey: apiKey}),
		Checks: []httpapi.Check{
			{Name: "gateway", Check: check(&gatewayDown)},
			{Name: "sqlite", Check: check(&sqliteDown)},
			{Name: "postgres", Shared: true, Check: check(&pgDown)},
			{Name: "redis", Shared: true, Check: check(&redisDown)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	get := func() (int, string) {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		return w.Code, strings.TrimSuffix(w.Body.String(), "\n")
	}
	for _, tc := range []struct {
		name string
		down []*atomic.Bool
		code int
		body string
	}{
		{"all well", nil, 200,
			`{"status":"ready","checks":{"gateway":"ok","sqlite":"ok","postgres":"ok","redis":"ok"}}`},
		{"PostgreSQL and Redis down: shared, reported, still ready", []*atomic.Bool{&pgDown, &redisDown}, 200,
			`{"status":"ready","checks":{"gateway":"ok","sqlite":"ok","postgres":"unavailable","redis":"unavailable"}}`},
		{"this node's SQLite fails", []*atomic.Bool{&sqliteDown}, 503,
			`{"status":"not_ready","reason":"sqlite","checks":{"gateway":"ok","sqlite":"unavailable","postgres":"ok","redis":"ok"}}`},
		{"the gateway is not running, PostgreSQL down too", []*atomic.Bool{&gatewayDown, &pgDown}, 503,
			`{"status":"not_ready","reason":"gateway","checks":{"gateway":"unavailable","sqlite":"ok","postgres":"unavailable","redis":"ok"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, b := range []*atomic.Bool{&gatewayDown, &sqliteDown, &pgDown, &redisDown} {
				b.Store(false)
			}
			for _, b := range tc.down {
				b.Store(true)
			}
			code, body := get()
			if code != tc.code || body != tc.body {
				t.Errorf("got %d %s\nwant %d %s", code, body, tc.code, tc.body)
			}
			if strings.Contains(body, "secret") || strings.Contains(body, "10.0.0.7") {
				t.Errorf("the body tells a check's error: %s", body)
			}
		})
	}
	srv.Drain()
	if code, body := get(); code != http.StatusServiceUnavailable || body != `{"status":"not_ready","reason":"draining"}` {
		t.Errorf("draining: got %d %s", code, body)
	}
}

package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// logBuffer is a log the test reads while the server writes it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) lines(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		all := line != ""
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

// TestReadinessNamesTheFailingCheck: a check that fails says so in the
// log, with its error; a check still waiting when the probe's caller goes
// away (a load balancer's shorter timeout) is not taken for failed; one
// that does not answer within the probe's 2 s is, and the log says that
// it did not answer. A check's StateError names its state in the body.
func TestReadinessNamesTheFailingCheck(t *testing.T) {
	var logs logBuffer
	var d deps
	streamMissing := &httpapi.StateError{State: "stream_missing", Err: errors.New("the changes stream is missing")}
	var natsState atomic.Pointer[error]
	srv, err := httpapi.New(httpapi.Config{
		Tracker: d, Reader: d, Contacts: d, Profiles: d, Auth: auth.New(auth.Config{APIKey: apiKey}),
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Checks: []httpapi.Check{
			{Name: "gateway", Check: func(context.Context) error { return nil }},
			// A backend whose answer never comes: the check waits for
			// the probe's context.
			{Name: "postgres", Shared: true, Check: func(ctx context.Context) error {
				<-ctx.Done()
				return ctx.Err()
			}},
			{Name: "redis", Shared: true, Check: func(context.Context) error {
				return errors.New("the state store is down: writes are buffered in the node")
			}},
			{Name: "nats", Shared: true, Check: func(context.Context) error {
				if p := natsState.Load(); p != nil {
					return *p
				}
				return nil
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	probe := func(ctx context.Context) (int, string) {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil).WithContext(ctx))
		return w.Code, strings.TrimSuffix(w.Body.String(), "\n")
	}

	// The caller goes away after 100 ms.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	code, body := probe(ctx)
	cancel()
	if want := `{"status":"ready","checks":{"gateway":"ok","postgres":"ok","redis":"unavailable","nats":"ok"}}`; code != 200 || body != want {
		t.Errorf("probe whose caller went away: %d %s, want 200 %s", code, body, want)
	}
	if got := logs.lines(`msg="readiness check fails"`, "check=redis", "the state store is down"); len(got) != 1 {
		t.Errorf("redis's failure logged %d times, want once with its error:\n%s", len(got), logs.lines())
	}
	if got := logs.lines(`msg="readiness check fails"`, "check=postgres"); len(got) != 0 {
		t.Errorf("postgres logged as failing when the probe's caller went away: %s", got)
	}
	if got := logs.lines("readiness checks not judged", "caller went away", "checks=postgres"); len(got) != 1 {
		t.Errorf("no line says postgres was not judged:\n%s", logs.lines())
	}

	// The probe's own 2 s run out, on time: postgres did not answer.
	natsState.Store(func() *error { var e error = fmt.Errorf("natsbus: %w", streamMissing); return &e }())
	code, body = probe(context.Background())
	if want := `{"status":"ready","checks":{"gateway":"ok","postgres":"unavailable","redis":"unavailable","nats":"stream_missing"}}`; code != 200 || body != want {
		t.Errorf("probe that ran out of time: %d %s, want 200 %s", code, body, want)
	}
	if got := logs.lines(`msg="readiness check fails"`, "check=postgres", "no answer within the probe's 2s"); len(got) != 1 {
		t.Errorf("postgres's timeout not logged as such:\n%s", logs.lines())
	}
	if got := logs.lines(`msg="readiness check fails"`, "check=nats", "state=stream_missing", "the changes stream is missing"); len(got) != 1 {
		t.Errorf("nats's state not logged:\n%s", logs.lines())
	}
	if got := logs.lines(`msg="readiness check fails"`, "check=redis"); len(got) != 1 {
		t.Errorf("redis's unchanged failure logged again: %s", got)
	}
	natsState.Store(nil)
	if code, body = probe(context.Background()); !strings.Contains(body, `"nats":"ok"`) {
		t.Errorf("nats back: %d %s", code, body)
	}
	if got := logs.lines(`msg="readiness check passes again"`, "check=nats"); len(got) != 1 {
		t.Errorf("nats's recovery not logged:\n%s", logs.lines())
	}
}

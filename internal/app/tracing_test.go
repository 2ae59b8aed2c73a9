package app_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracing"
)

// TestTracing: with tracing on (the SDK's in-memory exporter), a scale-out
// node (Redis, PostgreSQL, NATS) makes a server span per HTTP request,
// named by route, and one per WebSocket operation, with a child span per
// backend call made for it; heartbeats over the WebSocket make none.
func TestTracing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tracing.Use(tp)
	t.Cleanup(func() { tracing.Use(nil); _ = tp.Shutdown(t.Context()) })

	rs, pg, ns := testsvc.Redis(t), testsvc.Postgres(t), testsvc.NATS(t)
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		TTL: 30 * time.Second, RedisURL: rs.URL, PostgresURL: pg.URL, NATSURL: ns.URL})

	// children returns the names of the spans whose parent is s, sorted.
	children := func(s tracetest.SpanStub) []string {
		var names []string
		for _, c := range exp.GetSpans() {
			if c.Parent.SpanID() == s.SpanContext.SpanID() && c.Parent.TraceID() == s.SpanContext.TraceID() {
				names = append(names, c.Name)
			}
		}
		slices.Sort(names)
		return names
	}
	// only returns the one span named name recorded since mark.
	only := func(mark int, name string) tracetest.SpanStub {
		t.Helper()
		var found []tracetest.SpanStub
		for _, s := range exp.GetSpans()[mark:] {
			if s.Name == name {
				found = append(found, s)
			}
		}
		if len(found) != 1 {
			var all []string
			for _, s := range exp.GetSpans()[mark:] {
				all = append(all, s.Name)
			}
			t.Fatalf("%d spans named %q, want 1; spans: %v", len(found), name, all)
		}
		return found[0]
	}

	if code, body := call(t, addr, "POST", "/v1/heartbeat", `{"user_id":"alice","device_id":"d1"}`); code != 200 {
		t.Fatalf("heartbeat: %d %s", code, body)
	}

	// An HTTP batch read: the route's server span, the read of Redis its child.
	mark := len(exp.GetSpans())
	if code, body := call(t, addr, "POST", "/v1/presence/batch", `{"user_ids":["alice","bob"]}`); code != 200 {
		t.Fatalf("batch: %d %s", code, body)
	}
	batch := only(mark, "presence_batch")
	if batch.SpanKind != trace.SpanKindServer || batch.Parent.IsValid() {
		t.Errorf("presence_batch: kind %v, parent %v; want a root server span", batch.SpanKind, batch.Parent)
	}
	if got := children(batch); !slices.Contains(got, "redis get") {
		t.Errorf("presence_batch's children %v, want redis get among them", got)
	}

	// A status change over HTTP: the durable write and the Redis script.
	mark = len(exp.GetSpans())
	if code, body := call(t, addr, "POST", "/v1/status", `{"user_id":"alice","status":"busy"}`); code != 200 {
		t.Fatalf("status: %d %s", code, body)
	}
	status := only(mark, "status")
	if got := children(status); !slices.Contains(got, "postgres save_status") || !slices.Contains(got, "redis set_status") {
		t.Errorf("status's children %v, want postgres save_status and redis set_status", got)
	}

	// A status change over the WebSocket, after heartbeats.
	c := dialWS(t, addr, "carol")
	c.msg("welcome")
	mark = len(exp.GetSpans())
	c.send(`{"type":"heartbeat"}`)
	c.send(`{"type":"set_status","status":"away","text":"lunch"}`)
	testwait.For(t, "the set_status span", func() bool {
		for _, s := range exp.GetSpans()[mark:] {
			if s.Name == "ws set_status" {
				return true
			}
		}
		return false
	})
	ws := only(mark, "ws set_status")
	if ws.SpanKind != trace.SpanKindServer || ws.Parent.IsValid() {
		t.Errorf("ws set_status: kind %v, parent %v; want a root server span", ws.SpanKind, ws.Parent)
	}
	if got := children(ws); !slices.Contains(got, "postgres save_status") || !slices.Contains(got, "redis set_status") {
		t.Errorf("ws set_status's children %v, want postgres save_status and redis set_status", got)
	}
	for _, s := range exp.GetSpans()[mark:] {
		if strings.Contains(s.Name, "heartbeat") {
			t.Errorf("a span %q for a WebSocket heartbeat", s.Name)
		}
	}
	// Backend calls outside a request (sweeps, checkpoints) are not traced.
	for _, s := range exp.GetSpans() {
		if strings.Contains(s.Name, " ") && !s.Parent.IsValid() && !strings.HasPrefix(s.Name, "ws ") {
			t.Errorf("a backend span %q without a parent", s.Name)
		}
	}
}

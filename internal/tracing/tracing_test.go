package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestOffWithoutEnv: without the OTLP variables Setup leaves tracing off,
// and Start then costs nothing: the same context, no span, no allocation.
func TestOffWithoutEnv(t *testing.T) {
	shutdown, err := Setup(context.Background(), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	if On() {
		t.Fatal("tracing on without OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	ctx := context.Background()
	if c, span := Start(ctx, "x"); c != ctx || span != nil {
		t.Errorf("Start while off: %v, %v", c, span)
	}
	if n := testing.AllocsPerRun(100, func() { Start(ctx, "x") }); n != 0 {
		t.Errorf("Start while off allocates %v times", n)
	}
}

// TestExportsOverOTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set, spans reach
// the collector there (an HTTP server of the test taking POST /v1/traces)
// by shutdown at the latest.
func TestExportsOverOTLP(t *testing.T) {
	var posts, bytes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" && r.URL.Path == "/v1/traces" {
			b, _ := io.ReadAll(r.Body)
			posts.Add(1)
			bytes.Add(int64(len(b)))
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL) // the exporter reads the process's environment
	shutdown, err := Setup(context.Background(), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if !On() {
		t.Fatal("tracing off with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}
	ctx, span := Start(context.Background(), "parent")
	if child := StartChild(ctx, "child"); child == nil {
		t.Error("no child span within a recorded span")
	} else {
		child.End()
	}
	span.End()
	if StartChild(context.Background(), "orphan") != nil {
		t.Error("a child span without a parent")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if On() {
		t.Error("tracing still on after shutdown")
	}
	if posts.Load() == 0 || bytes.Load() == 0 {
		t.Errorf("the collector got %d posts, %d bytes", posts.Load(), bytes.Load())
	}
}

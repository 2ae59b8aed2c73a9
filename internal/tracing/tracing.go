// Package tracing holds presenced's OpenTelemetry tracer: a span per HTTP
// request (internal/httpapi), per WebSocket operation other than a
// heartbeat (internal/gateway), and per backend call made within one of
// those (internal/backendcall).
//
// Tracing is off unless Setup finds the standard OTLP environment
// variables (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or a test calls Use. Off, Start
// returns its context unchanged and a nil span after one atomic load: no
// allocation, no no-op span.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of presenced's spans.
const Name = "github.com/presenced/presenced"

var (
	tracer     atomic.Pointer[trace.Tracer] // nil: tracing is off
	propagator = propagation.TraceContext{}
)

// Use makes tp the provider of presenced's spans; nil turns tracing off.
// It is safe for concurrent use.
func Use(tp trace.TracerProvider) {
	if tp == nil {
		tracer.Store(nil)
		return
	}
	t := tp.Tracer(Name)
	tracer.Store(&t)
}

// On reports whether spans are recorded.
func On() bool { return tracer.Load() != nil }

// Start starts a span named name, a child of ctx's span if it has one. Off,
// it returns ctx and a nil span.
func Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, nil
	}
	return (*t).Start(ctx, name, opts...)
}

// StartChild is Start only when ctx carries a span being recorded: a
// backend call is traced within a request or an operation, not on its own
// (the sweeps and checkpoints of every second would drown the rest).
func StartChild(ctx context.Context, name string, opts ...trace.SpanStartOption) trace.Span {
	t := tracer.Load()
	if t == nil || ctx == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return nil
	}
	_, span := (*t).Start(ctx, name, opts...)
	return span
}

// StartHTTP starts the span of an HTTP request: a server span named route,
// the child of the caller's span if the request carries a W3C traceparent
// header.
func StartHTTP(r *http.Request, route string) (context.Context, trace.Span) {
	if tracer.Load() == nil {
		return r.Context(), nil
	}
	ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	return Start(ctx, route, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", route)))
}

// Configured reports whether getenv names an OTLP endpoint for traces.
func Configured(getenv func(string) string) bool {
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup turns tracing on, exporting over OTLP/HTTP as the standard
// OTEL_EXPORTER_OTLP_* and OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES
// variables say, if getenv names an endpoint; otherwise it leaves tracing
// off. shutdown flushes the spans still queued and turns tracing off.
func Setup(ctx context.Context, getenv func(string) string) (shutdown func(context.Context) error, err error) {
	if !Configured(getenv) {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx) // reads the OTEL_EXPORTER_OTLP_* variables itself
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "presenced")),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagator)
	Use(tp)
	return func(ctx context.Context) error {
		Use(nil)
		return tp.Shutdown(ctx)
	}, nil
}

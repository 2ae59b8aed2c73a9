// Package backendcall times the calls presenced makes to its backends
// (Redis, PostgreSQL, SQLite, NATS) into one latency histogram per
// (backend, op), read by internal/metrics at scrape time.
//
// An Op is declared once per call site, as a package-level variable of the
// store that makes the call; a call costs one time.Now pair and two atomic
// adds on that Op's own counters: no lock, no map lookup, no allocation.
// The op name is the store method or script name, never user data, so the
// set of series is fixed by the code.
package backendcall

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/presenced/presenced/internal/tracing"
)

// Bounds are the histogram's upper bounds (le), in seconds: backend calls
// take tens of microseconds to milliseconds, a slow one seconds.
var Bounds = []float64{.000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// boundsNs are Bounds in nanoseconds, for the hot path.
var boundsNs = func() [nBounds]int64 {
	var b [nBounds]int64
	for i, s := range Bounds {
		b[i] = int64(s * 1e9)
	}
	return b
}()

const nBounds = 16

// Op is one kind of backend call. It is safe for concurrent use.
type Op struct {
	backend, name string
	spanName      string
	attrs         []attribute.KeyValue
	counts        [nBounds + 1]atomic.Uint64 // per bucket, not cumulative; the last is +Inf
	sumNs         atomic.Int64
}

var (
	mu  sync.Mutex // guards ops
	ops []*Op
)

// New returns the Op of backend and name, made on first use: call it once
// per call site (a package-level variable), not per call.
func New(backend, name string) *Op {
	mu.Lock()
	defer mu.Unlock()
	for _, o := range ops {
		if o.backend == backend && o.name == name {
			return o
		}
	}
	o := &Op{backend: backend, name: name, spanName: backend + " " + name,
		attrs: []attribute.KeyValue{attribute.String("presenced.backend", backend), attribute.String("presenced.op", name)}}
	ops = append(ops, o)
	return o
}

// Call is one call under way; End it once.
type Call struct {
	op    *Op
	start time.Time
	span  trace.Span // nil unless traced
}

// Start begins a call. ctx is the caller's (context.Background() for a
// call made on behalf of none): if it carries a span being recorded
// (internal/tracing), the call is its child span, named "<backend> <op>".
func (o *Op) Start(ctx context.Context) Call {
	var span trace.Span
	if tracing.On() {
		span = tracing.StartChild(ctx, o.spanName, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(o.attrs...))
	}
	return Call{op: o, start: time.Now(), span: span}
}

// End records the call's duration and, if traced, ends its span (an
// error status when err is not nil). err is the call's outcome.
func (c Call) End(err error) {
	c.op.Observe(time.Since(c.start))
	if c.span != nil {
		if err != nil {
			c.span.RecordError(err)
			c.span.SetStatus(codes.Error, err.Error())
		}
		c.span.End()
	}
}

// Done is End of *errp, for a deferred call in a function with a named
// error result:
//
//	func (s *Store) Save(ctx context.Context) (err error) {
//		defer opSave.Start(ctx).Done(&err)
func (c Call) Done(errp *error) {
	c.End(*errp)
}

// Observe records one call of duration d.
func (o *Op) Observe(d time.Duration) {
	ns := int64(d)
	i := 0
	for i < nBounds && ns > boundsNs[i] {
		i++
	}
	o.counts[i].Add(1)
	o.sumNs.Add(ns)
}

// Snapshot is an Op's histogram at one moment.
type Snapshot struct {
	Backend, Op string
	Count       uint64
	Sum         float64            // seconds
	Buckets     map[float64]uint64 // upper bound → cumulative count
}

// Count returns how many calls o has recorded.
func (o *Op) Count() uint64 {
	var n uint64
	for i := range o.counts {
		n += o.counts[i].Load()
	}
	return n
}

// Snapshots returns the histogram of every Op that has recorded a call,
// ordered by backend and op.
func Snapshots() []Snapshot {
	mu.Lock()
	list := slices.Clone(ops)
	mu.Unlock()
	out := make([]Snapshot, 0, len(list))
	for _, o := range list {
		s := Snapshot{Backend: o.backend, Op: o.name, Buckets: make(map[float64]uint64, nBounds)}
		for i := range o.counts {
			s.Count += o.counts[i].Load()
			if i < nBounds {
				s.Buckets[Bounds[i]] = s.Count
			}
		}
		if s.Count == 0 {
			continue
		}
		s.Sum = float64(o.sumNs.Load()) / 1e9
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Snapshot) int {
		return cmp.Or(cmp.Compare(a.Backend, b.Backend), cmp.Compare(a.Op, b.Op))
	})
	return out
}

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presenced/presenced/internal/backendcall"
)

var descBackendCall = prometheus.NewDesc("presenced_backend_call_duration_seconds",
	"Latency of calls to the backends (Redis, PostgreSQL, SQLite, NATS) by backend and op (the store method or script); a series appears after its first call.",
	[]string{"backend", "op"}, nil)

// backendCollector reads the histograms of internal/backendcall, kept in
// atomics by the stores, at scrape time.
type backendCollector struct{}

func (backendCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descBackendCall }

func (backendCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range backendcall.Snapshots() {
		ch <- prometheus.MustNewConstHistogram(descBackendCall, s.Count, s.Sum, s.Buckets, s.Backend, s.Op)
	}
}

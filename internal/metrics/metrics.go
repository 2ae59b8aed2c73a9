// Package metrics exposes presenced's counters to Prometheus. Hot-path
// counters live in the components as plain atomics; this package reads them
// at scrape time, so a heartbeat never touches a Prometheus metric.
package metrics

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/presenced/presenced/internal/buildinfo"
	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/ingestroute"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/natsbus"
	"github.com/presenced/presenced/internal/peers"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/replica"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/webhook"
)

// Registry holds every metric of one node. It is safe for concurrent use.
type Registry struct {
	reg      *prometheus.Registry
	latency  *prometheus.HistogramVec
	requests *prometheus.CounterVec
}

// Sources are the components whose counters are read at scrape time.
type Sources struct {
	Tracker func() tracker.Stats
	// SharedState says the hot state is shared by several nodes (Redis).
	// No node then makes every transition, so the tracker's count of
	// online users is not the cluster's (it went negative on nodes that
	// swept more departures than they saw arrivals) and
	// presenced_online_users is not exported.
	SharedState bool
	Users       func() int // users held in memory, nil if unknown
	Gateway     func() gateway.Stats
	Hub         func() fanout.Stats
	Rooms       func() fanout.RoomStats
	Bus         func() natsbus.Stats     // nil without NATS
	Ingest      func() ingest.Stats      // nil without the ingest consumer
	IngestRoute func() ingestroute.Stats // nil unless the ingest's devices are owned (Redis)
	Peers       func() peers.Stats       // nil without peers (NATS and Redis)
	Replica     func() replica.Stats     // nil without a read replica
	Connections func() connbudget.Stats
	Webhooks    func() webhook.Stats // nil without webhooks
	// KafkaIngest and KafkaChanges are the Kafka consumer's and
	// producer's, nil without them; KafkaIngestTopic labels the lag.
	KafkaIngest      func() kafka.ConsumerStats
	KafkaIngestTopic string
	KafkaChanges     func() kafka.ProducerStats
}

// New returns a Registry with the Go runtime, process, build and presence
// metrics.
func New(src Sources) *Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildInfoGauge(buildinfo.Read()))
	r := &Registry{
		reg: reg,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "presenced_http_request_duration_seconds",
			Help:    "Latency of HTTP API requests by route.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "presenced_http_requests_total",
			Help: "HTTP API requests by route and status code.",
		}, []string{"route", "code"}),
	}
	reg.MustRegister(r.latency, r.requests, backendCollector{})
	if src.Tracker != nil {
		reg.MustRegister(&trackerCollector{src: src})
		reg.MustRegister(&scaleOutCollector{tracker: src.Tracker, bus: src.Bus, ingest: src.Ingest, route: src.IngestRoute, peers: src.Peers})
		if src.Replica != nil {
			reg.MustRegister(&replicaCollector{src.Replica})
		}
		if src.Webhooks != nil {
			reg.MustRegister(&webhookCollector{src.Webhooks})
		}
		if src.KafkaIngest != nil || src.KafkaChanges != nil {
			reg.MustRegister(&kafkaCollector{ingest: src.KafkaIngest, topic: src.KafkaIngestTopic, changes: src.KafkaChanges})
		}
	}
	if src.Tracker != nil || src.Rooms != nil {
		reg.MustRegister(&roomCollector{tracker: src.Tracker, hub: src.Rooms})
	}
	if src.Gateway != nil || src.Hub != nil || src.Connections != nil {
		reg.MustRegister(&edgeCollector{gw: src.Gateway, hub: src.Hub, conns: src.Connections})
	}
	return r
}

// Handler serves the metrics in the Prometheus text format.
func (r *Registry) Handler() http.Handler {
	return promhttpHandler(r.reg)
}

// Observe records one HTTP request.
func (r *Registry) Observe(route string, code int, d time.Duration) {
	r.latency.WithLabelValues(route).Observe(d.Seconds())
	r.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
}

// buildInfoGauge is presenced_build_info{version,revision,go} 1: what
// -version prints, so a dashboard shows which build each node runs.
func buildInfoGauge(in buildinfo.Info) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "presenced_build_info",
		Help:        "Always 1: the build this node runs (as -version prints it; revision empty when the build was not stamped).",
		ConstLabels: prometheus.Labels{"version": in.Version, "revision": in.Revision, "go": in.Go},
	})
	g.Set(1)
	return g
}

var (
	descHeartbeats  = prometheus.NewDesc("presenced_heartbeats_total", "Heartbeats applied.", nil, nil)
	descTransitions = prometheus.NewDesc("presenced_transitions_total", "Changes of public status, by previous and new status.", []string{"from", "to"}, nil)
	descTextChanges = prometheus.NewDesc("presenced_status_text_changes_total", "Changes of status text without a change of status.", nil, nil)
	descOnline      = prometheus.NewDesc("presenced_online_users", "Users whose public status is not offline (only where this node holds the whole hot state: not with Redis).", nil, nil)
	descUsers       = prometheus.NewDesc("presenced_users_in_memory", "Users held in the hot state.", nil, nil)
	descFlushed     = prometheus.NewDesc("presenced_last_seen_checkpoints_total", "last_seen values written to the durable store.", nil, nil)
	descFlushErrors = prometheus.NewDesc("presenced_checkpoint_errors_total", "Failed group commits of last_seen (retried).", nil, nil)
)

type trackerCollector struct{ src Sources }

func (c *trackerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHeartbeats, descTransitions, descTextChanges, descOnline, descUsers, descFlushed, descFlushErrors} {
		ch <- d
	}
}

func (c *trackerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Tracker()
	ch <- prometheus.MustNewConstMetric(descHeartbeats, prometheus.CounterValue, float64(s.Heartbeats))
	for k, n := range s.Transitions {
		ch <- prometheus.MustNewConstMetric(descTransitions, prometheus.CounterValue, float64(n), k[0].String(), k[1].String())
	}
	// Zero series for the common kinds, so dashboards see them from the start.
	for _, k := range [][2]presence.Status{{presence.Offline, presence.Online}, {presence.Online, presence.Offline}, {presence.Online, presence.Away}, {presence.Away, presence.Online}} {
		if _, ok := s.Transitions[k]; !ok {
			ch <- prometheus.MustNewConstMetric(descTransitions, prometheus.CounterValue, 0, k[0].String(), k[1].String())
		}
	}
	ch <- prometheus.MustNewConstMetric(descTextChanges, prometheus.CounterValue, float64(s.TextChanges))
	if !c.src.SharedState {
		ch <- prometheus.MustNewConstMetric(descOnline, prometheus.GaugeValue, float64(s.Online))
	}
	if c.src.Users != nil {
		ch <- prometheus.MustNewConstMetric(descUsers, prometheus.GaugeValue, float64(c.src.Users()))
	}
	ch <- prometheus.MustNewConstMetric(descFlushed, prometheus.CounterValue, float64(s.Flushed))
	ch <- prometheus.MustNewConstMetric(descFlushErrors, prometheus.CounterValue, float64(s.FlushErrors))
}

// Values returns every presenced_* series and a few of the process's
// (resident memory, goroutines, open files) by name, read now from the
// same sources a scrape reads: a counter or gauge with labels appears
// once per label set, as name{label="value",…}, and once as name, the sum
// over its label sets; a histogram as name_count and name_sum. The
// operator page (GET /v1/admin/stats) computes its rates from these.
func (r *Registry) Values() (map[string]float64, error) {
	fams, err := r.reg.Gather()
	out := make(map[string]float64, 128)
	for _, f := range fams {
		name := f.GetName()
		if !strings.HasPrefix(name, "presenced_") && !processValues[name] {
			continue
		}
		for _, m := range f.GetMetric() {
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				v = m.GetUntyped().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_count"] += float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"] += m.GetHistogram().GetSampleSum()
				continue
			default:
				continue
			}
			out[name] += v
			if lps := m.GetLabel(); len(lps) > 0 {
				var b strings.Builder
				b.WriteString(name)
				b.WriteByte('{')
				for i, lp := range lps {
					if i > 0 {
						b.WriteByte(',')
					}
					b.WriteString(lp.GetName())
					b.WriteString(`="`)
					b.WriteString(lp.GetValue())
					b.WriteByte('"')
				}
				b.WriteByte('}')
				out[b.String()] = v
			}
		}
	}
	return out, err
}

// processValues are the series of the Go and process collectors Values
// returns besides presenced's own.
var processValues = map[string]bool{
	"process_resident_memory_bytes": true,
	"process_open_fds":              true,
	"go_goroutines":                 true,
}

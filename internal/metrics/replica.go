package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presenced/presenced/internal/replica"
)

var (
	descReplicaUsers   = prometheus.NewDesc("presenced_replica_users", "Users this node's read replica holds.", nil, nil)
	descReplicaMax     = prometheus.NewDesc("presenced_replica_max_users", "The bound of the read replica (-read-replica-users); 0 with -read-replica: every user.", nil, nil)
	descReplicaMisses  = prometheus.NewDesc("presenced_replica_misses_total", "Users a status read asked the bounded read replica for that it did not hold (or held too long): read from Redis and kept.", nil, nil)
	descReplicaRefresh = prometheus.NewDesc("presenced_replica_refreshed_total", "Users the bounded read replica read again from Redis in the background for being held longer than 5 minutes.", nil, nil)
	descReplicaEvicted = prometheus.NewDesc("presenced_replica_evicted_total", "Users the bounded read replica dropped to make room for a user read.", nil, nil)
	descReplicaReady   = prometheus.NewDesc("presenced_replica_ready", "1 while the read replica answers status reads, 0 while they go to Redis (filling, or changes may have been missed).", nil, nil)
	descReplicaChanges = prometheus.NewDesc("presenced_replica_changes_total", "Changes the read replica received, by outcome (stale: it held that version or a newer one; not_held: bounded, full, and the user not among those it holds).", []string{"outcome"}, nil)
	descReplicaFills   = prometheus.NewDesc("presenced_replica_fills_total", "Times the read replica was filled from Redis (a bounded one: emptied, to be read through again).", nil, nil)
	descReplicaFill    = prometheus.NewDesc("presenced_replica_last_fill_seconds", "How long the last fill of the read replica took.", nil, nil)
	descReplicaReads   = prometheus.NewDesc("presenced_replica_reads_total", "Status reads, by what answered them (replica, or store while the replica was not ready).", []string{"source"}, nil)
	descReplicaFull    = prometheus.NewDesc("presenced_replica_full_reads_total", "Full views read over HTTP, by what answered them (replica, or store while it was not ready or the device notes were not heard).", []string{"source"}, nil)
	descReplicaFullMis = prometheus.NewDesc("presenced_replica_full_misses_total", "Users a full view asked the read replica for whose full view it did not keep (new, changed, or a device note since): read from Redis and kept.", nil, nil)
	descReplicaNotes   = prometheus.NewDesc("presenced_replica_device_notes_total", "Device notes heard: a user's devices changed while nothing everyone sees did.", nil, nil)
	descReplicaNotesUp = prometheus.NewDesc("presenced_replica_notes_heard", "1 while the device notes are heard (full views may be answered by the replica), 0 while not (on a Redis before 7.0: never).", nil, nil)
)

type replicaCollector struct{ stats func() replica.Stats }

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReplicaUsers, descReplicaMax, descReplicaMisses, descReplicaRefresh, descReplicaEvicted, descReplicaReady, descReplicaChanges, descReplicaFills, descReplicaFill, descReplicaReads, descReplicaFull, descReplicaFullMis, descReplicaNotes, descReplicaNotesUp} {
		ch <- d
	}
}

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ready := 0.0
	if s.Ready {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReplicaUsers, prometheus.GaugeValue, float64(s.Users))
	ch <- prometheus.MustNewConstMetric(descReplicaMax, prometheus.GaugeValue, float64(s.Max))
	ch <- prometheus.MustNewConstMetric(descReplicaMisses, prometheus.CounterValue, float64(s.Misses))
	ch <- prometheus.MustNewConstMetric(descReplicaEvicted, prometheus.CounterValue, float64(s.Evicted))
	ch <- prometheus.MustNewConstMetric(descReplicaRefresh, prometheus.CounterValue, float64(s.Refreshed))
	ch <- prometheus.MustNewConstMetric(descReplicaReady, prometheus.GaugeValue, ready)
	ch <- prometheus.MustNewConstMetric(descReplicaChanges, prometheus.CounterValue, float64(s.Applied), "applied")
	ch <- prometheus.MustNewConstMetric(descReplicaChanges, prometheus.CounterValue, float64(s.Stale), "stale")
	ch <- prometheus.MustNewConstMetric(descReplicaChanges, prometheus.CounterValue, float64(s.NotHeld), "not_held")
	ch <- prometheus.MustNewConstMetric(descReplicaFills, prometheus.CounterValue, float64(s.Fills))
	ch <- prometheus.MustNewConstMetric(descReplicaFill, prometheus.GaugeValue, s.LastFill.Seconds())
	ch <- prometheus.MustNewConstMetric(descReplicaReads, prometheus.CounterValue, float64(s.Served), "replica")
	ch <- prometheus.MustNewConstMetric(descReplicaReads, prometheus.CounterValue, float64(s.Refused), "store")
	notes := 0.0
	if s.NotesUp {
		notes = 1
	}
	ch <- prometheus.MustNewConstMetric(descReplicaFull, prometheus.CounterValue, float64(s.FullServed), "replica")
	ch <- prometheus.MustNewConstMetric(descReplicaFull, prometheus.CounterValue, float64(s.FullRefused), "store")
	ch <- prometheus.MustNewConstMetric(descReplicaFullMis, prometheus.CounterValue, float64(s.FullMisses))
	ch <- prometheus.MustNewConstMetric(descReplicaNotes, prometheus.CounterValue, float64(s.Noted))
	ch <- prometheus.MustNewConstMetric(descReplicaNotesUp, prometheus.GaugeValue, notes)
}

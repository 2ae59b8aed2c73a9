package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presenced/presenced/internal/kafka"
)

var (
	descKafkaConsumed     = prometheus.NewDesc("presenced_kafka_ingest_consumed_total", "Records this node polled from the Kafka ingest topic.", nil, nil)
	descKafkaEvents       = prometheus.NewDesc("presenced_kafka_ingest_events_total", "Records of the Kafka ingest topic by outcome: applied (one tracker call per device and poll), coalesced (folded into a later event of the same device), skipped as stale, ignored (before a remembered disconnect), invalid, refused, given_up.", []string{"outcome"}, nil)
	descKafkaRetried      = prometheus.NewDesc("presenced_kafka_ingest_retried_total", "Tracker calls of Kafka ingest events that failed and are tried again (the partition waits, uncommitted).", nil, nil)
	descKafkaLag          = prometheus.NewDesc("presenced_kafka_ingest_lag", "Records of a partition this node owns not applied yet (the partition's end less the first record not applied).", []string{"topic", "partition"}, nil)
	descKafkaPartitions   = prometheus.NewDesc("presenced_kafka_ingest_partitions", "Partitions of the Kafka ingest topic this node owns in the consumer group.", nil, nil)
	descKafkaCommits      = prometheus.NewDesc("presenced_kafka_ingest_commits_total", "Offset commits of the Kafka ingest consumer that succeeded.", nil, nil)
	descKafkaCommitErrors = prometheus.NewDesc("presenced_kafka_ingest_commit_errors_total", "Offset commits that failed (tried again; the events were applied).", nil, nil)
	descKafkaFetchErrors  = prometheus.NewDesc("presenced_kafka_ingest_fetch_errors_total", "Fetches of the Kafka ingest consumer that failed (the client retries).", nil, nil)
	descKafkaHandOffs     = prometheus.NewDesc("presenced_kafka_ingest_handoffs_total", "Partitions that left this node whose devices it handed back to the store: done, or unfinished within the commit timeout (the rest follows when the store answers).", []string{"result"}, nil)

	descKafkaProduced = prometheus.NewDesc("presenced_kafka_changes_produced_total", "Changes the Kafka brokers acknowledged on the changes topic.", nil, nil)
	descKafkaQueued   = prometheus.NewDesc("presenced_kafka_changes_queued", "Changes waiting for the Kafka brokers.", nil, nil)
	descKafkaDropped  = prometheus.NewDesc("presenced_kafka_changes_dropped_total", "Changes dropped because the Kafka queue was full (brokers unreachable).", nil, nil)
	descKafkaFailed   = prometheus.NewDesc("presenced_kafka_changes_failed_total", "Changes the Kafka brokers refused for good, or still queued at shutdown.", nil, nil)
)

type kafkaCollector struct {
	ingest  func() kafka.ConsumerStats // nil without the Kafka ingest
	topic   string
	changes func() kafka.ProducerStats // nil without the Kafka changes
}

func (c *kafkaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKafkaConsumed, descKafkaEvents, descKafkaRetried, descKafkaLag, descKafkaPartitions, descKafkaCommits, descKafkaCommitErrors, descKafkaFetchErrors, descKafkaHandOffs,
		descKafkaProduced, descKafkaQueued, descKafkaDropped, descKafkaFailed} {
		ch <- d
	}
}

func (c *kafkaCollector) Collect(ch chan<- prometheus.Metric) {
	if c.ingest != nil {
		s := c.ingest()
		counter := func(d *prometheus.Desc, v uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
		}
		counter(descKafkaConsumed, s.Consumed)
		for outcome, n := range map[string]uint64{"applied": s.Applied, "coalesced": s.Coalesced, "stale": s.Stale, "ignored": s.Ignored,
			"invalid": s.Invalid, "refused": s.Refused, "given_up": s.GivenUp} {
			counter(descKafkaEvents, n, outcome)
		}
		counter(descKafkaRetried, s.Retried)
		counter(descKafkaCommits, s.Commits)
		counter(descKafkaCommitErrors, s.CommitErrors)
		counter(descKafkaFetchErrors, s.FetchErrors)
		counter(descKafkaHandOffs, s.HandOffs, "done")
		counter(descKafkaHandOffs, s.HandOffErrors, "unfinished")
		ch <- prometheus.MustNewConstMetric(descKafkaPartitions, prometheus.GaugeValue, float64(s.Partitions))
		for p, n := range s.Lag {
			ch <- prometheus.MustNewConstMetric(descKafkaLag, prometheus.GaugeValue, float64(n), c.topic, strconv.FormatInt(int64(p), 10))
		}
	}
	if c.changes != nil {
		s := c.changes()
		ch <- prometheus.MustNewConstMetric(descKafkaProduced, prometheus.CounterValue, float64(s.Produced))
		ch <- prometheus.MustNewConstMetric(descKafkaQueued, prometheus.GaugeValue, float64(s.Queued))
		ch <- prometheus.MustNewConstMetric(descKafkaDropped, prometheus.CounterValue, float64(s.Dropped))
		ch <- prometheus.MustNewConstMetric(descKafkaFailed, prometheus.CounterValue, float64(s.Failed))
	}
}

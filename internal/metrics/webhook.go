package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presenced/presenced/internal/webhook"
)

var (
	descHookQueued    = prometheus.NewDesc("presenced_webhook_queued", "Changes waiting to be sent to the webhook endpoints.", nil, nil)
	descHookDelivered = prometheus.NewDesc("presenced_webhook_delivered_total", "Changes an endpoint answered 2xx.", nil, nil)
	descHookRetried   = prometheus.NewDesc("presenced_webhook_retried_total", "Webhook requests sent again after a failure.", nil, nil)
	descHookDropped   = prometheus.NewDesc("presenced_webhook_dropped_total", "Changes lost before an endpoint took them: the outbox (or its queue) was full, or the stream no longer held them.", nil, nil)
	descHookRejected  = prometheus.NewDesc("presenced_webhook_rejected_total", "Changes an endpoint refused for good (4xx other than 408 and 429).", nil, nil)
	descHookUnconf    = prometheus.NewDesc("presenced_webhook_unconfirmed_total", "Changes acknowledged to a client before they were in the webhooks' durable log (NATS unreachable, a failing disk): a crash then would lose them.", nil, nil)
)

type webhookCollector struct{ stats func() webhook.Stats }

func (c *webhookCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHookQueued, descHookDelivered, descHookRetried, descHookDropped, descHookRejected, descHookUnconf} {
		ch <- d
	}
}

func (c *webhookCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(descHookQueued, prometheus.GaugeValue, float64(s.Queued))
	ch <- prometheus.MustNewConstMetric(descHookDelivered, prometheus.CounterValue, float64(s.Delivered))
	ch <- prometheus.MustNewConstMetric(descHookRetried, prometheus.CounterValue, float64(s.Retried))
	ch <- prometheus.MustNewConstMetric(descHookDropped, prometheus.CounterValue, float64(s.Dropped))
	ch <- prometheus.MustNewConstMetric(descHookRejected, prometheus.CounterValue, float64(s.Rejected))
	ch <- prometheus.MustNewConstMetric(descHookUnconf, prometheus.CounterValue, float64(s.Unconfirmed))
}

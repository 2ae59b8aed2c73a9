package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
)

var (
	descConns      = prometheus.NewDesc("presenced_ws_connections", "Open WebSocket connections.", nil, nil)
	descWSUsers    = prometheus.NewDesc("presenced_ws_users", "Users with at least one WebSocket open on this node (per node: a user connected to two nodes counts on both).", nil, nil)
	descAccepted   = prometheus.NewDesc("presenced_ws_accepted_total", "WebSocket upgrades accepted.", nil, nil)
	descClosed     = prometheus.NewDesc("presenced_ws_closed_total", "WebSocket connections closed by the server, by reason.", []string{"reason"}, nil)
	descRateLimit  = prometheus.NewDesc("presenced_ws_rate_limited_total", "Client messages refused with rate_limited.", nil, nil)
	descCoalesced  = prometheus.NewDesc("presenced_ws_coalesced_heartbeats_total", "Heartbeats read together with an identical one of the same socket and applied once (the server was behind).", nil, nil)
	descLoopReads  = prometheus.NewDesc("presenced_ws_loop_reads_total", "Reads of only heartbeats and pings that the epoll loop applied itself, waking no worker (an idle socket's traffic).", nil, nil)
	descUnchanged  = prometheus.NewDesc("presenced_ws_snapshot_unchanged_total", "Users a subscribe's snapshot left out because the client held their version (known, after a reconnect).", nil, nil)
	descSetupLimit = prometheus.NewDesc("presenced_ws_setup_limit", "Handshakes and subscribes this node admits at once now: it halves when the process wakes late (its CPU is short) and grows while it wakes on time.", nil, nil)
	descSetupWait  = prometheus.NewDesc("presenced_ws_setup_waiting", "Handshakes and subscribes waiting for their turn to be set up.", nil, nil)
	descSetupBusy  = prometheus.NewDesc("presenced_ws_setup_busy_total", "Handshakes and subscribes refused (unavailable) after waiting the longest allowed for their turn (internal/admission).", nil, nil)
	descSetupLate  = prometheus.NewDesc("presenced_ws_setup_late_wakeups_total", "Wake-ups of the setup gate's probe later than it allows (internal/admission), each of which halved the limit.", nil, nil)
	descSubs       = prometheus.NewDesc("presenced_fanout_subscriptions", "Subscriptions (watcher, user) on this node.", nil, nil)
	descTargets    = prometheus.NewDesc("presenced_fanout_watched_users", "Users watched by at least one connection on this node.", nil, nil)
	descDelivered  = prometheus.NewDesc("presenced_fanout_delivered_total", "Presence messages handed to connections.", nil, nil)
	descWithheld   = prometheus.NewDesc("presenced_fanout_withheld_total", "Deliveries withheld by the privacy filter.", nil, nil)
	descFrames     = prometheus.NewDesc("presenced_fanout_frames_total", "Distinct presence messages encoded (one per view per change).", nil, nil)
	descAsync      = prometheus.NewDesc("presenced_fanout_async_batches_total", "Batches of the path for users with very many watchers.", nil, nil)
	descAsyncQueue = prometheus.NewDesc("presenced_fanout_async_pending", "Users with a change waiting on the batched path.", nil, nil)
	descResynced   = prometheus.NewDesc("presenced_fanout_resynced_total", "Connections resynchronised (after a state store outage or a bus reconnection): each sent what changed of the users it watches.", nil, nil)
	descNotSent    = prometheus.NewDesc("presenced_fanout_not_sent_total", "Presence messages not sent to a connection, by reason: stale (it was sent that version of the user or a later one), unchanged (the same view as the last it was sent).", []string{"reason"}, nil)
	descOpen       = prometheus.NewDesc("presenced_connections", "Open client connections (HTTP and WebSocket) by state: pending (the node waits on its client to send a request: head, TLS handshake, or a body a handler reads), idle (keep-alive), other (a request in flight, or a WebSocket).", []string{"state"}, nil)
	descRefused    = prometheus.NewDesc("presenced_connections_refused_total", "Connections refused at a cap (overall or per source address).", nil, nil)
	descEvicted    = prometheus.NewDesc("presenced_connections_evicted_total", "Stalled pending or idle connections closed to make room for a new one.", nil, nil)
)

type edgeCollector struct {
	gw    func() gateway.Stats
	hub   func() fanout.Stats
	conns func() connbudget.Stats
}

func (c *edgeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConns, descWSUsers, descAccepted, descClosed, descRateLimit, descCoalesced, descLoopReads, descUnchanged, descSetupLimit, descSetupWait, descSetupBusy, descSetupLate, descSubs, descTargets, descDelivered, descWithheld, descFrames, descAsync, descAsyncQueue, descResynced, descNotSent, descOpen, descRefused, descEvicted} {
		ch <- d
	}
}

func (c *edgeCollector) Collect(ch chan<- prometheus.Metric) {
	if c.gw != nil {
		s := c.gw()
		ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(s.Connections))
		ch <- prometheus.MustNewConstMetric(descWSUsers, prometheus.GaugeValue, float64(s.Users))
		ch <- prometheus.MustNewConstMetric(descAccepted, prometheus.CounterValue, float64(s.Accepted))
		for reason, n := range map[string]uint64{"idle": s.ClosedIdle, "slow_consumer": s.ClosedSlow, "rate": s.ClosedRate, "too_big": s.ClosedTooBig, "token_expired": s.ClosedExpired} {
			ch <- prometheus.MustNewConstMetric(descClosed, prometheus.CounterValue, float64(n), reason)
		}
		ch <- prometheus.MustNewConstMetric(descRateLimit, prometheus.CounterValue, float64(s.RateLimited))
		ch <- prometheus.MustNewConstMetric(descCoalesced, prometheus.CounterValue, float64(s.CoalescedBeats))
		ch <- prometheus.MustNewConstMetric(descLoopReads, prometheus.CounterValue, float64(s.LoopReads))
		ch <- prometheus.MustNewConstMetric(descUnchanged, prometheus.CounterValue, float64(s.Unchanged))
		ch <- prometheus.MustNewConstMetric(descSetupLimit, prometheus.GaugeValue, float64(s.Setup.Limit))
		ch <- prometheus.MustNewConstMetric(descSetupWait, prometheus.GaugeValue, float64(s.Setup.Waiting))
		ch <- prometheus.MustNewConstMetric(descSetupBusy, prometheus.CounterValue, float64(s.Setup.Busy))
		ch <- prometheus.MustNewConstMetric(descSetupLate, prometheus.CounterValue, float64(s.Setup.Late))
	}
	if c.conns != nil {
		s := c.conns()
		ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(s.Pending), "pending")
		ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(s.Idle), "idle")
		ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(s.Open-s.Pending-s.Idle), "other")
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(s.Refused))
		ch <- prometheus.MustNewConstMetric(descEvicted, prometheus.CounterValue, float64(s.Evicted))
	}
	if c.hub != nil {
		s := c.hub()
		ch <- prometheus.MustNewConstMetric(descSubs, prometheus.GaugeValue, float64(s.Subscriptions))
		ch <- prometheus.MustNewConstMetric(descTargets, prometheus.GaugeValue, float64(s.Targets))
		ch <- prometheus.MustNewConstMetric(descDelivered, prometheus.CounterValue, float64(s.Delivered))
		ch <- prometheus.MustNewConstMetric(descWithheld, prometheus.CounterValue, float64(s.SkippedPrivacy))
		ch <- prometheus.MustNewConstMetric(descFrames, prometheus.CounterValue, float64(s.Frames))
		ch <- prometheus.MustNewConstMetric(descAsync, prometheus.CounterValue, float64(s.AsyncBatches))
		ch <- prometheus.MustNewConstMetric(descAsyncQueue, prometheus.GaugeValue, float64(s.AsyncPending))
		ch <- prometheus.MustNewConstMetric(descResynced, prometheus.CounterValue, float64(s.Resynced))
		ch <- prometheus.MustNewConstMetric(descNotSent, prometheus.CounterValue, float64(s.Stale), "stale")
		ch <- prometheus.MustNewConstMetric(descNotSent, prometheus.CounterValue, float64(s.Unchanged), "unchanged")
	}
}

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/ingestroute"
	"github.com/presenced/presenced/internal/natsbus"
	"github.com/presenced/presenced/internal/peers"
	"github.com/presenced/presenced/internal/tracker"
)

// The scale-out series: the state store's outages and the users waiting
// for the durable store (docs/operations.md), the NATS bus and the ingest
// consumer.
var (
	descStoreDown     = prometheus.NewDesc("presenced_store_down", "1 while the state store (Redis) is considered down and writes are buffered.", nil, nil)
	descOutages       = prometheus.NewDesc("presenced_store_outages_total", "Times the state store was found down.", nil, nil)
	descBuffered      = prometheus.NewDesc("presenced_store_buffered_users", "Users with operations buffered while the state store is down.", nil, nil)
	descReplayed      = prometheus.NewDesc("presenced_store_replayed_total", "Buffered operations replayed when the state store came back.", nil, nil)
	descStaleReplays  = prometheus.NewDesc("presenced_store_stale_replays_total", "Replayed users whose last change was over by the replay (not announced; the sweep settles them).", nil, nil)
	descStoreResets   = prometheus.NewDesc("presenced_store_resets_total", "Times the state store was found to have lost its data (versions moved to a new epoch, watchers resynced).", nil, nil)
	descPartsDown     = prometheus.NewDesc("presenced_store_parts_down", "Parts of the state store (a Redis Cluster's shards) this node finds down now: their users' writes are buffered, the others' go on.", nil, nil)
	descPartOutages   = prometheus.NewDesc("presenced_store_part_outages_total", "Times a part of the state store (a shard of a Redis Cluster whose master did not answer) was found down.", nil, nil)
	descDegradedReads = prometheus.NewDesc("presenced_degraded_reads_total", "Reads answered from the durable store and this node's buffer while the state store was down.", nil, nil)
	descAwaiting      = prometheus.NewDesc("presenced_awaiting_profile_users", "Users whose heartbeats this node holds because their durable profile cannot be read (the durable store is down).", nil, nil)
	descProfiles      = prometheus.NewDesc("presenced_awaiting_profile_loaded_total", "Users whose held heartbeats were applied once their durable profile could be read.", nil, nil)
	descOwned         = prometheus.NewDesc("presenced_owned_devices", "Devices this node owns (its sockets', and the ingest's of the partitions it owns) and whose liveness it keeps (the state store holds them alive under this node's lease).", nil, nil)
	descLeaseLosses   = prometheus.NewDesc("presenced_lease_losses_total", "Times this node found its lease taken over or lost and claimed its devices again.", nil, nil)
	descTakeovers     = prometheus.NewDesc("presenced_lease_takeovers_total", "Leases of other nodes that ran out and this node took over.", nil, nil)
	descPeerSigns     = prometheus.NewDesc("presenced_peer_signs_total", "Signs of devices (beats, byes) other nodes gave this node's degraded reads.", nil, nil)
	descPeerSnapshots = prometheus.NewDesc("presenced_peer_snapshots_total", "Users other nodes read in the state store for this node's degraded reads (this node cut off from it).", nil, nil)
	descPeerAskErrors = prometheus.NewDesc("presenced_peer_ask_errors_total", "Degraded reads that could not ask the other nodes (NATS unreachable).", nil, nil)

	descPeerAsked    = prometheus.NewDesc("presenced_peer_questions_total", "Questions (of up to 100 users) this node asked the other nodes for degraded reads.", nil, nil)
	descPeerAnswered = prometheus.NewDesc("presenced_peer_answers_total", "Questions of other nodes this node answered.", nil, nil)
	descPeerTimeouts = prometheus.NewDesc("presenced_peer_timeouts_total", "Questions that ended before every live node answered (the read went on without the silent ones).", nil, nil)
	descPeerBad      = prometheus.NewDesc("presenced_peer_malformed_total", "Questions or answers of other nodes that could not be decoded (dropped).", nil, nil)
	descPeerLate     = prometheus.NewDesc("presenced_peer_late_total", "Questions of other nodes not answered: this node was too far behind to answer them in time (overloaded).", nil, nil)

	descBusPublished = prometheus.NewDesc("presenced_bus_published_total", "Changes published to NATS (presence.changes), retries included.", nil, nil)
	descBusAcked     = prometheus.NewDesc("presenced_bus_acked_total", "Changes acknowledged by the JetStream stream.", nil, nil)
	descBusRetried   = prometheus.NewDesc("presenced_bus_retried_total", "Publishes sent again after a failure or a missing ack.", nil, nil)
	descBusDropped   = prometheus.NewDesc("presenced_bus_dropped_total", "Changes dropped because the outgoing queue was full.", nil, nil)
	descBusQueued    = prometheus.NewDesc("presenced_bus_queued", "Changes waiting to be published.", nil, nil)
	descBusInFlight  = prometheus.NewDesc("presenced_bus_in_flight", "Changes published and awaiting the stream's ack, or failed and awaiting a retry.", nil, nil)
	descBusMissing   = prometheus.NewDesc("presenced_bus_stream_missing", "1 while this node finds the changes stream (PRESENCE_CHANGES) missing and cannot create it again: its changes wait, readers of the stream get none of them.", nil, nil)
	descBusRecreated = prometheus.NewDesc("presenced_bus_stream_recreated_total", "Times this node found the changes stream missing (NATS lost its store, or it was deleted) and created it again; what it held before is lost.", nil, nil)
	descBusUnacked   = prometheus.NewDesc("presenced_bus_unacked_seconds", "How long the changes stream has acknowledged none of this node's changes while some wait (0: none waits, or the stream keeps up).", nil, nil)
	descBusReceived  = prometheus.NewDesc("presenced_bus_received_total", "Changes of other nodes received for this node's watchers.", nil, nil)
	descBusSubs      = prometheus.NewDesc("presenced_bus_subscriptions", "Users this node subscribes to on NATS (watched here).", nil, nil)
	descBusSlow      = prometheus.NewDesc("presenced_bus_slow_consumer_total", "Incoming changes NATS dropped because this node fell behind.", nil, nil)

	descIngest       = prometheus.NewDesc("presenced_ingest_events_total", "Session events of the ingest stream, by outcome.", []string{"outcome"}, nil)
	descIngestRouted = prometheus.NewDesc("presenced_ingest_routed_total", "Session events of the ingest stream by where they were applied: local (this node owns their partition), forwarded (to the owner, which answered), received (forwarded here), fallback (no owner known, or it did not answer: applied here, unowned).", []string{"how"}, nil)
	descIngestOwned  = prometheus.NewDesc("presenced_ingest_partitions", "Partitions of the ingest's users this node owns (their devices are this node's, as its sockets' are).", nil, nil)
	descIngestSkips  = prometheus.NewDesc("presenced_ingest_route_skips_total", "Forwarded ingest events this node answered busy (every worker taken: the sender applies a beat itself), and events it did not forward to an owner that failed to answer within the last 5 s (applied here, or a disconnect delivered again).", []string{"reason"}, nil)
	descIngestMoved  = prometheus.NewDesc("presenced_ingest_handoffs_total", "Ingest partitions that left this node, their devices handed back to the store.", nil, nil)
)

type scaleOutCollector struct {
	tracker func() tracker.Stats
	bus     func() natsbus.Stats
	ingest  func() ingest.Stats
	route   func() ingestroute.Stats
	peers   func() peers.Stats
}

func (c *scaleOutCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStoreDown, descOutages, descBuffered, descReplayed, descStaleReplays, descStoreResets, descPartsDown, descPartOutages, descDegradedReads, descAwaiting, descProfiles,
		descOwned, descLeaseLosses, descTakeovers, descPeerSigns, descPeerSnapshots, descPeerAskErrors, descPeerAsked, descPeerAnswered, descPeerTimeouts, descPeerBad, descPeerLate, descBusPublished, descBusAcked, descBusRetried, descBusDropped, descBusQueued, descBusInFlight, descBusMissing, descBusRecreated, descBusUnacked, descBusReceived, descBusSubs, descBusSlow, descIngest, descIngestRouted, descIngestOwned, descIngestSkips, descIngestMoved} {
		ch <- d
	}
}

func (c *scaleOutCollector) Collect(ch chan<- prometheus.Metric) {
	if c.tracker != nil {
		s := c.tracker()
		down := 0.0
		if s.Down {
			down = 1
		}
		ch <- prometheus.MustNewConstMetric(descStoreDown, prometheus.GaugeValue, down)
		ch <- prometheus.MustNewConstMetric(descOutages, prometheus.CounterValue, float64(s.Outages))
		ch <- prometheus.MustNewConstMetric(descBuffered, prometheus.GaugeValue, float64(s.Buffered))
		ch <- prometheus.MustNewConstMetric(descReplayed, prometheus.CounterValue, float64(s.Replayed))
		ch <- prometheus.MustNewConstMetric(descStaleReplays, prometheus.CounterValue, float64(s.StaleReplays))
		ch <- prometheus.MustNewConstMetric(descStoreResets, prometheus.CounterValue, float64(s.StoreResets))
		ch <- prometheus.MustNewConstMetric(descPartsDown, prometheus.GaugeValue, float64(s.PartsDown))
		ch <- prometheus.MustNewConstMetric(descPartOutages, prometheus.CounterValue, float64(s.PartOutages))
		ch <- prometheus.MustNewConstMetric(descDegradedReads, prometheus.CounterValue, float64(s.DegradedReads))
		ch <- prometheus.MustNewConstMetric(descAwaiting, prometheus.GaugeValue, float64(s.AwaitingProfile))
		ch <- prometheus.MustNewConstMetric(descProfiles, prometheus.CounterValue, float64(s.ProfilesLoaded))
		ch <- prometheus.MustNewConstMetric(descOwned, prometheus.GaugeValue, float64(s.OwnedDevices))
		ch <- prometheus.MustNewConstMetric(descLeaseLosses, prometheus.CounterValue, float64(s.LeaseLosses))
		ch <- prometheus.MustNewConstMetric(descTakeovers, prometheus.CounterValue, float64(s.LeaseTakeovers))
		ch <- prometheus.MustNewConstMetric(descPeerSigns, prometheus.CounterValue, float64(s.PeerSigns))
		ch <- prometheus.MustNewConstMetric(descPeerSnapshots, prometheus.CounterValue, float64(s.PeerSnapshots))
		ch <- prometheus.MustNewConstMetric(descPeerAskErrors, prometheus.CounterValue, float64(s.PeerAskErrors))
	}
	if c.peers != nil {
		s := c.peers()
		ch <- prometheus.MustNewConstMetric(descPeerAsked, prometheus.CounterValue, float64(s.Asked))
		ch <- prometheus.MustNewConstMetric(descPeerAnswered, prometheus.CounterValue, float64(s.Answered))
		ch <- prometheus.MustNewConstMetric(descPeerTimeouts, prometheus.CounterValue, float64(s.Timeouts))
		ch <- prometheus.MustNewConstMetric(descPeerBad, prometheus.CounterValue, float64(s.Bad))
		ch <- prometheus.MustNewConstMetric(descPeerLate, prometheus.CounterValue, float64(s.Late))
	}
	if c.bus != nil {
		s := c.bus()
		ch <- prometheus.MustNewConstMetric(descBusPublished, prometheus.CounterValue, float64(s.Published))
		ch <- prometheus.MustNewConstMetric(descBusAcked, prometheus.CounterValue, float64(s.Acked))
		ch <- prometheus.MustNewConstMetric(descBusRetried, prometheus.CounterValue, float64(s.Retried))
		ch <- prometheus.MustNewConstMetric(descBusDropped, prometheus.CounterValue, float64(s.Dropped))
		ch <- prometheus.MustNewConstMetric(descBusQueued, prometheus.GaugeValue, float64(s.Queued))
		ch <- prometheus.MustNewConstMetric(descBusInFlight, prometheus.GaugeValue, float64(s.InFlight))
		missing := 0.0
		if s.StreamMissing {
			missing = 1
		}
		ch <- prometheus.MustNewConstMetric(descBusMissing, prometheus.GaugeValue, missing)
		ch <- prometheus.MustNewConstMetric(descBusRecreated, prometheus.CounterValue, float64(s.StreamRecreated))
		ch <- prometheus.MustNewConstMetric(descBusUnacked, prometheus.GaugeValue, s.Unacked.Seconds())
		ch <- prometheus.MustNewConstMetric(descBusReceived, prometheus.CounterValue, float64(s.Received))
		ch <- prometheus.MustNewConstMetric(descBusSubs, prometheus.GaugeValue, float64(s.Subscriptions))
		ch <- prometheus.MustNewConstMetric(descBusSlow, prometheus.CounterValue, float64(s.SlowConsumer))
	}
	if c.ingest != nil {
		s := c.ingest()
		for outcome, n := range map[string]uint64{"applied": s.Applied, "stale": s.Stale, "ignored": s.Ignored, "invalid": s.Invalid,
			"refused": s.Refused, "retried": s.Retried, "given_up": s.GivenUp} {
			ch <- prometheus.MustNewConstMetric(descIngest, prometheus.CounterValue, float64(n), outcome)
		}
	}
	if c.route != nil {
		s := c.route()
		for how, n := range map[string]uint64{"local": s.Local, "forwarded": s.Forwarded, "received": s.Received, "fallback": s.Fallback} {
			ch <- prometheus.MustNewConstMetric(descIngestRouted, prometheus.CounterValue, float64(n), how)
		}
		ch <- prometheus.MustNewConstMetric(descIngestOwned, prometheus.GaugeValue, float64(s.Owned))
		ch <- prometheus.MustNewConstMetric(descIngestSkips, prometheus.CounterValue, float64(s.Busy), "busy")
		ch <- prometheus.MustNewConstMetric(descIngestSkips, prometheus.CounterValue, float64(s.Skipped), "suspect")
		ch <- prometheus.MustNewConstMetric(descIngestMoved, prometheus.CounterValue, float64(s.HandOffs))
	}
}

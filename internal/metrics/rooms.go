package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/tracker"
)

var (
	descRoomEvents  = prometheus.NewDesc("presenced_room_events_total", "Joins and leaves of rooms this node made (its tracker published).", nil, nil)
	descRoomsWatch  = prometheus.NewDesc("presenced_rooms_watched", "Rooms watched by at least one connection on this node.", nil, nil)
	descRoomWatches = prometheus.NewDesc("presenced_rooms_watchers", "Watches of rooms (connection, room) on this node.", nil, nil)
	descRoomFrames  = prometheus.NewDesc("presenced_rooms_delivered_total", "Room messages handed to connections (snapshots, joins, leaves, members' statuses).", nil, nil)
	descRoomGaps    = prometheus.NewDesc("presenced_rooms_gaps_total", "Room events that came ahead of a missing earlier one and were held back.", nil, nil)
	descRoomResyncs = prometheus.NewDesc("presenced_rooms_resyncs_total", "Rooms whose watchers were sent a fresh snapshot (an event missing for the gap wait, or the queue overflowed).", nil, nil)
	descRoomDropped = prometheus.NewDesc("presenced_rooms_dropped_total", "Room events lost to a full queue of the room hub (every watched room was resynced).", nil, nil)
	descRoomRereads = prometheus.NewDesc("presenced_rooms_member_reads_total", "Members of watched rooms read again once their changes reached the room hub, so a change made just before is not missed.", nil, nil)
	descRoomRereadE = prometheus.NewDesc("presenced_rooms_member_read_errors_total", "Reads of members again that failed (retried a second later).", nil, nil)
)

// roomCollector exports the tracker's room events and the room hub's
// counters.
type roomCollector struct {
	tracker func() tracker.Stats
	hub     func() fanout.RoomStats
}

func (c *roomCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRoomEvents, descRoomsWatch, descRoomWatches, descRoomFrames, descRoomGaps, descRoomResyncs, descRoomDropped, descRoomRereads, descRoomRereadE} {
		ch <- d
	}
}

func (c *roomCollector) Collect(ch chan<- prometheus.Metric) {
	if c.tracker != nil {
		ch <- prometheus.MustNewConstMetric(descRoomEvents, prometheus.CounterValue, float64(c.tracker().RoomEvents))
	}
	if c.hub != nil {
		s := c.hub()
		ch <- prometheus.MustNewConstMetric(descRoomsWatch, prometheus.GaugeValue, float64(s.Rooms))
		ch <- prometheus.MustNewConstMetric(descRoomWatches, prometheus.GaugeValue, float64(s.Watchers))
		ch <- prometheus.MustNewConstMetric(descRoomFrames, prometheus.CounterValue, float64(s.Delivered))
		ch <- prometheus.MustNewConstMetric(descRoomGaps, prometheus.CounterValue, float64(s.Gaps))
		ch <- prometheus.MustNewConstMetric(descRoomResyncs, prometheus.CounterValue, float64(s.Resyncs))
		ch <- prometheus.MustNewConstMetric(descRoomDropped, prometheus.CounterValue, float64(s.Dropped))
		ch <- prometheus.MustNewConstMetric(descRoomRereads, prometheus.CounterValue, float64(s.MemberReads))
		ch <- prometheus.MustNewConstMetric(descRoomRereadE, prometheus.CounterValue, float64(s.MemberReadErrors))
	}
}

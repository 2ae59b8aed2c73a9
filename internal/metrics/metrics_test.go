package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/buildinfo"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/natsbus"
	"github.com/presenced/presenced/internal/tracker"
)

// TestBuildInfo: /metrics carries presenced_build_info with the labels of
// the build information -version prints.
func TestBuildInfo(t *testing.T) {
	r := New(Sources{})
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	in := buildinfo.Read()
	want := `presenced_build_info{go="` + in.Go + `",revision="` + in.Revision + `",version="` + in.Version + `"} 1`
	if !strings.Contains(rec.Body.String(), want+"\n") {
		t.Fatalf("no %s in\n%s", want, rec.Body.String())
	}
}

// TestBackendCalls: a backend call recorded by internal/backendcall is a
// presenced_backend_call_duration_seconds series at the next scrape.
func TestBackendCalls(t *testing.T) {
	r := New(Sources{})
	scrape := func() string {
		rec := httptest.NewRecorder()
		r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	series := `presenced_backend_call_duration_seconds_count{backend="metricstest",op="probe"}`
	if body := scrape(); strings.Contains(body, series) {
		t.Fatalf("%s before any call", series)
	}
	op := backendcall.New("metricstest", "probe")
	op.Observe(300 * time.Microsecond)
	op.Observe(2 * time.Millisecond)
	body := scrape()
	for _, want := range []string{
		series + " 2\n",
		`presenced_backend_call_duration_seconds_bucket{backend="metricstest",op="probe",le="0.0005"} 1` + "\n",
		`presenced_backend_call_duration_seconds_bucket{backend="metricstest",op="probe",le="0.0025"} 2` + "\n",
		`presenced_backend_call_duration_seconds_bucket{backend="metricstest",op="probe",le="+Inf"} 2` + "\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in /metrics", want)
		}
	}
}

// TestBusStream: what the bus knows of the changes stream is on /metrics:
// missing now, re-created, how long changes have waited for an ack, and
// the publishes awaiting one.
func TestBusStream(t *testing.T) {
	st := natsbus.Stats{InFlight: 7, StreamMissing: true, StreamRecreated: 2, Unacked: 1500 * time.Millisecond}
	r := New(Sources{Tracker: func() tracker.Stats { return tracker.Stats{} }, Bus: func() natsbus.Stats { return st }})
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		"presenced_bus_in_flight 7\n",
		"presenced_bus_stream_missing 1\n",
		"presenced_bus_stream_recreated_total 2\n",
		"presenced_bus_unacked_seconds 1.5\n",
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("no %q in /metrics", want)
		}
	}
}

// TestRooms: the tracker's room events and the room hub's counters are
// on /metrics.
func TestRooms(t *testing.T) {
	r := New(Sources{
		Tracker: func() tracker.Stats { return tracker.Stats{RoomEvents: 7} },
		Rooms: func() fanout.RoomStats {
			return fanout.RoomStats{Rooms: 2, Watchers: 5, Delivered: 40, Gaps: 3, Resyncs: 1, Dropped: 0, MemberReads: 9, MemberReadErrors: 1}
		},
	})
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		"presenced_room_events_total 7\n", "presenced_rooms_watched 2\n", "presenced_rooms_watchers 5\n",
		"presenced_rooms_delivered_total 40\n", "presenced_rooms_gaps_total 3\n", "presenced_rooms_resyncs_total 1\n",
		"presenced_rooms_dropped_total 0\n", "presenced_rooms_member_reads_total 9\n", "presenced_rooms_member_read_errors_total 1\n",
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("no %q in /metrics", want)
		}
	}
}

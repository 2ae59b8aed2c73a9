package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
)

// startIntervalNode is an embedded node whose rooms above 10 members are
// in interval mode, with an interval of 300 ms.
func startIntervalNode(t *testing.T) string {
	t.Helper()
	return startNodeWith(t, app.Config{RoomIntervalAbove: 10, RoomInterval: 300 * time.Millisecond})
}

func TestRoomIntervalInProcess(t *testing.T) {
	url := startIntervalNode(t)
	// 40 members and 2 of 4 movers: 42, above 10. The 4 movers move 20
	// times a second in all, each every 200 ms: some join and leave
	// within one interval, and cancel out.
	var r roomIntervalResult
	runJSON(t, &r, "room-interval", "-url", url, "-dev", "-api-key", testAPIKey, "-members", "40", "-movers", "4",
		"-watchers", "5", "-rate", "20", "-room-interval", "300ms", "-duration", "2s", "-unwatched", "1s", "-seed-concurrency", "8")
	if r.Mode != "interval" || r.Seeded != 40 {
		t.Errorf("mode %q, seeded %d", r.Mode, r.Seeded)
	}
	if r.Errors != 0 || r.WatcherDrops != 0 || r.Watched.Errors != 0 {
		t.Errorf("errors %d (%s), drops %d", r.Errors, r.FirstError, r.WatcherDrops)
	}
	if p := r.Watched; p.Sent < 10 || p.Joins+p.Leaves != p.Sent || p.ServerCores <= 0 || p.CPUPerChangeUs <= 0 {
		t.Errorf("watched drive: %+v", p)
	}
	if r.Unwatched == nil || r.Unwatched.Sent < 5 {
		t.Fatalf("unwatched drive: %+v", r.Unwatched)
	}
	m := r.Messages
	if m.RoomInterval == 0 || m.RoomChange != 0 || m.Resyncs != 0 {
		t.Errorf("a big room's watchers read %d room_interval, %d room_change, %d room messages", m.RoomInterval, m.RoomChange, m.Resyncs)
	}
	// What the watchers were told adds up to what was sent: the net is
	// the movers' change, every change is told or cancelled in pairs.
	if m.NetBad != 0 || m.CountBad != 0 || !m.IDsChecked || m.IDErrors != 0 {
		t.Errorf("net %+d: %d watchers told another, %d another count; ids checked %v, %d errors", m.NetWant, m.NetBad, m.CountBad, m.IDsChecked, m.IDErrors)
	}
	if m.Reported+2*m.CancelledPairs != r.Watched.Sent || m.CancelledPairs < 0 {
		t.Errorf("%d told and %d pairs cancelled of %d sent", m.Reported, m.CancelledPairs, r.Watched.Sent)
	}
	if m.MaxPerInterval < 1 || m.MeanPerIntvl <= 0 || m.AfterUnwatch != 0 {
		t.Errorf("per interval: max %d, mean %v; %d after unwatching", m.MaxPerInterval, m.MeanPerIntvl, m.AfterUnwatch)
	}
	if r.FinalCount != r.WantCount || r.WantCount < 40 || r.WantCount > 44 {
		t.Errorf("final count %d, want %d (40 members and up to 4 movers)", r.FinalCount, r.WantCount)
	}

	// The same node, a room below the threshold: events, each told.
	var e roomIntervalResult
	runJSON(t, &e, "room-interval", "-url", url, "-dev", "-api-key", testAPIKey, "-members", "0", "-movers", "4",
		"-watchers", "3", "-rate", "20", "-room-interval", "300ms", "-duration", "1500ms", "-unwatched", "0", "-mode", "events")
	em := e.Messages
	if e.Errors != 0 || e.Unwatched != nil || em.RoomInterval != 0 || em.RoomChange != 3*e.Watched.Sent || em.Reported != e.Watched.Sent || em.CancelledPairs != 0 {
		t.Errorf("events: errors %d (%s), unwatched %v, messages %+v of %d sent", e.Errors, e.FirstError, e.Unwatched, em, e.Watched.Sent)
	}
	if em.NetBad != 0 || em.CountBad != 0 || em.IDErrors != 0 || e.FinalCount != e.WantCount {
		t.Errorf("events: %+v, final count %d, want %d", em, e.FinalCount, e.WantCount)
	}

	// A big room where an events one is wanted fails before the drive.
	var out, errb strings.Builder
	if code := run([]string{"room-interval", "-url", url, "-dev", "-api-key", testAPIKey, "-members", "20", "-movers", "2",
		"-watchers", "1", "-rate", "5", "-duration", "1s", "-mode", "events"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), `mode "interval"`) {
		t.Errorf("a big room taken for a small one: exit %d\n%s", code, errb.String())
	}
}

func TestRiCount(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Two watchers, interval 1 s, a drive of 3 s from t0 read until 4 s.
	// The first reads a tick at 0.6, 1.7 (late), 2.5 s; the second two
	// messages in the window of its second tick.
	a := &riWatcher{msgs: []riMsg{
		{at: at(600), kind: 'i', net: 2, reported: 4, count: 12},
		{at: at(1700), kind: 'i', net: -1, reported: 1, count: 11},
		{at: at(2500), kind: 'i', net: 0, reported: 2, count: 11},
		{at: at(5000), kind: 'i', net: 1, reported: 1, count: 12}, // after the end
	}}
	b := &riWatcher{msgs: []riMsg{
		{at: at(600), kind: 'i', net: 2, reported: 4, count: 12},
		{at: at(1500), kind: 'r', count: 11},
		{at: at(1700), kind: 'i', net: -1, reported: 1, count: 11, more: true},
	}, idErrors: 3}
	s := riCount([]*riWatcher{a, b}, time.Second, t0, at(4000), riPhase{Seconds: 3, Sent: 9}, 1, 11)
	if s.Intervals != 4 || s.RoomInterval != 5 || s.Resyncs != 1 || s.AfterUnwatch != 1 {
		t.Errorf("counts: %+v", s)
	}
	if s.MaxPerInterval != 2 {
		t.Errorf("max per interval %d, want 2 (the second watcher's room and room_interval at 1.5 and 1.7 s)", s.MaxPerInterval)
	}
	// 3 messages in windows 0–2, and 3 in windows 0–1.
	if want := (3.0/3 + 3.0/2) / 2; s.MeanPerIntvl != want {
		t.Errorf("mean per interval %v, want %v", s.MeanPerIntvl, want)
	}
	// The first watcher was told a net of +1 and 7 changes of 9 (one
	// pair cancelled), the second a net of +1 as well.
	if s.Reported != 7 || s.CancelledPairs != 1 || s.NetBad != 0 || s.CountBad != 0 {
		t.Errorf("told: %+v", s)
	}
	if s.IDsChecked || s.IDErrors != 0 || s.WithMore != 1 || s.MaxTold != 4 {
		t.Errorf("ids counted only in more_: checked %v, %d errors, %d such messages, at most %d told in one", s.IDsChecked, s.IDErrors, s.WithMore, s.MaxTold)
	}
	s = riCount([]*riWatcher{a}, time.Second, t0, at(4000), riPhase{Seconds: 3, Sent: 9}, 2, 12)
	if s.NetBad != 1 || s.CountBad != 1 || !s.IDsChecked {
		t.Errorf("a net of +1 taken for +2: %+v", s)
	}
}

func TestRiWatcherIDs(t *testing.T) {
	w := &riWatcher{in: map[string]bool{}}
	now := time.Now()
	w.record(&wsMsg{Type: "room_interval", Joined: []string{"a", "b"}, Count: 3, Version: 4}, now)
	w.record(&wsMsg{Type: "room_interval", Joined: []string{"c"}, Left: []string{"a"}, Count: 3, Version: 6}, now)
	if w.idErrors != 0 || w.version.Load() != 6 {
		t.Fatalf("consistent joins and leaves: %d errors, version %d", w.idErrors, w.version.Load())
	}
	w.record(&wsMsg{Type: "room_interval", Joined: []string{"b"}, Left: []string{"a"}, Count: 3, Version: 7}, now)
	if w.idErrors != 2 {
		t.Errorf("b joined twice and a left twice: %d errors, want 2", w.idErrors)
	}
	w.record(&wsMsg{Type: "room_change", Event: "status", UserID: "b"}, now)
	w.record(&wsMsg{Type: "presence"}, now)
	if len(w.msgs) != 3 {
		t.Errorf("a status change and a presence message were kept: %d messages", len(w.msgs))
	}
	w.record(&wsMsg{Type: "room_interval", MoreLeft: 2, Count: 1, Version: 9}, now)
	if m := w.msgs[3]; m.net != -2 || m.reported != 2 || !m.more {
		t.Errorf("more_left 2: %+v", m)
	}
}

func TestParseRoomIntervalFlags(t *testing.T) {
	t.Setenv(jwtSecretEnv, "")
	bad := [][]string{
		{"room-interval", "-api-key", "k"},                          // ws without -dev
		{"room-interval", "-dev", "-movers", "5", "-rate", "100"},   // each mover every 50 ms
		{"room-interval", "-dev", "-watchers", "0"},                 // no watchers
		{"room-interval", "-dev", "-mode", "batch"},                 // no such mode
		{"room-interval", "-dev", "-room-interval", "10ms"},         // not the server's
		{"room-interval", "-dev", "-members", "-1"},                 // negative
		{"room-interval", "-dev", "-unwatched", "20m"},              // too long
		{"room-interval", "-dev", "-url", "ws://192.168.1.1:18090"}, // not loopback
	}
	for _, args := range bad {
		if code := run(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	c, err := parseRoomInterval([]string{"-dev", "-duration", "40s"}, io.Discard)
	if err != nil || c.members != 100_000 || c.watchers != 500 || c.rate != 100 || c.unwatched != 40*time.Second || c.interval != 5*time.Second {
		t.Errorf("defaults: %+v %v", c, err)
	}
	if code := run([]string{"room-interval", "-h"}, io.Discard, io.Discard); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}

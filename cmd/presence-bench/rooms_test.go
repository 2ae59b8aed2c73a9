package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runJSONShort is runJSON for a run too short for a line of progress.
func runJSONShort(t *testing.T, v any, args ...string) {
	t.Helper()
	var out, errb bytes.Buffer
	args = append(args, "-json", "-server-pid", strconv.Itoa(os.Getpid()))
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("%q: exit %d\n%s", args, code, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		t.Fatalf("%q: %v\n%s", args, err, out.String())
	}
}

func TestRoomsInProcess(t *testing.T) {
	url := startNode(t, 0)
	var r roomsResult
	runJSON(t, &r, "rooms", "-url", url, "-dev", "-api-key", testAPIKey, "-watchers", "20", "-movers", "2",
		"-interval", "200ms", "-duration", "2s")
	if r.StatusUsers != 10 {
		t.Errorf("status users %d, want 10: 2 movers every 200ms make 10 events a second, one change a second each", r.StatusUsers)
	}
	if r.Errors != 0 || r.RateLimited != 0 || r.WatcherDrops != 0 {
		t.Errorf("errors %d (%s), rate limited %d, drops %d", r.Errors, r.FirstError, r.RateLimited, r.WatcherDrops)
	}
	for name, s := range map[string]roomsSide{"room": r.RoomChanges, "status": r.StatusChange} {
		if s.Sent < 2 || s.Confirmed < 1 || s.Confirmed > s.Sent {
			t.Errorf("%s: sent %d, confirmed %d", name, s.Sent, s.Confirmed)
		}
		if s.Expected != int64(s.Confirmed)*20 || s.Deliveries+s.Missing != s.Expected {
			t.Errorf("%s: expected %d, deliveries %d, missing %d", name, s.Expected, s.Deliveries, s.Missing)
		}
		if l := s.Latency; l.Samples != int(s.Deliveries) || l.Max <= 0 || l.P50 > l.P99 || l.P99 > l.Max {
			t.Errorf("%s latency: %+v", name, l)
		}
	}
	// Every join and leave is a room event of its own, never coalesced:
	// every one the movers sent reaches every watcher.
	if c := r.RoomChanges; c.Confirmed != c.Sent || c.Missing != 0 || c.Resyncs != 0 {
		t.Errorf("room: %d of %d sends confirmed, %d deliveries missing, %d resyncs", c.Confirmed, c.Sent, c.Missing, c.Resyncs)
	}
	if r.GeneratorCores <= 0 || r.Skipped < 0 {
		t.Errorf("generator CPU %v, skipped %d", r.GeneratorCores, r.Skipped)
	}
	if r.RatioP99 <= 0 {
		t.Errorf("ratio %v", r.RatioP99)
	}
}

func TestRoomCountInProcess(t *testing.T) {
	url := "http" + strings.TrimPrefix(startNode(t, 0), "ws")
	var r roomCountResult
	// 2 s a phase: a phase of 1 s may end before its first progress line.
	runJSON(t, &r, "room-count", "-url", url, "-api-key", testAPIKey, "-members", "300", "-seed-concurrency", "8",
		"-concurrency", "2", "-duration", "2s")
	if r.Seeded != 300 || r.SeedErrors != 0 {
		t.Errorf("seeded %d, %d errors", r.Seeded, r.SeedErrors)
	}
	// The first read of each client checks the count: 300 members.
	for name, p := range map[string]readPhase{"read": r.Read, "counts": r.Counts} {
		l := p.Latency
		if p.Reads == 0 || p.Errors != 0 || l.Count != p.Reads {
			t.Errorf("%s: %+v", name, p)
		}
		if !(0 < l.P50Ms && l.P50Ms <= l.P99Ms && l.P99Ms <= l.P999Ms && l.P999Ms <= l.MaxMs) {
			t.Errorf("%s: percentiles out of order: %+v", name, l)
		}
	}
	// Read again without seeding: a room of another size fails the check.
	var again roomCountResult
	runJSONShort(t, &again, "room-count", "-url", url, "-api-key", testAPIKey, "-seed=false", "-room", r.Room,
		"-members", "299", "-concurrency", "1", "-duration", "300ms")
	if again.Read.Errors == 0 || !strings.Contains(again.Read.FirstError, "count 300") {
		t.Errorf("a room of 300 read as one of 299: %d errors, %q", again.Read.Errors, again.Read.FirstError)
	}
}

func TestRoomMemoryInProcess(t *testing.T) {
	url := "http" + strings.TrimPrefix(startNode(t, 0), "ws")
	var r roomMemResult
	runJSONShort(t, &r, "room-memory", "-url", url, "-api-key", testAPIKey, "-users", "200", "-memberships-per-user", "3",
		"-rooms", "20", "-seed-concurrency", "8", "-duration", "1ms")
	if r.Memberships != 600 || r.Errors != 0 {
		t.Errorf("memberships %d, errors %d (%s)", r.Memberships, r.Errors, r.FirstError)
	}
	for name, s := range map[string]sample{"before": r.Before, "users online": r.UsersOnline, "with rooms": r.WithRooms} {
		if s.RSS == 0 || !s.Metrics || s.HeapInuse == 0 {
			t.Errorf("%s: %+v", name, s)
		}
	}
	// 200 users × 3 of 20 rooms: the scenario counted 30 members in each.
	if r.CheckedRooms != 20 || r.CheckedMembers != 600 {
		t.Errorf("checked %d rooms, %d members; want 20 and 600", r.CheckedRooms, r.CheckedMembers)
	}
}

func TestParseRoomFlags(t *testing.T) {
	t.Setenv(jwtSecretEnv, "")
	bad := [][]string{
		{"rooms", "-watchers", "10"},                                        // ws without -dev or -jwt-secret
		{"rooms", "-dev", "-interval", "50ms"},                              // over a device's limit of joins and leaves
		{"rooms", "-dev", "-movers", "100"},                                 // 1,000 status users to match
		{"rooms", "-dev", "-watchers", "0"},                                 // no watchers
		{"rooms", "-dev", "-duration", "20m"},                               // too long
		{"rooms", "-dev", "-room", "a b"},                                   // not an id
		{"rooms", "-dev", "-url", "ws://10.0.0.1:80"},                       // not loopback
		{"room-count", "-members", "0"},                                     // empty room
		{"room-count", "-seed=false"},                                       // which room?
		{"room-count", "-concurrency", "0"},                                 // no clients
		{"room-memory", "-memberships-per-user", "101"},                     // over a device's rooms
		{"room-memory", "-rooms", "5", "-memberships-per-user", "10"},       // fewer rooms than a user joins
		{"room-memory", "-users", "1000000", "-memberships-per-user", "20"}, // too many memberships
		{"room-memory", "-pprof-url", "http://10.0.0.1:6060"},               // not loopback
	}
	for _, args := range bad {
		if code := run(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	c, err := parseRooms([]string{"-dev", "-movers", "10", "-interval", "100ms"}, io.Discard)
	if err != nil || c.statusUsers != 100 || c.duration != 20*time.Second {
		t.Errorf("rooms: %+v %v; want 100 status users (10 × 10 events a second, one change a second each)", c, err)
	}
	for _, s := range []string{"rooms", "room-count", "room-memory"} {
		if code := run([]string{s, "-h"}, io.Discard, io.Discard); code != 0 {
			t.Errorf("%s -h: exit %d", s, code)
		}
	}
}

func TestMatchRoomEvents(t *testing.T) {
	at := func(ms int) time.Time { return time.UnixMilli(int64(ms)) }
	// Sends: join, leave, join, leave, join; the observer saw the last
	// three (the first two came before it watched).
	sends := []roomSend{{true, at(0)}, {false, at(100)}, {true, at(200)}, {false, at(300)}, {true, at(400)}}
	events := []roomEvent{{true, 7}, {false, 9}, {true, 12}}
	got := matchRoomEvents(sends[2:], events)
	want := map[uint64]time.Time{7: at(200), 9: at(300), 12: at(400)}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for v, w := range want {
		if !got[v].Equal(w) {
			t.Errorf("version %d: sent at %v, want %v", v, got[v], w)
		}
	}
	// A run with refusals (rate_limited, counted apart) cannot tell which
	// send made an event: the earliest send of the kind takes it.
	got = matchRoomEvents(sends, []roomEvent{{true, 4}, {false, 5}})
	if !got[4].Equal(at(0)) || !got[5].Equal(at(100)) {
		t.Errorf("greedy match: %v", got)
	}
	// An event of a kind the mover never sent after its last send of that
	// kind matches nothing.
	got = matchRoomEvents(sends[4:], []roomEvent{{false, 3}})
	if len(got) != 0 {
		t.Errorf("a leave matched to a join: %v", got)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
)

// Flaky devices against a node with a short ttl, on the real clock: on
// loopback the server must tell every dead device from the flaky ones,
// with the close grace as long as the ttl (the default, cut to it) and
// shorter (1s of a 3s ttl: drops
// come back within it, deaths are seen when it ends).
func TestChurnInProcess(t *testing.T) {
	for _, tc := range []struct {
		name            string
		ttl, grace      time.Duration
		heartbeatMs     int64
		graceMs, goalMs int64
	}{
		{"grace the ttl", 2 * time.Second, 0, 1000, 2000, 1000},
		{"grace 1s", 3 * time.Second, time.Second, 1500, 1000, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testChurnInProcess(t, startNodeWith(t, app.Config{TTL: tc.ttl, CloseGrace: tc.grace}),
				tc.ttl.Milliseconds(), tc.heartbeatMs, tc.graceMs, tc.goalMs)
		})
	}
}

func testChurnInProcess(t *testing.T, url string, ttlMs, heartbeatMs, graceMs, goalMs int64) {
	cfg, err := parseChurn([]string{"-url", url, "-dev", "-devices", "60", "-duration", "2s", "-rate", "15", "-mix", "2,2,1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	res, err := runChurn(context.Background(), cfg, &progress)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.TTLMs != ttlMs || res.HeartbeatMs != heartbeatMs || res.CloseGraceMs != graceMs || res.Goal.LagP99Ms != float64(goalMs) {
		t.Errorf("ttl %d ms, heartbeat %d ms, close grace %d ms, goal %v ms: want %d, %d, %d, %d (read from the welcome)",
			res.TTLMs, res.HeartbeatMs, res.CloseGraceMs, res.Goal.LagP99Ms, ttlMs, heartbeatMs, graceMs, goalMs)
	}
	if res.Reconnects == 0 || res.Misses == 0 || res.Deaths == 0 {
		t.Errorf("not every behaviour happened: %d reconnects, %d misses, %d deaths", res.Reconnects, res.Misses, res.Deaths)
	}
	if res.FalseOffline != 0 || res.MissedOffline != 0 {
		t.Errorf("false offline %d, missed %d (of %d deaths)", res.FalseOffline, res.MissedOffline, res.Deaths)
	}
	if res.Detected != res.Deaths || res.Lag.Samples != res.Deaths || res.Lag.Max == 0 {
		t.Errorf("lag not measured: %+v, %d detected", res.Lag, res.Detected)
	}
	if res.Violations != 0 || res.ServerCloses != 0 {
		// The tool's own lateness on a loaded machine: such devices are
		// left out of the verdict, which is what the run reports.
		t.Logf("%d kept-alive violations, %d server closes (%s)", res.Violations, res.ServerCloses, res.FirstError)
	}
	if !strings.Contains(progress.String(), "churn") {
		t.Errorf("no progress: %q", progress.String())
	}
	var out bytes.Buffer
	printChurn(&out, res)
	if !strings.Contains(out.String(), "false offline") {
		t.Errorf("table:\n%s", out.String())
	}
	b, _ := json.Marshal(res)
	for _, k := range []string{`"false_offline":0`, `"missed_offline":0`, `"lag":{`, fmt.Sprintf(`"ttl_ms":%d`, ttlMs)} {
		if !bytes.Contains(b, []byte(k)) {
			t.Errorf("JSON lacks %s: %s", k, b)
		}
	}
}

// The verdict: an offline while the device was kept alive is false; one
// after the device let its beats lapse is the tool's fault; a dead device
// without an offline within ttl + 5s is missed.
func TestChurnVerdict(t *testing.T) {
	t0 := time.Now()
	ttl := 2 * time.Second
	devs := []*churnDevice{
		{idx: 0, lastBeat: t0},                                          // alive, false offline
		{idx: 1, lastBeat: t0, violated: t0.Add(-time.Second)},          // alive but lapsed
		{idx: 2, lastBeat: t0, dead: true, deadAt: t0},                  // dead, detected
		{idx: 3, lastBeat: t0, dead: true, deadAt: t0},                  // dead, offline too late
		{idx: 4, lastBeat: t0, dead: true, deadAt: t0},                  // dead, nothing
		{idx: 5, lastBeat: t0, dead: true, deadAt: t0.Add(time.Second)}, // false offline before death, then detected
		{idx: 6, lastBeat: t0.Add(-5 * time.Second)},                    // never beat again (closed by the server): lapsed
	}
	r := &churnRun{cfg: &churnConfig{devices: len(devs)}, devices: devs, ttl: ttl, grace: ttl, interval: ttl / 4}
	r.offlines = []churnOffline{
		{dev: 0, at: t0.Add(time.Second)},
		{dev: 1, at: t0.Add(time.Second)},
		{dev: 2, at: t0.Add(ttl + 300*time.Millisecond)},
		{dev: 3, at: t0.Add(ttl + 6*time.Second)},
		{dev: 5, at: t0.Add(500 * time.Millisecond)},
		{dev: 5, at: t0.Add(ttl + 100*time.Millisecond)},
		{dev: 6, at: t0},
	}
	res := r.result(t0.Add(-time.Minute), t0.Add(ttl/2))
	if res.FalseOffline != 2 || res.MissedOffline != 2 || res.Deaths != 4 || res.Detected != 2 || res.Violations != 2 {
		t.Errorf("false %d missed %d deaths %d detected %d violations %d, want 2 2 4 2 2",
			res.FalseOffline, res.MissedOffline, res.Deaths, res.Detected, res.Violations)
	}
	if res.Lag.Samples != 2 || res.Lag.Max != 300 || res.LagMinMs != 100 {
		t.Errorf("lag %+v min %v", res.Lag, res.LagMinMs)
	}
	if res.GoalMet {
		t.Error("goal met")
	}
}

// With a close grace shorter than the ttl a dead device ends at its drop +
// the grace (or its ttl, if that comes first), and the lag is measured
// from there.
func TestChurnVerdictCloseGrace(t *testing.T) {
	t0 := time.Now()
	ttl, grace := 10*time.Second, 2*time.Second
	devs := []*churnDevice{
		{idx: 0, lastBeat: t0, dead: true, deadAt: t0.Add(time.Second)},     // ends at the grace: t0+3s
		{idx: 1, lastBeat: t0, dead: true, deadAt: t0.Add(9 * time.Second)}, // ends at the ttl: t0+10s
		{idx: 2, lastBeat: t0, dead: true, deadAt: t0},                      // offline too late
	}
	r := &churnRun{cfg: &churnConfig{devices: len(devs)}, devices: devs, ttl: ttl, grace: grace, interval: ttl / 4}
	r.offlines = []churnOffline{
		{dev: 0, at: t0.Add(3*time.Second + 150*time.Millisecond)},
		{dev: 1, at: t0.Add(10*time.Second + 50*time.Millisecond)},
		{dev: 2, at: t0.Add(8 * time.Second)},
	}
	res := r.result(t0.Add(-time.Minute), t0.Add(ttl))
	if res.Deaths != 3 || res.Detected != 2 || res.MissedOffline != 1 || res.FalseOffline != 0 {
		t.Errorf("deaths %d detected %d missed %d false %d, want 3 2 1 0", res.Deaths, res.Detected, res.MissedOffline, res.FalseOffline)
	}
	if res.Lag.Max != 150 || res.LagMinMs != 50 || res.Goal.LagP99Ms != 200 || res.CloseGraceMs != 2000 {
		t.Errorf("lag %+v min %v goal %v grace %d", res.Lag, res.LagMinMs, res.Goal.LagP99Ms, res.CloseGraceMs)
	}
}

// What happens after the run ended is no part of the verdict: the
// offlines of the sockets the tool then drops (at once with no close
// grace), a death applied after it.
func TestChurnVerdictAfterTheEnd(t *testing.T) {
	t0 := time.Now()
	ttl := 5 * time.Second
	devs := []*churnDevice{
		{idx: 0, lastBeat: t0}, // alive, its socket dropped at the end
		{idx: 1, lastBeat: t0, dead: true, deadAt: t0.Add(time.Millisecond)}, // dead, detected at once
		{idx: 2, lastBeat: t0, dead: true, deadAt: t0.Add(2 * time.Second)},  // died after the end
	}
	r := &churnRun{cfg: &churnConfig{devices: len(devs)}, devices: devs, ttl: ttl, grace: 0, interval: ttl / 4,
		ended: t0.Add(time.Second)}
	r.offlines = []churnOffline{
		{dev: 0, at: t0.Add(time.Second + time.Millisecond)},
		{dev: 1, at: t0.Add(2 * time.Millisecond)},
	}
	res := r.result(t0.Add(-time.Minute), r.ended)
	if res.FalseOffline != 0 || res.Deaths != 1 || res.Detected != 1 || res.MissedOffline != 0 || res.CloseGraceMs != 0 {
		t.Errorf("false %d deaths %d detected %d missed %d grace %d, want 0 1 1 0 0",
			res.FalseOffline, res.Deaths, res.Detected, res.MissedOffline, res.CloseGraceMs)
	}
	if res.Lag.Max != 1 {
		t.Errorf("lag %+v, want 1 ms after the drop", res.Lag)
	}
}

func TestParseChurnRefuses(t *testing.T) {
	t.Setenv(jwtSecretEnv, "")
	for _, args := range [][]string{
		{"-devices", "10"},
		{"-dev", "-devices", "0"},
		{"-dev", "-devices", "1000000"},
		{"-dev", "-duration", "2h"},
		{"-dev", "-rate", "-1"},
		{"-dev", "-devices", "10", "-rate", "11"},
		{"-dev", "-mix", "1,2"},
		{"-dev", "-mix", "0,0,0"},
		{"-dev", "-url", "ws://192.168.1.1:80"},
	} {
		if _, err := parseChurn(args, io.Discard); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
	c, err := parseChurn([]string{"-dev"}, io.Discard)
	if err != nil || c.devices != 2000 || c.rate != 40 || c.duration != time.Minute {
		t.Errorf("defaults: %v %+v", err, c)
	}
}

// The mix is interleaved, not drawn: any window of sum(weights) picks has
// each kind in its proportion, so a short run has every behaviour.
func TestMixerInterleavesTheProportions(t *testing.T) {
	for _, w := range [][3]int{{2, 2, 1}, {4, 4, 2}, {0, 1, 1}, {0, 0, 3}, {1, 0, 0}, {7, 3, 1}} {
		m := newMixer(w)
		total := w[0] + w[1] + w[2]
		var picks []int
		for range 5 * total {
			picks = append(picks, m.next())
		}
		for start := 0; start+total <= len(picks); start += total {
			var got [3]int
			for _, k := range picks[start : start+total] {
				got[k]++
			}
			if got != w {
				t.Fatalf("weights %v: picks %v, window at %d has %v", w, picks, start, got)
			}
		}
	}
	// The churn test's own mix: a death among any 5 picks in a row.
	m := newMixer([3]int{2, 2, 1})
	for i := range 20 {
		found := false
		for range 5 {
			found = found || m.next() == 2
		}
		if !found {
			t.Fatalf("no death in picks %d to %d", 5*i, 5*i+4)
		}
	}
}

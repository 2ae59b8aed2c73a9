package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testsvc"
)

// The heartbeats, batch and limits scenarios against an in-process node
// (its CPU is this process's: -server-pid is our own pid) and the shared
// Redis of testsvc for the baseline. TestMain (fanout_test.go) stops it.

// progressLine is a line of progress: its label, then the seconds since
// the start ("measure   1.0s  sent …", "GET   1.2s …" on a busy machine).
var progressLine = regexp.MustCompile(`(?m)^[A-Za-z -]*\s[0-9]+\.[0-9]s\s`)

// runJSON runs the command line and decodes its -json output into v.
func runJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	var out, errb bytes.Buffer
	args = append(args, "-json", "-server-pid", strconv.Itoa(os.Getpid()))
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("%q: exit %d\n%s", args, code, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		t.Fatalf("%q: %v\n%s", args, err, out.String())
	}
	if !progressLine.MatchString(errb.String()) {
		t.Errorf("no progress line on stderr:\n%s", errb.String())
	}
}

func checkBeats(t *testing.T, r *hbResult, devices int) {
	t.Helper()
	if r.Devices != devices || r.Sent <= 0 || r.Accepted <= 0 || r.SentTotal <= 0 || r.AcceptedTotal <= 0 {
		t.Errorf("nothing measured: %+v", r)
	}
	if r.AcceptedTotal > r.SentTotal {
		t.Errorf("accepted %d > sent %d over the run", r.AcceptedTotal, r.SentTotal)
	}
	if r.Errors != 0 || r.RateLimited != 0 {
		t.Errorf("errors %d, rate-limited %d: %s", r.Errors, r.RateLimited, r.FirstError)
	}
	if r.ServerCores <= 0 || r.GeneratorCores <= 0 || r.SentPerSec <= 0 || r.AcceptedPerSec <= 0 {
		t.Errorf("rates or CPU missing: %+v", r)
	}
}

func TestHeartbeatsWebSocketWithBaseline(t *testing.T) {
	url := startNode(t, 0)
	rd := testsvc.SharedRedis(t)
	var r hbResult
	runJSON(t, &r, "heartbeats", "-url", url, "-dev", "-api-key", testAPIKey, "-n", "200", "-interval", "200ms",
		"-warmup", "500ms", "-duration", "2s", "-prefix", "hb-",
		"-baseline-redis", "redis://"+rd.Addr+"/0", "-baseline-conns", "20")
	checkBeats(t, &r, 200)
	if r.Connected != 200 || r.ConnectFailed != 0 || r.Transport != "ws" {
		t.Errorf("connected %d, failed %d, transport %s", r.Connected, r.ConnectFailed, r.Transport)
	}
	b := r.Baseline
	if b == nil {
		t.Fatal("no baseline")
	}
	if b.Conns != 20 || b.Accepted <= 0 || b.Accepted > b.Sent || b.Errors != 0 || b.Ratio <= 0 {
		t.Errorf("baseline: %+v", b)
	}
	if b.KeysDeleted < 1 || b.KeysDeleted > 200 {
		t.Errorf("baseline deleted %d keys, want 1..200 (one per device that beat)", b.KeysDeleted)
	}
}

func TestHeartbeatsTokensAndHTTP(t *testing.T) {
	url := startNode(t, 0)
	var r hbResult
	runJSON(t, &r, "heartbeats", "-url", url, "-jwt-secret", testJWTSecret, "-api-key", testAPIKey, "-n", "50",
		"-interval", "200ms", "-warmup", "0s", "-duration", "1500ms")
	checkBeats(t, &r, 50)
	if r.Connected != 50 {
		t.Errorf("connected %d with tokens", r.Connected)
	}
	var h hbResult
	runJSON(t, &h, "heartbeats", "-transport", "http", "-url", strings.Replace(url, "ws:", "http:", 1),
		"-api-key", testAPIKey, "-n", "100", "-concurrency", "4", "-interval", "200ms", "-warmup", "0s", "-duration", "1500ms")
	checkBeats(t, &h, 100)
	if h.Transport != "http" || h.Baseline != nil {
		t.Errorf("transport %s, baseline %v", h.Transport, h.Baseline)
	}
}

func TestBatchWithBaseline(t *testing.T) {
	url := startNode(t, 0)
	rd := testsvc.SharedRedis(t)
	var r batchResult
	runJSON(t, &r, "batch", "-url", url, "-api-key", testAPIKey, "-users", "500", "-ids", "100", "-concurrency", "2",
		"-seed-concurrency", "8", "-duration", "1200ms", "-prefix", "batch_",
		"-baseline-redis", "redis://"+rd.Addr)
	if r.Seeded != 500 || r.SeedErrors != 0 {
		t.Errorf("seeded %d, %d errors", r.Seeded, r.SeedErrors)
	}
	phases := map[string]readPhase{"GET": r.Get, "POST": r.Post}
	if r.Baseline == nil {
		t.Fatal("no baseline")
	}
	phases["MGET"] = r.Baseline.MGet
	for name, p := range phases {
		l := p.Latency
		if p.Reads == 0 || p.ReadsPerSec <= 0 || p.Errors != 0 || l.Count != p.Reads {
			t.Errorf("%s: %+v", name, p)
		}
		if !(0 < l.P50Ms && l.P50Ms <= l.P99Ms && l.P99Ms <= l.P999Ms && l.P999Ms <= l.MaxMs) {
			t.Errorf("%s: percentiles out of order: %+v", name, l)
		}
	}
	if b := r.Baseline; b.RatioReads <= 0 || b.RatioP99 <= 0 || b.KeysDeleted != 500 {
		t.Errorf("baseline: %+v", b)
	}

	// Without seeding, the same population is read again.
	var again batchResult
	// 2 s: a phase of 1 s may end before its first progress line.
	runJSON(t, &again, "batch", "-url", url, "-api-key", testAPIKey, "-users", "500", "-ids", "500", "-seed=false", "-prefix", "batch_",
		"-concurrency", "1", "-duration", "2s")
	if again.Seeded != 0 || again.Get.Reads == 0 || again.Get.Errors != 0 {
		t.Errorf("-seed=false: %+v", again)
	}
}

func TestLimits(t *testing.T) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		t.Skip("no redis-benchmark")
	}
	rd := testsvc.SharedRedis(t)
	var r limitsResult
	var out, errb bytes.Buffer
	if code := run([]string{"limits", "-redis", rd.Addr, "-requests", "5000", "-users", "10000", "-duration", "300ms", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.RedisSetPerSec <= 0 || r.RedisSetexRate <= 0 || r.MapPerSec <= 0 || r.MapShards != 256 || r.MapUpdates <= 0 {
		t.Errorf("%+v", r)
	}
}

func TestParseRedisBenchmark(t *testing.T) {
	out := "SETEX k 30 v: rps=0.0 (overall: 0.0) avg_msec=-nan (overall: -nan)\r                \rSETEX k 30 v: 781249.94 requests per second, p50=0.823 msec\n\n"
	if v, err := parseRedisBenchmark(out); err != nil || v != 781249.94 {
		t.Errorf("got %v %v", v, err)
	}
	if _, err := parseRedisBenchmark("Could not connect to Redis at 127.0.0.1:1: Connection refused\n"); err == nil {
		t.Error("no figure: accepted")
	}
}

func TestParseStatCPU(t *testing.T) {
	// comm with a space and a parenthesis; utime 250, stime 50 ticks.
	stat := "1234 (pres (x) d) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 100 0 0"
	if d, err := parseStatCPU(stat); err != nil || d != 3*time.Second {
		t.Errorf("got %v %v, want 3s", d, err)
	}
	if _, err := parseStatCPU("1234 (x) S 1"); err == nil {
		t.Error("short stat: accepted")
	}
	if d, err := cpuTime(os.Getpid()); err != nil || d < 0 {
		t.Errorf("own CPU: %v %v", d, err)
	}
}

func TestParseRedisURL(t *testing.T) {
	good := map[string]redisTarget{
		"redis://127.0.0.1:6379/0":      {addr: "127.0.0.1:6379"},
		"127.0.0.1:7000":                {addr: "127.0.0.1:7000"},
		"redis://localhost/3":           {addr: "127.0.0.1:6379", db: 3},
		"redis://u:p@127.0.0.2:6380/1":  {addr: "127.0.0.2:6380", user: "u", password: "p", db: 1},
		"redis://:secret@127.0.0.1:1/0": {addr: "127.0.0.1:1", password: "secret"},
	}
	for in, want := range good {
		if got, err := parseRedisURL(in); err != nil || got != want {
			t.Errorf("%s: %+v %v, want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"redis://10.0.0.1:6379", "rediss://127.0.0.1:6379", "redis://example.com:6379", "redis://127.0.0.1:6379/x", "redis://[::1]:6379", "redis://127.0.0.1:99999"} {
		if _, err := parseRedisURL(in); err == nil {
			t.Errorf("%s: accepted", in)
		}
	}
}

func TestParseScenarioFlags(t *testing.T) {
	t.Setenv(jwtSecretEnv, "")
	bad := [][]string{
		{"heartbeats", "-n", "10"},                                   // ws without -dev or -jwt-secret
		{"heartbeats", "-dev", "-n", "20000"},                        // more sockets than one process holds
		{"heartbeats", "-dev", "-duration", "2h"},                    // too long
		{"heartbeats", "-dev", "-interval", "10ms"},                  // over the server's rate limit
		{"heartbeats", "-dev", "-url", "ws://192.168.1.1:80"},        // not loopback
		{"heartbeats", "-dev", "-transport", "udp"},                  // transport
		{"heartbeats", "-dev", "-baseline-redis", "redis://1.2.3.4"}, // baseline not loopback
		{"batch", "-users", "10", "-ids", "100"},                     // more ids than users
		{"batch", "-ids", "1001"},                                    // over the API's bound
		{"batch", "-prefix", "a,b"},                                  // would break the query
		{"batch", "-duration", "0s"},                                 // unbounded
		{"limits", "-redis", "10.1.1.1:6379"},                        // not loopback
		{"limits", "-requests", "0"},                                 // count
		{"limits", "-duration", "90m"},                               // too long
	}
	for _, args := range bad {
		if code := run(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	// HTTP needs no WebSocket credentials; many devices fit.
	c, err := parseHeartbeats([]string{"-transport", "http", "-n", "1000000", "-api-key", "k"}, io.Discard)
	if err != nil || c.senders < 1 || c.duration != 20*time.Second {
		t.Errorf("http: %+v %v", c, err)
	}
	for _, s := range []string{"heartbeats", "batch", "limits"} {
		if code := run([]string{s, "-h"}, io.Discard, io.Discard); code != 0 {
			t.Errorf("%s -h: exit %d", s, code)
		}
	}
}

func TestSchedule(t *testing.T) {
	g := &beatGen{sent: make([]padded, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var beats [8]int
	devs := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	g.schedule(ctx, 0, devs, minInterval, func(dev int32) outcome {
		beats[dev]++
		if dev == 7 {
			return beatDrop // a broken device is dropped after its first try
		}
		for _, n := range beats[:7] {
			if n < 3 {
				return beatSent
			}
		}
		cancel() // every live device beat three times
		return beatSent
	})
	if ctx.Err() == context.DeadlineExceeded {
		t.Fatalf("not every device beat 3 times: %v", beats)
	}
	if beats[7] != 1 {
		t.Errorf("dropped device tried %d times", beats[7])
	}
	if got, want := g.total(), int64(sumInts(beats[:7])); got != want {
		t.Errorf("counted %d beats, sent %d", got, want)
	}
	if s := shares(5, 2); len(s) != 2 || len(s[0]) != 3 || s[1][1] != 3 {
		t.Errorf("shares(5, 2) = %v", s)
	}
	if s := shares(2, 10); len(s) != 2 {
		t.Errorf("shares(2, 10) = %v: more owners than devices", s)
	}
}

func sumInts(v []int) int {
	t := 0
	for _, x := range v {
		t += x
	}
	return t
}

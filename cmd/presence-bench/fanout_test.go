package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/app/apptest"
	"github.com/presenced/presenced/internal/ratelimit"
	"github.com/presenced/presenced/internal/testsvc"
)

// TestMain stops the shared Redis of the baseline test.
func TestMain(m *testing.M) { testsvc.Main(m) }

// The credentials of the test nodes: as long as a node outside -dev
// requires (auth.MinSecretLen), although the nodes run under -dev.
const (
	testAPIKey    = "presence-bench-test-api-key-0123456789"
	testJWTSecret = "presence-bench-test-jwt-secret-0123456789"
)

// startNode runs one presenced node in-process on a loopback port, in
// development mode with testAPIKey and testJWTSecret and the given ttl
// (0: the default), and returns its ws:// URL.
func startNode(t *testing.T, ttl time.Duration) string {
	t.Helper()
	return startNodeWith(t, app.Config{TTL: ttl})
}

// startNodeWith starts an embedded node with cfg (under -dev, testAPIKey)
// on a free loopback port and returns its ws:// URL.
func startNodeWith(t *testing.T, cfg app.Config) string {
	t.Helper()
	cfg.DataDir, cfg.APIKey, cfg.Dev, cfg.JWTSecret, cfg.PollInterval = t.TempDir(), testAPIKey, true, []byte(testJWTSecret), -1
	return "ws://" + apptest.Run(t, cfg)
}

func TestFanoutInProcess(t *testing.T) {
	url := startNode(t, 0)
	cfg, err := parseFanout([]string{"-url", url, "-dev", "-watchers", "20", "-targets", "3",
		"-devices", "2", "-duration", "3s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.interval != ratelimit.Status.Every {
		t.Errorf("interval %v, want the server's limit of a user's status changes, %v", cfg.interval, ratelimit.Status.Every)
	}
	var progress bytes.Buffer
	res, err := runFanout(context.Background(), cfg, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if res.Changes < 3 || res.Confirmed < 1 || res.Confirmed > res.Changes {
		t.Errorf("changes %d, confirmed %d; %+v", res.Changes, res.Confirmed, res)
	}
	if res.RateLimited != 0 || res.Errors != 0 || res.WatcherDrops != 0 {
		t.Errorf("rate limited %d, errors %d (%s), drops %d", res.RateLimited, res.Errors, res.FirstError, res.WatcherDrops)
	}
	if res.Expected != int64(res.Confirmed)*20 || res.Deliveries+res.Missing != res.Expected {
		t.Errorf("expected %d, deliveries %d, missing %d", res.Expected, res.Deliveries, res.Missing)
	}
	if res.Coalesced < 0 || res.Coalesced > res.Missing {
		t.Errorf("coalesced %d of %d missing", res.Coalesced, res.Missing)
	}
	// A socket that falls a whole change behind may coalesce two changes
	// (the protocol allows it; the target's own socket shows it too): only
	// a run without that must deliver everything.
	if res.Confirmed == res.Changes && res.Missing != 0 {
		t.Errorf("%d deliveries missing of %d", res.Missing, res.Expected)
	} else if res.Confirmed != res.Changes {
		t.Logf("a loaded machine: %d of %d changes coalesced on the target's own socket, %d deliveries missing", res.Changes-res.Confirmed, res.Changes, res.Missing)
	}
	if l := res.Latency; l.Samples != int(res.Deliveries) || l.Max <= 0 || l.P50 > l.P99 || l.P99 > l.Max {
		t.Errorf("latency %+v", l)
	}
	if !strings.Contains(progress.String(), "fanout") {
		t.Errorf("no progress on stderr: %q", progress.String())
	}
	var out bytes.Buffer
	printFanout(&out, res)
	if !strings.Contains(out.String(), "missing "+strconv.FormatInt(res.Missing, 10)) {
		t.Errorf("table:\n%s", out.String())
	}
}

// Watchers on other nodes than the targets: with in-process nodes that do
// not share state, a second URL is only a check of the round-robin; the
// targets' node is the first.
func TestFanoutCommandJSONAndBaseline(t *testing.T) {
	url := startNode(t, 0)
	rd := testsvc.SharedRedis(t)
	var out, errb bytes.Buffer
	code := runFanoutCmd([]string{"-url", url, "-dev", "-watchers", "10", "-targets", "2",
		"-changes", "6", "-duration", "5s", "-json", "-baseline-redis", rd.URL}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if res["scenario"] != "fanout" || res["changes"] != 6.0 || res["expected_deliveries"] != res["changes_confirmed"].(float64)*10 {
		t.Errorf("result %s", out.String())
	}
	if res["changes_confirmed"] == 6.0 && (res["missing_deliveries"] != 0.0 || res["deliveries"] != 60.0) {
		t.Errorf("deliveries missing without coalescing: %s", out.String())
	}
	b, _ := res["baseline"].(map[string]any)
	if b == nil || b["publishes"] != 6.0 || b["deliveries"] != 60.0 || b["missing_deliveries"] != 0.0 {
		t.Errorf("baseline %v", b)
	}
	if lat, _ := b["latency"].(map[string]any); lat == nil || lat["max_ms"].(float64) <= 0 {
		t.Errorf("baseline latency %v", b["latency"])
	}
	if res["ratio_p50"] == nil {
		t.Errorf("no ratio: %s", out.String())
	}
}

// Signed tokens instead of -dev, the secret from the environment.
func TestFanoutTokens(t *testing.T) {
	url := startNode(t, 0)
	t.Setenv(jwtSecretEnv, testJWTSecret)
	var out, errb bytes.Buffer
	if code := runFanoutCmd([]string{"-url", url, "-watchers", "3", "-changes", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "deliveries 6 of 6 expected, missing 0") {
		t.Errorf("result:\n%s", out.String())
	}
}

func TestParseFanoutRefuses(t *testing.T) {
	t.Setenv(jwtSecretEnv, "")
	for _, args := range [][]string{
		{"-watchers", "10"},                  // neither -dev nor -jwt-secret
		{"-dev", "-jwt-secret", "s"},         // both
		{"-dev", "-url", "ws://10.0.0.1:80"}, // not loopback
		{"-dev", "-watchers", "0"},           //
		{"-dev", "-watchers", "1000000"},     // absurd
		{"-dev", "-targets", "501"},          // over a connection's subscriptions
		{"-dev", "-interval", "1ms"},         //
		{"-dev", "-interval", "500ms"},       // faster than a user may change status
		{"-dev", "-duration", "5h"},          //
		{"-dev", "-changes", "-1"},           //
		{"-dev", "-baseline-redis", "redis://10.1.1.1:6379"},
		{"-dev", "-watchers", "20000", "-targets", "500", "-duration", "10m"}, // too many samples
	} {
		if _, err := parseFanout(args, io.Discard); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
	c, err := parseFanout([]string{"-dev", "-url", "ws://127.0.0.1:1,ws://127.0.0.1:2", "-url", "ws://127.0.0.1:3"}, io.Discard)
	if err != nil || len(c.eps) != 3 || c.eps[2].url.Port() != "3" {
		t.Errorf("urls: %v %+v", err, c)
	}
}

func TestMatchEchoes(t *testing.T) {
	t0 := time.Now()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	// busy, online, busy, online, busy, online
	var sends []fanoutSend
	for i := range 6 {
		sends = append(sends, fanoutSend{busy: i%2 == 0, at: at(i)})
	}
	// Version 10 before; change 1 (online) was refused, so 2 (busy) made 12
	// after 0 made 11; 3 and 4 coalesced into 4's echo (version 14); a
	// duplicate of 14; 5 made 15.
	echo := []fanoutEcho{{true, 11}, {true, 12}, {true, 14}, {true, 14}, {false, 15}}
	got := matchEchoes(10, sends, echo)
	want := map[uint64]time.Time{11: at(0), 12: at(2), 14: at(4), 15: at(5)}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for v, w := range want {
		if !got[v].Equal(w) {
			t.Errorf("version %d: send %v, want %v", v, got[v].Sub(t0), w.Sub(t0))
		}
	}
}

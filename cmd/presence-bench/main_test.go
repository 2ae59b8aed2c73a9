package main

import (
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

func TestLoopbackURL(t *testing.T) {
	good := map[string]string{
		"ws://127.0.0.1:18090":        "ws://127.0.0.1:18090/v1/ws",
		"ws://127.0.0.1:18090/":       "ws://127.0.0.1:18090/v1/ws",
		"http://localhost:8080":       "ws://127.0.0.1:8080/v1/ws",
		"ws://127.1.2.3:80/custom/ws": "ws://127.1.2.3:80/custom/ws",
	}
	for in, want := range good {
		u, base, err := loopbackURL(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if u.String() != want {
			t.Errorf("%s: %s, want %s", in, u, want)
		}
		if !strings.HasPrefix(base, "http://127.") || strings.HasSuffix(base, "/") {
			t.Errorf("%s: http base %q", in, base)
		}
	}
	bad := []string{
		"ws://10.0.0.1:8080",         // not loopback
		"ws://example.com:8080",      // a name (never resolved)
		"ws://0.0.0.0:8080",          // unspecified, not loopback
		"ws://[::1]:8080",            // IPv6 loopback: no source spreading
		"wss://127.0.0.1:8080",       // TLS
		"ftp://127.0.0.1:21",         // scheme
		"ws://127.0.0.1",             // no port
		"ws://127.0.0.1:0",           // bad port
		"ws://127.0.0.1:8080/?a=b",   // query
		"ws://u:p@127.0.0.1:8080",    // credentials
		"127.0.0.1:8080",             // no scheme
		"ws://127.0.0.1.evil.com:80", // a name that starts like an address
	}
	for _, in := range bad {
		if _, _, err := loopbackURL(in); err == nil {
			t.Errorf("%s: accepted", in)
		}
	}
}

func TestParseConnections(t *testing.T) {
	parse := func(args ...string) (*connConfig, error) { return parseConnections(args, io.Discard) }
	c, err := parse("-url", "ws://127.0.0.1:18090", "-n", "15000", "-dev")
	if err != nil {
		t.Fatal(err)
	}
	if c.procs != 2 || c.hold != 35*time.Second || c.heartbeat != 15*time.Second {
		t.Errorf("defaults: procs %d hold %v heartbeat %v, want 2, 35s, 15s", c.procs, c.hold, c.heartbeat)
	}
	t.Setenv(jwtSecretEnv, "")
	for _, args := range [][]string{
		{"-n", "10"},                             // neither -dev nor -jwt-secret
		{"-n", "10", "-dev", "-jwt-secret", "s"}, // both
		{"-n", "0", "-dev"},
		{"-n", "1000000", "-dev"},                  // over the bound
		{"-n", "40000", "-procs", "2", "-dev"},     // 20,000 per process
		{"-n", "10", "-dev", "-heartbeat", "10ms"}, // too fast
		{"-n", "10", "-dev", "-hold", "2h"},        // too long
		{"-n", "10", "-dev", "-url", "ws://1.2.3.4:80"},
		{"-n", "10", "-dev", "extra"},
		{"-n", "100000", "-per-source", "100", "-dev"}, // more than 127.0.0.254
	} {
		if _, err := parse(args...); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
	t.Setenv(jwtSecretEnv, "s")
	if c, err := parse("-n", "10"); err != nil || c.jwtSecret != "s" {
		t.Errorf("secret from the environment: %v %+v", err, c)
	}
}

func TestSplitAndSources(t *testing.T) {
	parts := split(15001, 2)
	if parts[0] != [2]int{0, 7501} || parts[1] != [2]int{7501, 7500} {
		t.Errorf("split: %v", parts)
	}
	for i, want := range map[int]string{0: "127.0.0.2", 9999: "127.0.0.2", 10000: "127.0.0.3", 25000: "127.0.0.4"} {
		if got := sourceAddr(i, 10000).String(); got != want {
			t.Errorf("sourceAddr(%d) = %s, want %s", i, got, want)
		}
	}
}

func TestResultMath(t *testing.T) {
	r := connResult{
		Connected: 10_010, Dropped: 10,
		Before: sample{RSS: 20 << 20, HeapInuse: 4 << 20, Goroutines: 30},
		After:  sample{RSS: 20<<20 + 10_000*3000, HeapInuse: 4<<20 + 10_000*1024, Goroutines: 30},
	}
	r.compute()
	if r.Held != 10_000 || r.RSSPerConn != 3000 || r.HeapInusePerConn != 1024 || r.GoroutinesPerConn != 0 {
		t.Errorf("%+v", r)
	}
	if got := perConn(100, 50, 10); got != -5 {
		t.Errorf("memory going down: %v, want -5", got)
	}
	if got := perConn(0, 100, 0); got != 0 || math.IsNaN(got) {
		t.Errorf("no connections: %v", got)
	}
}

func TestServerReadings(t *testing.T) {
	rss, err := parseVmRSS("Name:\tpresenced\nVmPeak:\t 1 kB\nVmRSS:\t   14848 kB\nThreads: 7\n")
	if err != nil || rss != 14848*1024 {
		t.Errorf("VmRSS: %d %v", rss, err)
	}
	if _, err := parseVmRSS("Name:\tx\n"); err == nil {
		t.Error("no VmRSS: accepted")
	}
	m, err := parseMetrics(strings.NewReader("# HELP x\ngo_memstats_heap_inuse_bytes 4.57e+06\ngo_gc_duration_seconds{quantile=\"0\"} 1\ngo_goroutines 32\n"))
	if err != nil || m["go_memstats_heap_inuse_bytes"] != 4.57e6 || m["go_goroutines"] != 32 || len(m) != 2 {
		t.Errorf("metrics: %v %v", m, err)
	}
	table := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 0100007F:46AA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 123456 1 0 100 0 0 10 0\n" +
		"   1: 0100007F:46AA 0200007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 654321 1 0 100 0 0 10 0\n"
	if got := listenInodes(table, 18090); len(got) != 1 || got[0] != "123456" {
		t.Errorf("listenInodes: %v", got)
	}
}

func TestParseThreadsAndCPU(t *testing.T) {
	if n := parseThreads("Name:\tpresenced\nVmRSS:\t 1 kB\nThreads:\t12\n"); n != 12 {
		t.Fatalf("threads %d, want 12", n)
	}
	// A command name with spaces and parentheses; utime 250, stime 50.
	stat := "4242 (pre sen) ced) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 0 0"
	cpu, err := parseCPU(stat)
	if err != nil || cpu != 3 {
		t.Fatalf("parseCPU = %v, %v; want 3 s", cpu, err)
	}
	if _, err := parseCPU("4242 (x) S 1"); err == nil {
		t.Fatal("a short stat line parsed")
	}
}

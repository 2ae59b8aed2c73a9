package main

import (
	"io"
	"testing"
	"time"
)

func TestParseStorm(t *testing.T) {
	urls := "ws://127.0.0.1:1,ws://127.0.0.1:2,ws://127.0.0.1:3"
	c, err := parseStorm([]string{"-dev", "-api-key", "k", "-url", urls}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.eps) != 3 || c.kill != 2 || c.perNode != 3000 || c.subs != 50 || c.probes != 20 || c.probeWatchers != 50 {
		t.Errorf("defaults: %+v", c)
	}
	for _, args := range [][]string{
		{"-dev", "-api-key", "k", "-url", "ws://127.0.0.1:1"},                          // nothing survives
		{"-dev", "-url", urls},                                                         // no API key for the probes
		{"-dev", "-api-key", "k", "-url", urls, "-kill", "3"},                          // no such node
		{"-dev", "-api-key", "k", "-url", urls, "-per-node", "7000"},                   // more sockets than files
		{"-dev", "-api-key", "k", "-url", urls, "-subs", "501"},                        //
		{"-dev", "-api-key", "k", "-url", urls, "-probe-watchers", "400"},              // 20 × 400 > the survivors' 6,000
		{"-dev", "-api-key", "k", "-url", urls, "-interval", "10ms"},                   //
		{"-dev", "-api-key", "k", "-url", urls, "-storm", "500ms"},                     // shorter than -interval
		{"-dev", "-api-key", "k", "-url", urls, "-per-source", "10"},                   // past 127.0.0.254
		{"-dev", "-api-key", "k", "-url", urls, "-pprof-url", "http://127.0.0.1:6060"}, // no -profile-dir
		{"-dev", "-api-key", "k", "-url", urls, "-pprof-url", "http://10.0.0.1:6060", "-profile-dir", "x"},
		{"-api-key", "k", "-url", urls}, // neither -dev nor a secret
	} {
		if _, err := parseStorm(args, io.Discard); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}

// The reconnect waits are the Go client's: attempt n waits within
// [d/2, d], d = min(250ms·2ⁿ, 10s).
func TestStormBackoff(t *testing.T) {
	for n, d := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second} {
		lo, hi := stormBackoff(n, 0), stormBackoff(n, 0.999999)
		if lo != d/2 || hi > d || hi < d*99/100 {
			t.Errorf("attempt %d: waits %v…%v, want %v…%v", n, lo, hi, d/2, d)
		}
	}
}

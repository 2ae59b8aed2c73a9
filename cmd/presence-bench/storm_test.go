package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/app/apptest"
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
		{"-api-key", "k", "-url", urls},                        // neither -dev nor a secret
		{"-dev", "-api-key", "k", "-url", urls, "-tag", "A-1"}, // not a part of a user id
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

// The killed node's sockets, in their process (run here in-process over
// pipes): they connect and subscribe, say ready; told the node is about
// to die, they say so; when it dies they reconnect to the survivor and
// subscribe again, and on stop report each socket's return.
func TestStormKilled(t *testing.T) {
	survivor := startNode(t, 0)
	_, addr, stopKilled := apptest.Start(t, app.Config{DataDir: t.TempDir(), APIKey: testAPIKey, Dev: true,
		JWTSecret: []byte(testJWTSecret), PollInterval: -1})
	defer stopKilled()
	apptest.WaitReady(t, addr)
	cfg, err := parseStorm([]string{"-dev", "-api-key", "k", "-url", survivor + ",ws://" + addr,
		"-per-node", "2", "-subs", "1", "-probes", "1", "-probe-watchers", "1", "-tag", "kt"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := stormKilled(context.Background(), cfg, inR, outW, errW)
		outW.Close()
		errW.Close()
		done <- err
	}()
	back := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "storm-killed: all 2 sockets back") {
				back <- sc.Text()
			}
		}
	}()
	out := bufio.NewReader(outR)
	line := func(want string) string {
		t.Helper()
		l, err := out.ReadString('\n')
		if err != nil || !strings.HasPrefix(l, want) {
			t.Fatalf("read %q, %v; want %q", l, err, want)
		}
		return l
	}
	line("ready")
	io.WriteString(inW, "settled\nkilling\n")
	line("killing")
	if err := stopKilled(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-back:
	case <-time.After(30 * time.Second):
		t.Fatal("the sockets did not come back on the survivor")
	}
	io.WriteString(inW, "stop\n")
	var r stormKilledReport
	if err := json.Unmarshal([]byte(line("{")), &r); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Sockets 1 and 3 of four were on the killed node (node = i mod 2).
	if len(r.Sockets) != 2 || r.Sockets[0].Idx != 1 || r.Sockets[1].Idx != 3 {
		t.Fatalf("report of sockets %+v, want 1 and 3", r.Sockets)
	}
	for _, k := range r.Sockets {
		if k.Reconnected == 0 || k.Attempts < 1 || k.Resub.Sent+k.Resub.Unchanged != 1 || k.Resub.Bytes == 0 {
			t.Errorf("socket %+v: want back, after an attempt, its one user in the snapshot", k)
		}
	}
	if r.Errors != 0 {
		t.Errorf("errors %d: %s", r.Errors, r.FirstError)
	}

	// Its report goes into the storm's verdict: each socket's return, the
	// offlines it saw, its errors; a socket not of the killed node is refused.
	sh, sockets, _ := newStormPopulation(context.Background(), cfg)
	r.FalseAll, r.FalseSnap, r.FalseBy = 1, 1, map[string]int{"stkt-u0": 1}
	r.FalseFirst = []falseShown{{User: "stkt-u0", Snapshot: true, At: time.Unix(5, 0).UnixNano()}}
	r.Errors, r.FirstError = 2, "boom"
	if err := sh.merge(&r, sockets); err != nil {
		t.Fatal(err)
	}
	if sockets[1].reconnected.IsZero() || sockets[3].attempts < 1 || !sockets[0].reconnected.IsZero() {
		t.Errorf("sockets after the merge: %+v %+v %+v", sockets[0], sockets[1], sockets[3])
	}
	if sh.falseAll.Load() != 1 || sh.falseBy["stkt-u0"] != 1 || sh.errs.n.Load() != 2 || !strings.Contains(sh.errs.firstErr(), "boom") {
		t.Errorf("offlines %d %v, errors %d %q", sh.falseAll.Load(), sh.falseBy, sh.errs.n.Load(), sh.errs.firstErr())
	}
	if got := sh.describe(sh.falseFirst[0], time.Unix(4, 0)); got != "stkt-u0 (a survivor's user) in a snapshot at +1.00s" {
		t.Errorf("described as %q", got)
	}
	r.Sockets = []killedSocket{{Idx: 0}}
	if err := sh.merge(&r, sockets); err == nil {
		t.Error("a survivor's socket in the report: accepted")
	}
}

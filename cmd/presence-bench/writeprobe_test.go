package main

import (
	"bytes"
	"context"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"
)

// The write probe writes a status every -every and prints each write's
// latency, which readProbe reads back; a refused write is printed as
// failed. With watchers, the user holds a socket, so each write is a
// change with a version, and every watcher's delivery of it is printed.
func TestWriteProbe(t *testing.T) {
	wsURL := startNode(t, 0)
	base := "http://" + strings.TrimPrefix(wsURL, "ws://")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := writeProbe(ctx, &writeProbeConfig{urls: []string{base}, apiKey: testAPIKey, user: "wp", every: 20 * time.Millisecond}, &out); err != nil {
		t.Fatal(err)
	}
	ws, ds, err := readProbe(&out)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) < 3 || len(ds) != 0 {
		t.Fatalf("%d writes in 300 ms at one every 20 ms, %d deliveries without watchers", len(ws), len(ds))
	}
	for _, w := range ws {
		if w.took <= 0 || w.sent.Before(start) || w.sent.After(time.Now()) {
			t.Fatalf("write %+v", w)
		}
	}

	out.Reset()
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := writeProbe(ctx, &writeProbeConfig{urls: []string{base}, apiKey: "wrong", user: "wp", every: 20 * time.Millisecond}, &out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	ws, _, err = readProbe(&out)
	if err != nil || len(ws) == 0 || ws[0].took != -1 || !strings.Contains(text, "401") {
		t.Fatalf("with a wrong key: %+v %v\n%s", ws, err, text)
	}

	// Three watchers.
	u, err := url.Parse(wsURL + "/v1/ws")
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cfg := &writeProbeConfig{urls: []string{base}, apiKey: testAPIKey, user: "wpw", every: 50 * time.Millisecond,
		ws: []wsEndpoint{{url: u, dev: true}}, watchers: 3}
	if err := writeProbe(ctx, cfg, &out); err != nil {
		t.Fatal(err)
	}
	ws, ds, err = readProbe(&out)
	if err != nil {
		t.Fatal(err)
	}
	versions := map[uint64]bool{}
	for _, w := range ws {
		if w.took < 0 || w.version == 0 {
			t.Fatalf("write %+v: want a change with its version", w)
		}
		versions[w.version] = true
	}
	n := 0
	for _, d := range ds {
		if versions[d.version] {
			n++
		}
	}
	// Every write but the last few (in flight at the end) reached all three.
	if len(ws) < 10 || n < 3*(len(ws)-3) {
		t.Fatalf("%d writes, %d of %d deliveries match a write's version", len(ws), n, len(ds))
	}
}

func TestWriteProbeFlags(t *testing.T) {
	t.Setenv(writeProbeKeyEnv, "k-from-env")
	c, err := parseWriteProbe([]string{"-url", "http://127.0.0.1:1,http://127.0.0.1:2", "-api-key", "env:" + writeProbeKeyEnv, "-user", "u"}, io.Discard)
	if err != nil || c.apiKey != "k-from-env" || len(c.urls) != 2 || c.every != 50*time.Millisecond {
		t.Fatalf("%+v %v", c, err)
	}
	c, err = parseWriteProbe([]string{"-url", "http://127.0.0.1:1", "-api-key", "k", "-user", "u", "-ws", "ws://127.0.0.1:1,ws://127.0.0.1:2", "-watchers", "5", "-dev"}, io.Discard)
	if err != nil || len(c.ws) != 2 || c.watchers != 5 {
		t.Fatalf("%+v %v", c, err)
	}
	t.Setenv(jwtSecretEnv, "")
	for _, args := range [][]string{
		{"-api-key", "k", "-user", "u"},
		{"-url", "http://127.0.0.1:1", "-user", "u"},
		{"-url", "http://127.0.0.1:1", "-api-key", "k", "-user", "u", "-every", "0s"},
		{"-url", "http://127.0.0.1:1", "-api-key", "k", "-user", "u", "-for", "2h"},
		{"-url", "http://127.0.0.1:1", "-api-key", "k", "-user", "u", "-watchers", "2000", "-dev"},
		{"-url", "http://127.0.0.1:1", "-api-key", "k", "-user", "u", "-watchers", "2", "-ws", "ws://127.0.0.1:1"}, // no -dev, no secret
	} {
		if _, err := parseWriteProbe(args, io.Discard); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
	for _, line := range []string{"12 x\n", "w 12 x\n", "d 1\n", "w 1 2 v\n"} {
		if _, _, err := readProbe(strings.NewReader(line)); err == nil {
			t.Errorf("%q read", line)
		}
	}
}

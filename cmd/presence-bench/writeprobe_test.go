package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// The write probe writes a status every -every and prints each write's
// latency, which readProbeWrites reads back; a refused write is printed
// as failed.
func TestWriteProbe(t *testing.T) {
	base := "http://" + strings.TrimPrefix(startNode(t, 0), "ws://")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	writeProbe(ctx, &writeProbeConfig{urls: []string{base}, apiKey: testAPIKey, user: "wp", every: 20 * time.Millisecond, dur: time.Second}, &out)
	ws, err := readProbeWrites(&out)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) < 3 {
		t.Fatalf("%d writes in 300 ms at one every 20 ms:\n%s", len(ws), out.String())
	}
	for _, w := range ws {
		if w.took <= 0 || w.sent.Before(start) || w.sent.After(time.Now()) {
			t.Fatalf("write %+v", w)
		}
	}

	out.Reset()
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	writeProbe(ctx, &writeProbeConfig{urls: []string{base}, apiKey: "wrong", user: "wp", every: 20 * time.Millisecond, dur: time.Second}, &out)
	text := out.String()
	ws, err = readProbeWrites(&out)
	if err != nil || len(ws) == 0 || ws[0].took != -1 || !strings.Contains(text, "401") {
		t.Fatalf("with a wrong key: %+v %v\n%s", ws, err, text)
	}
}

func TestWriteProbeFlags(t *testing.T) {
	t.Setenv(writeProbeKeyEnv, "k-from-env")
	c, err := parseWriteProbe([]string{"-url", "http://127.0.0.1:1,http://127.0.0.1:2", "-api-key", "env:" + writeProbeKeyEnv, "-user", "u"}, io.Discard)
	if err != nil || c.apiKey != "k-from-env" || len(c.urls) != 2 || c.every != 50*time.Millisecond {
		t.Fatalf("%+v %v", c, err)
	}
	for _, args := range [][]string{
		{"-api-key", "k", "-user", "u"},
		{"-url", "http://127.0.0.1:1", "-user", "u"},
		{"-url", "http://127.0.0.1:1", "-api-key", "k", "-user", "u", "-every", "0s"},
		{"-url", "http://127.0.0.1:1", "-api-key", "k", "-user", "u", "-for", "2h"},
	} {
		if _, err := parseWriteProbe(args, io.Discard); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
	if _, err := readProbeWrites(strings.NewReader("12 x\n")); err == nil {
		t.Error("a bad line read")
	}
}

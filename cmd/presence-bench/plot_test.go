package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// wellFormed parses an SVG document to its end and returns the text of
// its <title> elements.
func wellFormed(t *testing.T, b []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var titles []string
	inTitle, root := false, ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, b)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tk.Name.Local
			}
			inTitle = tk.Name.Local == "title"
		case xml.EndElement:
			inTitle = false
		case xml.CharData:
			if inTitle {
				titles = append(titles, string(tk))
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q", root)
	}
	return titles
}

func TestPlot(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	files := []string{
		write("fanout-1.json", `{"scenario":"fanout","latency":{"samples":10,"p50_ms":0.8,"p99_ms":2.5,"p999_ms":4,"max_ms":9.5},
			"baseline":{"latency":{"p50_ms":0.2,"p99_ms":0.9,"p999_ms":1.1,"max_ms":3}}}`),
		write("churn.json", `{"scenario":"churn","lag":{"p50_ms":40,"p99_ms":120,"max_ms":300},"ttl_ms":5000}`),
		// two connections runs in one file, one in another; a field missing
		write("conn-a.json", `{"scenario":"connections","n":1000,"held":1000,"rss_bytes_per_conn":20480,"heap_inuse_bytes_per_conn":8192}
			{"scenario":"connections","n":15000,"held":14990,"rss_bytes_per_conn":18432}`),
		write("conn-b.json", `[{"scenario":"connections","n":5000,"held":5000,"rss_bytes_per_conn":19000,"heap_inuse_bytes_per_conn":8000}]`),
		// a scenario whose fields the plot does not know: tolerated
		write("batch.json", `{"scenario":"batch","reads_per_sec":1200,"latency":{"count":5,"p50_ms":1.5,"p99_ms":7}}`),
		write("limits.json", `{"scenario":"limits","redis_setex_per_sec":90000}`),
	}
	out := filepath.Join(dir, "img")
	var stdout, stderr bytes.Buffer
	if code := runPlotCmd(append([]string{"-o", out}, files...), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if got := strings.Fields(stdout.String()); len(got) != 2 {
		t.Fatalf("written: %q", got)
	}
	lat, err := os.ReadFile(filepath.Join(out, "latency.svg"))
	if err != nil {
		t.Fatal(err)
	}
	titles := strings.Join(wellFormed(t, lat), "\n")
	for _, want := range []string{
		"fanout fanout-1 latency\n", "fanout fanout-1 baseline.latency\n", "churn churn lag\n", "batch batch latency\n",
		"fanout fanout-1 latency p99.9: 4 ms", "churn churn lag max: 300 ms",
	} {
		if !strings.Contains(titles+"\n", want) {
			t.Errorf("latency.svg lacks %q; titles:\n%s", want, titles)
		}
	}
	if strings.Contains(titles, "churn churn lag p99.9") {
		t.Error("a bar for a missing p99.9")
	}
	mem, err := os.ReadFile(filepath.Join(out, "memory.svg"))
	if err != nil {
		t.Fatal(err)
	}
	titles = strings.Join(wellFormed(t, mem), "\n")
	for _, want := range []string{
		"RSS\n", "heap in use\n",
		"connections conn-a#1 RSS: 20 KiB/conn at 1000 connections",
		"connections conn-a#2 RSS: 18 KiB/conn at 14990 connections",
		"connections conn-b RSS: 18.55 KiB/conn at 5000 connections",
		"connections conn-a#1 heap in use: 8 KiB/conn at 1000 connections",
	} {
		if !strings.Contains(titles+"\n", want) {
			t.Errorf("memory.svg lacks %q; titles:\n%s", want, titles)
		}
	}
	if strings.Contains(titles, "conn-a#2 heap") {
		t.Error("a heap point for a result without heap figures")
	}
	// The RSS line goes through the runs in order of connections.
	i1, i2, i3 := strings.Index(titles, "conn-a#1 RSS"), strings.Index(titles, "conn-b RSS"), strings.Index(titles, "conn-a#2 RSS")
	if !(i1 < i2 && i2 < i3) {
		t.Errorf("points not sorted by connections:\n%s", titles)
	}
}

func TestPlotRefuses(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"scenario":`), 0o644)
	none := filepath.Join(dir, "none.json")
	os.WriteFile(none, []byte(`{"scenario":"limits"}`), 0o644)
	for _, args := range [][]string{
		{},                         // no files
		{"-o", dir, bad},           // not JSON
		{"-o", dir, none},          // nothing to plot
		{"-o", dir, dir + "/nope"}, // missing
	} {
		if code := runPlotCmd(args, io.Discard, io.Discard); code == 0 {
			t.Errorf("%q: exit 0", args)
		}
	}
}

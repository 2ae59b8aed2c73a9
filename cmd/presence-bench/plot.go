package main

// The plot command: SVG figures from the -json results of any scenario.
//
//	presence-bench plot -o docs/img results/*.json
//
// It writes, in the -o directory,
//
//   - latency.svg: grouped bars of p50, p99, p99.9 and max (milliseconds,
//     log scale), one group per latency summary found in the results. A
//     latency summary is any JSON object with at least one of p50_ms,
//     p99_ms, p999_ms and max_ms, at any depth (fanout's latency and
//     baseline.latency, churn's lag, the latency of batch and heartbeats…),
//     named by its scenario, its file and its path;
//   - memory.svg: RSS and Go heap in use per connection (KiB) against the
//     connection count, one point per connections result (held, or n; fields
//     rss_bytes_per_conn, heap_inuse_bytes_per_conn).
//
// A file may hold one result object, several one after the other, or an
// array of them. Missing fields are skipped, not errors; a figure without
// data is not written. The SVG is written by hand: no dependencies.

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

const maxPlotFiles = 1000

// plotResult is one result object read from a file.
type plotResult struct {
	label string
	obj   map[string]any
}

// latSeries is one latency summary: its name and its four figures (NaN
// when absent).
type latSeries struct {
	name string
	vals [4]float64 // p50, p99, p99.9, max in ms
}

var latKeys = [4]string{"p50_ms", "p99_ms", "p999_ms", "max_ms"}
var latNames = [4]string{"p50", "p99", "p99.9", "max"}

// memPoint is one connections result.
type memPoint struct {
	label   string
	conns   float64
	rssKiB  float64 // NaN when absent
	heapKiB float64
}

func runPlotCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("presence-bench plot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", ".", "directory for latency.svg and memory.svg")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	files := fs.Args()
	if len(files) == 0 || len(files) > maxPlotFiles {
		fmt.Fprintf(stderr, "presence-bench plot: give 1 to %d -json result files\n", maxPlotFiles)
		return 2
	}
	written, err := plotFiles(*out, files)
	if err != nil {
		fmt.Fprintf(stderr, "presence-bench plot: %v\n", err)
		return 1
	}
	if len(written) == 0 {
		fmt.Fprintln(stderr, "presence-bench plot: no latency nor connections figures in these files")
		return 1
	}
	for _, w := range written {
		fmt.Fprintln(stdout, w)
	}
	return 0
}

// plotFiles reads files and writes the figures into dir; it returns the
// paths written.
func plotFiles(dir string, files []string) ([]string, error) {
	var results []plotResult
	for _, f := range files {
		rs, err := readResults(f)
		if err != nil {
			return nil, err
		}
		results = append(results, rs...)
	}
	lat, mem := collect(results)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	if len(lat) > 0 {
		p := filepath.Join(dir, "latency.svg")
		if err := os.WriteFile(p, latencySVG(lat), 0o644); err != nil {
			return nil, err
		}
		written = append(written, p)
	}
	if len(mem) > 0 {
		p := filepath.Join(dir, "memory.svg")
		if err := os.WriteFile(p, memorySVG(mem), 0o644); err != nil {
			return nil, err
		}
		written = append(written, p)
	}
	return written, nil
}

// readResults reads the JSON objects of one file.
func readResults(path string) ([]plotResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) > 64<<20 {
		return nil, fmt.Errorf("%s: larger than 64 MiB", path)
	}
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	dec := json.NewDecoder(bytes.NewReader(b))
	var objs []map[string]any
	for {
		var v any
		if err := dec.Decode(&v); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch v := v.(type) {
		case map[string]any:
			objs = append(objs, v)
		case []any:
			for _, e := range v {
				if o, ok := e.(map[string]any); ok {
					objs = append(objs, o)
				}
			}
		}
	}
	var out []plotResult
	for i, o := range objs {
		sc, _ := o["scenario"].(string)
		if sc == "" {
			sc = "?"
		}
		label := sc + " " + base
		if len(objs) > 1 {
			label += fmt.Sprintf("#%d", i+1)
		}
		out = append(out, plotResult{label: label, obj: o})
	}
	return out, nil
}

// collect finds the latency summaries and the memory points.
func collect(results []plotResult) ([]latSeries, []memPoint) {
	var lat []latSeries
	var mem []memPoint
	for _, r := range results {
		walkLatency(r.obj, "", func(path string, vals [4]float64) {
			name := r.label
			if path != "" {
				name += " " + path
			}
			lat = append(lat, latSeries{name: name, vals: vals})
		})
		if sc, _ := r.obj["scenario"].(string); sc == "connections" {
			n, ok := num(r.obj, "held")
			if !ok || n <= 0 {
				n, ok = num(r.obj, "n")
			}
			if !ok || n <= 0 {
				continue
			}
			p := memPoint{label: r.label, conns: n, rssKiB: math.NaN(), heapKiB: math.NaN()}
			if v, ok := num(r.obj, "rss_bytes_per_conn"); ok {
				p.rssKiB = v / 1024
			}
			if v, ok := num(r.obj, "heap_inuse_bytes_per_conn"); ok {
				p.heapKiB = v / 1024
			}
			if !math.IsNaN(p.rssKiB) || !math.IsNaN(p.heapKiB) {
				mem = append(mem, p)
			}
		}
	}
	slices.SortStableFunc(mem, func(a, b memPoint) int {
		switch {
		case a.conns < b.conns:
			return -1
		case a.conns > b.conns:
			return 1
		}
		return 0
	})
	return lat, mem
}

// walkLatency calls found for every object under v with latency keys, in
// a stable (sorted) order.
func walkLatency(v any, path string, found func(path string, vals [4]float64)) {
	switch v := v.(type) {
	case map[string]any:
		vals, has := [4]float64{}, false
		for i, k := range latKeys {
			vals[i] = math.NaN()
			if f, ok := num(v, k); ok && f >= 0 {
				vals[i], has = f, true
			}
		}
		if has {
			found(path, vals)
			return
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			walkLatency(v[k], p, found)
		}
	case []any:
		for i, e := range v {
			walkLatency(e, fmt.Sprintf("%s[%d]", path, i), found)
		}
	}
}

func num(o map[string]any, k string) (float64, bool) {
	f, ok := o[k].(float64)
	return f, ok && !math.IsNaN(f) && !math.IsInf(f, 0)
}

// svg is a small SVG writer.
type svg struct{ b bytes.Buffer }

func newSVG(w, h int) *svg {
	s := &svg{}
	fmt.Fprintf(&s.b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&s.b, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", w, h)
	return s
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

func (s *svg) text(x, y float64, anchor, extra, t string) {
	fmt.Fprintf(&s.b, `<text x="%.1f" y="%.1f" text-anchor="%s"%s>%s</text>`+"\n", x, y, anchor, extra, esc(t))
}

func (s *svg) line(x1, y1, x2, y2 float64, stroke string) {
	fmt.Fprintf(&s.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x1, y1, x2, y2, stroke)
}

func (s *svg) bytes() []byte {
	s.b.WriteString("</svg>\n")
	return s.b.Bytes()
}

var plotColors = [4]string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2"}

// latencySVG draws grouped bars, log scale, one group per series.
func latencySVG(series []latSeries) []byte {
	const (
		left, right, top = 70.0, 20.0, 50.0
		groupW, barW     = 90.0, 18.0
		plotH            = 320.0
	)
	longest := 0
	for _, s := range series {
		longest = max(longest, len([]rune(s.name)))
	}
	labelH := 7*float64(longest) + 20 // names written upward under their group
	w := left + right + groupW*float64(len(series))
	w = max(w, 480)
	h := top + plotH + labelH
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, v := range s.vals {
			if !math.IsNaN(v) && v > 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	y := func(v float64) float64 {
		v = max(v, math.Pow(10, dlo))
		return top + plotH - (math.Log10(v)-dlo)/(dhi-dlo)*plotH
	}
	s := newSVG(int(w), int(h))
	s.text(w/2, 22, "middle", ` font-size="15"`, "Latency percentiles (ms, log scale)")
	for d := dlo; d <= dhi; d++ {
		yy := y(math.Pow(10, d))
		s.line(left, yy, w-right, yy, "#dddddd")
		s.text(left-6, yy+4, "end", "", trimFloat(math.Pow(10, d)))
	}
	s.line(left, top, left, top+plotH, "black")
	s.line(left, top+plotH, w-right, top+plotH, "black")
	for i, name := range latNames { // legend
		x := left + 10 + float64(i)*70
		fmt.Fprintf(&s.b, `<rect x="%.1f" y="32" width="10" height="10" fill="%s"/>`+"\n", x, plotColors[i])
		s.text(x+14, 41, "start", "", name)
	}
	for g, ser := range series {
		x0 := left + float64(g)*groupW + (groupW-4*barW)/2
		fmt.Fprintf(&s.b, `<g class="series"><title>%s</title>`+"\n", esc(ser.name))
		for i, v := range ser.vals {
			if math.IsNaN(v) {
				continue
			}
			yy := y(v)
			fmt.Fprintf(&s.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s ms</title></rect>`+"\n",
				x0+float64(i)*barW, yy, barW-2, top+plotH-yy, plotColors[i], esc(ser.name), latNames[i], trimFloat(v))
		}
		cx, cy := left+float64(g)*groupW+groupW/2, top+plotH+8
		fmt.Fprintf(&s.b, `<text x="%.1f" y="%.1f" text-anchor="end" dominant-baseline="middle" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n", cx, cy, cx, cy, esc(ser.name))
		s.b.WriteString("</g>\n")
	}
	return s.bytes()
}

// memorySVG draws RSS and heap per connection against connections.
func memorySVG(pts []memPoint) []byte {
	const (
		w, h                     = 640.0, 400.0
		left, right, top, bottom = 70.0, 30.0, 50.0, 50.0
	)
	xmax, ymax := 0.0, 0.0
	for _, p := range pts {
		xmax = max(xmax, p.conns)
		for _, v := range []float64{p.rssKiB, p.heapKiB} {
			if !math.IsNaN(v) {
				ymax = max(ymax, v)
			}
		}
	}
	xmax, ymax = niceCeil(xmax), niceCeil(max(ymax, 1))
	px := func(v float64) float64 { return left + v/xmax*(w-left-right) }
	py := func(v float64) float64 { return top + (h - top - bottom) - max(v, 0)/ymax*(h-top-bottom) }
	s := newSVG(int(w), int(h))
	s.text(w/2, 22, "middle", ` font-size="15"`, "Server memory per connection (KiB)")
	for i := 0; i <= 5; i++ {
		v := ymax * float64(i) / 5
		s.line(left, py(v), w-right, py(v), "#dddddd")
		s.text(left-6, py(v)+4, "end", "", trimFloat(v))
		xv := xmax * float64(i) / 5
		s.text(px(xv), h-bottom+16, "middle", "", trimFloat(xv))
	}
	s.line(left, top, left, h-bottom, "black")
	s.line(left, h-bottom, w-right, h-bottom, "black")
	s.text(w/2, h-10, "middle", "", "connections held")
	for k, name := range []string{"RSS", "heap in use"} {
		get := func(p memPoint) float64 { return p.rssKiB }
		if k == 1 {
			get = func(p memPoint) float64 { return p.heapKiB }
		}
		var path []string
		for _, p := range pts {
			if v := get(p); !math.IsNaN(v) {
				path = append(path, fmt.Sprintf("%.1f,%.1f", px(p.conns), py(v)))
			}
		}
		if len(path) == 0 {
			continue
		}
		fmt.Fprintf(&s.b, `<g class="series"><title>%s</title>`+"\n", name)
		fmt.Fprintf(&s.b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", plotColors[k], strings.Join(path, " "))
		for _, p := range pts {
			if v := get(p); !math.IsNaN(v) {
				fmt.Fprintf(&s.b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s: %s KiB/conn at %s connections</title></circle>`+"\n",
					px(p.conns), py(v), plotColors[k], esc(p.label+" "+name), trimFloat(v), trimFloat(p.conns))
			}
		}
		s.b.WriteString("</g>\n")
		x := left + 10 + float64(k)*110
		fmt.Fprintf(&s.b, `<rect x="%.1f" y="32" width="10" height="10" fill="%s"/>`+"\n", x, plotColors[k])
		s.text(x+14, 41, "start", "", name)
	}
	return s.bytes()
}

// niceCeil rounds v up to 1, 2 or 5 × a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// trimFloat prints v with at most 3 significant decimals.
func trimFloat(v float64) string {
	switch {
	case v >= 100 || v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

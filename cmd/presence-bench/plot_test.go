package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// svgDoc is what a test reads back from a figure: the text it shows and
// the styles of its strokes.
type svgDoc struct {
	texts []string
	paths []svgPath
}

type svgPath struct{ d, style string }

// readSVG parses an SVG document to its end (it must be well-formed XML
// with an <svg> root) and returns its texts and path styles.
func readSVG(t *testing.T, path string) svgDoc {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	var doc svgDoc
	root, inText := "", false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: not well-formed XML: %v", path, err)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tk.Name.Local
			}
			inText = tk.Name.Local == "text"
			if tk.Name.Local == "path" {
				var p svgPath
				for _, a := range tk.Attr {
					switch a.Name.Local {
					case "d":
						p.d = a.Value
					case "style":
						p.style = a.Value
					}
				}
				doc.paths = append(doc.paths, p)
			}
		case xml.EndElement:
			inText = false
		case xml.CharData:
			if inText {
				doc.texts = append(doc.texts, string(tk))
			}
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root element %q", path, root)
	}
	return doc
}

// hasGoalLine reports whether a dashed horizontal stroke in the goal's
// colour runs across most of the figure (the legend's sample of it is
// 20 points long).
// hasGoalLine reports a dashed horizontal goal line at least minLen
// points long.
func (d svgDoc) hasGoalLine(minLen float64) bool {
	return slices.ContainsFunc(d.paths, func(p svgPath) bool {
		if !strings.Contains(p.style, "stroke:#C01C28") || !strings.Contains(p.style, "stroke-dasharray") {
			return false
		}
		var x1, y1, x2, y2 float64
		if _, err := fmt.Sscanf(p.d, "M%g,%gL%g,%g", &x1, &y1, &x2, &y2); err != nil {
			return false
		}
		return y1 == y2 && x2-x1 > minLen
	})
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlot(t *testing.T) {
	dir := t.TempDir()
	files := []string{
		writeFile(t, dir, "mem.json", `{"kind":"lines","title":"Memory per idle connection","x_label":"connections held",
			"y_label":"KiB RSS per connection","unit":" KiB","log_y":true,
			"goal":{"value":2.5,"label":"goal ≤ 2.5 KiB"},
			"series":[{"name":"presenced","points":[[2500,4.1],[15000,3.5]]},{"name":"Centrifugo 6.3.1","points":[[2500,33.2],[15000,31.4]]}],
			"date":"2026-11-25","commit":"abc1234","machine":"2 vCPU","commands":["peerbench conns …"],"raw":{"any":["thing"]}}`),
		writeFile(t, dir, "lat.json", `{"kind":"bars","title":"Fan-out to 500 watchers","y_label":"latency (ms)","unit":" ms",
			"groups":["p50","p99"],"goal":{"value":50,"label":"goal: p99 ≤ 50 ms"},
			"series":[{"name":"presenced","values":[5.54,10.9]},{"name":"Centrifugo & co","values":[5.06,8.9]},{"name":"naive","values":[0.25,1234.5]}]}`),
		// no goal: drawn without one
		writeFile(t, dir, "nogoal.json", `{"kind":"bars","title":"t","y_label":"µs","groups":["per beat"],
			"series":[{"name":"only","values":[0.25]}]}`),
	}
	out := filepath.Join(dir, "img")
	var stdout, stderr bytes.Buffer
	if code := runPlotCmd(append([]string{"-o", out}, files...), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := []string{filepath.Join(out, "mem.svg"), filepath.Join(out, "lat.svg"), filepath.Join(out, "nogoal.svg")}
	if got := strings.Fields(stdout.String()); !slices.Equal(got, want) {
		t.Fatalf("written %q, want %q", got, want)
	}

	mem := readSVG(t, want[0])
	for _, s := range []string{"Memory per idle connection", "connections held", "KiB RSS per connection",
		"presenced", "Centrifugo 6.3.1", "goal ≤ 2.5 KiB",
		"2,500", "15,000", // the x ticks: the counts measured
		"4.1 KiB", "31.4 KiB", // every point labelled
		"1", "2", "5", "10", "20"} { // the log axis at 1-2-5
		if !slices.Contains(mem.texts, s) {
			t.Errorf("mem.svg lacks the text %q; it has %q", s, mem.texts)
		}
	}
	if !mem.hasGoalLine(float64(figureWidth.Points()) / 2) {
		t.Error("mem.svg: no dashed goal line")
	}

	lat := readSVG(t, want[1])
	for _, s := range []string{"Fan-out to 500 watchers", "presenced", "Centrifugo & co", "naive", "goal: p99 ≤ 50 ms",
		"p50", "p99", "5.54 ms", "8.9 ms", "0.25 ms", "1,235 ms"} {
		if !slices.Contains(lat.texts, s) {
			t.Errorf("lat.svg lacks the text %q; it has %q", s, lat.texts)
		}
	}
	if !lat.hasGoalLine(float64(figureWidth.Points()) / 2) {
		t.Error("lat.svg: no dashed goal line")
	}

	ng := readSVG(t, want[2])
	if ng.hasGoalLine(0) || !slices.Contains(ng.texts, "only") {
		t.Errorf("nogoal.svg: goal line %v, texts %q", ng.hasGoalLine(0), ng.texts)
	}
	// A reader without Liberation Sans gets a metric-compatible font.
	b, _ := os.ReadFile(want[1])
	if !bytes.Contains(b, []byte("font-family:'Liberation Sans',Arial,Helvetica,sans-serif;")) ||
		bytes.Contains(b, []byte("font-family:Liberation")) {
		t.Error("lat.svg: the font family has no fallback")
	}
}

// TestPlotEdges: figures at the edges of what may be drawn — all zeros on
// a linear axis, one point on a log axis at x = 0 — are drawn, not refused
// nor crashed on.
func TestPlotEdges(t *testing.T) {
	dir := t.TempDir()
	files := []string{
		writeFile(t, dir, "zero.json", `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"series":[{"name":"nothing","values":[0]}]}`),
		writeFile(t, dir, "one.json", `{"kind":"lines","title":"t","x_label":"x","y_label":"y","log_y":true,"series":[{"name":"alone","points":[[0,3]]}]}`),
	}
	var stderr bytes.Buffer
	if code := runPlotCmd(append([]string{"-o", dir}, files...), io.Discard, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for name, want := range map[string]string{"zero.svg": "nothing", "one.svg": "alone"} {
		if doc := readSVG(t, filepath.Join(dir, name)); !slices.Contains(doc.texts, want) {
			t.Errorf("%s lacks %q: %q", name, want, doc.texts)
		}
	}
}

// TestPlotDocs draws the figures committed in docs/img and checks that the
// committed images show the same series and goal: a figure file changed
// without its image redrawn (or the other way round) fails here.
func TestPlotDocs(t *testing.T) {
	files, err := filepath.Glob("../../docs/img/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no figures in docs/img: %v", err)
	}
	out := t.TempDir()
	var stderr bytes.Buffer
	if code := runPlotCmd(append([]string{"-o", out}, files...), io.Discard, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, f := range files {
		fig, err := readFigure(f)
		if err != nil {
			t.Fatal(err)
		}
		if fig.Date == "" || fig.Commit == "" || fig.Machine == "" || len(fig.Commands) == 0 {
			t.Errorf("%s: date, commit, machine and commands are required of a committed figure", f)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".json") + ".svg"
		drawn := readSVG(t, filepath.Join(out, name))
		committed := readSVG(t, filepath.Join(filepath.Dir(f), name))
		if !slices.Equal(drawn.texts, committed.texts) {
			t.Errorf("docs/img/%s is not what %s draws: redraw it with presence-bench plot -o docs/img docs/img/*.json\ncommitted: %q\ndrawn:     %q",
				name, f, committed.texts, drawn.texts)
		}
		// Across the figure, or across its group's slot (a p99 goal).
		minLen := float64(figureWidth.Points()) / 2
		if fig.Goal != nil && fig.Goal.Group != "" {
			minLen /= float64(len(fig.Groups))
		}
		if fig.Goal != nil && !committed.hasGoalLine(minLen) {
			t.Errorf("docs/img/%s: no goal line", name)
		}
		// The legend has its band above the data: no grid line and no
		// goal (both drawn inside the data) runs through it.
		_, l, err := fig.render()
		if err != nil {
			t.Fatal(err)
		}
		if l.legend.Min.Y < l.data.Max.Y || l.legend.Max.Y > figureHeight || l.legend.Max.Y <= l.legend.Min.Y {
			t.Errorf("%s: legend %v overlaps the data %v or leaves the page", name, l.legend, l.data)
		}
	}
}

// A goal about one group of bars (a p99 goal) spans that group's bars and
// no other group's.
func TestPlotGoalOfOneGroup(t *testing.T) {
	for i := range 3 {
		lo, hi := goalSpan(i)
		// The bars of group i lie within i ± 0.35 (70% of its slot).
		if lo > float64(i)-0.35 || hi < float64(i)+0.35 || lo <= float64(i)-0.5 || hi >= float64(i)+0.5 {
			t.Errorf("goalSpan(%d) = [%v, %v]: not group %d's bars alone", i, lo, hi, i)
		}
	}
	fig := &figure{Kind: "bars", Title: "t", YLabel: "y", Groups: []string{"p50", "p99"},
		Goal: &goal{Value: 1, Label: "goal: p99 ≤ 1", Group: "p99"}, Series: []series{{Name: "s", Values: []float64{0.5, 2}}}}
	if err := fig.check(); err != nil {
		t.Fatal(err)
	}
	b, err := fig.svg()
	if err != nil || !bytes.Contains(b, []byte("goal: p99")) {
		t.Fatalf("svg: %v", err)
	}
}

func TestPlotRefuses(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.json", `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"series":[{"name":"s","values":[1]}]}`)
	bad := map[string]string{
		"notjson":   `{"kind":`,
		"two":       `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"series":[{"name":"s","values":[1]}]} {}`,
		"unknown":   `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"series":[{"name":"s","values":[1]}],"colour":"red"}`,
		"kind":      `{"kind":"pie","title":"t","y_label":"y","groups":["a"],"series":[{"name":"s","values":[1]}]}`,
		"noseries":  `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"series":[]}`,
		"noname":    `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"series":[{"values":[1]}]}`,
		"count":     `{"kind":"bars","title":"t","y_label":"y","groups":["a","b"],"series":[{"name":"s","values":[1]}]}`,
		"negative":  `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"series":[{"name":"s","values":[-1]}]}`,
		"logzero":   `{"kind":"lines","title":"t","x_label":"x","y_label":"y","log_y":true,"series":[{"name":"s","points":[[1,0]]}]}`,
		"nopoints":  `{"kind":"lines","title":"t","x_label":"x","y_label":"y","series":[{"name":"s","points":[]}]}`,
		"goallabel": `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"goal":{"value":1},"series":[{"name":"s","values":[1]}]}`,
		"notitle":   `{"kind":"bars","y_label":"y","groups":["a"],"series":[{"name":"s","values":[1]}]}`,
		"goalgroup": `{"kind":"bars","title":"t","y_label":"y","groups":["a"],"goal":{"value":1,"label":"g","group":"b"},"series":[{"name":"s","values":[1]}]}`,
		"linegroup": `{"kind":"lines","title":"t","x_label":"x","y_label":"y","goal":{"value":1,"label":"g","group":"a"},"series":[{"name":"s","points":[[1,1]]}]}`,
	}
	out := filepath.Join(dir, "out")
	for name, body := range bad {
		p := writeFile(t, dir, name+".json", body)
		var stderr bytes.Buffer
		// the good file first: nothing is written when any file is bad
		if code := runPlotCmd([]string{"-o", out, good, p}, io.Discard, &stderr); code != 1 {
			t.Errorf("%s: exit %d, want 1", name, code)
		}
		if !strings.Contains(stderr.String(), name+".json") {
			t.Errorf("%s: the error does not name the file: %s", name, stderr.String())
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("something was written for bad input: %v", err)
	}
	for _, args := range [][]string{{}, {"-o", out, filepath.Join(dir, "missing.json")}, {"-bogus"}} {
		if code := runPlotCmd(args, io.Discard, io.Discard); code == 0 {
			t.Errorf("%q: exit 0", args)
		}
	}
}

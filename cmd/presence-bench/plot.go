package main

// The plot command: one SVG figure per JSON file of measured figures.
//
//	presence-bench plot -o docs/img docs/img/*.json
//
// Each file (docs/img/memory.json is one) holds the figures of one
// question — memory per connection, fan-out latency, batch-read latency,
// Redis CPU per heartbeat — with where they come from (date, commit,
// machine, the exact commands), and is drawn to the -o directory under
// the same base name with .svg. Two kinds of figure:
//
//   - "lines": one line per series through its (x, y) points, e.g. KiB
//     per connection against connections held, one line for presenced
//     and one for Centrifugo;
//   - "bars": groups of bars, one group per entry of "groups" (p50, p99),
//     one bar per series in each group.
//
// Every figure may carry a goal, drawn as a dashed horizontal line named
// in the legend — across the whole figure, or in a bars figure across the
// one group it is about ("group": "p99") — and every bar and point is
// labelled with its value. The legend has a band of its own between the
// title and the data, so that no grid line or goal runs through it.
// Drawing is gonum.org/v1/plot's. The figures are sized for the width of
// a documentation page (8 × 4.5 in, ~770 px).

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

const (
	maxPlotFiles     = 100
	maxFigureBytes   = 1 << 20
	maxFigureSeries  = 8
	maxFigurePoints  = 100
	figureWidth      = 8 * vg.Inch
	figureHeight     = 4.5 * vg.Inch
	figureFontFamily = "Liberation Sans"
)

// figure is one file of measured figures. The provenance fields are not
// drawn; they say where the figures come from.
type figure struct {
	Kind   string   `json:"kind"` // "lines" or "bars"
	Title  string   `json:"title"`
	XLabel string   `json:"x_label"`
	YLabel string   `json:"y_label"`
	Unit   string   `json:"unit"`   // after each value label: "ms", " KiB"
	LogY   bool     `json:"log_y"`  // a log scale for the values
	Groups []string `json:"groups"` // bars: the name under each group
	Goal   *goal    `json:"goal"`
	Series []series `json:"series"`

	Date     string          `json:"date"`
	Commit   string          `json:"commit"`
	Machine  string          `json:"machine"`
	Commands []string        `json:"commands"`
	Notes    string          `json:"notes"`
	Raw      json.RawMessage `json:"raw"` // the tools' own output, kept as it was
}

type goal struct {
	Value float64 `json:"value"`
	Label string  `json:"label"`
	Group string  `json:"group"` // bars: the group it is about (p99), "" all
}

type series struct {
	Name   string       `json:"name"`
	Points [][2]float64 `json:"points"` // lines: (x, y)
	Values []float64    `json:"values"` // bars: one per group
}

func runPlotCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("presence-bench plot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", ".", "directory the SVG files are written to (NAME.json → NAME.svg)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: presence-bench plot [-o dir] figures.json…")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	files := fs.Args()
	if len(files) == 0 || len(files) > maxPlotFiles {
		fmt.Fprintf(stderr, "presence-bench plot: give 1 to %d figure files\n", maxPlotFiles)
		return 2
	}
	written, err := plotFiles(*out, files)
	if err != nil {
		fmt.Fprintf(stderr, "presence-bench plot: %v\n", err)
		return 1
	}
	for _, w := range written {
		fmt.Fprintln(stdout, w)
	}
	return 0
}

// plotFiles reads every file before it writes anything, so that one bad
// file leaves the directory as it was; it returns the paths written.
func plotFiles(dir string, files []string) ([]string, error) {
	figs := make([]*figure, len(files))
	for i, f := range files {
		fig, err := readFigure(f)
		if err != nil {
			return nil, err
		}
		figs[i] = fig
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	for i, f := range files {
		b, err := figs[i].svg()
		if err != nil {
			return written, fmt.Errorf("%s: %w", f, err)
		}
		p := filepath.Join(dir, strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))+".svg")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	return written, nil
}

func readFigure(path string) (*figure, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) > maxFigureBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxFigureBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var fig figure
	if err := dec.Decode(&fig); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: more than one JSON value", path)
	}
	if err := fig.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &fig, nil
}

// check refuses a figure that cannot be drawn truthfully.
func (f *figure) check() error {
	if f.Title == "" || f.YLabel == "" {
		return errors.New("title and y_label are required")
	}
	if len(f.Series) == 0 || len(f.Series) > maxFigureSeries {
		return fmt.Errorf("give 1 to %d series", maxFigureSeries)
	}
	val := func(what string, v float64, logScale bool) error {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || (logScale && v == 0) {
			return fmt.Errorf("%s: %v is not a value this figure can show", what, v)
		}
		return nil
	}
	if f.Goal != nil {
		if f.Goal.Label == "" {
			return errors.New("the goal needs a label")
		}
		if err := val("goal", f.Goal.Value, f.LogY); err != nil {
			return err
		}
		if f.Goal.Group != "" && (f.Kind != "bars" || !slices.Contains(f.Groups, f.Goal.Group)) {
			return fmt.Errorf("the goal's group %q is not a group of this bars figure", f.Goal.Group)
		}
	}
	for _, s := range f.Series {
		if s.Name == "" {
			return errors.New("every series needs a name")
		}
		switch f.Kind {
		case "lines":
			if len(s.Points) == 0 || len(s.Points) > maxFigurePoints || len(s.Values) != 0 {
				return fmt.Errorf("series %q: a lines figure takes 1 to %d points and no values", s.Name, maxFigurePoints)
			}
			for _, p := range s.Points {
				if err := val("series "+s.Name+" x", p[0], false); err != nil {
					return err
				}
				if err := val("series "+s.Name, p[1], f.LogY); err != nil {
					return err
				}
			}
		case "bars":
			if len(s.Values) != len(f.Groups) || len(s.Points) != 0 {
				return fmt.Errorf("series %q: a bars figure takes one value per group (%d) and no points", s.Name, len(f.Groups))
			}
			for _, v := range s.Values {
				if err := val("series "+s.Name, v, f.LogY); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("kind %q: want lines or bars", f.Kind)
		}
	}
	if f.Kind == "bars" && (len(f.Groups) == 0 || len(f.Groups) > maxFigurePoints) {
		return fmt.Errorf("a bars figure takes 1 to %d groups", maxFigurePoints)
	}
	if f.Kind == "lines" && f.XLabel == "" {
		return errors.New("a lines figure needs an x_label")
	}
	return nil
}

// seriesColors: presenced first, its peer second, the naive design third.
var seriesColors = []color.RGBA{
	{0x1f, 0x6f, 0xb4, 0xff}, // blue
	{0xe6, 0x7e, 0x0e, 0xff}, // orange
	{0x80, 0x80, 0x80, 0xff}, // grey
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0x94, 0x67, 0xbd, 0xff},
	{0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff},
	{0x17, 0xbe, 0xcf, 0xff},
}

// figureFont is gonum's Liberation Sans (metric-compatible with Arial).
var figureFont = font.Font{Typeface: "Liberation", Variant: "Sans"}

var goalColor = color.RGBA{0xc0, 0x1c, 0x28, 0xff}

// svg draws the figure.
func (f *figure) svg() ([]byte, error) {
	b, _, err := f.render()
	return b, err
}

// legendGap is the room between the legend's band and the data, above and
// below the band.
const legendGap = vg.Length(6)

// layout is where render put the data and the legend on the page.
type layout struct {
	data, legend vg.Rectangle
}

// render draws the figure, and says where the data and the legend went.
func (f *figure) render() ([]byte, layout, error) {
	plot.DefaultFont = figureFont
	plotter.DefaultFont = figureFont
	p := plot.New()
	p.Title.Text = f.Title
	p.Title.TextStyle.Font.Size = 15
	p.Title.Padding = 8
	p.X.Label.Text = f.XLabel
	p.Y.Label.Text = f.YLabel
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = 12
		a.Tick.Label.Font.Size = 11
	}
	// The legend is drawn apart, in its band (p's own stays empty).
	legend := plot.NewLegend()
	legend.TextStyle.Font.Size = 11
	legend.Top, legend.Left = true, true
	legend.XOffs = 6
	entries := 0
	add := func(name string, thumbs ...plot.Thumbnailer) {
		legend.Add(name, thumbs...)
		entries++
	}
	grid := plotter.NewGrid()
	if f.Kind == "bars" {
		grid.Vertical.Color = nil
	}
	p.Add(grid)
	p.Y.Min = 0

	var err error
	switch f.Kind {
	case "lines":
		err = f.drawLines(p, add)
	default:
		err = f.drawBars(p, add)
	}
	if err != nil {
		return nil, layout{}, err
	}
	if f.Goal != nil {
		style := draw.LineStyle{Color: goalColor, Width: vg.Points(2), Dashes: []vg.Length{vg.Points(8), vg.Points(4)}}
		if i := slices.Index(f.Groups, f.Goal.Group); f.Goal.Group != "" && i >= 0 {
			// Across its group's bars only: a p99 goal does not judge p50.
			lo, hi := goalSpan(i)
			g, err := plotter.NewLine(plotter.XYs{{X: lo, Y: f.Goal.Value}, {X: hi, Y: f.Goal.Value}})
			if err != nil {
				return nil, layout{}, err
			}
			g.LineStyle = style
			p.Add(g)
			add(f.Goal.Label, g)
		} else {
			fn := plotter.NewFunction(func(float64) float64 { return f.Goal.Value })
			fn.LineStyle = style
			fn.Samples = 2
			p.Add(fn)
			add(f.Goal.Label, fn)
		}
		p.Y.Max = math.Max(p.Y.Max, f.Goal.Value)
	}
	// Head room for the value labels above the data.
	if f.LogY {
		lo := f.minValue()
		p.Y.Scale = plot.LogScale{}
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo)))
		p.Y.Max = math.Max(p.Y.Max, p.Y.Min*10)
		p.Y.Max = math.Pow(10, math.Log10(p.Y.Max)+0.25*(math.Log10(p.Y.Max)-math.Log10(p.Y.Min)))
		p.Y.Tick.Marker = steps125{}
	} else {
		p.Y.Max = math.Max(p.Y.Max*1.2, 1) // all zeros: still an axis
		p.Y.Tick.Marker = steps125Linear{}
	}
	// The legend's band: under the title, above the data.
	rowH := legend.TextStyle.FontExtents().Height
	bandH := vg.Length(entries)*rowH + vg.Length(max(entries-1, 0))*legend.Padding
	titleBottom := figureHeight - p.Title.TextStyle.Rectangle(p.Title.Text).Size().Y - p.Title.Padding
	p.Title.Padding += bandH + 2*legendGap

	c := vgsvg.New(figureWidth, figureHeight)
	dc := draw.New(c)
	p.Draw(dc)
	data := p.DataCanvas(dc)
	band := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: data.Min.X, Y: titleBottom - legendGap - bandH},
		Max: vg.Point{X: data.Max.X, Y: titleBottom - legendGap},
	}}
	legend.Draw(band)
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, layout{}, err
	}
	// The SVG names the font the layout was measured with; a reader
	// without it gets the metric-compatible Arial or Helvetica rather
	// than the browser's default serif.
	out := bytes.ReplaceAll(buf.Bytes(), []byte("font-family:"+figureFontFamily+";"),
		[]byte("font-family:'"+figureFontFamily+"',Arial,Helvetica,sans-serif;"))
	return out, layout{data: data.Rectangle, legend: band.Rectangle}, nil
}

// goalSpan is the x range of the goal of group i of a bars figure: the
// group's slot, less a margin.
func goalSpan(i int) (lo, hi float64) {
	return float64(i) - 0.42, float64(i) + 0.42
}

func (f *figure) minValue() float64 {
	lo := math.Inf(1)
	for _, s := range f.Series {
		for _, p := range s.Points {
			lo = math.Min(lo, p[1])
		}
		for _, v := range s.Values {
			lo = math.Min(lo, v)
		}
	}
	if f.Goal != nil {
		lo = math.Min(lo, f.Goal.Value)
	}
	return lo
}

func (f *figure) drawLines(p *plot.Plot, legend func(string, ...plot.Thumbnailer)) error {
	var xs []float64
	for i, s := range f.Series {
		pts := make(plotter.XYs, len(s.Points))
		labels := make([]string, len(s.Points))
		for j, pt := range s.Points {
			pts[j] = plotter.XY{X: pt[0], Y: pt[1]}
			labels[j] = formatValue(pt[1]) + f.Unit
			xs = append(xs, pt[0])
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		clr := seriesColors[i%len(seriesColors)]
		l.Color, l.Width = clr, vg.Points(2.5)
		sc.Color, sc.Radius, sc.Shape = clr, vg.Points(4), draw.CircleGlyph{}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: labels})
		if err != nil {
			return err
		}
		for j := range lb.TextStyle {
			lb.TextStyle[j].Color = clr
			lb.TextStyle[j].Font.Size = 10
			lb.TextStyle[j].XAlign = draw.XCenter
		}
		lb.Offset = vg.Point{Y: vg.Points(7)}
		p.Add(l, sc, lb)
		legend(s.Name, l, sc)
		for _, pt := range s.Points {
			p.Y.Max = math.Max(p.Y.Max, pt[1])
		}
	}
	// Ticks at the x values measured, with thousands separated.
	ticks := make([]plot.Tick, 0, len(xs))
	seen := map[float64]bool{}
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			ticks = append(ticks, plot.Tick{Value: x, Label: formatValue(x)})
		}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	pad := (hi - lo) * 0.06
	if pad == 0 {
		pad = math.Max(hi*0.1, 1)
	}
	p.X.Min, p.X.Max = math.Max(0, lo-pad), hi+pad
	return nil
}

func (f *figure) drawBars(p *plot.Plot, legend func(string, ...plot.Thumbnailer)) error {
	n := len(f.Series)
	// The bars of a group share ~70% of the group's slot on the page.
	slot := (figureWidth - 90) / vg.Length(len(f.Groups))
	w := min(slot*0.7/vg.Length(n), vg.Points(70))
	for i, s := range f.Series {
		b, err := plotter.NewBarChart(plotter.Values(s.Values), w)
		if err != nil {
			return err
		}
		clr := seriesColors[i%len(seriesColors)]
		b.Color = clr
		b.LineStyle.Width = 0
		b.Offset = w * (vg.Length(i) - vg.Length(n-1)/2)
		pts := make(plotter.XYs, len(s.Values))
		labels := make([]string, len(s.Values))
		for j, v := range s.Values {
			pts[j] = plotter.XY{X: float64(j), Y: v}
			labels[j] = formatValue(v) + f.Unit
			p.Y.Max = math.Max(p.Y.Max, v)
		}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: labels})
		if err != nil {
			return err
		}
		for j := range lb.TextStyle {
			lb.TextStyle[j].Font.Size = 10
			lb.TextStyle[j].XAlign = draw.XCenter
		}
		lb.Offset = vg.Point{X: b.Offset, Y: vg.Points(3)}
		p.Add(b, lb)
		legend(s.Name, b)
	}
	p.NominalX(f.Groups...)
	p.X.Min, p.X.Max = -0.5, float64(len(f.Groups))-0.5
	p.Y.Padding = vg.Points(5) // NominalX pads for half the first name: the range above leaves room
	p.X.Tick.Label.Font.Size = 12
	return nil
}

// formatValue writes a figure as a reader wants it: 3 significant digits
// at most, thousands separated (15,000; 31.5; 0.25).
func formatValue(v float64) string {
	if v >= 1000 {
		s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
		var b strings.Builder
		for i, r := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(r)
		}
		return b.String()
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// steps125Linear marks a linear axis every 1, 2 or 5 × a power of ten,
// the first of these steps that gives at most 7 marks.
type steps125Linear struct{}

func (steps125Linear) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: formatValue(lo)}}
	}
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/7)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(m*step) <= 7 {
			step *= m
			break
		}
	}
	var ts []plot.Tick
	for i := math.Ceil(lo / step); i*step <= hi*(1+1e-9); i++ {
		v := i * step
		ts = append(ts, plot.Tick{Value: v, Label: formatValue(v)})
	}
	return ts
}

// steps125 marks a log axis at 1, 2, 5 × powers of ten.
type steps125 struct{}

func (steps125) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
				ts = append(ts, plot.Tick{Value: v, Label: formatValue(v)})
			}
		}
	}
	return ts
}

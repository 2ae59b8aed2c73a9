package deploy

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/testsvc"
)

// promQLNames returns the metric names a PromQL expression selects:
// strings, label matchers, ranges, grouping clauses and function calls
// removed, what remains are metric names (and keywords, dropped).
func promQLNames(expr string) []string {
	e := regexp.MustCompile(`\$\{?[a-zA-Z_]+\}?`).ReplaceAllString(expr, "x")
	e = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`).ReplaceAllString(e, `""`)
	e = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(e, " ")
	e = regexp.MustCompile(`\[[^\]]*\]`).ReplaceAllString(e, " ")
	e = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`).ReplaceAllString(e, " ")
	keywords := map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true, "x": true, "inf": true, "nan": true, "group_left": true, "group_right": true, "ignoring": true, "on": true}
	var names []string
	ident := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	for _, loc := range ident.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // part of a number (1e3) or a duration
		}
		if rest := strings.TrimLeft(e[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") || keywords[strings.ToLower(name)] {
			continue // a function or an aggregation
		}
		names = append(names, name)
	}
	return names
}

func TestPromQLNames(t *testing.T) {
	for expr, want := range map[string]string{
		`histogram_quantile(0.99, sum by (le, route) (rate(presenced_http_request_duration_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`: "presenced_http_request_duration_seconds_bucket",
		`sum by (code) (rate(presenced_http_requests_total{code=~"4..|5.."}[5m])) / ignoring(code) group_left sum(up)`:                                 "presenced_http_requests_total up",
		`count by (version) (presenced_build_info) and on(instance) presenced_ws_users > 1e3`:                                                          "presenced_build_info presenced_ws_users",
	} {
		if got := strings.Join(promQLNames(expr), " "); got != want {
			t.Errorf("%s: got %q, want %q", expr, got, want)
		}
	}
}

// declaredMetrics returns the metric names internal/metrics declares
// (prometheus.NewDesc's first argument, the Name of a …Opts literal; a
// histogram's with its _bucket, _sum and _count series): the series that
// appear only after an event.
func declaredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(repoRoot, "internal", "metrics", "*.go"))
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
					if s, ok := stringLit(n.Args[0]); ok {
						names[s] = true
					}
				}
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
					return true
				}
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if k, _ := kv.Key.(*ast.Ident); !ok || k == nil || k.Name != "Name" {
						continue
					}
					if s, ok := stringLit(kv.Value); ok {
						names[s] = true
						if strings.Contains(sel.Sel.Name, "Histogram") {
							names[s+"_bucket"], names[s+"_sum"], names[s+"_count"] = true, true, true
						}
					}
				}
			}
			return true
		})
	}
	if len(names) < 30 {
		t.Fatalf("found only %d metric names in internal/metrics: is the parse broken?", len(names))
	}
	return names
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// scrapedNames returns the series names of a Prometheus text exposition.
func scrapedNames(body string) map[string]bool {
	names := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// TestGrafanaDashboard: every metric the dashboard's queries (panels and
// template variables) select is one presenced exposes — scraped from a
// running embedded node and a running scale-out node (Redis, PostgreSQL,
// NATS) after some traffic, or, for series that appear only after an
// event, declared in internal/metrics. `up` is Prometheus' own.
func TestGrafanaDashboard(t *testing.T) {
	img := dockerBuild(t)
	b, err := os.ReadFile(filepath.Join("grafana", "presenced.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query string `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana/presenced.json: %v", err)
	}
	queries := map[string]string{} // expr → where
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries[tg.Expr] = "panel " + p.Title
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		// label_values(selector, label): the label is no metric.
		m := regexp.MustCompile(`^label_values\((.*),\s*[a-z_]+\)$`).FindStringSubmatch(v.Query)
		if m == nil {
			t.Errorf("variable %s: query %q: want label_values(metric, label)", v.Name, v.Query)
			continue
		}
		queries[m[1]] = "variable " + v.Name
	}

	exposed := declaredMetrics(t)
	exposed["up"] = true
	key := "grafana-test-api-key-of-32-bytes-or-more"
	secret := "grafana-test-jwt-secret-of-32-bytes-or-more"
	traffic := func(n *node) {
		t.Helper()
		waitReady(t, n, n.addr)
		for i, user := range []string{"alice", "bob"} {
			if code, body := do(t, "POST", n.addr, "/v1/heartbeat", key, `{"user_id":"`+user+`","device_id":"d`+strconv.Itoa(i)+`"}`); code != http.StatusOK {
				t.Fatalf("heartbeat: %d %s", code, body)
			}
		}
		get(t, n.addr, "/v1/presence/alice", key)
		get(t, n.addr, "/v1/presence/nobody!", key) // a 400
		code, body := get(t, n.addr, "/metrics", key)
		if code != http.StatusOK {
			t.Fatalf("/metrics: %d", code)
		}
		scraped := scrapedNames(body)
		if !scraped["presenced_http_request_duration_seconds_bucket"] || !scraped["presenced_build_info"] {
			t.Fatalf("the scrape lacks the HTTP histogram or the build info:\n%s", body)
		}
		for name := range scraped {
			exposed[name] = true
		}
	}
	common := []string{"-addr=127.0.0.1:0", "-api-key=" + key, "-jwt-secret=" + secret}
	embedded := startNode(t, exec.Command(img.binary, append(common, "-data="+t.TempDir())...), false)
	traffic(embedded)
	embedded.stop(t)
	redis, pg, nats := testsvc.SharedRedis(t), testsvc.SharedPostgres(t), testsvc.SharedNATS(t)
	scaled := startNode(t, exec.Command(img.binary, append(common, "-data="+t.TempDir(), "-redis-url="+redis.URL,
		"-redis-prefix="+testsvc.Unique(t)+":", "-postgres-url="+pg.NewDatabase(t), "-nats-url="+nats.URL)...), false)
	traffic(scaled)
	scaled.stop(t)

	seen := map[string]bool{}
	for expr, where := range queries {
		names := promQLNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q selects no metric", where, expr)
		}
		for _, name := range names {
			seen[name] = true
			if !exposed[name] {
				t.Errorf("%s: %q queries %s, which presenced does not expose", where, expr, name)
			}
		}
	}
	var list []string
	for n := range seen {
		list = append(list, n)
	}
	sort.Strings(list)
	if len(list) < 20 {
		t.Errorf("the dashboard queries only %d metrics: %q", len(list), list)
	}
	t.Logf("%d queries, %d metrics checked", len(queries), len(list))
}

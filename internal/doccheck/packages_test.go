package doccheck

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// moduleRoot is the directory of the module's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("go env GOMOD: not in a module")
	}
	return filepath.Dir(gomod)
}

// goList returns every package of the module (its path relative to the
// module: "internal/tracker", "cmd/presenced") with the module's packages
// it imports, tests left out.
func goList(t *testing.T, root string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderr.Bytes())
	}
	modOut, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	prefix := strings.TrimSpace(string(modOut)) + "/"
	pkgs := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		pkg, ok := strings.CutPrefix(fields[0], prefix)
		if !ok {
			continue
		}
		imports := []string{}
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, prefix); ok {
				imports = append(imports, rel)
			}
		}
		slices.Sort(imports)
		pkgs[pkg] = imports
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// row is one row of the package table of docs/architecture.md.
type row struct {
	line    int
	name    string   // as written: "tracker", "cmd/presenced"
	imports []string // as written
}

// packageTable reads the rows of the table whose header's first cell is
// "package" in docs/architecture.md: | `name` | its job | `a`, `b` |.
func packageTable(t *testing.T, path string) []row {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows []row
	in := false
	for i, line := range strings.Split(string(b), "\n") {
		cells := splitRow(line)
		switch {
		case len(cells) == 3 && cells[0] == "package" && strings.HasPrefix(cells[2], "imports"):
			in = true
			continue
		case !in:
			continue
		case len(cells) == 0:
			in = false
			continue
		case strings.HasPrefix(cells[0], "---"):
			continue
		}
		if len(cells) != 3 {
			t.Errorf("%s:%d: a row of the package table needs three cells (package, job, imports): %q", path, i+1, line)
			continue
		}
		r := row{line: i + 1, name: strings.Trim(cells[0], "`")}
		if cells[2] != "—" {
			for _, imp := range strings.Split(cells[2], ",") {
				r.imports = append(r.imports, strings.Trim(strings.TrimSpace(imp), "`"))
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// splitRow returns the cells of a Markdown table row, or nil for a line
// that is not one.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || len(line) < 2 {
		return nil
	}
	cells := strings.Split(line[1:len(line)-1], "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// resolve turns a name as the table writes it into a package path of the
// module: the path itself ("client", "cmd/presenced", "js/presence") when
// there is such a package, else the package under internal/ ("tracker").
func resolve(name string, pkgs map[string][]string) string {
	if _, ok := pkgs[name]; ok {
		return name
	}
	return "internal/" + name
}

// short is how the table writes a package: without "internal/".
func short(pkg string) string {
	return strings.TrimPrefix(pkg, "internal/")
}

func cell(pkgs []string) string {
	if len(pkgs) == 0 {
		return "—"
	}
	names := make([]string, len(pkgs))
	for i, p := range pkgs {
		names[i] = "`" + short(p) + "`"
	}
	return strings.Join(names, ", ")
}

// TestPackageMap: docs/architecture.md has a row for every package of the
// module and none for a package that does not exist, and each row's
// imports are exactly the module's packages that package imports (go
// list, tests left out). A failure names the row and says what to write.
func TestPackageMap(t *testing.T) {
	root := moduleRoot(t)
	doc := filepath.Join(root, "docs", "architecture.md")
	pkgs := goList(t, root)
	rows := packageTable(t, doc)
	if len(rows) < 10 || len(pkgs) < 10 {
		t.Fatalf("found %d rows in the package table of %s and %d packages in go list: is the table (header | package | … | imports … |) or go list broken?", len(rows), doc, len(pkgs))
	}
	seen := map[string]int{}
	for _, r := range rows {
		pkg := resolve(r.name, pkgs)
		if prev, ok := seen[pkg]; ok {
			t.Errorf("docs/architecture.md:%d: row `%s` repeats the row of line %d: remove one", r.line, r.name, prev)
			continue
		}
		seen[pkg] = r.line
		want, ok := pkgs[pkg]
		if !ok {
			t.Errorf("docs/architecture.md:%d: row `%s`: go list ./... has no package %s: remove the row, or fix its name", r.line, r.name, pkg)
			continue
		}
		var got []string
		for _, imp := range r.imports {
			got = append(got, resolve(imp, pkgs))
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			continue
		}
		var extra, missing []string
		for _, g := range got {
			if !slices.Contains(want, g) {
				extra = append(extra, short(g))
			}
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				missing = append(missing, short(w))
			}
		}
		t.Errorf("docs/architecture.md:%d: row `%s`: its imports column should read\n\t%s\n(it lists %v that %s does not import, and misses %v)", r.line, r.name, cell(want), extra, pkg, missing)
	}
	var absent []string
	for pkg := range pkgs {
		if _, ok := seen[pkg]; !ok {
			absent = append(absent, pkg)
		}
	}
	slices.Sort(absent)
	for _, pkg := range absent {
		t.Errorf("docs/architecture.md: no row for package %s: add\n\t| `%s` | <what it is for, in one line> | %s |", pkg, short(pkg), cell(pkgs[pkg]))
	}
}

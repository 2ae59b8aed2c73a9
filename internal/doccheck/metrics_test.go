package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestMetricsExist: every presenced_* series README.md and docs/*.md name
// is one the code defines (a string literal of a non-test Go file), and a
// family they name by its prefix (presenced_bus_*) is the prefix of one.
// The archive of past measurements is left out: it may name series that
// are gone.
func TestMetricsExist(t *testing.T) {
	root := moduleRoot(t)
	literal := regexp.MustCompile(`"(presenced_[a-z0-9_]*)`)
	var defined []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && path != root) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllStringSubmatch(string(b), -1) {
			defined = append(defined, m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 20 {
		t.Fatalf("found %d presenced_* literals in the code: is the scan broken?", len(defined))
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	named := regexp.MustCompile("`(presenced_[a-z0-9_]*)(\\*|\\{|`)")
	for _, doc := range docs {
		if filepath.Base(doc) == "benchmarks-archive.md" {
			continue
		}
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range named.FindAllStringSubmatch(line, -1) {
				name, prefix := m[1], m[2] == "*" || strings.HasSuffix(m[1], "_")
				ok := slices.Contains(defined, name)
				if !ok && prefix {
					ok = slices.ContainsFunc(defined, func(d string) bool { return strings.HasPrefix(d, name) })
				}
				if !ok {
					t.Errorf("%s:%d names the series %s, which no Go file of the module defines: fix the name or remove it", rel, i+1, name)
				}
			}
		}
	}
}

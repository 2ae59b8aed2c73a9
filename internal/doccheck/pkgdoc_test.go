package doccheck

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxPackageDocLines is how long a package doc may be: what the package
// is for, pointing to docs/architecture.md for the design around it.
const maxPackageDocLines = 25

// TestPackageDocsAreShort keeps every package doc of the module to what
// the package is for, so design prose lives once, in docs/.
func TestPackageDocsAreShort(t *testing.T) {
	root := moduleRoot(t)
	seen := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		if f.Doc == nil {
			return nil
		}
		seen++
		if n := strings.Count(strings.TrimSpace(f.Doc.Text()), "\n") + 1; n > maxPackageDocLines {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s: the package doc has %d lines, want at most %d (the rest belongs in docs/)", rel, n, maxPackageDocLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 40 {
		t.Fatalf("found %d package docs, want one per package (is the walk wrong?)", seen)
	}
}

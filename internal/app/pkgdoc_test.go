package app_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs makes "every package has a doc comment" a test.
func TestPackageDocs(t *testing.T) {
	root := filepath.Join("..", "..")
	dirs := map[string]bool{} // dir → has a doc comment
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		dirs[dir] = dirs[dir] || (f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 10 {
		t.Fatalf("found only %d packages; is the walk rooted right?", len(dirs))
	}
	for dir, ok := range dirs {
		if !ok {
			t.Errorf("package in %s has no doc comment", dir)
		}
	}
}

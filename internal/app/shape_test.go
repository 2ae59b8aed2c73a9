package app_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompositionRootShape keeps the composition root easy to take over:
// no function of internal/app or cmd/presenced longer than maxFuncLines.
// (The length of every package doc is doccheck's.)
func TestCompositionRootShape(t *testing.T) {
	const maxFuncLines = 80
	for _, dir := range []string{".", filepath.Join("..", "..", "cmd", "presenced")} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				if fn, ok := d.(*ast.FuncDecl); ok {
					if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
						t.Errorf("%s: %s has %d lines, want at most %d", path, fn.Name.Name, n, maxFuncLines)
					}
				}
			}
		}
	}
}

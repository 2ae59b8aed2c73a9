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
// no function of internal/app or cmd/presenced longer than maxFuncLines,
// and package docs of at most maxDocLines (the detail lives beside the
// code it describes).
func TestCompositionRootShape(t *testing.T) {
	const maxFuncLines, maxDocLines = 80, 25
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
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if f.Doc != nil {
				if n := strings.Count(f.Doc.Text(), "\n"); n > maxDocLines {
					t.Errorf("%s: the package doc has %d lines, want at most %d", path, n, maxDocLines)
				}
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

package httpapi

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
)

// TestHeaderValueKeys: every key this package looks up with headerValue is
// a literal in canonical form, so the look-up finds what h.Get would.
func TestHeaderValueKeys(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	calls := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if id, ok := call.Fun.(*ast.Ident); !ok || id.Name != "headerValue" || len(call.Args) != 2 {
				return true
			}
			calls++
			lit, ok := call.Args[1].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: headerValue with a key that is not a string literal", fset.Position(call.Pos()))
				return true
			}
			key, _ := strconv.Unquote(lit.Value)
			if c := http.CanonicalHeaderKey(key); c != key {
				t.Errorf("%s: headerValue key %q, canonical %q", fset.Position(call.Pos()), key, c)
			}
			return true
		})
	}
	if calls == 0 {
		t.Fatal("no headerValue calls found")
	}
}

package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLayers: dependencies point one way (docs/architecture.md): sale
// imports nothing of ours, the adapters (stockgate, orderqueue,
// orderstore) none of each other, and what only cmd wires (the bench
// runner, the demo, the change notices, the dashboard, the buyer page) is imported by cmd
// alone.
func TestLayers(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	const mod = "github.com/flashsale/flashsale/"
	out, err := exec.Command(goTool, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{} // package -> the module's packages it imports
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], mod)
		imports[pkg] = nil
		for _, imp := range f[1:] {
			if p, ok := strings.CutPrefix(imp, mod); ok {
				imports[pkg] = append(imports[pkg], p)
			}
		}
	}
	if len(imports["internal/sale"]) > 0 {
		t.Errorf("internal/sale imports %v: it imports the standard library only", imports["internal/sale"])
	}
	adapters := []string{"internal/stockgate", "internal/orderqueue", "internal/orderstore"}
	for _, a := range adapters {
		for _, imp := range imports[a] {
			if slices.Contains(adapters, imp) {
				t.Errorf("%s imports %s: adapters never import each other", a, imp)
			}
		}
	}
	for _, only := range []string{"internal/bench", "internal/demo", "internal/notice", "internal/dashboard", "internal/buyerpage"} {
		if _, ok := imports[only]; !ok {
			t.Errorf("go list has no %s", only)
		}
		for pkg, imps := range imports {
			if pkg != "cmd/flashsale" && slices.Contains(imps, only) {
				t.Errorf("%s imports %s: only cmd/flashsale wires it", pkg, only)
			}
		}
	}
}

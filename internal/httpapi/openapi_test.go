package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/api"
)

// loadSpec parses and validates api/openapi.yaml.
func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %s, want 3.1", doc.OpenAPI)
	}
	return doc
}

// TestSpecCoversRoutes: every route the mux registers (with every optional
// route switched on) is an operation of the spec, and every operation of the
// spec is a route.
func TestSpecCoversRoutes(t *testing.T) {
	doc := loadSpec(t)
	ok := func(ctx context.Context) (any, error) { return nil, nil }
	s := New(nil, nil, slog.New(slog.DiscardHandler), Config{
		DeadLetters: struct{ DeadLetters }{}, Lifecycle: struct{ Lifecycle }{}, Audit: struct{ AuditReader }{},
		Reconcile: ok, Overview: ok, Metrics: http.NotFoundHandler(), Dashboard: http.NotFoundHandler(), BuyerPage: http.NotFoundHandler(), Risk: struct{ RiskAdmin }{},
		History: struct{ HistoryAdmin }{},
	})
	var routes []string
	for _, p := range s.Routes() {
		method, path, _ := strings.Cut(p, " ")
		routes = append(routes, method+" "+strings.TrimSuffix(path, "{$}"))
	}
	var ops []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			ops = append(ops, method+" "+path)
		}
	}
	slices.Sort(routes)
	slices.Sort(ops)
	if d := cmp.Diff(ops, routes); d != "" {
		t.Errorf("spec operations (-) vs mux routes (+):\n%s", d)
	}
}

// TestSpecErrorCodes: the spec's error codes are the error table's.
func TestSpecErrorCodes(t *testing.T) {
	doc := loadSpec(t)
	var spec []string
	for _, v := range doc.Components.Schemas["Error"].Value.Properties["error"].Value.Properties["code"].Value.Enum {
		spec = append(spec, v.(string))
	}
	table := []string{"internal"}
	for _, e := range errorCodes {
		if !slices.Contains(table, e.code) {
			table = append(table, e.code)
		}
	}
	slices.Sort(spec)
	slices.Sort(table)
	if d := cmp.Diff(spec, table); d != "" {
		t.Errorf("spec codes (-) vs error table (+):\n%s", d)
	}
}

func TestServesSpec(t *testing.T) {
	s := New(nil, nil, slog.New(slog.DiscardHandler), Config{})
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/yaml" || string(body) != string(api.OpenAPI) {
		t.Fatalf("GET /openapi.yaml: %d %q, %d bytes", rec.Code, rec.Header().Get("Content-Type"), len(body))
	}
}

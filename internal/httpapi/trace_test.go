package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/flashsale/flashsale/internal/tracing"
)

func tracedServer(tb testing.TB, on bool) (*Server, *tracetest.InMemoryExporter) {
	var cfg Config
	exp := tracetest.NewInMemoryExporter()
	if on {
		tr, stop, err := tracing.Setup(context.Background(), tracing.Config{SpanExporter: exp})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = stop(context.Background()) })
		cfg.Tracer = tr
	}
	return New(nil, nil, slog.New(slog.DiscardHandler), cfg), exp
}

// TestRouteSpans: with a tracer every routed request gets a server span
// named after its route, with its status; an unrouted one gets none.
func TestRouteSpans(t *testing.T) {
	s, exp := tracedServer(t, true)
	for _, path := range []string{"/healthz", "/no/such/route"} {
		s.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != "GET /healthz" {
		t.Fatalf("spans %v, want one GET /healthz", spans)
	}
	var status int64
	for _, a := range spans[0].Attributes {
		if a.Key == "http.response.status_code" {
			status = a.Value.AsInt64()
		}
	}
	if status != http.StatusOK {
		t.Fatalf("status attribute %d, want 200", status)
	}
}

// BenchmarkRouteTracing is one routed request (GET /healthz) with tracing
// off (what every deployment pays by default: nothing more than without
// tracing) and on (every request sampled, in-memory exporter).
func BenchmarkRouteTracing(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			s, exp := tracedServer(b, on)
			r := httptest.NewRequest(http.MethodGet, "/healthz", nil)
			b.ReportAllocs()
			for b.Loop() {
				s.ServeHTTP(httptest.NewRecorder(), r)
				if on {
					exp.Reset()
				}
			}
		})
	}
}

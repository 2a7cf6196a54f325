package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/flashsale/flashsale/internal/tracing"
)

// header is a message's headers as the consumer reads them.
type header map[string]string

func (h header) Get(k string) string { return h[k] }

func newTracer(t *testing.T) (*tracing.Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tr, stop, err := tracing.Setup(context.Background(), tracing.Config{SpanExporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop(context.Background()) })
	return tr, exp
}

// TestOffCostsNothing: with tracing off the Tracer is nil; starting a span,
// injecting and extracting allocate nothing and change no context.
func TestOffCostsNothing(t *testing.T) {
	tr, stop, err := tracing.Setup(context.Background(), tracing.Config{Exporter: "none"})
	if err != nil || tr != nil {
		t.Fatalf("Setup(none) = %v, %v; want nil tracer", tr, err)
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		c, span := tr.Start(ctx, "x", trace.SpanKindServer)
		if c != ctx || span.IsRecording() || tr.Inject(c) != nil {
			t.Fatal("a nil tracer changed something")
		}
		span.End()
	})
	if allocs != 0 {
		t.Fatalf("tracing off: %v allocations per span, want 0", allocs)
	}
}

// TestInjectLinkRoundTrip: the headers Inject gives a message yield a link
// to the span that published it; a message without them yields none.
func TestInjectLinkRoundTrip(t *testing.T) {
	tr, _ := newTracer(t)
	ctx, span := tr.Start(context.Background(), "publish", trace.SpanKindProducer)
	defer span.End()
	h := tr.Inject(ctx)
	if !strings.HasPrefix(h["traceparent"], "00-"+span.SpanContext().TraceID().String()+"-") {
		t.Fatalf("traceparent = %q, want the span's trace id", h["traceparent"])
	}
	l, ok := tracing.LinkFrom(header(h))
	if !ok || l.SpanContext.TraceID() != span.SpanContext().TraceID() || l.SpanContext.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("LinkFrom = %v, %v; want a link to %v", l.SpanContext, ok, span.SpanContext())
	}
	for _, h := range []tracing.Getter{header{}, header{"traceparent": "garbage"}, nil} {
		if _, ok := tracing.LinkFrom(h); ok {
			t.Fatalf("LinkFrom(%v) found a link", h)
		}
	}
	if got := tr.Inject(context.Background()); got != nil {
		t.Fatalf("Inject without a span = %v, want nil", got)
	}
}

// TestLogHandlerAddsIDs: a line logged with a context holding a span
// carries its trace and span ids; a line without one carries neither.
func TestLogHandlerAddsIDs(t *testing.T) {
	tr, _ := newTracer(t)
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	ctx, span := tr.Start(context.Background(), "op", trace.SpanKindInternal)
	log.InfoContext(ctx, "inside")
	span.End()
	log.Info("outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %q", len(lines), buf.String())
	}
	var in, out map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &in); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &out); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	if in["trace_id"] != sc.TraceID().String() || in["span_id"] != sc.SpanID().String() || in["component"] != "test" {
		t.Fatalf("line inside the span = %v, want trace_id %s span_id %s", in, sc.TraceID(), sc.SpanID())
	}
	if _, ok := out["trace_id"]; ok {
		t.Fatalf("line outside any span carries a trace id: %v", out)
	}
}

// TestConfigCheck: bad exporter and sampler settings are refused with a
// message naming them.
func TestConfigCheck(t *testing.T) {
	for _, c := range []struct {
		cfg  tracing.Config
		want string // "" = accepted
	}{
		{tracing.Config{}, ""},
		{tracing.Config{Exporter: "otlp", Sampler: "parentbased_traceidratio", SamplerArg: "0.25"}, ""},
		{tracing.Config{Exporter: "jaeger"}, `exporter "jaeger"`},
		{tracing.Config{Sampler: "sometimes"}, `sampler "sometimes"`},
		{tracing.Config{Sampler: "traceidratio", SamplerArg: "2"}, `argument "2"`},
	} {
		err := c.cfg.Check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.cfg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want one naming %s", c.cfg, err, c.want)
		}
	}
	s, err := tracing.ParseSampler("always_off", "")
	if err != nil || s.Description() != sdktrace.NeverSample().Description() {
		t.Fatalf("always_off = %v, %v", s, err)
	}
}

// TestOTLPExportAtShutdown: with the OTLP exporter, the endpoint and the
// service name come from the standard variables, and the spans still
// buffered reach the collector when the provider shuts down.
func TestOTLPExportAtShutdown(t *testing.T) {
	type post struct {
		path, contentType string
		body              []byte
	}
	got := make(chan post, 10)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- post{r.URL.Path, r.Header.Get("Content-Type"), b}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test-env")

	tr, stop, err := tracing.Setup(context.Background(), tracing.Config{Exporter: tracing.ExporterOTLP, ServiceName: "flashsale-test"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tr.Start(context.Background(), "exported-span", trace.SpanKindInternal)
	span.End()
	select {
	case p := <-got:
		t.Fatalf("exported before shutdown (batched export expected): %s", p.path)
	default:
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p.path != "/v1/traces" || p.contentType != "application/x-protobuf" {
			t.Fatalf("export to %s as %s, want /v1/traces as protobuf", p.path, p.contentType)
		}
		for _, want := range []string{"exported-span", "flashsale-test", "test-env"} {
			if !bytes.Contains(p.body, []byte(want)) {
				t.Errorf("exported body lacks %q", want)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing exported at shutdown")
	}
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/internal/tracing"
)

// spanNamed returns the spans named name.
func spanNamed(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// TestTracingPurchase: with tracing on, one purchase through the real
// service (HTTP, Redis gate, relay, JetStream, consumer, database) makes the
// request span (continuing the caller's traceparent), the gate span and the
// publish span in the purchase's trace, and a batch-apply span in a trace of
// its own that links the purchase's; a log line within the batch carries its
// trace id. A reservation published without trace context (an older
// instance's, or one republished from Redis) is applied all the same.
func TestTracingPurchase(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	cfg := testConfig(t, "embedded", "FLASHSALE_STREAM_ACK_TIMEOUT", "2s",
		"FLASHSALE_LOG_FORMAT", "json", "FLASHSALE_LOG_LEVEL", "debug")
	cfg.spanExporter = exp
	var logs syncBuffer
	log, err := newLogger(cfg, io.MultiWriter(&logs, testLogWriter{t}))
	if err != nil {
		t.Fatal(err)
	}
	a, err := start(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.handler)
	t.Cleanup(func() {
		srv.Close()
		a.close()
	})
	h := &harness{t: t, cfg: cfg, a: a, srv: srv, srvURL: srv.URL, hc: &http.Client{Timeout: 20 * time.Second}}
	h.mustPutSKU("traced", 10, 5)

	// The caller's trace: the request span continues it.
	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	r := h.do(http.MethodPost, "/api/v1/orders", `{"sku_id":"traced","quantity":1}`,
		"Authorization: Bearer "+userToken(t, "alice"), "traceparent: 00-"+callerTrace+"-00f067aa0ba902b7-01")
	if r.Status != http.StatusAccepted {
		t.Fatalf("purchase: %d %s", r.Status, r.Raw)
	}
	orderID := r.str("order_id")

	var batch tracetest.SpanStub
	deadline := time.Now().Add(30 * time.Second)
	for batch.Name == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no apply.batch span links trace %s; spans: %v", callerTrace, names(exp.GetSpans()))
		}
		time.Sleep(50 * time.Millisecond)
		for _, s := range spanNamed(exp.GetSpans(), "apply.batch") {
			for _, l := range s.Links {
				if l.SpanContext.TraceID().String() == callerTrace {
					batch = s
				}
			}
		}
	}
	spans := exp.GetSpans()

	httpSpans := spanNamed(spans, "POST /api/v1/orders")
	if len(httpSpans) != 1 {
		t.Fatalf("request spans: %d, want 1 (%v)", len(httpSpans), names(spans))
	}
	req := httpSpans[0]
	if got := req.SpanContext.TraceID().String(); got != callerTrace || !req.Parent.IsRemote() {
		t.Fatalf("request span in trace %s (parent remote %v), want the caller's %s", got, req.Parent.IsRemote(), callerTrace)
	}
	if req.SpanKind != trace.SpanKindServer || attr(req, "http.route") != "POST /api/v1/orders" || attr(req, "http.response.status_code") != "202" {
		t.Fatalf("request span: kind %v, attributes %v", req.SpanKind, req.Attributes)
	}
	child := func(name string) tracetest.SpanStub {
		t.Helper()
		for _, s := range spanNamed(spans, name) {
			if s.Parent.SpanID() == req.SpanContext.SpanID() && s.SpanContext.TraceID() == req.SpanContext.TraceID() {
				return s
			}
		}
		t.Fatalf("no %s span under the request span; spans: %v", name, names(spans))
		return tracetest.SpanStub{}
	}
	gate := child("stockgate.reserve")
	if attr(gate, "flashsale.order_id") != orderID || attr(gate, "flashsale.outcome") != "accepted" {
		t.Fatalf("gate span attributes: %v", gate.Attributes)
	}
	pub := child("relay.publish")
	if pub.SpanKind != trace.SpanKindProducer || attr(pub, "messaging.message.id") != orderID {
		t.Fatalf("publish span: kind %v, attributes %v", pub.SpanKind, pub.Attributes)
	}
	// The batch links the publish span (the message's producer) and lives in
	// a trace of its own: one batch serves many purchases.
	var linked bool
	for _, l := range batch.Links {
		linked = linked || l.SpanContext.SpanID() == pub.SpanContext.SpanID()
	}
	if !linked || batch.SpanContext.TraceID() == req.SpanContext.TraceID() || batch.SpanKind != trace.SpanKindConsumer {
		t.Fatalf("batch span: links %v, trace %s, kind %v; want a link to the publish span %s in another trace",
			batch.Links, batch.SpanContext.TraceID(), batch.SpanKind, pub.SpanContext.SpanID())
	}
	if attr(batch, "flashsale.applied") != "1" {
		t.Fatalf("batch span attributes: %v", batch.Attributes)
	}
	if !logLineWith(logs.String(), "consumer: batch applied", batch.SpanContext.TraceID().String()) {
		t.Fatalf("no log line carries the batch's trace id %s:\n%s", batch.SpanContext.TraceID(), logs.String())
	}

	// A reservation without trace context, as an older instance or the
	// republisher publishes it, is applied; its batch has no link for it.
	res := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: "traced", User: "bob", Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
	h.reserveInGate(res)
	data, _ := json.Marshal(res)
	if errs := a.queue.Publish(context.Background(), []orderqueue.Message{{ID: res.OrderID, SKU: res.SKU, Data: data}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	settle(t, a, "traced", []string{orderID, res.OrderID}, 30*time.Second)
	for _, s := range spanNamed(exp.GetSpans(), "apply.batch") {
		if s.SpanContext.SpanID() != batch.SpanContext.SpanID() && len(s.Links) > 0 {
			t.Fatalf("a batch of the untraced reservation has links: %v", s.Links)
		}
	}
}

// reserveInGate takes r's units in Redis as the gate does, so that applying
// it is a normal purchase.
func (h *harness) reserveInGate(r sale.Reservation) {
	h.t.Helper()
	gr, err := h.a.gate.Reserve(context.Background(), r)
	if err != nil || gr.Duplicate {
		h.t.Fatalf("gate reserve: %+v %v", gr, err)
	}
	// The gate put it in the outbox too: drop it there, this test publishes
	// it itself (without trace context).
	if err := h.a.gate.Unqueue(context.Background(), r.SKU, r.OrderID); err != nil {
		h.t.Fatal(err)
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// logLineWith reports whether a JSON log line with message msg has trace_id id.
func logLineWith(logs, msg, id string) bool {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg && line["trace_id"] == id {
			return true
		}
	}
	return false
}

// TestTracingOffByDefault: without a setting no tracer is made and the log
// handler is not wrapped.
func TestTracingOffByDefault(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig("test", nil, func(string) string { return "" }, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tracing != "none" || cfg.tracing().On() {
		t.Fatalf("tracing = %q (on %v), want none", cfg.Tracing, cfg.tracing().On())
	}
	tr, _, err := tracing.Setup(context.Background(), cfg.tracing())
	if err != nil || tr != nil {
		t.Fatalf("Setup = %v, %v; want no tracer", tr, err)
	}
	// The standard variable turns it on, FLASHSALE_TRACING wins over it.
	env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}
	cfg, err = parseConfig("test", nil, func(k string) string { return env[k] }, io.Discard, nil)
	if err != nil || cfg.Tracing != "otlp" {
		t.Fatalf("OTEL_TRACES_EXPORTER=otlp: tracing %q, %v", cfg.Tracing, err)
	}
	env["FLASHSALE_TRACING"] = "none"
	if cfg, _ = parseConfig("test", nil, func(k string) string { return env[k] }, io.Discard, nil); cfg.Tracing != "none" {
		t.Fatalf("FLASHSALE_TRACING=none over OTEL_TRACES_EXPORTER=otlp: %q", cfg.Tracing)
	}
}

// TestTracingBadSettings: each bad tracing or profiling setting is refused
// with an error naming it.
func TestTracingBadSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"FLASHSALE_TRACING": "zipkin"}, `exporter "zipkin"`},
		{map[string]string{"OTEL_TRACES_SAMPLER": "often"}, `sampler "often"`},
		{map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, `argument "half"`},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"FLASHSALE_PPROF_ADDR": "127.0.0.1:6060"}, "admin token"},
		{map[string]string{"FLASHSALE_PPROF_ADDR": "6060", "FLASHSALE_ADMIN_TOKEN": "x"}, "pprof-addr"},
	} {
		_, err := parseConfig("test", nil, func(k string) string { return c.env[k] }, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.env, err, c.want)
		}
	}
}

// TestPprofListener: flashsale serve has no profiling endpoints unless
// FLASHSALE_PPROF_ADDR is set, never on the API's listener, and they refuse
// a request without the admin token.
func TestPprofListener(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("on=%v", on), func(t *testing.T) {
			env := map[string]string{
				"FLASHSALE_HTTP_ADDR":         "127.0.0.1:0",
				"FLASHSALE_DATABASE_URL":      testenv.Database(t),
				"FLASHSALE_USER_TOKEN_SECRET": testSecret,
				"FLASHSALE_ADMIN_TOKEN":       testAdmin,
				"FLASHSALE_DATA_DIR":          t.TempDir(),
				"FLASHSALE_DRAIN_DELAY":       "0",
			}
			env["FLASHSALE_REDIS_URL"], env["FLASHSALE_REDIS_PREFIX"] = testenv.Redis(t)
			if on {
				env["FLASHSALE_PPROF_ADDR"] = "127.0.0.1:0"
			}
			ctx, cancel := context.WithCancel(context.Background())
			out := &syncBuffer{}
			done := make(chan error, 1)
			go func() { done <- runServe(ctx, nil, func(k string) string { return env[k] }, out, testLogWriter{t}) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("serve: %v", err)
				}
			})
			api := waitLine(t, out, "flashsale listening on ", done)
			get := func(url string, token string) int {
				t.Helper()
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			// The API's listener never serves them, admin token or not.
			for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap"} {
				if got := get(api+p, testAdmin); got != http.StatusNotFound {
					t.Fatalf("API listener %s: %d, want 404", p, got)
				}
			}
			if !on {
				if strings.Contains(out.String(), "profiling on") {
					t.Fatalf("profiling listener started unasked: %s", out.String())
				}
				return
			}
			prof := strings.TrimSuffix(waitLine(t, out, "flashsale profiling on ", done), "/debug/pprof/ (admin token required)")
			for _, c := range []struct {
				path, token string
				want        int
			}{
				{"/debug/pprof/", "", http.StatusUnauthorized},
				{"/debug/pprof/cmdline", "wrong", http.StatusUnauthorized},
				{"/debug/pprof/heap", "", http.StatusUnauthorized},
				{"/debug/pprof/", testAdmin, http.StatusOK},
				{"/debug/pprof/heap", testAdmin, http.StatusOK},
				{"/debug/pprof/goroutine?debug=1", testAdmin, http.StatusOK},
			} {
				if got := get(prof+c.path, c.token); got != c.want {
					t.Errorf("profiling %s (token %q): %d, want %d", c.path, c.token, got, c.want)
				}
			}
		})
	}
}

// waitLine waits for a line of out starting with prefix and returns the
// rest of it.
func waitLine(t *testing.T, out *syncBuffer, prefix string, done <-chan error) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		for _, l := range strings.Split(out.String(), "\n") {
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return rest
			}
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no line %q in %q", prefix, out.String())
	return ""
}

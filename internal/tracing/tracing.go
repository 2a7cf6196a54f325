// Package tracing is flashsale's OpenTelemetry tracing: the tracer provider
// (OTLP over HTTP, configured by the standard OTEL_* variables), a nil-safe
// Tracer the purchase path calls, the W3C trace context carried in queue
// messages, and a log handler that adds trace and span ids to log lines.
//
// Tracing is off unless asked for. Off, the Tracer is nil: Start returns the
// context it was given and a span that does nothing, with no allocation, so
// the purchase path pays one nil check per span.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Exporters are the values of Config.Exporter (OTEL_TRACES_EXPORTER).
const (
	ExporterNone = "none"
	ExporterOTLP = "otlp"
)

// Config selects and describes the traces.
type Config struct {
	// Exporter is ExporterNone (or "": tracing off) or ExporterOTLP. The
	// OTLP exporter reads its endpoint, headers, timeout and TLS settings
	// from the standard OTEL_EXPORTER_OTLP_* variables itself.
	Exporter string
	// ServiceName is the service.name resource attribute (default "flashsale").
	ServiceName string
	// Sampler and SamplerArg are OTEL_TRACES_SAMPLER and
	// OTEL_TRACES_SAMPLER_ARG (see ParseSampler); "" is parentbased_always_on.
	Sampler    string
	SamplerArg string
	// SpanExporter, if set, receives the spans instead of the OTLP exporter,
	// each as it ends (tests: tracetest.NewInMemoryExporter).
	SpanExporter sdktrace.SpanExporter
	// Log receives the exporter's errors (export failures); nil discards them.
	Log *slog.Logger
}

// On reports whether c turns tracing on.
func (c Config) On() bool {
	return c.SpanExporter != nil || c.Exporter == ExporterOTLP
}

// Check reports a setting Setup would refuse, with a message naming it.
func (c Config) Check() error {
	switch c.Exporter {
	case "", ExporterNone, ExporterOTLP:
	default:
		return fmt.Errorf("tracing: exporter %q is not supported: use otlp or none", c.Exporter)
	}
	_, err := ParseSampler(c.Sampler, c.SamplerArg)
	return err
}

// ParseSampler returns the sampler an OTEL_TRACES_SAMPLER name and its
// OTEL_TRACES_SAMPLER_ARG select: always_on, always_off, traceidratio,
// parentbased_always_on (the default, also for ""), parentbased_always_off,
// parentbased_traceidratio. The ratio samplers take a probability in [0, 1]
// (default 1).
func ParseSampler(name, arg string) (sdktrace.Sampler, error) {
	ratio := 1.0
	if arg != "" && strings.HasSuffix(name, "traceidratio") {
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || f < 0 || f > 1 {
			return nil, fmt.Errorf("tracing: sampler argument %q is not a probability in [0, 1]", arg)
		}
		ratio = f
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("tracing: sampler %q is not one of always_on, always_off, traceidratio, "+
		"parentbased_always_on, parentbased_always_off, parentbased_traceidratio", name)
}

// Setup builds the tracer provider c describes. With tracing off it returns
// a nil Tracer and a shutdown that does nothing. shutdown flushes the spans
// still buffered and stops the exporter: call it once, after the last span
// ended (after the workers stopped).
func Setup(ctx context.Context, c Config) (_ *Tracer, shutdown func(context.Context) error, _ error) {
	nothing := func(context.Context) error { return nil }
	if err := c.Check(); err != nil {
		return nil, nothing, err
	}
	if !c.On() {
		return nil, nothing, nil
	}
	sampler, _ := ParseSampler(c.Sampler, c.SamplerArg)
	name := c.ServiceName
	if name == "" {
		name = "flashsale"
	}
	// From the environment first (OTEL_RESOURCE_ATTRIBUTES), then the
	// service name, which wins over an OTEL_SERVICE_NAME read there.
	res, err := resource.New(ctx,
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(name)),
	)
	if err != nil && res == nil {
		return nil, nothing, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSampler(sampler)}
	if c.SpanExporter != nil {
		opts = append(opts, sdktrace.WithSyncer(c.SpanExporter))
	} else {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, nothing, fmt.Errorf("tracing: otlp exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
		// The SDK reports failed exports only through this global hook.
		log := c.Log
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return newTracer(tp), tp.Shutdown, nil
}

// Tracer starts flashsale's spans. A nil *Tracer is tracing off: every
// method is safe to call on it and does nothing.
type Tracer struct {
	t    trace.Tracer
	prop propagation.TraceContext
}

// NewTracer returns a Tracer of tp (nil tp: nil Tracer, tracing off).
func NewTracer(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		return nil
	}
	return newTracer(tp)
}

func newTracer(tp trace.TracerProvider) *Tracer {
	return &Tracer{t: tp.Tracer("github.com/flashsale/flashsale")}
}

// nop is the span of a nil Tracer (an interface value made once, so
// returning it does not allocate).
var nop trace.Span = noop.Span{}

// Start starts a span of the given kind as a child of ctx's span (a new trace
// when there is none) and returns a context holding it. Callers set
// attributes only when span.IsRecording(), so tracing off builds none.
func (t *Tracer) Start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if t == nil {
		return ctx, nop
	}
	return t.t.Start(ctx, name, trace.WithSpanKind(kind))
}

// Extract returns ctx with the remote span context carrier holds (W3C
// traceparent and tracestate), or ctx unchanged if it holds none.
func (t *Tracer) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	if t == nil {
		return ctx
	}
	return t.prop.Extract(ctx, carrier)
}

// Inject returns the W3C trace context headers (traceparent, tracestate) of
// ctx's span, to carry in a message; nil when tracing is off or ctx holds no
// span.
func (t *Tracer) Inject(ctx context.Context) map[string]string {
	if t == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := propagation.MapCarrier{}
	t.prop.Inject(ctx, h)
	return h
}

// Getter reads one header of a message (nats.Header is one).
type Getter interface {
	Get(key string) string
}

// LinkFrom returns a link to the span whose W3C trace context h carries
// (Inject's headers); false when it carries none (a message published
// without tracing, or republished from Redis).
func LinkFrom(h Getter) (trace.Link, bool) {
	var p propagation.TraceContext
	sc := trace.SpanContextFromContext(p.Extract(context.Background(), getter{h}))
	if !sc.IsValid() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc}, true
}

type getter struct{ g Getter }

func (g getter) Get(k string) string {
	if g.g == nil {
		return ""
	}
	return g.g.Get(k)
}
func (getter) Set(string, string) {}
func (getter) Keys() []string     { return []string{"traceparent", "tracestate"} }

// Fail marks span as failed with err (nothing when err is nil).
func Fail(span trace.Span, err error) {
	if err == nil || !span.IsRecording() {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// ShutdownTimeout bounds the flush at exit.
const ShutdownTimeout = 5 * time.Second

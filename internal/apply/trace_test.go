package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/tracing"
)

// tracedMsg is a delivered message with headers.
type tracedMsg struct {
	*msg
	h nats.Header
}

func (m tracedMsg) Headers() nats.Header { return m.h }

// TestBatchSpanLinksPurchases: a batch's span links the trace context each
// message carries; a message without one (published from Redis) adds no
// link and is applied all the same; a failed batch's span is marked failed.
func TestBatchSpanLinksPurchases(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, stop, err := tracing.Setup(context.Background(), tracing.Config{SpanExporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())

	var msgs []jetstream.Msg
	var want []trace.SpanContext
	for i, id := range []string{"01890000-0000-7000-8000-000000000001", "01890000-0000-7000-8000-000000000002", "01890000-0000-7000-8000-000000000003"} {
		data, _ := json.Marshal(sale.Reservation{OrderID: id, SKU: "s", User: "u", Quantity: 1, AcceptedAt: 1})
		m := tracedMsg{msg: &msg{data: data, delivered: 1}}
		if i != 1 { // the second has no trace context
			ctx, span := tr.Start(context.Background(), "relay.publish", trace.SpanKindProducer)
			m.h = nats.Header{}
			for k, v := range tr.Inject(ctx) {
				m.h[k] = []string{v}
			}
			want = append(want, span.SpanContext())
			span.End()
		}
		msgs = append(msgs, m)
	}
	st := &store{}
	c := apply.New(st, gate{}, &dead{}, slog.New(slog.DiscardHandler), nil, apply.Config{Tracer: tr})
	c.Handle(context.Background(), msgs)
	for _, m := range msgs {
		if !m.(tracedMsg).acked {
			t.Fatal("a message was not acked")
		}
	}
	batches := exp.GetSpans()[len(want):]
	if len(batches) != 1 || batches[0].Name != "apply.batch" {
		t.Fatalf("spans after the publishes: %+v, want one apply.batch", batches)
	}
	var got []trace.SpanContext
	for _, l := range batches[0].Links {
		got = append(got, l.SpanContext.WithRemote(false))
	}
	if len(got) != len(want) || !got[0].Equal(want[0]) || !got[1].Equal(want[1]) {
		t.Fatalf("links %v, want %v", got, want)
	}

	exp.Reset()
	st.err = errors.New("database refuses")
	c.Handle(context.Background(), msgs[:1])
	if s := exp.GetSpans(); len(s) != 1 || s[0].Status.Code != codes.Error {
		t.Fatalf("failed batch spans: %+v, want one with status Error", s)
	}
}

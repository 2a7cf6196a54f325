package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/relay"
	"github.com/flashsale/flashsale/internal/sale"
)

// countingHolder counts the broker reads of a queue.
type countingHolder struct {
	q         *orderqueue.Queue
	one, bulk atomic.Int64
}

func (h *countingHolder) Unapplied(ctx context.Context, sku string) ([]sale.Reservation, error) {
	h.one.Add(1)
	return h.q.Unapplied(ctx, sku)
}

func (h *countingHolder) UnappliedAll(ctx context.Context) (map[string][]sale.Reservation, error) {
	h.bulk.Add(1)
	return h.q.UnappliedAll(ctx)
}

// TestRepublisherReadsOncePerPass: with stuck reservations on many SKUs,
// a pass reads what the broker holds once, not once per SKU, and still
// leaves alone what the stream holds.
func TestRepublisherReadsOncePerPass(t *testing.T) {
	e := newEnv(t)
	h := &countingHolder{q: e.queue}
	rep := relay.NewRepublisher(e.gate, h, e.queue, slog.New(slog.DiscardHandler), relay.RepublishConfig{After: after})
	at := time.Now()
	for i := range 30 {
		sku := fmt.Sprintf("B%02d", i)
		e.load(t, sku)
		e.reserve(t, sku, 1, at)
	}
	res, err := rep.RunOnce(context.Background(), at.Add(2*after))
	if err != nil {
		t.Fatal(err)
	}
	if res.Held != 30 || res.Republished != 0 {
		t.Fatalf("pass: %+v, want 30 held by the stream and none republished", res)
	}
	if b, o := h.bulk.Load(), h.one.Load(); b != 1 || o != 0 {
		t.Fatalf("broker reads: %d bulk and %d per SKU, want 1 and 0", b, o)
	}
}

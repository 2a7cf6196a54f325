package purchase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// lookupGate is a fakeGate that holds what it reserved in flight and
// counts the Redis look-ups of Order.
type lookupGate struct {
	fakeGate
	mu      sync.Mutex
	held    map[string]sale.Reservation
	lookups [][]string // the SKUs asked, per call
}

func (g *lookupGate) record(r sale.Reservation) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[r.OrderID] = r
}

func (g *lookupGate) Lookup(_ context.Context, id string, skus ...string) (sale.Reservation, bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lookups = append(g.lookups, skus)
	r, ok := g.held[id]
	if ok && !slices.Contains(skus, r.SKU) {
		ok = false // asked in the wrong SKUs' keys
	}
	return r, ok, nil
}

type noOrders struct{}

func (noOrders) Order(context.Context, string) (sale.Order, error) {
	return sale.Order{}, sale.ErrOrderNotFound
}
func (noOrders) OrderByKey(context.Context, string, string, string) (sale.Order, error) {
	return sale.Order{}, sale.ErrOrderNotFound
}

// recordingRelay hands each accepted reservation to the gate's in-flight set.
type recordingRelay struct{ g *lookupGate }

func (r recordingRelay) Notify(_ context.Context, sku, id string, _ []byte) {
	r.g.record(sale.Reservation{OrderID: id, SKU: sku, User: "buyer", Quantity: 1})
}
func (r recordingRelay) Publish(ctx context.Context, sku, id string, p []byte) error {
	r.Notify(ctx, sku, id, p)
	return nil
}

// TestOrderLookupOneCall: with 1,000 SKUs on sale, a queued order (in
// Redis, not yet in the database) is found with one Redis call asking the
// SKUs of its id's tag only (one, but for a rare shared tag), not one call
// per SKU.
func TestOrderLookupOneCall(t *testing.T) {
	var skus fakeSKUs
	for i := range 1000 {
		skus = append(skus, sale.SKU{ID: fmt.Sprintf("sku-%04d", i), PerUserLimit: 5, Stock: 100, TotalStock: 100})
	}
	cat := NewCatalog(skus)
	if err := cat.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	g := &lookupGate{fakeGate: fakeGate{avail: 1_000_000}, held: map[string]sale.Reservation{}}
	s := New(Deps{Catalog: cat, Gate: g, Relay: recordingRelay{g}, Orders: noOrders{}, Log: slog.New(slog.DiscardHandler)}, BreakerConfig{Disabled: true})
	s.ack = 0
	ctx := context.Background()
	for _, sku := range []string{"sku-0000", "sku-0517", "sku-0999"} {
		res, err := s.Buy(ctx, Request{User: "buyer", SKU: sku, Quantity: 1, ClientIP: "192.0.2.1"})
		if err != nil {
			t.Fatal(err)
		}
		g.lookups = nil
		o, err := s.Order(ctx, "buyer", res.OrderID)
		if err != nil || o.Status != sale.StatusQueued || o.SKU != sku {
			t.Fatalf("order of %s: %+v %v", sku, o, err)
		}
		if len(g.lookups) != 1 || len(g.lookups[0]) > 2 || !slices.Contains(g.lookups[0], sku) {
			t.Fatalf("order of %s: look-ups %v, want one call asking %s (and at most one SKU sharing its tag)", sku, g.lookups, sku)
		}
	}
}

// someOrders knows one order.
type someOrders struct{ o sale.Order }

func (s someOrders) Order(_ context.Context, id string) (sale.Order, error) {
	if id == s.o.ID {
		return s.o, nil
	}
	return sale.Order{}, sale.ErrOrderNotFound
}
func (someOrders) OrderByKey(context.Context, string, string, string) (sale.Order, error) {
	return sale.Order{}, sale.ErrOrderNotFound
}

// TestClosedForgottenAsksDatabase: a reserve call the gate refuses because
// the reservation is older than the closed markers it remembers is answered
// from the database: the order it made if there is one (a duplicate,
// nothing reserved), otherwise unavailable (never a second reservation).
func TestClosedForgottenAsksDatabase(t *testing.T) {
	g := &fakeGate{avail: 10, refuse: func(sale.Reservation, stockgate.Limits) error { return stockgate.ErrClosedForgotten }}
	cat := NewCatalog(fakeSKUs{{ID: "s", PerUserLimit: 5, Stock: 100, TotalStock: 100}})
	if err := cat.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := sale.Reservation{OrderID: stockgate.NewOrderID("s"), SKU: "s", User: "u", Quantity: 1, AcceptedAt: 1}
	for _, tc := range []struct {
		orders OrderReader
		dup    bool
	}{{someOrders{sale.Order{ID: r.OrderID, SKU: "s", User: "u", Quantity: 1}}, true}, {noOrders{}, false}} {
		s := New(Deps{Catalog: cat, Gate: g, Relay: nopRelay{}, Orders: tc.orders, Log: slog.New(slog.DiscardHandler)}, BreakerConfig{Disabled: true})
		gr, err := s.reserve(ctx, r, stockgate.Limits{})
		switch {
		case tc.dup && (err != nil || !gr.Duplicate || gr.OrderID != r.OrderID):
			t.Fatalf("order in the database: %+v %v, want a duplicate of it", gr, err)
		case !tc.dup && !errors.Is(err, sale.ErrUnavailable):
			t.Fatalf("order unknown to the database: %+v %v, want unavailable", gr, err)
		}
	}
	if g.avail != 10 {
		t.Fatalf("available %d, want 10: nothing reserved", g.avail)
	}
}

// stalledOrders answers nothing until its caller gives up, as a database
// whose connection slots are all taken does.
type stalledOrders struct{}

func (stalledOrders) Order(ctx context.Context, _ string) (sale.Order, error) {
	<-ctx.Done()
	return sale.Order{}, ctx.Err()
}
func (stalledOrders) OrderByKey(ctx context.Context, _, _, _ string) (sale.Order, error) {
	<-ctx.Done()
	return sale.Order{}, ctx.Err()
}

// TestSettledDoesNotWaitForAStalledDatabase: a retry's answer is refined
// from the database only within settledTimeout; a database that does not
// answer leaves the retry its true answer (queued) instead of holding it.
func TestSettledDoesNotWaitForAStalledDatabase(t *testing.T) {
	s := New(Deps{Catalog: NewCatalog(fakeSKUs{}), Gate: &fakeGate{}, Relay: nopRelay{}, Orders: stalledOrders{}, Log: slog.New(slog.DiscardHandler)}, BreakerConfig{Disabled: true})
	in := Result{OrderID: "o1", Duplicate: true, Status: sale.StatusQueued}
	done := make(chan Result, 1)
	go func() { done <- s.settled(context.Background(), "u", in) }()
	select {
	case got := <-done:
		if got.Status != sale.StatusQueued || got.Order != nil {
			t.Fatalf("settled on a stalled database: %+v, want the queued answer unchanged", got)
		}
	case <-time.After(10 * settledTimeout):
		t.Fatalf("settled still waiting on a stalled database after %v", 10*settledTimeout)
	}
}

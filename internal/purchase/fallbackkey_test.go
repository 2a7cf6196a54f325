package purchase

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// downGate is a Redis whose gate calls fail (the breaker opens) while its
// look-up of an Idempotency-Key holds the first attempt's reservation in
// flight, answering after delay, or failing with err.
type downGate struct {
	fakeGate
	inFlight string // the order id the key made in Redis
	delay    time.Duration
	err      error
}

func (g *downGate) ReserveLimited(context.Context, sale.Reservation, stockgate.Limits) (stockgate.ReserveResult, error) {
	return stockgate.ReserveResult{}, errors.New("dial tcp: connection refused")
}

func (g *downGate) Duplicate(ctx context.Context, _, _, _ string) (string, bool, error) {
	if g.err != nil {
		return "", false, g.err
	}
	select {
	case <-time.After(g.delay):
		return g.inFlight, true, nil
	case <-ctx.Done():
		return "", false, ctx.Err()
	}
}

// countingDirect is the database fallback: it sells every reservation it
// is given and records their order ids.
type countingDirect struct {
	mu   sync.Mutex
	sold []string
}

func (d *countingDirect) BuyDirect(_ context.Context, r sale.Reservation, _ time.Time) (sale.Order, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sold = append(d.sold, r.OrderID)
	return sale.Order{ID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity, Status: sale.StatusPendingPayment}, false, nil
}

// TestKeyLookupBeforeFallbackSale: the breaker is open and a client
// retries an Idempotency-Key whose first attempt is in flight in Redis.
// The retry is answered with that reservation when Redis answers the
// look-up within fallbackKeyLookup; when it answers later, or fails, the
// database fallback sells (a hung Redis must not hold it): that is the
// interleaving in which one key has an order sold by the fallback and a
// reservation still in flight, which the database settles by refusing the
// later one (duplicate_key; orderstore's ApplyBatch).
func TestKeyLookupBeforeFallbackSale(t *testing.T) {
	for _, tc := range []struct {
		name      string
		delay     time.Duration
		err       error
		wantFound bool // answered with the reservation in flight
	}{
		{name: "redis answers at once", wantFound: true},
		{name: "redis answers within the bound", delay: fallbackKeyLookup / 4, wantFound: true},
		{name: "redis answers after the bound", delay: 10 * fallbackKeyLookup},
		{name: "redis fails the look-up", err: errors.New("read tcp: connection reset by peer")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &downGate{inFlight: "in-flight", delay: tc.delay, err: tc.err}
			d := &countingDirect{}
			cat := NewCatalog(fakeSKUs{{ID: "s", PerUserLimit: 5, Stock: 100, TotalStock: 100}})
			if err := cat.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			s := New(Deps{Catalog: cat, Gate: g, Relay: nopRelay{}, Direct: d, Log: slog.New(slog.DiscardHandler)},
				BreakerConfig{CallTimeout: 100 * time.Millisecond, OpenFor: time.Minute, MinRequests: 3})
			for i := 0; s.BreakerState() != "open"; i++ {
				if i == 10 {
					t.Fatalf("breaker %s after %d failed purchases", s.BreakerState(), i)
				}
				_, _ = s.Buy(context.Background(), Request{User: "opener", SKU: "s", Quantity: 1})
			}
			start := time.Now()
			res, err := s.Buy(context.Background(), Request{User: "bob", SKU: "s", Quantity: 1, IdempotencyKey: "k2"})
			took := time.Since(start)
			if err != nil {
				t.Fatalf("retry of k2 while the breaker is open: %v", err)
			}
			d.mu.Lock()
			sold := d.sold
			d.mu.Unlock()
			if tc.wantFound {
				want := Result{OrderID: "in-flight", Duplicate: true, Status: sale.StatusQueued}
				if diff := cmp.Diff(want, res); diff != "" {
					t.Errorf("retry answered (-want +got):\n%s", diff)
				}
				if len(sold) != 0 {
					t.Errorf("the fallback sold %v, want nothing", sold)
				}
				return
			}
			if res.OrderID == "in-flight" || res.Duplicate || res.Status != sale.StatusPendingPayment {
				t.Errorf("retry answered %+v, want a new pending_payment order sold by the fallback", res)
			}
			if diff := cmp.Diff([]string{res.OrderID}, sold); diff != "" {
				t.Errorf("fallback sales (-want +got):\n%s", diff)
			}
			if tc.delay > 0 && took >= tc.delay {
				t.Errorf("the fallback waited %v for a look-up bounded at %v", took, fallbackKeyLookup)
			}
		})
	}
}

// heldGate is a failing gate (the breaker opens) that says what a buyer
// holds after delay, or fails with err.
type heldGate struct {
	downGate
	held int64
}

func (g *heldGate) Ping(context.Context) error { return errors.New("connection refused") }

// Duplicate finds no key: the key's look-up did not answer in time.
func (g *heldGate) Duplicate(ctx context.Context, _, _, _ string) (string, bool, error) {
	return "", false, context.DeadlineExceeded
}

func (g *heldGate) Held(ctx context.Context, _, _ string) (int64, error) {
	if g.err != nil {
		return 0, g.err
	}
	select {
	case <-time.After(g.delay):
		return g.held, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// TestHeldBeforeFallbackSale: with the breaker open, a buyer whose
// reservation is still in flight in Redis (not in the database, so the
// fallback's own limit check cannot see it) is refused limit_reached when
// Redis says in time what they hold, instead of sold a unit the database
// would then refuse them (a 202 that ends failed). When Redis cannot say
// within fallbackKeyLookup, the fallback sells as before.
func TestHeldBeforeFallbackSale(t *testing.T) {
	for _, tc := range []struct {
		name     string
		held     int64
		delay    time.Duration
		err      error
		wantSold bool
	}{
		{name: "holds the limit", held: 1},
		{name: "holds nothing", held: 0, wantSold: true},
		{name: "redis answers after the bound", held: 1, delay: 10 * fallbackKeyLookup, wantSold: true},
		{name: "redis fails", held: 1, err: errors.New("read tcp: connection reset by peer"), wantSold: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &heldGate{downGate: downGate{delay: tc.delay, err: tc.err}, held: tc.held}
			d := &countingDirect{}
			cat := NewCatalog(fakeSKUs{{ID: "s", PerUserLimit: 1, Stock: 100, TotalStock: 100}})
			if err := cat.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			s := New(Deps{Catalog: cat, Gate: BoundedGate{PingGate: g, Timeout: time.Second}, Relay: nopRelay{}, Direct: d, Log: slog.New(slog.DiscardHandler)},
				BreakerConfig{CallTimeout: 100 * time.Millisecond, OpenFor: time.Minute, MinRequests: 3})
			for i := 0; s.BreakerState() != "open"; i++ {
				if i == 10 {
					t.Fatalf("breaker %s after %d failed purchases", s.BreakerState(), i)
				}
				_, _ = s.Buy(context.Background(), Request{User: "opener", SKU: "s", Quantity: 1})
			}
			d.mu.Lock()
			d.sold = nil
			d.mu.Unlock()
			res, err := s.Buy(context.Background(), Request{User: "bob", SKU: "s", Quantity: 1})
			d.mu.Lock()
			sold := d.sold
			d.mu.Unlock()
			if tc.wantSold {
				if err != nil || len(sold) != 1 || res.Status != sale.StatusPendingPayment {
					t.Errorf("fallback: %+v, %v, sold %v; want one sale", res, err, sold)
				}
				return
			}
			if !errors.Is(err, sale.ErrLimitReached) || len(sold) != 0 {
				t.Errorf("bob holding his limit in redis: %+v, %v, sold %v; want limit_reached and no sale", res, err, sold)
			}
			// With a key whose look-up did not answer (this gate's
			// Duplicate finds nothing), the unit held may be the key's own
			// order: unknown (503, retry with the key), not limit_reached.
			res, err = s.Buy(context.Background(), Request{User: "bob", SKU: "s", Quantity: 1, IdempotencyKey: "k1"})
			d.mu.Lock()
			sold = d.sold
			d.mu.Unlock()
			if !errors.Is(err, sale.ErrUnavailable) || errors.Is(err, sale.ErrLimitReached) || len(sold) != 0 {
				t.Errorf("bob's keyed retry holding his limit in redis: %+v, %v, sold %v; want unavailable and no sale", res, err, sold)
			}
		})
	}
}

package purchase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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

// keyedOrders is the database's orders: those its keys made (user NUL key
// -> order), with its look-ups by key counted; err, if set, fails them.
type keyedOrders struct {
	mu    sync.Mutex
	byKey map[string]sale.Order
	reads int
	err   error
}

func (k *keyedOrders) Order(_ context.Context, id string) (sale.Order, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, o := range k.byKey {
		if o.ID == id {
			return o, nil
		}
	}
	return sale.Order{}, sale.ErrOrderNotFound
}

func (k *keyedOrders) OrderByKey(_ context.Context, _, user, key string) (sale.Order, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reads++
	if k.err != nil {
		return sale.Order{}, k.err
	}
	if o, ok := k.byKey[user+"\x00"+key]; ok {
		return o, nil
	}
	return sale.Order{}, sale.ErrOrderNotFound
}

func (k *keyedOrders) count() int { k.mu.Lock(); defer k.mu.Unlock(); return k.reads }

func (k *keyedOrders) fail(err error) { k.mu.Lock(); k.err = err; k.mu.Unlock() }

// TestKeyedRefusalAfterFallbackAsksDatabase: the database fallback sold
// order X for key k while the breaker was open, and its buyer lost the
// answer (a commit that succeeded past the request's deadline is answered
// 503). The breaker has closed; the restorer has not yet taken X into
// Redis, which refuses k (sold out, or limit reached: it counts a
// reservation of the buyer's that was in flight there). A retry of k is
// answered X, not the refusal, from the sold-out flag's path as from the
// gate's; a key without an order is still refused; a database that cannot
// say answers 503 (retry with the key), never the refusal. Before the
// breaker ever opened, and once SettleFor has passed since it closed, a
// keyed refusal reads nothing from the database.
func TestKeyedRefusalAfterFallbackAsksDatabase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flag    bool  // the sold-out flag answers (SoldOutTTL)
		gate    error // what the gate answers once Redis is back
		refusal error // the refusal a buyer is told
	}{
		{"sold-out flag", true, &stockgate.SoldOutError{}, sale.ErrSoldOut},
		{"gate sold out", false, &stockgate.SoldOutError{}, sale.ErrSoldOut},
		{"gate limit reached", false, sale.ErrLimitReached, sale.ErrLimitReached},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := sale.Order{ID: stockgate.NewOrderID("s"), SKU: "s", User: "u", Quantity: 1, Status: sale.StatusPendingPayment}
			db := &keyedOrders{byKey: map[string]sale.Order{"u\x00k": x}}
			var down atomic.Bool
			g := &fakeGate{avail: 0, refuse: func(sale.Reservation, stockgate.Limits) error {
				if down.Load() {
					return errors.New("dial tcp: connection refused")
				}
				return tc.gate
			}}
			cat := NewCatalog(fakeSKUs{{ID: "s", PerUserLimit: 1, Stock: 100, TotalStock: 100}})
			if err := cat.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			var l Limits
			if tc.flag {
				l.SoldOutTTL = time.Hour
			}
			s := New(Deps{Catalog: cat, Gate: g, Relay: nopRelay{}, Orders: db, Direct: &countingDirect{}, Log: slog.New(slog.DiscardHandler), Limits: l},
				BreakerConfig{CallTimeout: time.Second, OpenFor: 20 * time.Millisecond, MinRequests: 3, SettleFor: time.Minute})
			keyed := func(user, key string) (Result, error) {
				return s.Buy(context.Background(), Request{User: user, SKU: "s", Quantity: 1, IdempotencyKey: key})
			}

			if _, err := keyed("u", "k"); !errors.Is(err, tc.refusal) || db.count() != 0 {
				t.Fatalf("before any opening: %v, %d database reads; want %v, none", err, db.count(), tc.refusal)
			}
			s.Noticed("s", false) // forget the flag: the next purchases reach the gate
			down.Store(true)
			for i := range 3 {
				_, _ = s.Buy(context.Background(), Request{User: fmt.Sprintf("f%d", i), SKU: "s", Quantity: 1})
			}
			if st := s.guard.State(); st == "closed" {
				t.Fatal("breaker closed after 3 failed gate calls, want it open")
			}
			down.Store(false)
			// Probe until the breaker closes (past OpenFor; a probe whose
			// rebuild outlasts its call is answered busy on a slow machine).
			for deadline := time.Now().Add(10 * time.Second); s.guard.State() != "closed"; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("breaker %s 10 s after Redis came back, want closed", s.guard.State())
				}
				_ = buy(s, "probe", 1)
			}
			if tc.flag {
				if err := buy(s, "sets-the-flag", 1); !errors.Is(err, sale.ErrSoldOut) {
					t.Fatalf("a purchase once Redis is back: %v, want sold out", err)
				}
			}

			res, err := keyed("u", "k")
			if err != nil || res.OrderID != x.ID || !res.Duplicate {
				t.Fatalf("retry of a key the fallback sold: %+v, %v; want order %s", res, err, x.ID)
			}
			if _, err := keyed("v", "k2"); !errors.Is(err, tc.refusal) {
				t.Fatalf("a key without an order: %v, want %v", err, tc.refusal)
			}
			db.fail(errors.New("read tcp: i/o timeout"))
			if _, err := keyed("u", "k"); !errors.Is(err, sale.ErrUnavailable) {
				t.Fatalf("retry while the database cannot say: %v, want unavailable", err)
			}
			db.fail(nil)

			// SettleFor after the closing (the window's end, set in the past).
			s.guard.unsettledUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
			reads := db.count()
			if _, err := keyed("u", "k"); !errors.Is(err, tc.refusal) || db.count() != reads {
				t.Fatalf("SettleFor after closing: %v, %d database reads; want %v, none", err, db.count()-reads, tc.refusal)
			}
		})
	}
}

// TestGuardSettleWindow: the window in which keyed refusals ask the
// database is open from the breaker's opening, through half-open, until
// SettleFor after it closes.
func TestGuardSettleWindow(t *testing.T) {
	obs := &states{}
	const settle = time.Hour
	g := newGuard(BreakerConfig{CallTimeout: time.Second, OpenFor: 20 * time.Millisecond, MinRequests: 3, SettleFor: settle}, directNone{}, rebuildNothing,
		slog.New(slog.DiscardHandler), obs)
	if g.unsettled() {
		t.Fatal("unsettled before any opening")
	}
	clk := newWaitClock()
	defer clk.put()
	fail := func(context.Context) (stockgate.ReserveResult, error) {
		return stockgate.ReserveResult{}, errors.New("dial tcp: connection refused")
	}
	for range 3 {
		_, _ = g.reserve(context.Background(), clk, fail)
	}
	if g.State() == "closed" || !g.unsettled() {
		t.Fatalf("breaker %s, unsettled %v after 3 failures; want open, true", g.State(), g.unsettled())
	}
	time.Sleep(30 * time.Millisecond)
	if st := g.State(); st != "half-open" || !g.unsettled() {
		t.Fatalf("breaker %s, unsettled %v past OpenFor; want half-open, true", st, g.unsettled())
	}
	before := time.Now()
	for deadline := time.Now().Add(10 * time.Second); g.State() != "closed"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("breaker %s after 10 s of probes, want closed", g.State())
		}
		_, _ = g.reserve(context.Background(), clk, okCall)
	}
	after := time.Now()
	until := time.Unix(0, g.unsettledUntil.Load())
	if !g.unsettled() || until.Before(before.Add(settle)) || until.After(after.Add(settle)) {
		t.Fatalf("closed between %v and %v: unsettled %v until %v, want until SettleFor (%v) after the closing", before, after, g.unsettled(), until, settle)
	}
}

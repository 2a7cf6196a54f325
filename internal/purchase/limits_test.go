package purchase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// fakeGate sells avail units and counts its calls; refuse, if set, decides
// instead.
type fakeGate struct {
	mu     sync.Mutex
	avail  int64
	calls  int
	keys   map[string]string // user NUL key -> order id
	refuse func(r sale.Reservation, l stockgate.Limits) error
}

func (g *fakeGate) ReserveLimited(_ context.Context, r sale.Reservation, l stockgate.Limits) (stockgate.ReserveResult, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	if g.refuse != nil {
		if err := g.refuse(r, l); err != nil {
			return stockgate.ReserveResult{}, err
		}
	}
	if g.avail < r.Quantity {
		return stockgate.ReserveResult{}, &stockgate.SoldOutError{Available: g.avail}
	}
	g.avail -= r.Quantity
	if r.IdempotencyKey != "" {
		if g.keys == nil {
			g.keys = map[string]string{}
		}
		g.keys[r.User+"\x00"+r.IdempotencyKey] = r.OrderID
	}
	return stockgate.ReserveResult{OrderID: r.OrderID, Available: g.avail}, nil
}

func (g *fakeGate) Lookup(context.Context, string, ...string) (sale.Reservation, bool, error) {
	return sale.Reservation{}, false, nil
}

func (g *fakeGate) Available(context.Context, string) (int64, bool, error) { return g.avail, true, nil }

// Unsent says no reservation is left in the outbox: the relay took it.
func (g *fakeGate) Unsent(context.Context, string, string, string) ([]byte, string, error) {
	return nil, "", nil
}

func (g *fakeGate) Duplicate(_ context.Context, sku, user, key string) (string, bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	id, ok := g.keys[user+"\x00"+key]
	return id, ok, nil
}

func (g *fakeGate) give(n int64) { g.mu.Lock(); g.avail += n; g.mu.Unlock() }

func (g *fakeGate) count() int { g.mu.Lock(); defer g.mu.Unlock(); return g.calls }

type fakeSKUs []sale.SKU

func (f fakeSKUs) SKUs(context.Context) ([]sale.SKU, error) { return f, nil }

type nopRelay struct{}

func (nopRelay) Notify(context.Context, string, string, []byte)        {}
func (nopRelay) Publish(context.Context, string, string, []byte) error { return nil }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time           { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration)      { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newClock() *clock                    { return &clock{t: time.Unix(1_800_000_000, 0)} }
func (c *clock) since(t time.Time) string { return c.now().Sub(t).String() }

func newTestService(t *testing.T, g *fakeGate, l Limits) (*Service, *clock) {
	t.Helper()
	cat := NewCatalog(fakeSKUs{{ID: "s", PerUserLimit: 5, Stock: 100, TotalStock: 100}})
	if err := cat.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := New(Deps{Catalog: cat, Gate: g, Relay: nopRelay{}, Log: slog.New(slog.DiscardHandler), Limits: l}, BreakerConfig{Disabled: true})
	c := newClock()
	s.now = c.now
	return s, c
}

func buy(s *Service, user string, qty int64) error {
	_, err := s.Buy(context.Background(), Request{User: user, SKU: "s", Quantity: qty, ClientIP: "192.0.2.1"})
	return err
}

// TestSoldOutFlag: after the gate says sold out, purchases are answered from
// memory; after the TTL exactly one asks the gate again, so units given back
// are sold again; a notice clears the flag at once.
func TestSoldOutFlag(t *testing.T) {
	g := &fakeGate{avail: 2}
	s, c := newTestService(t, g, Limits{SoldOutTTL: time.Second})
	for i := 0; i < 2; i++ {
		if err := buy(s, fmt.Sprint("u", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	// The last unit sold set the flag: no gate call says sold out.
	calls := g.count()
	for i := 0; i < 50; i++ {
		if err := buy(s, fmt.Sprint("v", i), 1); !errors.Is(err, sale.ErrSoldOut) {
			t.Fatalf("got %v, want sold out", err)
		}
	}
	if g.count() != calls {
		t.Fatalf("%d gate calls while flagged sold out, want 0", g.count()-calls)
	}
	if !s.SoldOutFlagged("s") {
		t.Fatal("not flagged sold out")
	}

	// A unit comes back (a release); after the TTL one request probes and buys it.
	g.give(1)
	c.add(1100 * time.Millisecond)
	var wg sync.WaitGroup
	var mu sync.Mutex
	sold := 0
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := buy(s, fmt.Sprint("w", i), 1); err == nil {
				mu.Lock()
				sold++
				mu.Unlock()
			} else if !errors.Is(err, sale.ErrSoldOut) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if sold != 1 || g.count() != calls+1 {
		t.Fatalf("after the TTL: %d sold with %d gate calls, want 1 sold with 1 call", sold, g.count()-calls)
	}

	// A notice (restock, release elsewhere) clears the flag at once.
	g.give(1)
	s.Noticed("s", false)
	if err := buy(s, "x", 1); err != nil {
		t.Fatalf("after a notice: %v", err)
	}
}

// TestSoldOutFlagKeyedRetry: a retry with an Idempotency-Key gets its
// order after the sale sold out, without a gate call; a new key is sold out.
func TestSoldOutFlagKeyedRetry(t *testing.T) {
	g := &fakeGate{avail: 1}
	s, _ := newTestService(t, g, Limits{SoldOutTTL: time.Hour})
	ctx := context.Background()
	first, err := s.Buy(ctx, Request{User: "a", SKU: "s", Quantity: 1, IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	calls := g.count()
	again, err := s.Buy(ctx, Request{User: "a", SKU: "s", Quantity: 1, IdempotencyKey: "k1"})
	if err != nil || again.OrderID != first.OrderID || !again.Duplicate {
		t.Fatalf("retry: %+v %v, want order %s", again, err, first.OrderID)
	}
	if _, err := s.Buy(ctx, Request{User: "a", SKU: "s", Quantity: 1, IdempotencyKey: "k2"}); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("new key: %v, want sold out", err)
	}
	if g.count() != calls {
		t.Fatalf("%d gate calls, want 0", g.count()-calls)
	}
}

// hangGate is a fakeGate whose key look-ups hang until their context ends
// (3 s at most); it records each look-up's deadline, as the time left when
// it was asked, and how it ended.
type hangGate struct {
	fakeGate
	mu      sync.Mutex
	lookUps []lookUp
}

type lookUp struct {
	left     time.Duration // until the deadline, when asked
	deadline bool          // whether it had one
	err      error         // what it returned
}

func (g *hangGate) Duplicate(ctx context.Context, _, _, _ string) (string, bool, error) {
	var l lookUp
	if dl, ok := ctx.Deadline(); ok {
		l.left, l.deadline = time.Until(dl), true
	}
	select {
	case <-ctx.Done():
		l.err = ctx.Err()
	case <-time.After(3 * time.Second): // not bounded: the test fails on it
		l.err = errors.New("hangGate: the look-up did not end at its bound")
	}
	g.mu.Lock()
	g.lookUps = append(g.lookUps, l)
	g.mu.Unlock()
	return "", false, l.err
}

// last is the last look-up (none: no deadline, an error).
func (g *hangGate) last() lookUp {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.lookUps) == 0 {
		return lookUp{err: errors.New("no look-up")}
	}
	return g.lookUps[len(g.lookUps)-1]
}

// TestSoldOutKeyLookupBounded: on a SKU flagged sold out, a keyed purchase's
// look-up of its key is bounded by the gate call's timeout when the
// buyer's context has no deadline, by the buyer's deadline when it comes
// sooner; a look-up that hangs to its bound sends the purchase on to the
// gate (here: sold out), never answers it from the flag.
func TestSoldOutKeyLookupBounded(t *testing.T) {
	const callTimeout = 150 * time.Millisecond
	g := &hangGate{}
	cat := NewCatalog(fakeSKUs{{ID: "s", PerUserLimit: 5, Stock: 100, TotalStock: 100}})
	if err := cat.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := New(Deps{Catalog: cat, Gate: g, Relay: nopRelay{}, Log: slog.New(slog.DiscardHandler), Limits: Limits{SoldOutTTL: time.Hour}},
		BreakerConfig{Disabled: true, CallTimeout: callTimeout})
	if err := buy(s, "first", 1); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("first purchase: %v, want sold out (sets the flag)", err)
	}
	calls := g.count()
	_, err := s.Buy(context.Background(), Request{User: "a", SKU: "s", Quantity: 1, IdempotencyKey: "k1"})
	if !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("keyed purchase after a hung look-up: %v, want the gate's sold out", err)
	}
	// Only the upper bound is asserted: a stalled test goroutine finds
	// less of the bound left, never more.
	if l := g.last(); !l.deadline || l.left > callTimeout {
		t.Fatalf("look-up bounded %v from the call (deadline %v), want at most %v", l.left, l.deadline, callTimeout)
	}
	if err := g.last().err; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the look-up ended with %v, want its deadline", err)
	}
	if g.count() != calls+1 {
		t.Fatalf("%d gate calls after the hung look-up, want 1", g.count()-calls)
	}

	short := callTimeout / 5
	ctx, cancel := context.WithTimeout(context.Background(), short)
	defer cancel()
	_, _ = s.Buy(ctx, Request{User: "b", SKU: "s", Quantity: 1, IdempotencyKey: "k1"})
	if l := g.last(); !l.deadline || l.left > short {
		t.Fatalf("look-up with the buyer's deadline %v away bounded %v from the call (deadline %v), want at most that", short, l.left, l.deadline)
	}
	if err := g.last().err; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the look-up with the buyer's deadline ended with %v, want that deadline", err)
	}
}

// TestSoldOutFlagQuantity: the flag remembers the units left; a purchase
// that fits still goes to the gate.
func TestSoldOutFlagQuantity(t *testing.T) {
	g := &fakeGate{avail: 1}
	s, _ := newTestService(t, g, Limits{SoldOutTTL: time.Hour})
	if err := buy(s, "a", 2); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatal(err)
	}
	calls := g.count()
	if err := buy(s, "b", 2); !errors.Is(err, sale.ErrSoldOut) || g.count() != calls {
		t.Fatalf("2 of 1 left: %v, %d calls", err, g.count()-calls)
	}
	if err := buy(s, "c", 1); err != nil {
		t.Fatalf("1 of 1 left: %v", err)
	}
}

// TestSoldOutStaleAnswer: a sold-out answer obtained before a notice does
// not set the flag again after it.
func TestSoldOutStaleAnswer(t *testing.T) {
	g := &fakeGate{avail: 0}
	s, _ := newTestService(t, g, Limits{SoldOutTTL: time.Hour})
	g.refuse = func(sale.Reservation, stockgate.Limits) error {
		s.Noticed("s", false) // a restock lands while this call is in Redis
		g.avail = 1
		return &stockgate.SoldOutError{}
	}
	if err := buy(s, "a", 1); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatal(err)
	}
	g.refuse = nil
	if err := buy(s, "b", 1); err != nil {
		t.Fatalf("after the restock: %v", err)
	}
}

// TestLimitsRemembered: once the gate says a limit refuses, this instance
// answers 429 from memory until the wait is over, for that key only.
func TestLimitsRemembered(t *testing.T) {
	g := &fakeGate{avail: 100}
	l := Limits{User: stockgate.Rate{PerSecond: 2, Burst: 1}, IP: stockgate.Rate{PerSecond: 2, Burst: 1}}
	s, c := newTestService(t, g, l)
	var seen stockgate.Limits
	g.refuse = func(r sale.Reservation, l stockgate.Limits) error {
		seen = l
		if r.User == "flood" {
			return &stockgate.LimitedError{User: 500 * time.Millisecond}
		}
		return nil
	}
	if err := buy(s, "flood", 1); !errors.Is(err, sale.ErrRateLimited) {
		t.Fatal(err)
	}
	if seen.User != l.User || seen.IP != l.IP || seen.IPKey != "192.0.2.1" {
		t.Fatalf("gate got limits %+v", seen)
	}
	calls := g.count()
	start := c.now()
	for i := 0; i < 10; i++ {
		err := buy(s, "flood", 1)
		var rl *sale.RateLimitError
		if !errors.As(err, &rl) || rl.Scope != "user" || rl.RetryAfter <= 0 || rl.RetryAfter > 500*time.Millisecond {
			t.Fatalf("at %s: %v, want a user limit from memory", c.since(start), err)
		}
		c.add(40 * time.Millisecond)
	}
	if g.count() != calls {
		t.Fatalf("%d gate calls while remembered", g.count()-calls)
	}
	if err := buy(s, "honest", 1); err != nil || g.count() != calls+1 {
		t.Fatalf("another user: %v", err)
	}
	c.add(200 * time.Millisecond)
	if err := buy(s, "flood", 1); !errors.Is(err, sale.ErrRateLimited) || g.count() != calls+2 {
		t.Fatalf("after the wait the gate decides again: %v, %d calls", err, g.count()-calls)
	}
}

func TestIPKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1":               "192.0.2.1",
		"::ffff:192.0.2.1":        "192.0.2.1",
		"2001:db8:1:2:3:4:5:6":    "2001:db8:1:2::/64",
		"2001:db8:1:2::9":         "2001:db8:1:2::/64",
		"fe80::1%eth0":            "fe80::/64",
		"":                        "",
		"not-an-ip":               "",
		"192.0.2.1:80":            "",
		"2001:db8::1]:80; DROP x": "",
	} {
		if got := IPKey(in); got != want {
			t.Errorf("IPKey(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBlocklistBounded(t *testing.T) {
	var b blocklist
	now := time.Unix(0, 0)
	for i := 0; i < 1000; i++ {
		b.add(fmt.Sprint(i), time.Millisecond, now)
	}
	now = now.Add(2 * time.Second)
	b.add("x", time.Second, now)
	if len(b.m) != 1 {
		t.Fatalf("%d entries after a sweep, want 1", len(b.m))
	}
	if b.wait("x", now) != time.Second || b.wait("0", now) != 0 {
		t.Fatal("wrong waits")
	}
}

package purchase

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestBoundedGate, on a private redis-server: a reserve and a key look-up
// answer as the gate's own while Redis answers; once Redis hangs (the
// process stopped) both return the deadline's error although the caller's
// context has none, every reserve is observed, look-ups are not; Ping
// passes through, so the breaker's probe pings Redis (New finds it).
func TestBoundedGate(t *testing.T) {
	ctx := context.Background() // no deadline: the bound is the gate's own
	rs := testenv.StartRedis(t)
	g := stockgate.New(testenv.RedisClient(t, rs.URL), "bounded")
	if ok, err := g.Seed(ctx, "S", stockgate.Config{PerUserLimit: 5}, 10, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatalf("seed: %v %v", ok, err)
	}
	var observed atomic.Int64
	bg := BoundedGate{PingGate: g, Timeout: 200 * time.Millisecond, Observe: func(d time.Duration) {
		if d <= 0 {
			t.Errorf("observed latency %v", d)
		}
		observed.Add(1)
	}}
	res := func() sale.Reservation {
		return sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: "S", User: "u", Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
	}

	r, err := bg.ReserveLimited(ctx, res(), stockgate.Limits{})
	if err != nil || r.OrderID == "" || r.Duplicate {
		t.Fatalf("reserve while Redis answers: %+v %v", r, err)
	}
	if _, found, err := bg.Duplicate(ctx, "S", "u", "no-such-key"); err != nil || found {
		t.Fatalf("look-up while Redis answers: %v %v", found, err)
	}
	if err := bg.Ping(ctx); err != nil {
		t.Fatalf("ping while Redis answers: %v", err)
	}
	if got := observed.Load(); got != 1 {
		t.Fatalf("observed %d calls, want the 1 reserve", got)
	}

	rs.Pause()
	defer rs.Resume()
	if _, err := bg.ReserveLimited(ctx, res(), stockgate.Limits{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("reserve while Redis hangs: %v, want the deadline's error", err)
	}
	if _, _, err := bg.Duplicate(ctx, "S", "u", "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("look-up while Redis hangs: %v, want the deadline's error", err)
	}
	if got := observed.Load(); got != 2 {
		t.Fatalf("observed %d calls, want the 2 reserves", got)
	}

	s := New(Deps{Catalog: NewCatalog(nil), Gate: bg, Log: slog.New(slog.DiscardHandler)}, BreakerConfig{})
	if s.guard.ping == nil {
		t.Fatal("the breaker's probe does not ping through a BoundedGate")
	}
}

// ctxGate records the context each call was given.
type ctxGate struct{ got context.Context }

func (g *ctxGate) ReserveLimited(ctx context.Context, _ sale.Reservation, _ stockgate.Limits) (stockgate.ReserveResult, error) {
	g.got = ctx
	return stockgate.ReserveResult{}, nil
}
func (g *ctxGate) Duplicate(ctx context.Context, _, _, _ string) (string, bool, error) {
	g.got = ctx
	return "", false, nil
}
func (g *ctxGate) Unsent(ctx context.Context, _, _, _ string) ([]byte, string, error) {
	g.got = ctx
	return nil, "", nil
}
func (g *ctxGate) Lookup(context.Context, string, ...string) (sale.Reservation, bool, error) {
	return sale.Reservation{}, false, nil
}
func (g *ctxGate) Available(context.Context, string) (int64, bool, error) { return 0, false, nil }
func (g *ctxGate) Ping(context.Context) error                             { return nil }

// TestBoundedGateKeepsEarlierDeadline: a caller's deadline that ends before
// Timeout is the call's own (the context passes unchanged, no timer is
// made); a later one, or none, is cut to Timeout.
func TestBoundedGateKeepsEarlierDeadline(t *testing.T) {
	const timeout = 200 * time.Millisecond
	cg := &ctxGate{}
	bg := BoundedGate{PingGate: cg, Timeout: timeout}
	calls := map[string]func(ctx context.Context){
		"reserve": func(ctx context.Context) { _, _ = bg.ReserveLimited(ctx, sale.Reservation{}, stockgate.Limits{}) },
		"look-up": func(ctx context.Context) { _, _, _ = bg.Duplicate(ctx, "S", "u", "k") },
	}
	for name, call := range calls {
		short, cancel := context.WithTimeout(context.Background(), timeout/4)
		call(short)
		cancel()
		if cg.got != short {
			t.Errorf("%s with an earlier deadline: the gate got another context", name)
		}
		for _, parent := range []time.Duration{0, time.Hour} {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if parent > 0 {
				ctx, cancel = context.WithTimeout(ctx, parent)
			}
			before := time.Now()
			call(ctx)
			cancel()
			dl, ok := cg.got.Deadline()
			if !ok || dl.After(before.Add(timeout+50*time.Millisecond)) {
				t.Errorf("%s with parent deadline %v: the gate's deadline %v (set %v), want at most %v from the call", name, parent, dl.Sub(before), ok, timeout)
			}
		}
	}
}

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

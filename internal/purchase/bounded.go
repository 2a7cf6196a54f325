package purchase

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// PingGate is a Gate that can also be pinged (the breaker's half-open
// probe pings Redis before it rebuilds; see New).
type PingGate interface {
	Gate
	Ping(ctx context.Context) error
}

// BoundedGate is the purchase path's gate: each reserve (ReserveLimited)
// and each idempotency look-up of a sold-out SKU (Duplicate) runs under a
// deadline of Timeout of its own, on top of the caller's, so that a hung
// Redis cannot hold requests: past it the call returns the context's
// error (context.DeadlineExceeded, wrapped). Observe, if set, is told how
// long each reserve took, whatever its outcome (the gate-latency
// histogram); look-ups are not observed. The other methods (Lookup,
// Available, Ping) are the wrapped gate's, unbounded. Safe for concurrent
// use when the wrapped gate is.
type BoundedGate struct {
	PingGate
	Timeout time.Duration
	Observe func(time.Duration)
}

// ReserveLimited is the wrapped gate's, bounded by Timeout and observed.
func (g BoundedGate) ReserveLimited(ctx context.Context, r sale.Reservation, l stockgate.Limits) (stockgate.ReserveResult, error) {
	ctx, cancel := context.WithTimeout(ctx, g.Timeout)
	defer cancel()
	start := time.Now()
	res, err := g.PingGate.ReserveLimited(ctx, r, l)
	if g.Observe != nil {
		g.Observe(time.Since(start))
	}
	return res, err
}

// Duplicate is the wrapped gate's, bounded by Timeout.
func (g BoundedGate) Duplicate(ctx context.Context, sku, user, key string) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, g.Timeout)
	defer cancel()
	return g.PingGate.Duplicate(ctx, sku, user, key)
}

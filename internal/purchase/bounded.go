package purchase

import (
	"context"
	"errors"
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

// BoundedGate is the purchase path's gate: each reserve (ReserveLimited),
// each idempotency look-up (Duplicate) and each outbox look-up of a
// retried key's order (Unsent) runs under a
// deadline of Timeout of its own, on top of the caller's, so that a hung
// Redis cannot hold requests: past it the call returns the context's
// error (context.DeadlineExceeded, wrapped); a caller's earlier deadline
// is kept as it is. Observe, if set, is told how
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
	ctx, cancel := g.bound(ctx)
	if cancel != nil {
		defer cancel()
	}
	start := time.Now()
	res, err := g.PingGate.ReserveLimited(ctx, r, l)
	if g.Observe != nil {
		g.Observe(time.Since(start))
	}
	return res, err
}

// Duplicate is the wrapped gate's, bounded by Timeout.
func (g BoundedGate) Duplicate(ctx context.Context, sku, user, key string) (string, bool, error) {
	ctx, cancel := g.bound(ctx)
	if cancel != nil {
		defer cancel()
	}
	return g.PingGate.Duplicate(ctx, sku, user, key)
}

// Unsent is the wrapped gate's, bounded by Timeout.
func (g BoundedGate) Unsent(ctx context.Context, sku, user, orderID string) ([]byte, string, error) {
	ctx, cancel := g.bound(ctx)
	if cancel != nil {
		defer cancel()
	}
	return g.PingGate.Unsent(ctx, sku, user, orderID)
}

// heldReader is a gate that says how many units of a sale a buyer holds
// (stockgate.Gate.Held).
type heldReader interface {
	Held(ctx context.Context, sku, user string) (int64, error)
}

// Held is the wrapped gate's, bounded by Timeout; a gate that cannot say
// answers errNoHeld.
func (g BoundedGate) Held(ctx context.Context, sku, user string) (int64, error) {
	h, ok := g.PingGate.(heldReader)
	if !ok {
		return 0, errNoHeld
	}
	ctx, cancel := g.bound(ctx)
	if cancel != nil {
		defer cancel()
	}
	return h.Held(ctx, sku, user)
}

var errNoHeld = errors.New("purchase: the gate does not say what a buyer holds")

// bound returns ctx bounded by Timeout, and its cancel. A caller's deadline
// that ends first already bounds the call (the purchase path's breaker
// gives each gate call one, from a pooled timer): then ctx is returned as
// it is, with a nil cancel, and no timer is made.
func (g BoundedGate) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= g.Timeout {
		return ctx, nil
	}
	return context.WithTimeout(ctx, g.Timeout)
}

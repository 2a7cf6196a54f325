package main

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// ReserveLimited is the purchase path's gate call, bounded like Reserve.
func (g timeoutGate) ReserveLimited(ctx context.Context, r sale.Reservation, l stockgate.Limits) (stockgate.ReserveResult, error) {
	ctx, cancel := context.WithTimeout(ctx, g.d)
	defer cancel()
	start := time.Now()
	res, err := g.Gate.ReserveLimited(ctx, r, l)
	g.m.Gate(time.Since(start))
	return res, err
}

// Duplicate is the idempotency look-up of a sold-out SKU, bounded like Reserve.
func (g timeoutGate) Duplicate(ctx context.Context, sku, user, key string) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, g.d)
	defer cancel()
	return g.Gate.Duplicate(ctx, sku, user, key)
}

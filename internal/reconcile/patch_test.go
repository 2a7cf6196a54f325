package reconcile_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestPatch: Patch computes the change from the sale as the database has
// it, applies it to the database and Redis as Put does, refuses an absent
// SKU, returns the change's own error with nothing written, and writes
// nothing for a change equal to the sale.
func TestPatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	store, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	gate := newGate(t)
	s := reconcile.NewSyncer(store, gate, nil, slog.New(slog.DiscardHandler))
	if _, _, err := s.Put(ctx, orderstore.SKUChange{ID: "p", TotalStock: 10, PerUserLimit: 2}); err != nil {
		t.Fatal(err)
	}
	restock := func(delta int64) func(sale.SKU) (orderstore.SKUChange, error) {
		return func(cur sale.SKU) (orderstore.SKUChange, error) {
			return orderstore.SKUChange{TotalStock: cur.TotalStock + delta, PerUserLimit: cur.PerUserLimit, StartsAt: cur.StartsAt, EndsAt: cur.EndsAt}, nil
		}
	}
	sku, err := s.Patch(ctx, "p", restock(5))
	if err != nil || sku.TotalStock != 15 || sku.Stock != 15 || sku.PerUserLimit != 2 {
		t.Fatalf("restock 5: %+v %v", sku, err)
	}
	if avail, ok, err := gate.Available(ctx, "p"); err != nil || !ok || avail != 15 {
		t.Fatalf("redis after restock: %d %v %v, want 15", avail, ok, err)
	}
	if _, err := s.Patch(ctx, "absent", restock(1)); !errors.Is(err, sale.ErrUnknownSKU) {
		t.Fatalf("absent sku: %v", err)
	}
	mine := errors.New("refused by the change")
	if _, err := s.Patch(ctx, "p", func(sale.SKU) (orderstore.SKUChange, error) { return orderstore.SKUChange{TotalStock: 1}, mine }); err != mine {
		t.Fatalf("change's error: %v", err)
	}
	before, err := store.Audit(ctx, "p", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if sku, err := s.Patch(ctx, "p", restock(0)); err != nil || sku.TotalStock != 15 {
		t.Fatalf("no-op: %+v %v", sku, err)
	}
	after, err := store.Audit(ctx, "p", 0, 100)
	if err != nil || len(after) != len(before) {
		t.Fatalf("no-op wrote audit rows: %d -> %d (%v)", len(before), len(after), err)
	}
	if _, err := s.Patch(ctx, "p", restock(-16)); !errors.Is(err, sale.ErrInvalid) && !errors.Is(err, sale.ErrStockConflict) {
		t.Fatalf("reduction below zero: %v", err)
	}
	if cur, err := s.SKU(ctx, "p"); err != nil || cur.TotalStock != 15 || cur.Stock != 15 {
		t.Fatalf("after the refusals: %+v %v", cur, err)
	}
}

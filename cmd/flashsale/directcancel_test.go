package main

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/google/uuid"
)

// TestDirectSaleThenCancelReachesRedis: a sale made by the database
// fallback (BuyDirect) owes Redis a debit keyed by its order id
// (redis_restores row <id>, quantity -2; the gate's rel set gets <id>).
// When that order is then cancelled (or expires), the release owes Redis the
// units and the buyer slot back under the SAME order id: either the
// INSERT IGNORE / ON CONFLICT DO NOTHING drops it (debit still pending), or
// restore.lua finds <id> already in rel and skips it. Redis never gets the
// 2 units nor the buyer slot back.
func TestDirectSaleThenCancelReachesRedis(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("dsc", 10, 2)
	ctx := context.Background()
	r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: "dsc", User: "dora", Quantity: 2, AcceptedAt: time.Now().UnixMilli()}
	if _, _, err := h.a.store.BuyDirect(ctx, r, time.Now()); err != nil {
		t.Fatal(err)
	}
	rep := settle(t, h.a, "dsc", []string{r.OrderID}, 10*time.Second)
	if rep.RedisAvailable != 8 || rep.DBStock != 8 {
		t.Fatalf("after a direct sale: %+v", rep)
	}
	// dora cancels her order (same path as the payment timeout).
	if _, err := h.a.lifecycle.Cancel(ctx, "dora", r.OrderID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := h.a.gate.ReadInFlight(ctx, "dsc")
		if err != nil {
			t.Fatal(err)
		}
		held, _ := h.a.gate.Held(ctx, "dsc", "dora")
		sku, _ := h.a.store.SKU(ctx, "dsc")
		if f.Available == 10 && held == 0 {
			return
		}
		if time.Now().After(deadline) {
			var pending int64
			_ = h.a.store.DB().QueryRowContext(ctx, h.a.store.Rebind(`SELECT count(*) FROM redis_restores WHERE sku_id = ?`), "dsc").Scan(&pending)
			t.Fatalf("after cancelling the direct sale: db stock %d, redis available %d (want 10), redis says dora holds %d (want 0), redis_restores pending %d",
				sku.Stock, f.Available, held, pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

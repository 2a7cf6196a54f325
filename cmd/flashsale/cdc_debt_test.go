package main

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/reconcile"
)

// debtScenario: after decrementWithReservationsInFlight (8 units in the
// database for 15 reservations in flight, Redis owing 7), reload runs: a
// warm-up (re-sync: what every instance does at start and POST
// /admin/v1/skus/{id}/warmup does) or a rebuild (fence + seed: what follows a
// Redis restart). Both compute from the database and must keep the 7 owed
// units as debt, so the 7 refusals to come pay it instead of putting units
// back on sale that the database does not have.
func debtScenario(t *testing.T, reload func(h *harness)) {
	h, ns, _ := decrementWithReservationsInFlight(t)
	ctx := context.Background()
	reload(h)
	f, err := h.a.gate.ReadInFlight(ctx, "dec")
	if err != nil {
		t.Fatal(err)
	}
	sku, _ := h.a.store.SKU(ctx, "dec")
	if f.Debt != 7 || f.Available != -7 {
		t.Fatalf("after reload: db stock %d, in flight %d reservations, redis available-debt %d, debt %d (want -7, 7)", sku.Stock, len(f.Reservations), f.Available, f.Debt)
	}
	ns.Restart()
	// Wait until every in-flight reservation is decided.
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, err = h.a.gate.ReadInFlight(ctx, "dec")
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Reservations) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservations still in flight: %d", len(f.Reservations))
		}
		time.Sleep(50 * time.Millisecond)
	}
	sku, _ = h.a.store.SKU(ctx, "dec")
	late := h.buy("late", "dec", 1, "")
	if f.Available != 0 || sku.Stock != 0 || late.Status == http.StatusAccepted {
		t.Fatalf("after the 7 refusals: db stock %d, redis offers %d units (want 0), a new buyer got %d %s",
			sku.Stock, f.Available, late.Status, late.Raw)
	}
}

// TestWarmupKeepsDebt: debtScenario with a warm-up through the admin API.
func TestWarmupKeepsDebt(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	debtScenario(t, func(h *harness) {
		if r := h.do(http.MethodPost, "/admin/v1/skus/dec/warmup", "", "Authorization: Bearer "+testAdmin); r.Status != http.StatusOK {
			t.Fatalf("warmup: %d %s", r.Status, r.Raw)
		}
	})
}

// TestRebuildKeepsDebt: the same with a rebuild (fence + seed, what the
// Redis monitor does after a Redis restart). The syncer here reads in-flight
// reservations from Redis only (queue nil) because the broker is down in
// this scenario; the serve's syncer would also ask the stream.
func TestRebuildKeepsDebt(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	debtScenario(t, func(h *harness) {
		s := reconcile.NewSyncer(h.a.store, h.a.gate, nil, slog.New(slog.DiscardHandler))
		if _, err := s.Rebuild(context.Background(), "dec"); err != nil {
			t.Fatal(err)
		}
	})
}

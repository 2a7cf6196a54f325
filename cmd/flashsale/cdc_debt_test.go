package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/testenv"
)

// debtScenario: 15 of 20 units reserved while the broker is down, an
// ERP takes 12 from the database (20 -> 8): Redis must show avail 0, debt 7.
// Then reload runs (a warm-up = resync, as every instance does at start and
// POST /admin/v1/skus/{id}/warmup does; or a rebuild = fence + seed, as after
// a Redis restart). The database truth is still: 8 units for 15 in-flight
// reservations, so 7 of them will be refused and Redis must keep owing 7.
// The resync (resync.lua) and the seed (warmup.go seed, seed.lua) compute
// avail = max(S - in flight, 0) and set debt = 0: the 7 owed units are
// forgotten, and the 7 refusals then put 7 units back on sale that the
// database does not have.
func debtScenario(t *testing.T, reload func(h *harness)) {
	ns := testenv.StartNATS(t, "")
	h := newHarness(t, testConfig(t, "", "FLASHSALE_NATS_URL", ns.URL, "FLASHSALE_RELAY_GRACE", "300ms"))
	h.mustPutSKU("dec", 20, 1)
	ns.Shutdown()
	var ids []string
	for i := 0; i < 15; i++ {
		r := h.buy(fmt.Sprintf("early-%d", i), "dec", 1, "")
		if r.Status != http.StatusAccepted {
			t.Fatalf("buy %d while the broker is down: %d %s", i, r.Status, r.Raw)
		}
		ids = append(ids, r.str("order_id"))
	}
	erp(t, h.a.store, "dec", -12)
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := h.a.gate.ReadInFlight(ctx, "dec")
		if err != nil {
			t.Fatal(err)
		}
		if f.Debt == 7 && f.Available == -7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis did not follow the external decrement: available %d, debt %d", f.Available, f.Debt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	reload(h)
	f, err := h.a.gate.ReadInFlight(ctx, "dec")
	if err != nil {
		t.Fatal(err)
	}
	sku, _ := h.a.store.SKU(ctx, "dec")
	t.Logf("after reload: db stock %d, in flight %d reservations, redis available-debt %d, debt %d", sku.Stock, len(f.Reservations), f.Available, f.Debt)
	ns.Restart()
	// Wait until every in-flight reservation is decided.
	deadline = time.Now().Add(30 * time.Second)
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

func TestWarmupKeepsDebt(t *testing.T) {
	debtScenario(t, func(h *harness) {
		if r := h.do(http.MethodPost, "/admin/v1/skus/dec/warmup", "", "Authorization: Bearer "+testAdmin); r.Status != http.StatusOK {
			t.Fatalf("warmup: %d %s", r.Status, r.Raw)
		}
	})
}

// TestRebuildKeepsDebt: the same with a rebuild (fence + seed, what
// the Redis monitor does after a Redis restart): seed computes
// avail = max(stock - in flight, 0) and seed.lua sets debt 0. The syncer here
// reads in-flight reservations from Redis only (queue nil) because the
// broker is down in this scenario; the serve's syncer would also ask the
// stream.
func TestRebuildKeepsDebt(t *testing.T) {
	debtScenario(t, func(h *harness) {
		s := reconcile.NewSyncer(h.a.store, h.a.gate, nil, slog.New(slog.DiscardHandler))
		if _, err := s.Rebuild(context.Background(), "dec"); err != nil {
			t.Fatal(err)
		}
	})
}

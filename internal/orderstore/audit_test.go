package orderstore_test

import (
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// auditSum returns the sum of db deltas of sku and the rows by reason.
func auditSum(t *testing.T, s *orderstore.Store, sku string) (int64, map[string]int) {
	t.Helper()
	es, err := s.Audit(testContext(t), sku, 0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	by := map[string]int{}
	for _, e := range es {
		if e.Store == "db" {
			sum += e.Delta
		}
		by[e.Reason]++
	}
	return sum, by
}

// TestAuditTrail: every change of inventory.stock has its audit row, written
// in the same transaction, so the db deltas add up to the stock; a change
// made behind flashsale's back is recorded by the trigger.
func TestAuditTrail(t *testing.T) {
	s := newStore(t)
	ctx := orderstore.WithActor(testContext(t), orderstore.Actor{Name: "admin", SourceIP: "192.0.2.1"})
	putSKU(t, s, "A", 10)
	if _, _, _, err := s.PutSKU(ctx, orderstore.SKUChange{ID: "A", TotalStock: 15, PerUserLimit: 5}); err != nil {
		t.Fatal(err)
	}
	r1, r2, r3 := newResv("A", "u1", 2), newResv("A", "u2", 1), newResv("A", "u3", 20)
	r1.ClientIP = "198.51.100.7"
	if _, err := s.ApplyBatch(ctx, []sale.Reservation{r1, r2, r3}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.BuyDirect(ctx, newResv("A", "u4", 1), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Cancel(ctx, r2.OrderID, "u2", sale.CancelByUser, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.PutSKU(ctx, orderstore.SKUChange{ID: "A", TotalStock: 14, PerUserLimit: 5}); err != nil {
		t.Fatal(err)
	}
	sum, by := auditSum(t, s, "A")
	l := checkInvariants(t, s, "A")
	if sum != l.Stock {
		t.Fatalf("audit sum %d != stock %d (%v)", sum, l.Stock, by)
	}
	want := map[string]int{"sku_created": 1, "restock": 1, "reservation_applied": 2, "fallback_sale": 1, "release:user_cancel": 1, "reduce": 1}
	for k, n := range want {
		if by[k] != n {
			t.Errorf("%d %s rows, want %d (%v)", by[k], k, n, by)
		}
	}
	es, _ := s.Audit(testContext(t), "A", 0, 100)
	for _, e := range es {
		if e.OrderID == r1.OrderID && (e.SourceIP != "198.51.100.7" || e.Actor != "user:u1" || e.Delta != -2) {
			t.Errorf("applied row %+v", e)
		}
		if e.Reason == "restock" && (e.Actor != "admin" || e.SourceIP != "192.0.2.1") {
			t.Errorf("restock row %+v", e)
		}
	}
	// An ERP restock straight in the database.
	execSQL(t, s, `UPDATE inventory SET stock = stock + 50, total_stock = total_stock + 50 WHERE sku_id = ?`, "A")
	sum, by = auditSum(t, s, "A")
	if l := checkInvariants(t, s, "A"); sum != l.Stock || by["external_change"] != 1 {
		t.Fatalf("after an external change: sum %d, stock %d, %v", sum, l.Stock, by)
	}
}

// TestAuditRedis: a change of the gate's stock is recorded with store redis
// and the caller's actor, does not count in the database's deltas, and Audit
// pages by id.
func TestAuditRedis(t *testing.T) {
	s := newStore(t)
	putSKU(t, s, "R", 10)
	ctx := orderstore.WithActor(testContext(t), orderstore.Actor{Name: "system:reconciler", SourceIP: "203.0.113.5"})
	if err := s.AuditRedis(ctx, "R", -3, orderstore.AuditRedisFix); err != nil {
		t.Fatal(err)
	}
	if err := s.AuditRedis(testContext(t), "R", 7, orderstore.AuditRedisReseed); err != nil {
		t.Fatal(err)
	}
	es, err := s.Audit(testContext(t), "R", 0, 100)
	if err != nil || len(es) != 3 {
		t.Fatalf("Audit = %+v, %v", es, err)
	}
	fix, reseed := es[1], es[2]
	if fix.Store != "redis" || fix.Delta != -3 || fix.Reason != orderstore.AuditRedisFix || fix.Actor != "system:reconciler" ||
		fix.SourceIP != "203.0.113.5" || fix.OrderID != "" || fix.SKU != "R" || fix.CreatedAt.IsZero() || fix.CreatedAt.Location() != time.UTC {
		t.Errorf("correction row %+v", fix)
	}
	if reseed.Store != "redis" || reseed.Delta != 7 || reseed.Actor != "system" || reseed.SourceIP != "" {
		t.Errorf("reseed row %+v", reseed)
	}
	if sum, _ := auditSum(t, s, "R"); sum != 10 {
		t.Errorf("db deltas add up to %d, want 10", sum)
	}
	page, err := s.Audit(testContext(t), "R", es[0].ID, 1)
	if err != nil || len(page) != 1 || page[0].ID != fix.ID {
		t.Errorf("page after %d: %+v, %v", es[0].ID, page, err)
	}
	if none, err := s.Audit(testContext(t), "other", 0, 10); err != nil || none == nil || len(none) != 0 {
		t.Errorf("Audit of another SKU = %#v, %v; want an empty slice", none, err)
	}
}

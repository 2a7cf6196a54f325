package orderstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/google/go-cmp/cmp"
)

func TestDiscard(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "DL", 5)
	applied := resv(oid(1, 1), "DL", "u1", 2)
	if _, err := s.ApplyBatch(ctx, []sale.Reservation{applied}); err != nil {
		t.Fatal(err)
	}
	dead := resv(oid(1, 2), "DL", "u2", 1)
	dead.IdempotencyKey = "k"
	ghost := resv(oid(1, 3), "GONE", "u3", 1) // its SKU was deleted meanwhile

	steps := []struct {
		name        string
		r           sale.Reservation
		wantAlready bool
		wantStatus  sale.Status
		wantErr     error
	}{
		{name: "dead letter", r: dead, wantStatus: sale.StatusFailed},
		{name: "discarded twice", r: dead, wantAlready: true, wantStatus: sale.StatusFailed},
		{name: "applied cannot be discarded", r: applied, wantAlready: true, wantStatus: sale.StatusPendingPayment},
		{name: "unknown sku", r: ghost, wantStatus: sale.StatusFailed},
		{name: "malformed", r: resv(oid(1, 4), "DL", "u4", 0), wantErr: sale.ErrInvalid},
	}
	for _, st := range steps {
		already, status, err := s.Discard(ctx, st.r)
		if st.wantErr != nil {
			if !errors.Is(err, st.wantErr) {
				t.Errorf("%s: err = %v, want %v", st.name, err, st.wantErr)
			}
			continue
		}
		if err != nil || already != st.wantAlready || status != st.wantStatus {
			t.Errorf("%s: Discard = %v, %q, %v; want %v, %q", st.name, already, status, err, st.wantAlready, st.wantStatus)
		}
	}

	for _, r := range []sale.Reservation{dead, ghost} {
		got, err := s.Order(ctx, r.OrderID)
		if err != nil {
			t.Fatal(err)
		}
		want := sale.Order{ID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity, Status: sale.StatusFailed,
			FailReason: orderstore.ReasonDiscarded, CreatedAt: acceptedAt}
		if diff := cmp.Diff(want, got, ignoreUpdatedAt); diff != "" {
			t.Errorf("Order(%s) (-want +got):\n%s", r.OrderID, diff)
		}
	}
	if _, err := s.Order(ctx, oid(1, 4)); !errors.Is(err, sale.ErrOrderNotFound) {
		t.Errorf("malformed reservation left an order: %v", err)
	}

	// Neither the queue nor the database fallback can apply it afterwards.
	got, err := s.ApplyBatch(ctx, []sale.Reservation{dead, ghost})
	if err != nil {
		t.Fatal(err)
	}
	want := []orderstore.Outcome{
		dup(failed(dead.OrderID, orderstore.ReasonDiscarded)),
		dup(failed(ghost.OrderID, orderstore.ReasonDiscarded)),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ApplyBatch after Discard (-want +got):\n%s", diff)
	}
	order, dupe, err := s.BuyDirect(ctx, dead, duringSale)
	if err != nil || !dupe || order.Status != sale.StatusFailed {
		t.Errorf("BuyDirect after Discard = %+v, %v, %v; want the failed order, duplicate", order, dupe, err)
	}
	if l := checkInvariants(t, s, "DL"); l.Stock != 3 || l.Orders != 2 {
		t.Errorf("ledger = %+v, want stock 3 (only the applied order), 2 orders", l)
	}
	checkInvariants(t, s, "GONE")
}

// Discard racing with ApplyBatch of the same reservation: exactly one wins.
func TestDiscardRacesApplyBatch(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const n = 40
	putSKU(t, s, "DLRACE", n)
	rs := make([]sale.Reservation, n)
	for i := range rs {
		rs[i] = newResv("DLRACE", fmt.Sprintf("u%02d", i), 1)
	}
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		discarded int
		appliedN  int
	)
	for i := range rs {
		wg.Go(func() {
			already, _, err := s.Discard(ctx, rs[i])
			if err != nil {
				t.Error(err)
				return
			}
			if !already {
				mu.Lock()
				discarded++
				mu.Unlock()
			}
		})
	}
	for start := 0; start < n; start += 10 {
		wg.Go(func() {
			out, err := s.ApplyBatch(ctx, rs[start:start+10])
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, o := range out {
				if !o.Duplicate {
					appliedN++
				}
			}
		})
	}
	wg.Wait()
	if discarded+appliedN != n {
		t.Errorf("%d discarded + %d applied != %d", discarded, appliedN, n)
	}
	if l := checkInvariants(t, s, "DLRACE"); l.Live != int64(appliedN) || l.Orders != n {
		t.Errorf("ledger = %+v, want %d live, %d orders", l, appliedN, n)
	}
}

func TestProcessed(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "PROC", 2)
	putSKU(t, s, "PROC2", 2)
	if _, err := s.ApplyBatch(ctx, []sale.Reservation{
		resv(oid(1, 1), "PROC", "u1", 2),
		resv(oid(1, 2), "PROC", "u2", 1), // short
		resv(oid(1, 3), "PROC2", "u1", 1),
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.BuyDirect(ctx, resv(oid(1, 4), "PROC2", "u2", 1), duringSale); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Discard(ctx, resv(oid(1, 5), "PROC", "u3", 1)); err != nil {
		t.Fatal(err)
	}
	execSQL(t, s, `UPDATE orders SET status = 'paid' WHERE order_id = ?`, oid(1, 3))

	got, err := s.Processed(ctx, []string{oid(1, 1), oid(1, 2), oid(1, 3), oid(1, 4), oid(1, 5), oid(1, 6), oid(1, 1)})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]sale.Status{
		oid(1, 1): sale.StatusPendingPayment,
		oid(1, 2): sale.StatusFailed,
		oid(1, 3): sale.StatusPaid,
		oid(1, 4): sale.StatusPendingPayment,
		oid(1, 5): sale.StatusFailed,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Processed (-want +got):\n%s", diff)
	}
	for _, ids := range [][]string{nil, {}, {oid(9, 9)}} {
		if got, err := s.Processed(ctx, ids); err != nil || got == nil || len(got) != 0 {
			t.Errorf("Processed(%v) = %v, %v; want an empty map", ids, got, err)
		}
	}
}

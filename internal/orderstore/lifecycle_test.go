package orderstore_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// applyOne applies r and fails unless it is pending_payment.
func applyOne(t *testing.T, s *orderstore.Store, r sale.Reservation) {
	t.Helper()
	out, err := s.ApplyBatch(testContext(t), []sale.Reservation{r})
	if err != nil || out[0].Status != sale.StatusPendingPayment {
		t.Fatalf("apply %s: %+v %v", r.OrderID, out, err)
	}
}

func restoresOf(t *testing.T, s *orderstore.Store) map[string]orderstore.Restore {
	t.Helper()
	rs, err := s.PendingRestores(testContext(t), 1000)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]orderstore.Restore{}
	for _, r := range rs {
		m[r.OrderID] = r
	}
	return m
}

func transitions(t *testing.T, s *orderstore.Store, id string) []string {
	t.Helper()
	rows, err := s.Pool().Query(testContext(t), `SELECT coalesce(from_status,'') || '>' || to_status || ':' || cause FROM order_transitions WHERE order_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		_ = rows.Scan(&v)
		out = append(out, v)
	}
	return out
}

func TestPayAndCancel(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "L", 10)
	now := time.Now()
	a, b := newResv("L", "ann", 2), newResv("L", "bob", 3)
	applyOne(t, s, a)
	applyOne(t, s, b)

	o, again, err := s.Pay(ctx, a.OrderID, "ann", "ref-1", now)
	if err != nil || again || o.Status != sale.StatusPaid || o.PaidAt == nil {
		t.Fatalf("pay: %+v %v %v", o, again, err)
	}
	if _, again, err := s.Pay(ctx, a.OrderID, "ann", "ref-1", now); err != nil || !again {
		t.Fatalf("pay again: %v %v", again, err)
	}
	if _, _, err := s.Pay(ctx, a.OrderID, "bob", "", now); !errors.Is(err, sale.ErrOrderNotFound) {
		t.Fatalf("pay someone else's order: %v", err)
	}
	if _, _, err := s.Cancel(ctx, a.OrderID, "ann", sale.CancelByUser, now); !errors.Is(err, sale.ErrOrderPaid) {
		t.Fatalf("cancel a paid order: %v", err)
	}
	o, again, err = s.Cancel(ctx, b.OrderID, "bob", sale.CancelByUser, now)
	if err != nil || again || o.Status != sale.StatusCancelled || o.CancelReason != sale.CancelByUser || o.CancelledAt == nil {
		t.Fatalf("cancel: %+v %v %v", o, again, err)
	}
	if _, again, err := s.Cancel(ctx, b.OrderID, "bob", sale.CancelByUser, now); err != nil || !again {
		t.Fatalf("cancel again: %v %v", again, err)
	}
	if _, _, err := s.Pay(ctx, b.OrderID, "bob", "", now); !errors.Is(err, sale.ErrOrderExpired) {
		t.Fatalf("pay a cancelled order: %v", err)
	}
	l := checkInvariants(t, s, "L")
	if l.Stock != 8 || l.Live != 2 {
		t.Fatalf("ledger %+v", l)
	}
	rs := restoresOf(t, s)
	if len(rs) != 1 || rs[b.OrderID].Quantity != 3 || rs[b.OrderID].User != "bob" {
		t.Fatalf("restores %+v", rs)
	}
	if got := transitions(t, s, b.OrderID); len(got) != 2 || got[1] != "pending_payment>cancelled:user_cancel" {
		t.Fatalf("transitions %v", got)
	}
	if err := s.RestoresDone(ctx, []string{b.OrderID}); err != nil || len(restoresOf(t, s)) != 0 {
		t.Fatalf("restores done: %v", err)
	}
}

func TestExpireNeverEarly(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "E", 10)
	r := newResv("E", "u", 1)
	applyOne(t, s, r)
	o, _ := s.Order(ctx, r.OrderID)
	before := o.ExpiresAt.Add(-time.Millisecond)
	if _, released, err := s.Expire(ctx, r.OrderID, before); err != nil || released {
		t.Fatalf("expired before its deadline: %v %v", released, err)
	}
	if got, err := s.ExpireDue(ctx, before, 100); err != nil || len(got) != 0 {
		t.Fatalf("sweeper released early: %v %v", got, err)
	}
	if _, released, err := s.Expire(ctx, r.OrderID, *o.ExpiresAt); err != nil || !released {
		t.Fatalf("not released at its deadline: %v %v", released, err)
	}
	if _, released, err := s.Expire(ctx, r.OrderID, *o.ExpiresAt); err != nil || released {
		t.Fatalf("released twice: %v %v", released, err)
	}
	if l := checkInvariants(t, s, "E"); l.Stock != 10 {
		t.Fatalf("ledger %+v", l)
	}
}

// TestPayRacesExpiry: payment and expiry of the same orders at the same
// moment, from several goroutines: each order ends paid or cancelled, never
// both; stock comes back once per cancelled order.
func TestPayRacesExpiry(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const n = 200
	putSKUChange(t, s, orderstore.SKUChange{ID: "R", TotalStock: n, PerUserLimit: 1})
	var rs []sale.Reservation
	for i := 0; i < n; i++ {
		rs = append(rs, newResv("R", fmt.Sprintf("user%d", i), 1))
	}
	if out, err := s.ApplyBatch(ctx, rs); err != nil || out[n-1].Status != sale.StatusPendingPayment {
		t.Fatal(out, err)
	}
	due := time.UnixMilli(rs[0].AcceptedAt).Add(16 * time.Minute)
	var paid, expired atomic.Int64
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(3)
		go func() {
			defer wg.Done()
			if _, again, err := s.Pay(ctx, r.OrderID, r.User, "", due); err == nil && !again {
				paid.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			if _, released, err := s.Expire(ctx, r.OrderID, due); err == nil && released {
				expired.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			got, _ := s.ExpireDue(ctx, due, 7)
			expired.Add(int64(len(got)))
		}()
	}
	wg.Wait()
	for {
		got, err := s.ExpireDue(ctx, due, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		expired.Add(int64(len(got)))
	}
	if paid.Load()+expired.Load() != n {
		t.Fatalf("%d paid + %d expired != %d", paid.Load(), expired.Load(), n)
	}
	l := checkInvariants(t, s, "R")
	if l.Stock != expired.Load() || l.Live != paid.Load() {
		t.Fatalf("ledger %+v, paid %d, expired %d", l, paid.Load(), expired.Load())
	}
	if got := len(restoresOf(t, s)); int64(got) != expired.Load() {
		t.Fatalf("%d restores owed for %d releases", got, expired.Load())
	}
	t.Logf("%d paid, %d expired", paid.Load(), expired.Load())
}

// TestCancelWhileQueued: a cancel requested before the reservation lands
// makes it land cancelled, taking no stock and owing its Redis units back.
func TestCancelWhileQueued(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "Q", 5)
	r, other := newResv("Q", "quinn", 2), newResv("Q", "otto", 1)
	if _, landed, err := s.RequestCancel(ctx, r.OrderID, "quinn", time.Now()); err != nil || landed {
		t.Fatalf("request cancel: %v %v", landed, err)
	}
	// Someone else's request for otto's order does not cancel it.
	if _, _, err := s.RequestCancel(ctx, other.OrderID, "mallory", time.Now()); err != nil {
		t.Fatal(err)
	}
	out, err := s.ApplyBatch(ctx, []sale.Reservation{r, other})
	if err != nil || out[0].Status != sale.StatusCancelled || out[1].Status != sale.StatusPendingPayment {
		t.Fatalf("apply: %+v %v", out, err)
	}
	o, _ := s.Order(ctx, r.OrderID)
	if o.CancelReason != sale.CancelByUser || o.ExpiresAt != nil {
		t.Fatalf("order %+v", o)
	}
	if l := checkInvariants(t, s, "Q"); l.Stock != 4 {
		t.Fatalf("ledger %+v", l)
	}
	if rs := restoresOf(t, s); rs[r.OrderID].Quantity != 2 || len(rs) != 1 {
		t.Fatalf("restores %+v", rs)
	}
	// After landing, a request cancels at once.
	o, landed, err := s.RequestCancel(ctx, other.OrderID, "otto", time.Now())
	if err != nil || !landed || o.Status != sale.StatusCancelled {
		t.Fatalf("request cancel of a landed order: %+v %v %v", o, landed, err)
	}
}

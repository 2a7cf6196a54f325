package orderstore_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/google/go-cmp/cmp"
)

// keyedResv is a reservation of one unit of sku by user with Idempotency-Key key.
func keyedResv(n int, sku, user, key string) sale.Reservation {
	r := resv(oid(7, n), sku, user, 1)
	r.IdempotencyKey = key
	return r
}

// refusedForKey is the outcome of a reservation whose key already made order first.
func refusedForKey(id, first string) orderstore.Outcome {
	o := failed(id, orderstore.ReasonDuplicateKey)
	o.KeyOrderID = first
	return o
}

// keyedOrders counts the orders of (sku, user) carrying key, and the live ones among them.
func keyedOrders(t *testing.T, s *orderstore.Store, sku, user, key string) (all, live int64) {
	t.Helper()
	all = queryInt(t, s, `SELECT count(*) FROM orders WHERE sku_id = ? AND user_id = ? AND idempotency_key = ?`, sku, user, key)
	live = queryInt(t, s, `SELECT count(*) FROM orders WHERE sku_id = ? AND user_id = ? AND idempotency_key = ?
AND status IN ('pending_payment', 'paid')`, sku, user, key)
	return all, live
}

// TestOneOrderPerIdempotencyKey: the database is the final arbiter of I11.
// A second reservation with a key that already made an order (in the same
// batch, in an earlier one, or by the database fallback) is refused with
// reason duplicate_key and names the first order; it takes no stock, so the
// gate gives its units back. The fallback with a key the gate's order
// already holds returns that order and takes nothing.
func TestOneOrderPerIdempotencyKey(t *testing.T) {
	t.Run("one batch", func(t *testing.T) {
		s := newStore(t)
		ctx := testContext(t)
		putSKU(t, s, "K1", 10)
		a, b := keyedResv(1, "K1", "u1", "click"), keyedResv(2, "K1", "u1", "click")
		other := keyedResv(3, "K1", "u2", "click") // another user's key of the same name
		got, err := s.ApplyBatch(ctx, []sale.Reservation{a, b, other})
		if err != nil {
			t.Fatal(err)
		}
		want := []orderstore.Outcome{pending(a.OrderID), refusedForKey(b.OrderID, a.OrderID), pending(other.OrderID)}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("outcomes (-want +got):\n%s", diff)
		}
		// Redelivered: the refusal still names the first order.
		got, err = s.ApplyBatch(ctx, []sale.Reservation{b})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]orderstore.Outcome{dup(refusedForKey(b.OrderID, a.OrderID))}, got); diff != "" {
			t.Errorf("redelivery (-want +got):\n%s", diff)
		}
		if l := checkInvariants(t, s, "K1"); l.Stock != 8 || l.Orders != 3 {
			t.Errorf("ledger %+v, want stock 8, 3 orders", l)
		}
		if all, live := keyedOrders(t, s, "K1", "u1", "click"); all != 1 || live != 1 {
			t.Errorf("u1's key is on %d orders (%d live), want 1 (1)", all, live)
		}
	})
	t.Run("two batches", func(t *testing.T) {
		s := newStore(t)
		ctx := testContext(t)
		putSKU(t, s, "K2", 10)
		a, b := keyedResv(1, "K2", "u1", "click"), keyedResv(2, "K2", "u1", "click")
		if _, err := s.ApplyBatch(ctx, []sale.Reservation{a}); err != nil {
			t.Fatal(err)
		}
		fill := keyedResv(3, "K2", "u3", "x")
		got, err := s.ApplyBatch(ctx, []sale.Reservation{fill, b})
		if err != nil {
			t.Fatal(err)
		}
		want := []orderstore.Outcome{pending(fill.OrderID), refusedForKey(b.OrderID, a.OrderID)}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("outcomes (-want +got):\n%s", diff)
		}
		if l := checkInvariants(t, s, "K2"); l.Stock != 8 {
			t.Errorf("ledger %+v, want stock 8", l)
		}
		if all, live := keyedOrders(t, s, "K2", "u1", "click"); all != 1 || live != 1 {
			t.Errorf("the key is on %d orders (%d live), want 1 (1)", all, live)
		}
	})
	t.Run("keys of other users and SKUs are other keys", func(t *testing.T) {
		s := newStore(t)
		ctx := testContext(t)
		putSKU(t, s, "K7", 10)
		putSKU(t, s, "K8", 10)
		a, b := keyedResv(1, "K7", "u1", "a"), keyedResv(2, "K8", "u1", "b")
		if _, err := s.ApplyBatch(ctx, []sale.Reservation{a, b}); err != nil {
			t.Fatal(err)
		}
		batch := []sale.Reservation{
			keyedResv(3, "K7", "u1", "b"), // u1's other key on K7
			keyedResv(4, "K8", "u1", "a"), // u1's key a, on the other SKU
			keyedResv(5, "K7", "u2", "a"), // another user's key a
			keyedResv(6, "K7", "u1", "a"), // a's key again
			keyedResv(7, "K8", "u1", "b"), // b's key again
		}
		got, err := s.ApplyBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		want := []orderstore.Outcome{pending(batch[0].OrderID), pending(batch[1].OrderID), pending(batch[2].OrderID),
			refusedForKey(batch[3].OrderID, a.OrderID), refusedForKey(batch[4].OrderID, b.OrderID)}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("outcomes (-want +got):\n%s", diff)
		}
		if l := checkInvariants(t, s, "K7"); l.Stock != 7 {
			t.Errorf("K7 ledger %+v, want stock 7", l)
		}
		if l := checkInvariants(t, s, "K8"); l.Stock != 8 {
			t.Errorf("K8 ledger %+v, want stock 8", l)
		}
	})
	t.Run("fallback sale first, then the gate's reservation", func(t *testing.T) {
		s := newStore(t)
		ctx := testContext(t)
		putSKU(t, s, "K3", 10)
		queued, direct := keyedResv(1, "K3", "u1", "click"), keyedResv(2, "K3", "u1", "click")
		o, dupl, err := s.BuyDirect(ctx, direct, duringSale)
		if err != nil || dupl || o.ID != direct.OrderID {
			t.Fatalf("BuyDirect = %s, %v, %v; want a new order %s", o.ID, dupl, err, direct.OrderID)
		}
		// The debit owed to the gate names the key, so the gate learns the order it made.
		owed, err := s.PendingRestores(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		wantOwed := []orderstore.Restore{{OrderID: orderstore.DebitPrefix + direct.OrderID, SKU: "K3", User: "u1", Quantity: -1, IdempotencyKey: "click"}}
		if diff := cmp.Diff(wantOwed, owed); diff != "" {
			t.Errorf("restores owed (-want +got):\n%s", diff)
		}
		got, err := s.ApplyBatch(ctx, []sale.Reservation{queued})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]orderstore.Outcome{refusedForKey(queued.OrderID, direct.OrderID)}, got); diff != "" {
			t.Errorf("outcomes (-want +got):\n%s", diff)
		}
		if l := checkInvariants(t, s, "K3"); l.Stock != 9 {
			t.Errorf("ledger %+v, want stock 9", l)
		}
		if all, live := keyedOrders(t, s, "K3", "u1", "click"); all != 1 || live != 1 {
			t.Errorf("the key is on %d orders (%d live), want 1 (1)", all, live)
		}
	})
	t.Run("gate's order first, then the fallback", func(t *testing.T) {
		s := newStore(t)
		ctx := testContext(t)
		putSKU(t, s, "K4", 10)
		queued, direct := keyedResv(1, "K4", "u1", "click"), keyedResv(2, "K4", "u1", "click")
		if _, err := s.ApplyBatch(ctx, []sale.Reservation{queued}); err != nil {
			t.Fatal(err)
		}
		o, dupl, err := s.BuyDirect(ctx, direct, duringSale)
		if err != nil || !dupl || o.ID != queued.OrderID {
			t.Fatalf("BuyDirect = %s, dup %v, %v; want the existing order %s", o.ID, dupl, err, queued.OrderID)
		}
		if l := checkInvariants(t, s, "K4"); l.Stock != 9 || l.Orders != 1 {
			t.Errorf("ledger %+v, want stock 9, 1 order", l)
		}
		if n := queryInt(t, s, `SELECT count(*) FROM redis_restores WHERE sku_id = 'K4'`); n != 0 {
			t.Errorf("%d redis restores owed, want 0 (nothing sold)", n)
		}
	})
	t.Run("concurrent batches", func(t *testing.T) {
		s := newStore(t)
		ctx := testContext(t)
		putSKU(t, s, "K5", 100)
		const n = 8
		var wg sync.WaitGroup
		var mu sync.Mutex
		won := 0
		for i := range n {
			wg.Go(func() {
				// Each batch holds the same keys in another order, with other orders around them.
				batch := []sale.Reservation{keyedResv(100+i, "K5", fmt.Sprintf("v%d", i), "own")}
				for k := range 3 {
					key := fmt.Sprintf("click-%d", (k+i)%3)
					batch = append(batch, keyedResv(10*i+k+1, "K5", "u1", key))
				}
				out, err := s.ApplyBatch(ctx, batch)
				if err != nil {
					t.Errorf("batch %d: %v", i, err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for _, o := range out[1:] {
					if o.Status == sale.StatusPendingPayment {
						won++
					} else if o.Reason != orderstore.ReasonDuplicateKey || o.KeyOrderID == "" {
						t.Errorf("batch %d: %+v", i, o)
					}
				}
			})
		}
		wg.Wait()
		if won != 3 {
			t.Errorf("%d reservations of 3 keys took stock, want 3", won)
		}
		if l := checkInvariants(t, s, "K5"); l.Stock != 100-3-n {
			t.Errorf("ledger %+v, want stock %d", l, 100-3-n)
		}
	})
	t.Run("the schema refuses a second order with the key", func(t *testing.T) {
		s := newStore(t)
		ctx := testContext(t)
		putSKU(t, s, "K6", 10)
		if _, err := s.ApplyBatch(ctx, []sale.Reservation{keyedResv(1, "K6", "u1", "click")}); err != nil {
			t.Fatal(err)
		}
		_, err := s.DB().ExecContext(ctx, s.Rebind(`INSERT INTO orders (order_id, sku_id, user_id, quantity, status, idempotency_key, created_at)
VALUES (?, 'K6', 'u1', 1, 'pending_payment', 'click', CURRENT_TIMESTAMP)`), oid(7, 2))
		if err == nil {
			t.Error("a second order with the same user, SKU and Idempotency-Key was inserted")
		}
	})
}

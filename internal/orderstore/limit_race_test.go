package orderstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// TestLimitSeesWriterItWaitedFor drives, step by step, a writer of a live
// order holding the SKU's inventory row lock against a purchase by the same
// user: the purchase waits for the lock, and once it is granted it counts
// the writer's order, so a user holding 1 unit who gets 2 more from the
// writer is refused a fourth (limit 3), whichever path buys. The limit check
// never reads holdings from a snapshot older than the lock.
func TestLimitSeesWriterItWaitedFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		buy  func(s *orderstore.Store, r sale.Reservation) error // nil: refused for the limit
	}{
		{"ApplyBatch", func(s *orderstore.Store, r sale.Reservation) error {
			out, err := s.ApplyBatch(testContext(t), []sale.Reservation{r})
			switch {
			case err != nil:
				return err
			case out[0].Status != sale.StatusFailed || out[0].Reason != orderstore.ReasonLimitReached:
				return errors.New("applied as " + string(out[0].Status) + "/" + out[0].Reason)
			}
			return nil
		}},
		{"BuyDirect", func(s *orderstore.Store, r sale.Reservation) error {
			o, _, err := s.BuyDirect(testContext(t), r, acceptedAt)
			switch {
			case errors.Is(err, sale.ErrLimitReached):
				return nil
			case err != nil:
				return err
			}
			return errors.New("sold as order " + o.ID + " " + string(o.Status))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			ctx := testContext(t)
			const sku = "LIMRACE"
			putSKUChange(t, s, orderstore.SKUChange{ID: sku, TotalStock: 8, PerUserLimit: 3})
			if out, err := s.ApplyBatch(ctx, []sale.Reservation{resv(oid(0x5754, 1), sku, "u0", 1)}); err != nil || out[0].Status != sale.StatusPendingPayment {
				t.Fatalf("first unit: %+v, %v", out, err)
			}

			// The writer: the row lock, then its order, not yet committed.
			tx, err := s.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			for _, st := range []struct {
				q    string
				args []any
			}{
				{`SELECT stock FROM inventory WHERE sku_id = ? FOR UPDATE`, []any{sku}},
				{`UPDATE inventory SET stock = stock - 2 WHERE sku_id = ?`, []any{sku}},
				{`INSERT INTO process_log (tx_id, sku_id) VALUES (?, ?)`, []any{oid(0x5754, 2), sku}},
				{`INSERT INTO orders (order_id, sku_id, user_id, quantity, status, created_at) VALUES (?, ?, 'u0', 2, 'pending_payment', ?)`,
					[]any{oid(0x5754, 2), sku, acceptedAt}},
			} {
				if _, err := tx.ExecContext(ctx, s.Rebind(st.q), st.args...); err != nil {
					t.Fatalf("%s: %v", st.q, err)
				}
			}

			done := make(chan error, 1)
			go func() { done <- tc.buy(s, resv(oid(0x5754, 3), sku, "u0", 1)) }()
			waitForRowLockWaiter(t, s, done)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Errorf("a fourth unit for u0 (limit 3) after the writer committed: %v", err)
			}
			over, limit, err := holdingsOverLimit(ctx, s, sku)
			if err != nil {
				t.Fatal(err)
			}
			if len(over) > 0 {
				t.Errorf("limit %d, holdings above it %v", limit, over)
			}
		})
	}
}

// waitForRowLockWaiter returns once a session of the test's database waits
// for a row lock; it fails the test if done delivers first (the purchase did
// not wait) or after 20 s. On MySQL it reads information_schema.innodb_trx,
// a cache InnoDB refreshes when it was not read for 100 ms: polled more
// slowly than that.
func waitForRowLockWaiter(t *testing.T, s *orderstore.Store, done <-chan error) {
	t.Helper()
	q, every := `
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = current_database()`, 5*time.Millisecond
	if s.Dialect() == orderstore.MySQL {
		q, every = `
SELECT count(*) FROM information_schema.innodb_trx
WHERE trx_state = 'LOCK WAIT'
  AND trx_mysql_thread_id IN (SELECT id FROM information_schema.processlist WHERE db = database())`, 150*time.Millisecond
	}
	deadline := time.Now().Add(20 * time.Second)
	for queryInt(t, s, q) == 0 {
		select {
		case err := <-done:
			t.Fatalf("the purchase returned before waiting for the row lock: %v", err)
		case <-time.After(every):
		}
		if time.Now().After(deadline) {
			t.Fatal("the purchase never waited for the row lock")
		}
	}
}

package orderstore

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/google/go-cmp/cmp"
)

// TestApplyLocksLate: on MySQL a batch decides before it locks the inventory
// row and checks under the lock that what it decided from still holds. A
// change in between (made here between the batch's reads and its writes)
// makes it decide again under the lock, as if it had locked first; without
// one it commits at once. A key another client takes meanwhile fails the
// order's insert (a key conflict), and the batch runs again.
func TestApplyLocksLate(t *testing.T) {
	if testenv.Dialect() != "mysql" {
		return // the PostgreSQL backend locks first (one pipelined round trip)
	}
	const at = 1_900_000_000_000
	r := func(n int, user string, qty int64) sale.Reservation {
		return sale.Reservation{OrderID: "00000000-0000-4000-8000-00000000000" + string(rune('0'+n)), SKU: "LATE", User: user,
			Quantity: qty, AcceptedAt: at}
	}
	pending := func(n int) Outcome { return Outcome{OrderID: r(n, "", 1).OrderID, Status: sale.StatusPendingPayment} }
	refused := func(n int, reason string) Outcome {
		return Outcome{OrderID: r(n, "", 1).OrderID, Status: sale.StatusFailed, Reason: reason}
	}
	keyed := func(r sale.Reservation, key string) sale.Reservation { r.IdempotencyKey = key; return r }
	keyTaken := func(n int) Outcome {
		o := refused(n, ReasonDuplicateKey)
		o.KeyOrderID = "00000000-0000-4000-8000-000000000099"
		return o
	}
	tests := []struct {
		name      string
		stock     int64
		limit     int64
		batch     []sale.Reservation
		change    string // SQL run by another client between the first reads and writes
		change2   string // and between the second ones (locking first)
		want      []Outcome
		wantStock int64
		wantRuns  []bool // lockFirst of each run reaching the writes (default: one run, lock late)
	}{
		{
			name: "nothing moved", stock: 5, limit: 1,
			batch:     []sale.Reservation{r(1, "u1", 1), r(2, "u2", 1)},
			want:      []Outcome{pending(1), pending(2)},
			wantStock: 3,
		},
		{
			name: "another order of the user went live", stock: 5, limit: 1,
			batch: []sale.Reservation{r(1, "u1", 1), r(2, "u2", 1)},
			change: `INSERT INTO orders (order_id, sku_id, user_id, quantity, status, created_at)
VALUES ('00000000-0000-4000-8000-000000000099', 'LATE', 'u1', 1, 'pending_payment', UTC_TIMESTAMP(6))`,
			want:      []Outcome{refused(1, ReasonLimitReached), pending(2)},
			wantStock: 4,
		},
		{
			name: "the limit went down", stock: 5, limit: 2,
			batch:     []sale.Reservation{r(1, "u1", 1), r(2, "u1", 1)},
			change:    `UPDATE inventory SET per_user_limit = 1 WHERE sku_id = 'LATE'`,
			want:      []Outcome{pending(1), refused(2, ReasonLimitReached)},
			wantStock: 4,
		},
		{
			name: "stock came back while the batch refused for stock", stock: 2, limit: 1,
			batch:     []sale.Reservation{r(1, "u1", 1), r(2, "u2", 1), r(3, "u3", 1)},
			change:    `UPDATE inventory SET stock = stock + 1 WHERE sku_id = 'LATE'`,
			want:      []Outcome{pending(1), pending(2), pending(3)},
			wantStock: 0,
		},
		{
			name: "stock taken below what the batch takes", stock: 3, limit: 1,
			batch:     []sale.Reservation{r(1, "u1", 1), r(2, "u2", 1)},
			change:    `UPDATE inventory SET stock = 1 WHERE sku_id = 'LATE'`,
			want:      []Outcome{pending(1), refused(2, ReasonInsufficientStock)},
			wantStock: 0,
		},
		{
			name: "stock taken, what is left still covers the batch", stock: 5, limit: 1,
			batch:     []sale.Reservation{r(1, "u1", 1), r(2, "u2", 1)},
			change:    `UPDATE inventory SET stock = 2 WHERE sku_id = 'LATE'`,
			want:      []Outcome{pending(1), pending(2)},
			wantStock: 0,
			wantRuns:  []bool{false}, // the decision stands: no second run
		},
		{
			name: "a key taken before the writes", stock: 5, limit: 1,
			batch: []sale.Reservation{keyed(r(1, "u1", 1), "k"), r(2, "u2", 1)},
			change: `INSERT INTO orders (order_id, sku_id, user_id, quantity, status, fail_reason, idempotency_key, created_at)
VALUES ('00000000-0000-4000-8000-000000000099', 'LATE', 'u1', 1, 'failed', 'unknown_sku', 'k', UTC_TIMESTAMP(6))`,
			want:      []Outcome{keyTaken(1), pending(2)},
			wantStock: 4,
			wantRuns:  []bool{false, false},
		},
		{
			name: "a holding moved, then a key taken while locking first", stock: 5, limit: 1,
			batch: []sale.Reservation{keyed(r(1, "u1", 1), "k"), r(2, "u2", 1)},
			change: `INSERT INTO orders (order_id, sku_id, user_id, quantity, status, created_at)
VALUES ('00000000-0000-4000-8000-000000000098', 'LATE', 'u2', 1, 'pending_payment', UTC_TIMESTAMP(6))`,
			change2: `INSERT INTO orders (order_id, sku_id, user_id, quantity, status, fail_reason, idempotency_key, created_at)
VALUES ('00000000-0000-4000-8000-000000000099', 'LATE', 'u1', 1, 'failed', 'unknown_sku', 'k', UTC_TIMESTAMP(6))`,
			want:      []Outcome{keyTaken(1), refused(2, ReasonLimitReached)},
			wantStock: 5,
			wantRuns:  []bool{false, true, true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			st, err := Open(ctx, testenv.MySQL(t), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, _, _, err := st.PutSKU(ctx, SKUChange{ID: "LATE", TotalStock: tt.stock, PerUserLimit: tt.limit}); err != nil {
				t.Fatal(err)
			}
			s := st.backend.(*myStore)
			var runs []bool
			s.beforeWrite = func(lockFirst bool) {
				runs = append(runs, lockFirst)
				change := map[int]string{1: tt.change, 2: tt.change2}[len(runs)]
				if change == "" {
					return
				}
				if _, err := s.outside.ExecContext(ctx, change); err != nil {
					t.Errorf("change: %v", err)
				}
			}
			got, err := st.ApplyBatch(ctx, tt.batch)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			wantRuns := tt.wantRuns
			if wantRuns == nil {
				wantRuns = []bool{false}
				if tt.change != "" {
					wantRuns = []bool{false, true}
				}
			}
			if diff := cmp.Diff(wantRuns, runs); diff != "" {
				t.Errorf("runs reaching the writes, by lockFirst (-want +got):\n%s", diff)
			}
			var stock int64
			if err := s.outside.QueryRowContext(ctx, `SELECT stock FROM inventory WHERE sku_id = 'LATE'`).Scan(&stock); err != nil {
				t.Fatal(err)
			}
			if stock != tt.wantStock {
				t.Errorf("stock = %d, want %d", stock, tt.wantStock)
			}
		})
	}
}

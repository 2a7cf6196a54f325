package reconcile_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/invariant"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// TestReloadBetweenCommitAndFinalize: the consumer commits a batch in
// which the database refused a reservation, and before it closes the
// batch in Redis (Finalize) the sale is reloaded (a rebuild, or an admin
// change of a split sale). The reload counts the refusal from the
// database (its units available, its buyer's slot free); the consumer's
// late Finalize, and the reload's own closing of what the database
// decided, must not give them back a second time: afterwards Redis
// available + in flight = the database stock, and each buyer holds in
// Redis what they hold in the database.
func TestReloadBetweenCommitAndFinalize(t *testing.T) {
	for _, tc := range []struct {
		name    string
		buckets int
		reload  func(e *splitEnv, sku string) error
		restock int64
	}{
		{"one bucket, rebuild", 1, rebuildOf, 0},
		{"split, rebuild", 3, rebuildOf, 0},
		{"split, restock", 3, restockOf(2), 2},
		{"split, put", 3, putOf, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSplitEnv(t)
			ctx := e.ctx
			const sku = "late"
			k := tc.buckets
			if _, _, err := e.sync.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 6, PerUserLimit: 6, Buckets: k}); err != nil {
				t.Fatal(err)
			}
			var rs []sale.Reservation
			for i := range 6 {
				r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: []string{"a", "b"}[i%2], Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
				if _, err := e.gate.ReserveIn(ctx, r, stockgate.Limits{}, k); err != nil {
					t.Fatalf("reserve %d: %v", i, err)
				}
				if k > 1 {
					r.Bucket = stockgate.HomeName(sku, r.User, k)
				}
				rs = append(rs, r)
			}
			// One unit leaves the database outside the gate: of the six
			// in flight, the database refuses one.
			if _, err := e.store.DB().ExecContext(ctx, e.store.Rebind("UPDATE inventory SET stock = stock - 1 WHERE sku_id = ?"), sku); err != nil {
				t.Fatal(err)
			}
			// The consumer's batch commits ...
			outs, err := e.store.ApplyBatch(ctx, rs)
			if err != nil {
				t.Fatal(err)
			}
			live := map[string]int64{}
			refused := 0
			for i, o := range outs {
				if o.Status == sale.StatusFailed {
					refused++
				} else {
					live[rs[i].User]++
				}
			}
			if refused != 1 {
				t.Fatalf("%d refused, want 1", refused)
			}
			// ... the sale is reloaded ...
			if err := tc.reload(e, sku); err != nil {
				t.Fatalf("reload: %v", err)
			}
			// ... and the consumer closes its batch in Redis.
			by := map[string][]stockgate.Outcome{}
			for i, o := range outs {
				b := stockgate.BucketOf(rs[i])
				by[b] = append(by[b], stockgate.Outcome{OrderID: o.OrderID, Refused: o.Status == sale.StatusFailed})
			}
			for b, os := range by {
				if _, err := e.gate.Finalize(ctx, b, os); err != nil {
					t.Fatal(err)
				}
			}
			f := e.exact(sku, "after the late finalize")
			if f.Available != tc.restock || f.Units() != 0 {
				t.Errorf("redis: %d available, %d in flight; want %d, 0", f.Available, f.Units(), tc.restock)
			}
			held := map[string]int64{}
			for _, u := range []string{"a", "b"} {
				n, err := e.gate.Held(ctx, sku, u)
				if err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					held[u] = n
				}
			}
			if diff := cmp.Diff(live, held); diff != "" {
				t.Errorf("buyers' holdings in redis (-database +redis):\n%s", diff)
			}
			if rep, err := invariant.Check(ctx, e.store, e.gate, sku, nil, true); err != nil || !rep.OK() {
				t.Errorf("invariants: %v %v", rep.Violations, err)
			}
		})
	}
}

func rebuildOf(e *splitEnv, sku string) error {
	_, err := e.sync.Rebuild(e.ctx, sku)
	return err
}

func restockOf(n int64) func(e *splitEnv, sku string) error {
	return func(e *splitEnv, sku string) error {
		_, err := e.sync.Patch(e.ctx, sku, func(cur sale.SKU) (orderstore.SKUChange, error) {
			return orderstore.SKUChange{TotalStock: cur.TotalStock + n, PerUserLimit: cur.PerUserLimit, Buckets: cur.Buckets}, nil
		})
		return err
	}
}

func putOf(e *splitEnv, sku string) error {
	cur, err := e.store.SKU(e.ctx, sku)
	if err != nil {
		return err
	}
	_, _, err = e.sync.Put(e.ctx, orderstore.SKUChange{ID: sku, TotalStock: cur.TotalStock, PerUserLimit: cur.PerUserLimit + 1, Buckets: cur.Buckets})
	return err
}

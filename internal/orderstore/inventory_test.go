package orderstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestPutSKU(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	start := time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)
	end := start.Add(90 * time.Minute)

	// Steps run in order on one database; sell applies a reservation of that
	// many units before the change.
	type want struct {
		sku     sale.SKU
		delta   int64
		created bool
		err     error
	}
	steps := []struct {
		name   string
		sell   int64
		change orderstore.SKUChange
		want   want
	}{
		{
			name:   "create with window",
			change: orderstore.SKUChange{ID: "A", TotalStock: 10, PerUserLimit: 2, StartsAt: start, EndsAt: end},
			want: want{
				sku:   sale.SKU{ID: "A", TotalStock: 10, Stock: 10, PerUserLimit: 2, StartsAt: start, EndsAt: end},
				delta: 10, created: true,
			},
		},
		{
			name:   "restock after sales keeps sold units counted",
			sell:   3,
			change: orderstore.SKUChange{ID: "A", TotalStock: 20, PerUserLimit: 2, StartsAt: start, EndsAt: end},
			want: want{
				sku:   sale.SKU{ID: "A", TotalStock: 20, Stock: 17, PerUserLimit: 2, StartsAt: start, EndsAt: end},
				delta: 10,
			},
		},
		{
			name:   "shrink to exactly what is sold, clear window, change limit",
			change: orderstore.SKUChange{ID: "A", TotalStock: 3, PerUserLimit: 4},
			want: want{
				sku:   sale.SKU{ID: "A", TotalStock: 3, Stock: 0, PerUserLimit: 4},
				delta: -17,
			},
		},
		{
			name:   "shrink below what is sold conflicts",
			change: orderstore.SKUChange{ID: "A", TotalStock: 2, PerUserLimit: 1},
			want:   want{err: sale.ErrStockConflict},
		},
		{
			name:   "same total is a zero delta",
			change: orderstore.SKUChange{ID: "A", TotalStock: 3, PerUserLimit: 4, EndsAt: end},
			want: want{
				sku:   sale.SKU{ID: "A", TotalStock: 3, Stock: 0, PerUserLimit: 4, EndsAt: end},
				delta: 0,
			},
		},
		{
			name:   "create with zero stock",
			change: orderstore.SKUChange{ID: "B", TotalStock: 0, PerUserLimit: 1},
			want:   want{sku: sale.SKU{ID: "B", PerUserLimit: 1}, created: true},
		},
		{
			name:   "bad id",
			change: orderstore.SKUChange{ID: "no spaces", TotalStock: 1, PerUserLimit: 1},
			want:   want{err: sale.ErrInvalid},
		},
		{
			name:   "zero per-user limit",
			change: orderstore.SKUChange{ID: "C", TotalStock: 1},
			want:   want{err: sale.ErrInvalid},
		},
		{
			name:   "negative total",
			change: orderstore.SKUChange{ID: "C", TotalStock: -1, PerUserLimit: 1},
			want:   want{err: sale.ErrInvalid},
		},
		{
			name:   "total above MaxStock",
			change: orderstore.SKUChange{ID: "C", TotalStock: sale.MaxStock + 1, PerUserLimit: 1},
			want:   want{err: sale.ErrInvalid},
		},
		{
			name:   "window ends before it starts",
			change: orderstore.SKUChange{ID: "C", TotalStock: 1, PerUserLimit: 1, StartsAt: end, EndsAt: start},
			want:   want{err: sale.ErrInvalid},
		},
	}
	ignoreUpdated := cmpopts.IgnoreFields(sale.SKU{}, "UpdatedAt", "Buckets")
	for i, st := range steps {
		// One unit per buyer, so the per-user limit never refuses them.
		for k := range st.sell {
			r := resv(oid(i, int(k)), st.change.ID, fmt.Sprintf("buyer%d", k), 1)
			if got, err := s.ApplyBatch(ctx, []sale.Reservation{r}); err != nil || got[0].Status != sale.StatusPendingPayment {
				t.Fatalf("%s: sell: %v, %v", st.name, got, err)
			}
		}
		before, _ := s.SKU(ctx, st.change.ID)
		sku, delta, created, err := s.PutSKU(ctx, st.change)
		if st.want.err != nil {
			if !errors.Is(err, st.want.err) {
				t.Errorf("%s: err = %v, want %v", st.name, err, st.want.err)
			}
			after, _ := s.SKU(ctx, st.change.ID)
			if diff := cmp.Diff(before, after); diff != "" {
				t.Errorf("%s: refused change modified the SKU (-before +after):\n%s", st.name, diff)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if diff := cmp.Diff(st.want.sku, sku, ignoreUpdated); diff != "" {
			t.Errorf("%s: sku (-want +got):\n%s", st.name, diff)
		}
		if delta != st.want.delta || created != st.want.created {
			t.Errorf("%s: delta, created = %d, %v; want %d, %v", st.name, delta, created, st.want.delta, st.want.created)
		}
		if sku.UpdatedAt.IsZero() {
			t.Errorf("%s: UpdatedAt is zero", st.name)
		}
		got, err := s.SKU(ctx, st.change.ID)
		if err != nil {
			t.Fatalf("%s: SKU: %v", st.name, err)
		}
		if diff := cmp.Diff(sku, got); diff != "" {
			t.Errorf("%s: SKU() differs from what PutSKU returned (-put +read):\n%s", st.name, diff)
		}
		checkInvariants(t, s, st.change.ID)
	}

	all, err := s.SKUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, k := range all {
		ids = append(ids, k.ID)
	}
	if diff := cmp.Diff([]string{"A", "B"}, ids); diff != "" {
		t.Errorf("SKUs ids (-want +got):\n%s", diff)
	}
}

func TestSKUUnknown(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	if _, err := s.SKU(ctx, "nope"); !errors.Is(err, sale.ErrUnknownSKU) {
		t.Errorf("SKU(nope) err = %v, want %v", err, sale.ErrUnknownSKU)
	}
	skus, err := s.SKUs(ctx)
	if err != nil || len(skus) != 0 {
		t.Errorf("SKUs on an empty store = %v, %v; want none", skus, err)
	}
}

// Concurrent creators of one SKU: exactly one creates it, the others update
// it with a zero delta.
func TestPutSKUConcurrentCreate(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const n = 6
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		creates int
		deltas  int64
	)
	for range n {
		wg.Go(func() {
			_, delta, created, err := s.PutSKU(ctx, orderstore.SKUChange{ID: "RACE", TotalStock: 50, PerUserLimit: 1})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			deltas += delta
			if created {
				creates++
			}
		})
	}
	wg.Wait()
	if creates != 1 || deltas != 50 {
		t.Errorf("creations = %d, sum of deltas = %d; want 1, 50", creates, deltas)
	}
	if l := checkInvariants(t, s, "RACE"); l.Stock != 50 || l.Total != 50 {
		t.Errorf("ledger = %+v, want stock = total = 50", l)
	}
}

// The number of stock buckets is stored with the sale, replaced by every
// change (0 means 1), and refused outside 1..sale.MaxBuckets by the
// database's own check too.
func TestPutSKUBuckets(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	steps := []struct {
		buckets, want int
		err           error
	}{
		{0, 1, nil}, {4, 4, nil}, {sale.MaxBuckets, sale.MaxBuckets, nil}, {1, 1, nil},
		{sale.MaxBuckets + 1, 1, sale.ErrInvalid}, {-1, 1, sale.ErrInvalid}, {3, 3, nil},
	}
	for i, st := range steps {
		_, _, _, err := s.PutSKU(ctx, orderstore.SKUChange{ID: "B", TotalStock: 10, PerUserLimit: 2, Buckets: st.buckets})
		if !errors.Is(err, st.err) {
			t.Fatalf("step %d: buckets %d: %v, want %v", i, st.buckets, err, st.err)
		}
		got, err := s.SKU(ctx, "B")
		if err != nil {
			t.Fatal(err)
		}
		if got.Buckets != st.want {
			t.Fatalf("step %d: stored buckets %d, want %d", i, got.Buckets, st.want)
		}
	}
	if _, err := s.DB().ExecContext(ctx, "UPDATE inventory SET buckets = 65 WHERE sku_id = 'B'"); err == nil {
		t.Fatal("the database accepted 65 buckets")
	}
}

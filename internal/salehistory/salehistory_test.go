package salehistory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// clock is a settable now for a Tally.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// fakeStore answers the database's part from memory.
type fakeStore struct {
	skus          map[string]sale.SKU
	units, buyers int64
}

func (f fakeStore) SKU(_ context.Context, id string) (sale.SKU, error) {
	s, ok := f.skus[id]
	if !ok {
		return sale.SKU{}, sale.ErrUnknownSKU
	}
	return s, nil
}
func (f fakeStore) SaleTotals(context.Context, string) (int64, int64, error) {
	return f.units, f.buyers, nil
}
func (fakeStore) PutSaleRecord(context.Context, orderstore.SaleRecord, bool) (bool, error) {
	return true, nil
}
func (fakeStore) SaleRecords(context.Context, string, int) ([]orderstore.SaleRecord, error) {
	return nil, nil
}

// TestTwoInstancesSumExactly: two instances (two tallies, one prefix),
// each counting from many goroutines, add up to the exact per-second
// totals, peaks, refusals, sell-out second and p99.
func TestTwoInstancesSumExactly(t *testing.T) {
	ctx := t.Context()
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	start := time.Unix(1_900_000_000, 0).UTC()
	var clocks [2]clock
	var tallies [2]*Tally
	for i := range tallies {
		tallies[i] = NewTally(c, prefix)
		clocks[i].set(start)
		tallies[i].now = clocks[i].now
	}
	// Second s: instance i counts per[s][i] attempts from 4 goroutines:
	// accepted until second 2, sold_out from second 2; every 10th limit_reached.
	per := [][2]int{{400, 300}, {1000, 1200}, {800, 40}, {8, 0}}
	want := map[int]int64{}
	for s, counts := range per {
		var wg sync.WaitGroup
		for i, n := range counts {
			clocks[i].set(start.Add(time.Duration(s) * time.Second))
			want[s] += int64(n)
			for g := range 4 {
				wg.Go(func() {
					for k := g; k < n; k += 4 {
						outcome := "accepted"
						switch {
						case k%10 == 0:
							outcome = "limit_reached"
						case s >= 2:
							outcome = "sold_out"
						}
						d := 2 * time.Millisecond
						if k%100 == 0 {
							d = 300 * time.Millisecond // 1% slow
						}
						tallies[i].Record("HOT", outcome, d)
					}
				})
			}
		}
		wg.Wait()
		// Flush mid-way, as the ticker does: second s is complete.
		for i := range tallies {
			if _, err := tallies[i].Flush(ctx, start.Add(time.Duration(s+1)*time.Second), false); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range tallies {
		if _, err := tallies[i].Flush(ctx, start, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := tallies[0].Sample(ctx, "HOT", FieldBacklog, 70, start.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := tallies[1].Sample(ctx, "HOT", FieldBacklog, 90, start.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := tallies[0].Sample(ctx, "HOT", FieldBacklog, 80, start.Add(time.Second)); err != nil {
		t.Fatal(err)
	}

	sku := sale.SKU{ID: "HOT", TotalStock: 1000, StartsAt: start, EndsAt: start.Add(time.Minute)}
	r := NewRecorder(tallies[0], fakeStore{units: 1000, buyers: 990}, slog.New(slog.DiscardHandler))
	got, err := r.Summary(ctx, sku, start.Add(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// limit_reached: k%10==0 per instance per second.
	var limit, sold, acc int64
	for s, counts := range per {
		for _, n := range counts {
			l := int64((n + 9) / 10)
			limit += l
			if s >= 2 {
				sold += int64(n) - l
			} else {
				acc += int64(n) - l
			}
		}
	}
	wantRec := orderstore.SaleRecord{SKU: "HOT", StartsAt: start, EndsAt: start.Add(time.Minute), RecordedAt: start.Add(2 * time.Minute),
		Stock: 1000, Seconds: 4, Attempts: want[0] + want[1] + want[2] + want[3], Accepted: acc,
		PeakAttempts: want[1], PeakAccepted: 1000 - 100 + 1200 - 120, SellOut: 2 * time.Second, Buyers: 990, UnitsSold: 1000,
		Refusals: map[string]int64{"limit_reached": limit, "sold_out": sold}, P99: float64(bucketBound(bucketOf(300*time.Millisecond))) / 1e6,
		BacklogMax: 90}
	if d := cmp.Diff(wantRec, got); d != "" {
		t.Errorf("summary (-want +got):\n%s", d)
	}
}

func TestBuckets(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, 51 * time.Microsecond, time.Millisecond, 7 * time.Millisecond, time.Second, time.Hour} {
		i := bucketOf(d)
		if i < latBuckets-1 && bucketBound(i) < d {
			t.Errorf("%v in bucket %d bounded by %v", d, i, bucketBound(i))
		}
		if i > 0 && bucketBound(i-1) >= d {
			t.Errorf("%v in bucket %d, fits %d", d, i, i-1)
		}
	}
}

func openStore(t *testing.T) *orderstore.Store {
	t.Helper()
	st, err := orderstore.Open(t.Context(), testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestRecordOnceAcrossInstances: two instances' recorders see the sale end
// at the same moment; exactly one row is written, by exactly one of them.
// A record on demand then refreshes that row, not a second one.
func TestRecordOnceAcrossInstances(t *testing.T) {
	ctx := t.Context()
	st := openStore(t)
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	start := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	end := start.Add(30 * time.Second)
	if _, _, _, err := st.PutSKU(ctx, orderstore.SKUChange{ID: "ENDED", Tag: "phones", TotalStock: 10, PerUserLimit: 2, StartsAt: start, EndsAt: end}); err != nil {
		t.Fatal(err)
	}
	ins := st.Rebind(`INSERT INTO orders (order_id, sku_id, user_id, quantity, status, created_at) VALUES (?, ?, ?, ?, ?, ?)`)
	for i, o := range []struct {
		user, status string
		qty          int64
	}{{"ann", "paid", 2}, {"bob", "pending_payment", 1}, {"ann", "pending_payment", 0 + 1}, {"cy", "failed", 1}, {"dee", "cancelled", 2}} {
		if _, err := st.DB().ExecContext(ctx, ins, fmt.Sprintf("o%d", i), "ENDED", o.user, o.qty, o.status, start); err != nil {
			t.Fatal(err)
		}
	}
	sku, err := st.SKU(ctx, "ENDED")
	if err != nil {
		t.Fatal(err)
	}
	var recs [2]*Recorder
	for i := range recs {
		tl := NewTally(c, prefix)
		tl.now = func() time.Time { return start.Add(time.Duration(i) * time.Second) }
		tl.Record("ENDED", "accepted", time.Millisecond)
		tl.Record("ENDED", "sold_out", time.Millisecond)
		if _, err := tl.Flush(ctx, start, true); err != nil {
			t.Fatal(err)
		}
		recs[i] = NewRecorder(tl, st, slog.New(slog.DiscardHandler))
	}
	now := end.Add(Grace)
	var written [2]int
	var wg sync.WaitGroup
	for i := range recs {
		wg.Go(func() {
			var err error
			if written[i], err = recs[i].RunOnce(ctx, []sale.SKU{sku}, now); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if written[0]+written[1] != 1 {
		t.Fatalf("rows written by the two instances: %v, want one in all", written)
	}
	for i := range recs { // seen recorded: no more work
		if n, err := recs[i].RunOnce(ctx, []sale.SKU{sku}, now.Add(time.Second)); err != nil || n != 0 {
			t.Fatal(n, err)
		}
	}
	rows, err := st.SaleRecords(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1: %+v", len(rows), rows)
	}
	got := rows[0]
	want := orderstore.SaleRecord{SKU: "ENDED", Tag: "phones", StartsAt: start, EndsAt: end, RecordedAt: now, Stock: 10, Seconds: 2, Attempts: 4, Accepted: 2,
		PeakAttempts: 2, PeakAccepted: 1, SellOut: 0, Buyers: 2, UnitsSold: 4, Refusals: map[string]int64{"sold_out": 2},
		P99: float64(bucketBound(bucketOf(time.Millisecond))) / 1e6}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("row (-want +got):\n%s", d)
	}

	// On demand: the same row, refreshed.
	later := now.Add(time.Minute)
	if _, err := recs[1].Record(ctx, "ENDED", later); err != nil {
		t.Fatal(err)
	}
	if rows, err = st.SaleRecords(ctx, "ENDED", 10); err != nil || len(rows) != 1 || !rows[0].RecordedAt.Equal(later.Truncate(time.Microsecond)) {
		t.Fatalf("after a record on demand: %+v %v", rows, err)
	}
	if _, err := recs[1].Record(ctx, "NOPE", later); !isUnknown(err) {
		t.Fatalf("unknown sku: %v", err)
	}
}

func isUnknown(err error) bool { return errors.Is(err, sale.ErrUnknownSKU) }

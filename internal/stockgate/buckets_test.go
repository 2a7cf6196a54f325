package stockgate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

func seedSplit(t testing.TB, g *stockgate.Gate, sku string, k int, stock, limit int64) {
	t.Helper()
	ok, err := g.SeedSplit(context.Background(), sku, stockgate.Config{PerUserLimit: limit}, k, stock, nil, nil, nil, nil, "e1")
	if err != nil || !ok {
		t.Fatalf("seed split: %v %v", ok, err)
	}
}

// bucketAvail returns each bucket's avail and the units in transfer.
func bucketAvail(t testing.TB, g *stockgate.Gate, sku string, k int) ([]int64, int64) {
	t.Helper()
	bs, err := g.ReadBuckets(context.Background(), stockgate.BucketNames(sku, k), false)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, k)
	var transit int64
	for i, b := range bs {
		out[i] = b.Avail - b.Debt
		transit += b.Transit
	}
	return out, transit
}

// userIn returns a user id whose home bucket of k is b.
func userIn(b, k, n int) string {
	for i := 0; ; i++ {
		u := fmt.Sprintf("u%d-%d", n, i)
		if stockgate.HomeBucket(u, k) == b {
			return u
		}
	}
}

func TestBucketNamesSpreadOverSlots(t *testing.T) {
	for _, k := range []int{1, 2, 3, 4, 6, 16, sale.MaxBuckets} {
		names := stockgate.BucketNames("hot-sku", k)
		if names[0] != "hot-sku" {
			t.Fatalf("k=%d: bucket 0 is %q, want the SKU itself", k, names[0])
		}
		seen := map[string]bool{}
		for b, n := range names {
			if seen[n] {
				t.Fatalf("k=%d: name %q twice", k, n)
			}
			seen[n] = true
			if stockgate.SKUOf(n) != "hot-sku" {
				t.Fatalf("SKUOf(%q) = %q", n, stockgate.SKUOf(n))
			}
			if b == 0 {
				continue
			}
			if s, want := stockgate.SlotOf(n), (stockgate.SlotOf("hot-sku")+b*16384/k)%16384; s != want {
				t.Fatalf("k=%d bucket %d: %q in slot %d, want %d", k, b, n, s, want)
			}
		}
	}
	// The slot function is Redis Cluster's: CLUSTER KEYSLOT "123456789" is 12739.
	if s := stockgate.SlotOf("123456789"); s != 12739 {
		t.Fatalf("slot of 123456789: %d, want 12739", s)
	}
}

// The home bucket refills from the others: a buyer whose home bucket is
// empty buys while any bucket has units, one after another until the sale
// as a whole is sold out, whichever bucket held them.
func TestBucketsRefillHomeFromOthers(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const k = 4
	seedSplit(t, g, "rf", k, 7, 5)
	// Every unit is bought by buyers of bucket 0.
	for i := range 7 {
		r := res("rf", userIn(0, k, i), 1)
		if _, err := g.ReserveIn(ctx, r, stockgate.Limits{}, k); err != nil {
			t.Fatalf("purchase %d with units left: %v", i+1, err)
		}
	}
	_, err := g.ReserveIn(ctx, res("rf", userIn(0, k, 99), 1), stockgate.Limits{}, k)
	var so *stockgate.SoldOutError
	if !errors.As(err, &so) || so.Available != 0 {
		t.Fatalf("8th purchase: %v, want sold out with 0 left", err)
	}
	left, transit := bucketAvail(t, g, "rf", k)
	for b, n := range left {
		if n != 0 {
			t.Fatalf("bucket %d has %d units after the sale sold out", b, n)
		}
	}
	if transit != 0 {
		t.Fatalf("%d units still in transfer", transit)
	}
	// A quantity larger than any one bucket holds gathers from several.
	seedSplit(t, g, "rf2", k, 8, 10) // 2 per bucket
	if _, err := g.ReserveIn(ctx, res("rf2", userIn(1, k, 0), 7), stockgate.Limits{}, k); err != nil {
		t.Fatalf("7 of 8 units over 4 buckets: %v", err)
	}
	if _, err := g.ReserveIn(ctx, res("rf2", userIn(2, k, 0), 2), stockgate.Limits{}, k); !errors.As(err, &so) || so.Available != 1 {
		t.Fatalf("2 of the last 1: %v, want sold out with 1 left", err)
	}
}

// The last units of a split sale sell exactly as with one bucket: 7 units,
// 4 buckets, 200 buyers with a limit of 1: exactly 7 sell, every other
// buyer hears sold_out, and none hears it before every one of the 7
// purchases had begun (a sold_out is linearised after the last sale: the
// sale as a whole had nothing left). Buyers start in waves so that early
// sold_out answers would be caught.
func TestBucketsLastUnitsExact(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const k, stock, buyers = 4, 7, 200
	for round := range 3 {
		sku := fmt.Sprintf("last%d", round)
		seedSplit(t, g, sku, k, stock, 1)
		var seq atomic.Int64
		type call struct {
			start, end int64
			err        error
		}
		calls := make([]call, buyers)
		var wg sync.WaitGroup
		for i := range buyers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := &calls[i]
				c.start = seq.Add(1)
				_, c.err = g.ReserveIn(ctx, res(sku, fmt.Sprintf("buyer-%d", i), 1), stockgate.Limits{}, k)
				c.end = seq.Add(1)
			}()
			if i%20 == 19 {
				time.Sleep(time.Millisecond)
			}
		}
		wg.Wait()
		sold := 0
		var starts []int64
		for _, c := range calls {
			switch {
			case c.err == nil:
				sold++
				starts = append(starts, c.start)
			case !errors.Is(c.err, sale.ErrSoldOut):
				t.Fatalf("round %d: unexpected %v", round, c.err)
			}
		}
		if sold != stock {
			t.Fatalf("round %d: %d sold of %d", round, sold, stock)
		}
		for i, c := range calls {
			if c.err == nil {
				continue
			}
			for _, s := range starts {
				if s > c.end {
					t.Fatalf("round %d: buyer %d heard sold_out (seq %d) before a purchase that succeeded had begun (seq %d)", round, i, c.end, s)
				}
			}
		}
		left, transit := bucketAvail(t, g, sku, k)
		for b, n := range left {
			if n != 0 {
				t.Fatalf("round %d: bucket %d has %d units left", round, b, n)
			}
		}
		if transit != 0 {
			t.Fatalf("round %d: %d units in transfer", round, transit)
		}
	}
}

// Per-user limit exact across buckets: a buyer's record lives in their
// home bucket, however many times they try and wherever the units are.
func TestBucketsPerUserLimit(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const k = 3
	seedSplit(t, g, "lim", k, 300, 2)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := range 120 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := g.ReserveIn(ctx, res("lim", fmt.Sprintf("u%d", i%10), 1), stockgate.Limits{}, k)
			switch {
			case err == nil:
				ok.Add(1)
			case !errors.Is(err, sale.ErrLimitReached):
				t.Errorf("unexpected %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 20 {
		t.Fatalf("%d accepted, want 10 users x 2", ok.Load())
	}
	for i := range 10 {
		u := fmt.Sprintf("u%d", i)
		if n, err := g.Held(ctx, "lim", u); err != nil || n != 2 {
			t.Fatalf("%s holds %d (%v), want 2", u, n, err)
		}
	}
}

// A refusal gives its units back to the reservation's own bucket, a
// release to the buyer's home bucket, and a caller that believes another
// number of buckets is refused.
func TestBucketsRefusalReleaseAndStaleSplit(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const k = 3
	seedSplit(t, g, "rr", k, 30, 5)
	u := userIn(2, k, 0)
	gr, err := g.ReserveIn(ctx, res("rr", u, 3), stockgate.Limits{}, k)
	if err != nil {
		t.Fatal(err)
	}
	r, found, err := g.Lookup(ctx, gr.OrderID, "rr")
	if err != nil || !found || r.Bucket != stockgate.BucketNames("rr", k)[2] {
		t.Fatalf("lookup: %+v %v %v", r, found, err)
	}
	if left, _ := bucketAvail(t, g, "rr", k); left[2] != 7 {
		t.Fatalf("home bucket after 3 of 10: %v", left)
	}
	if n, err := g.Finalize(ctx, stockgate.BucketOf(r), []stockgate.Outcome{{OrderID: r.OrderID, Refused: true}}); err != nil || n != 3 {
		t.Fatalf("finalize: %d %v", n, err)
	}
	if left, _ := bucketAvail(t, g, "rr", k); left[2] != 10 {
		t.Fatalf("home bucket after the refusal: %v", left)
	}
	if h, _ := g.Held(ctx, "rr", u); h != 0 {
		t.Fatalf("held after refusal: %d", h)
	}
	gr, err = g.ReserveIn(ctx, res("rr", u, 2), stockgate.Limits{}, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Finalize(ctx, stockgate.BucketNames("rr", k)[2], []stockgate.Outcome{{OrderID: gr.OrderID}}); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Restore(ctx, "rr", []stockgate.Release{{OrderID: gr.OrderID, User: u, Quantity: 2}}); err != nil || n != 2 {
		t.Fatalf("restore: %d %v", n, err)
	}
	if left, _ := bucketAvail(t, g, "rr", k); left[2] != 10 {
		t.Fatalf("home bucket after the release: %v", left)
	}
	if n, _, _ := g.Available(ctx, "rr"); n != 30 {
		t.Fatalf("available over buckets: %d", n)
	}
	if _, err := g.ReserveIn(ctx, res("rr", u, 1), stockgate.Limits{}, 1); !errors.Is(err, stockgate.ErrBucketsChanged) {
		t.Fatalf("stale split of 1: %v", err)
	}
	if _, err := g.ReserveIn(ctx, res("rr", u, 1), stockgate.Limits{}, 4); !errors.Is(err, stockgate.ErrBucketsChanged) {
		t.Fatalf("stale split of 4: %v", err)
	}
}

// A transfer whose caller died after the debit is finished by the
// sweeper (credited once), or refunded when its receiver was loaded again.
func TestBucketsTransferSweep(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const k = 2
	seedSplit(t, g, "sw", k, 10, 5)
	names := stockgate.BucketNames("sw", k)
	bs, err := g.ReadBuckets(ctx, names, false)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Minute)
	if n, err := g.TransferOut(ctx, names[1], names[0], bs[0].Epoch, 3, k, old); err != nil || n != 3 {
		t.Fatalf("transfer out: %d %v", n, err)
	}
	if f, err := g.ReadInFlight(ctx, "sw"); err != nil || f.Available != 10 {
		t.Fatalf("in transfer the sale still has its 10 units: %+v %v", f, err)
	}
	for range 2 { // twice: the second finds nothing
		if _, err := g.SweepTransfers(ctx, names[1], time.Now().Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if left, transit := bucketAvail(t, g, "sw", k); left[0] != 8 || left[1] != 2 || transit != 0 {
		t.Fatalf("after the sweep: %v transit %d", left, transit)
	}
	// Receiver loaded again (a new epoch) between the halves: refunded.
	if n, err := g.TransferOut(ctx, names[1], names[0], "an-old-epoch", 2, k, old); err != nil || n != 2 {
		t.Fatalf("transfer out: %d %v", n, err)
	}
	if _, err := g.SweepTransfers(ctx, names[1], time.Now()); err != nil {
		t.Fatal(err)
	}
	if left, transit := bucketAvail(t, g, "sw", k); left[0] != 8 || left[1] != 2 || transit != 0 {
		t.Fatalf("after the refund: %v transit %d", left, transit)
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// A transfer half done when the sale is rebuilt (every bucket fenced and
// seeded again from the database, which counts the units in transfer) never
// completes after it: its credit names the receiver's old epoch and is
// refused, and its journal entry is gone, so nothing is refunded either.
func TestBucketsTransferAcrossRebuild(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const k = 2
	seedSplit(t, g, "rb", k, 10, 5)
	names := stockgate.BucketNames("rb", k)
	bs, err := g.ReadBuckets(ctx, names, false)
	if err != nil {
		t.Fatal(err)
	}
	n, id, err := g.TransferOutID(ctx, names[1], names[0], bs[0].Epoch, 3, k, time.Now())
	if err != nil || n != 3 {
		t.Fatalf("transfer out: %d %v", n, err)
	}
	for _, name := range names {
		if err := g.Fence(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := g.SeedSplit(ctx, "rb", stockgate.Config{PerUserLimit: 5}, k, 10, nil, nil, nil, nil, "e2"); err != nil || !ok {
		t.Fatalf("reseed: %v %v", ok, err)
	}
	if err := g.CompleteTransfer(ctx, names[1], id, names[0], bs[0].Epoch, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := g.SweepTransfers(ctx, names[1], time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if left, transit := bucketAvail(t, g, "rb", k); left[0] != 5 || left[1] != 5 || transit != 0 {
		t.Fatalf("after the rebuild and the late credit: %v transit %d, want [5 5]", left, transit)
	}
}

// The janitor works per bucket: each bucket of an ended split sale is
// dropped (with its transfer journals) once nothing of it is in flight,
// and leaves the registry.
func TestBucketsExpirePerBucket(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	const k = 3
	ended := time.Now().Add(-time.Hour)
	if ok, err := g.SeedSplit(ctx, "ex", stockgate.Config{PerUserLimit: 1, EndsAt: ended}, k, 9, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatalf("seed: %v %v", ok, err)
	}
	names := stockgate.BucketNames("ex", k)
	bs, _ := g.ReadBuckets(ctx, names, false)
	if _, err := g.TransferOut(ctx, names[2], names[1], bs[1].Epoch, 1, k, time.Now()); err != nil {
		t.Fatal(err)
	}
	reg, err := g.SKUs(ctx)
	if err != nil || len(reg) != k {
		t.Fatalf("registry %v %v", reg, err)
	}
	for _, n := range reg {
		if dropped, err := g.Expire(ctx, n, time.Now(), time.Minute); err != nil || !dropped {
			t.Fatalf("expire %s: %v %v", n, dropped, err)
		}
	}
	if reg, _ := g.SKUs(ctx); len(reg) != 0 {
		t.Fatalf("registry after expiry: %v", reg)
	}
	for _, n := range names {
		for _, key := range []string{g.KeysOf(n).Meta, g.Prefix() + ":{" + n + "}:xfer"} {
			if e, err := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64(); err != nil || e != 0 {
				t.Fatalf("%s still exists (%v)", key, err)
			}
		}
	}
}

// runBucketScripts runs every script of the stock buckets (bucketread,
// xferout, xferin, xferdone) on g, for
// tests that check each gate script on a Redis Cluster: a sale of 3 units
// split in 3 buckets, one buyer of bucket 0 taking 2 (one transfer).
func runBucketScripts(t *testing.T, g *stockgate.Gate, sku string) {
	t.Helper()
	ctx := context.Background()
	if ok, err := g.SeedSplit(ctx, sku, stockgate.Config{PerUserLimit: 5}, 3, 3, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatalf("seed split: %v %v", ok, err)
	}
	if _, err := g.ReserveIn(ctx, res(sku, userIn(0, 3, 0), 2), stockgate.Limits{}, 3); err != nil {
		t.Fatalf("reserve with a transfer: %v", err)
	}
	if _, err := g.SettleDebt(ctx, sku); err != nil {
		t.Fatal(err)
	}
	if f, err := g.ReadInFlight(ctx, sku); err != nil || f.Available != 1 || f.Units() != 2 {
		t.Fatalf("after the transfer: %+v %v", f, err)
	}
}

func TestBucketScripts(t *testing.T) {
	g, _ := newGate(t)
	runBucketScripts(t, g, "scripts")
}

// A bucket not loaded yet is "not warmed" (the caller loads the sale),
// whatever number of buckets the caller believes.
func TestBucketsUnloadedIsNotWarmed(t *testing.T) {
	g, _ := newGate(t)
	if _, err := g.ReserveIn(context.Background(), res("nw", "u1", 1), stockgate.Limits{}, 4); !errors.Is(err, sale.ErrNotWarmed) {
		t.Fatalf("unloaded split sale: %v, want sale.ErrNotWarmed", err)
	}
}

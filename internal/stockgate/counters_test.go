package stockgate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// checkGauges compares the gauges (counts kept by the scripts) with the
// entries themselves.
func checkGauges(t *testing.T, g *stockgate.Gate, sku, step string) {
	t.Helper()
	ctx := context.Background()
	f, err := g.ReadInFlight(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := g.ReadGauges(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if gs.InFlight != int64(len(f.Reservations)) || gs.Units != f.Units() || gs.Loaded != f.Loaded || (f.Loaded && gs.Available != f.Available) {
		t.Fatalf("after %s: gauges %+v, entries say %d reservations, %d units, loaded %v, available %d",
			step, gs, len(f.Reservations), f.Units(), f.Loaded, f.Available)
	}
}

// TestInFlightCounterExact: after a random mix of reservations (with
// retries), closes (applied, refused, refused for a key), resyncs, fences
// and re-seeds, the meta hash's in-flight units equal the sum of the res
// entries at every step.
func TestInFlightCounterExact(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const sku = "cnt"
	seed(t, g, sku, 10_000, 100)
	rng := rand.New(rand.NewPCG(1, 2))
	var open []sale.Reservation
	for step := 0; step < 400; step++ {
		switch op := rng.IntN(10); {
		case op < 5: // reserve, sometimes twice (a retry of the same id)
			r := res(sku, fmt.Sprint("u", rng.IntN(30)), int64(1+rng.IntN(3)))
			for range 1 + rng.IntN(2) {
				if _, err := g.Reserve(ctx, r); err == nil {
					open = append(open, r)
				} else if !errors.Is(err, sale.ErrLimitReached) && !errors.Is(err, sale.ErrNotWarmed) {
					t.Fatal(err)
				}
			}
		case op < 8 && len(open) > 0: // close a few, some twice
			var outs []stockgate.Outcome
			for range 1 + rng.IntN(4) {
				r := open[rng.IntN(len(open))]
				o := stockgate.Outcome{OrderID: r.OrderID, Refused: rng.IntN(2) == 0}
				if o.Refused && rng.IntN(3) == 0 {
					o.KeyOrderID = "kept"
				}
				outs = append(outs, o)
			}
			if _, err := g.Finalize(ctx, sku, outs); err != nil {
				t.Fatal(err)
			}
		case op == 8: // resync closing some entries as processed
			f, err := g.ReadInFlight(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if !f.Loaded {
				continue
			}
			processed := map[string]bool{}
			for _, r := range f.Reservations {
				if rng.IntN(3) == 0 {
					processed[r.OrderID] = rng.IntN(2) == 0
				}
			}
			if _, err := g.Resync(ctx, sku, stockgate.Config{PerUserLimit: 100}, f, 10_000, processed, nil); err != nil {
				t.Fatal(err)
			}
		default: // fence, then seed re-recording part of what is in flight (and some new)
			f, err := g.ReadInFlight(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Fence(ctx, sku); err != nil {
				t.Fatal(err)
			}
			checkGauges(t, g, sku, "fence")
			var again []sale.Reservation
			for _, r := range f.Reservations {
				if rng.IntN(2) == 0 {
					again = append(again, r)
				}
			}
			again = append(again, res(sku, "new", 2))
			open = append(open, again[len(again)-1])
			if ok, err := g.Seed(ctx, sku, stockgate.Config{PerUserLimit: 100}, 10_000, nil, again, nil, nil, fmt.Sprint("e", step)); err != nil || !ok {
				t.Fatalf("re-seed: %v %v", ok, err)
			}
		}
		checkGauges(t, g, sku, fmt.Sprint("step ", step))
	}
}

// TestCountStartsFromEntries: a SKU whose meta hash has no count (loaded by
// a version without it) is read from its entries, and the next resync
// counts them; from then on the count is kept.
func TestCountStartsFromEntries(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	seed(t, g, "old", 100, 10)
	for i := range 3 {
		if _, err := g.Reserve(ctx, res("old", fmt.Sprint("u", i), 2)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Do(ctx, c.B().Hdel().Key(g.KeysOf("old").Meta).Field("inflight").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	checkGauges(t, g, "old", "count dropped")
	f, err := g.ReadInFlight(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Resync(ctx, "old", stockgate.Config{PerUserLimit: 10}, f, 100, nil, nil); err != nil {
		t.Fatal(err)
	}
	n, err := c.Do(ctx, c.B().Hget().Key(g.KeysOf("old").Meta).Field("inflight").Build()).AsInt64()
	if err != nil || n != 6 {
		t.Fatalf("count after resync: %d %v, want 6", n, err)
	}
	if _, err := g.Reserve(ctx, res("old", "u9", 1)); err != nil {
		t.Fatal(err)
	}
	checkGauges(t, g, "old", "reserve after resync")
}

// TestClosedMarkersBounded: closed-order markers of reservations accepted
// longer ago than the retention are dropped by later closes; a retry of a
// recently closed order id is still a duplicate, and a retry of one older
// than the dropped markers is refused with ErrClosedForgotten (the caller
// asks the database) instead of being reserved again.
func TestClosedMarkersBounded(t *testing.T) {
	g, c := newGate(t)
	g.SetClosedRetention(time.Minute)
	ctx := context.Background()
	const sku = "mk"
	seed(t, g, sku, 10_000, 10_000)
	old := time.Now().Add(-time.Hour).UnixMilli()
	var olds []sale.Reservation
	for i := range 200 {
		r := res(sku, fmt.Sprint("o", i), 1)
		r.AcceptedAt = old + int64(i)
		if _, err := g.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		olds = append(olds, r)
	}
	closeAll := func(rs []sale.Reservation) {
		t.Helper()
		outs := make([]stockgate.Outcome, len(rs))
		for i, r := range rs {
			outs[i] = stockgate.Outcome{OrderID: r.OrderID}
		}
		if _, err := g.Finalize(ctx, sku, outs); err != nil {
			t.Fatal(err)
		}
	}
	closeAll(olds)
	// Closing recent ones drops the old markers (the trim is bounded per
	// call: a few calls).
	var recent []sale.Reservation
	for round := range 20 {
		var batch []sale.Reservation
		for i := range 10 {
			r := res(sku, fmt.Sprint("r", round, "-", i), 1)
			if _, err := g.Reserve(ctx, r); err != nil {
				t.Fatal(err)
			}
			batch = append(batch, r)
		}
		closeAll(batch)
		recent = append(recent, batch...)
	}
	k := g.KeysOf(sku)
	fields, err := c.Do(ctx, c.B().Hkeys().Key(k.Idem).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	markers := 0
	for _, f := range fields {
		if strings.HasPrefix(f, "#") {
			markers++
		}
	}
	indexed, err := c.Do(ctx, c.B().Zcard().Key(k.Closed).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if markers != len(recent) || indexed != int64(len(recent)) {
		t.Fatalf("%d markers, %d indexed after closing %d old and %d recent; want only the %d recent", markers, indexed, len(olds), len(recent), len(recent))
	}
	// A retry of a recent closed id: a duplicate, nothing reserved.
	before := avail(t, g, sku)
	if rr, err := g.Reserve(ctx, recent[0]); err != nil || !rr.Duplicate {
		t.Fatalf("retry of a recent closed order: %+v %v, want a duplicate", rr, err)
	}
	// A retry of an old one: its marker is gone, the gate says so.
	if _, err := g.Reserve(ctx, olds[0]); !errors.Is(err, stockgate.ErrClosedForgotten) {
		t.Fatalf("retry of an order closed before the retention: %v, want ErrClosedForgotten", err)
	}
	if after := avail(t, g, sku); after != before {
		t.Fatalf("available %d after the retries, want %d", after, before)
	}
	// New purchases are not affected.
	if _, err := g.Reserve(ctx, res(sku, "fresh", 1)); err != nil {
		t.Fatal(err)
	}
}

// TestSeedChunked: a sale with 50,000 reservations in flight and as many
// buyers is seeded in chunks (many short script calls, not one long one),
// and the result is exact.
func TestSeedChunked(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := testenv.RedisClient(t, srv.URL)
	g := stockgate.New(c, "chunk")
	ctx := context.Background()
	const n = 50_000
	holdings := make(map[string]int64, n)
	inflight := make([]sale.Reservation, n)
	var units int64
	now := time.Now().UnixMilli()
	for i := range n {
		u := "u" + strconv.Itoa(i)
		q := int64(1 + i%3)
		holdings[u] = q
		inflight[i] = sale.Reservation{OrderID: stockgate.NewOrderID("big"), SKU: "big", User: u, Quantity: q, AcceptedAt: now,
			IdempotencyKey: "k" + strconv.Itoa(i)}
		units += q
	}
	calls := func() int64 {
		t.Helper()
		info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
				v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				return v
			}
		}
		return 0
	}
	before := calls()
	start := time.Now()
	ok, err := g.Seed(ctx, "big", stockgate.Config{PerUserLimit: 3}, 1000, holdings, inflight, nil, nil, "e1")
	if err != nil || !ok {
		t.Fatalf("seed: %v %v", ok, err)
	}
	t.Logf("seeded %d buyers and %d reservations in %v", n, n, time.Since(start))
	if got, want := calls()-before, int64(2*n/stockgate.SeedChunk); got < want {
		t.Fatalf("%d script calls, want at least %d (chunks of %d)", got, want, stockgate.SeedChunk)
	}
	k := g.KeysOf("big")
	if h, err := c.Do(ctx, c.B().Hlen().Key(k.Buyers).Build()).AsInt64(); err != nil || h != n {
		t.Fatalf("buyers %d %v, want %d", h, err, n)
	}
	if h, err := c.Do(ctx, c.B().Hlen().Key(k.Idem).Build()).AsInt64(); err != nil || h != n {
		t.Fatalf("idempotency keys %d %v, want %d", h, err, n)
	}
	if seeding, err := c.Do(ctx, c.B().Hexists().Key(k.Meta).Field("seeding").Build()).AsBool(); err != nil || seeding {
		t.Fatalf("seeding mark left: %v %v", seeding, err)
	}
	gs, err := g.ReadGauges(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	if !gs.Loaded || gs.Available != 1000 || gs.InFlight != n || gs.Units != units {
		t.Fatalf("gauges %+v, want loaded, 1000 available, %d in flight, %d units", gs, n, units)
	}
	checkGauges(t, g, "big", "chunked seed")
	// A buyer's hold and a key survived the chunking.
	if held, err := g.Held(ctx, "big", "u49999"); err != nil || held != holdings["u49999"] {
		t.Fatalf("held %d %v", held, err)
	}
	if id, found, err := g.Duplicate(ctx, "big", "u0", "k0"); err != nil || !found || id != inflight[0].OrderID {
		t.Fatalf("key k0: %q %v %v", id, found, err)
	}
}

// TestSeedChunksStayUnloaded: until its last chunk the SKU is refused
// (not loaded); once seeded it sells, and every chunk's buyers are there.
func TestSeedChunksStayUnloaded(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	old := stockgate.SeedChunk
	stockgate.SeedChunk = 100
	t.Cleanup(func() { stockgate.SeedChunk = old })
	var refused, chunks int
	stockgate.AfterSeedChunk(t, func(int) {
		chunks++
		if _, err := g.Reserve(ctx, res("slow", "buyer", 1)); errors.Is(err, sale.ErrNotWarmed) {
			refused++
		}
	})
	holdings := map[string]int64{}
	for i := range 450 {
		holdings[fmt.Sprint("h", i)] = 1
	}
	if ok, err := g.Seed(ctx, "slow", stockgate.Config{PerUserLimit: 5}, 50, holdings, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatalf("seed: %v %v", ok, err)
	}
	if chunks != 4 || refused != chunks {
		t.Fatalf("%d of %d reserves between chunks refused as not loaded, want 4 of 4", refused, chunks)
	}
	if _, err := g.Reserve(ctx, res("slow", "buyer", 1)); err != nil {
		t.Fatal(err)
	}
	if h, err := c.Do(ctx, c.B().Hlen().Key(g.KeysOf("slow").Buyers).Build()).AsInt64(); err != nil || h != 451 {
		t.Fatalf("buyers %d %v, want the 450 seeded and the one who bought once loaded", h, err)
	}
}

// TestSplitGaugesSum: a split sale's gauges are the sum of its buckets'
// entries (read in two round trips whatever the number of buckets), after
// buyers spread over every home bucket, some of them emptied.
func TestSplitGaugesSum(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	for _, k := range []int{2, 5, 16} {
		sku := fmt.Sprintf("gsplit%d", k)
		seedSplit(t, g, sku, k, int64(4*k), 3)
		checkGauges(t, g, sku, "seed")
		for i := range 6 * k {
			r := res(sku, fmt.Sprint("u", i), 1)
			if _, err := g.ReserveIn(ctx, r, stockgate.Limits{}, k); err != nil &&
				!errors.Is(err, sale.ErrSoldOut) && !errors.Is(err, sale.ErrLimitReached) {
				t.Fatal(err)
			}
		}
		checkGauges(t, g, sku, fmt.Sprintf("%d buyers in %d buckets", 6*k, k))
		gs, err := g.ReadGauges(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if !gs.Loaded || gs.Units != int64(4*k) || gs.Available != 0 {
			t.Fatalf("k=%d: gauges %+v, want loaded, %d units in flight, none available", k, gs, 4*k)
		}
	}
}

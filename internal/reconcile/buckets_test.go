package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/invariant"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

type splitEnv struct {
	t     *testing.T
	ctx   context.Context
	store *orderstore.Store
	gate  *stockgate.Gate
	c     rueidis.Client
	sync  *reconcile.Syncer
}

func newSplitEnv(t *testing.T) *splitEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	store, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	gate := stockgate.New(c, prefix)
	return &splitEnv{t: t, ctx: ctx, store: store, gate: gate, c: c, sync: reconcile.NewSyncer(store, gate, nil, slog.New(slog.DiscardHandler))}
}

// buy makes n concurrent purchases of one unit by users u0..u(users-1),
// each through its current split, and returns the accepted reservations.
func (e *splitEnv) buy(sku string, k, n, users int) []sale.Reservation {
	var mu sync.Mutex
	var out []sale.Reservation
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: fmt.Sprintf("u%d", i%users), Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
			_, err := e.gate.ReserveIn(e.ctx, r, stockgate.Limits{}, k)
			switch {
			case err == nil:
				r.Bucket = stockgate.HomeName(sku, r.User, k)
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			case errors.Is(err, sale.ErrSoldOut), errors.Is(err, sale.ErrLimitReached):
			default:
				e.t.Errorf("purchase: %v", err)
			}
		}()
	}
	wg.Wait()
	return out
}

// apply is the consumer: the database decides rs, the gate closes them in
// their buckets.
func (e *splitEnv) apply(rs []sale.Reservation) {
	e.t.Helper()
	outs, err := e.store.ApplyBatch(e.ctx, rs)
	if err != nil {
		e.t.Fatal(err)
	}
	by := map[string][]stockgate.Outcome{}
	for i, o := range outs {
		by[stockgate.BucketOf(rs[i])] = append(by[stockgate.BucketOf(rs[i])], stockgate.Outcome{OrderID: o.OrderID, Refused: o.Status == sale.StatusFailed})
	}
	for b, os := range by {
		if _, err := e.gate.Finalize(e.ctx, b, os); err != nil {
			e.t.Fatal(err)
		}
	}
}

// exact checks sum over buckets of (avail - debt) + units in flight = the
// database stock, and returns the in-flight read.
func (e *splitEnv) exact(sku string, step string) stockgate.InFlight {
	e.t.Helper()
	f, err := e.gate.ReadInFlight(e.ctx, sku)
	if err != nil {
		e.t.Fatal(err)
	}
	db, err := e.store.SKU(e.ctx, sku)
	if err != nil {
		e.t.Fatal(err)
	}
	if !f.Loaded || f.Available+f.Units() != db.Stock {
		e.t.Fatalf("%s: redis available %d + in flight %d != database stock %d (loaded %v)", step, f.Available, f.Units(), db.Stock, f.Loaded)
	}
	return f
}

func (e *splitEnv) restoreAll() {
	e.t.Helper()
	rs, err := e.store.PendingRestores(e.ctx, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	by := map[string][]stockgate.Release{}
	var ids []string
	for _, r := range rs {
		by[r.SKU] = append(by[r.SKU], stockgate.Release{OrderID: r.OrderID, User: r.User, Quantity: r.Quantity})
		ids = append(ids, r.OrderID)
	}
	for sku, list := range by {
		if _, err := e.gate.Restore(e.ctx, sku, list); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := e.store.RestoresDone(e.ctx, ids); err != nil {
		e.t.Fatal(err)
	}
}

// A sale split in buckets through its life, against a real database and
// Redis: created split, sold concurrently, half applied, rebuilt with the
// rest in flight, applied, cancelled, restocked, re-split, and the change
// of its split refused while a reservation is in flight. After every step
// the buckets together + units in flight = the database stock, and at the
// end the invariants hold with nothing in flight.
func TestSplitSaleLifecycle(t *testing.T) {
	e := newSplitEnv(t)
	ctx := e.ctx
	const sku = "hot"
	if _, created, err := e.sync.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 40, PerUserLimit: 2, Buckets: 4}); err != nil || !created {
		t.Fatalf("put: %v %v", created, err)
	}
	if k, err := e.gate.Buckets(ctx, sku); err != nil || k != 4 {
		t.Fatalf("redis buckets %d %v", k, err)
	}
	bs, err := e.gate.ReadBuckets(ctx, stockgate.BucketNames(sku, 4), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if !b.Loaded || b.Avail != 10 {
			t.Fatalf("bucket %s: %+v, want loaded with 10", b.Name, b)
		}
	}
	e.exact(sku, "created")

	sold := e.buy(sku, 4, 120, 30) // 30 users x limit 2 = 60 wanted, 40 to sell
	if len(sold) != 40 {
		t.Fatalf("%d sold of 40", len(sold))
	}
	held := map[string]int64{}
	for _, r := range sold {
		held[r.User]++
	}
	for u, n := range held {
		if n > 2 {
			t.Fatalf("%s bought %d, limit 2", u, n)
		}
	}
	e.exact(sku, "sold")
	e.apply(sold[:15])
	e.exact(sku, "half applied")

	// Rebuild with 25 in flight: every bucket fenced and seeded from the database.
	if _, err := e.sync.Rebuild(ctx, sku); err != nil {
		t.Fatal(err)
	}
	f := e.exact(sku, "rebuilt")
	if f.Units() != 25 || f.Available != 0 {
		t.Fatalf("after the rebuild: %d in flight, %d available; want 25, 0", f.Units(), f.Available)
	}
	for u, n := range held {
		if got, err := e.gate.Held(ctx, sku, u); err != nil || got != n {
			t.Fatalf("%s holds %d after the rebuild (%v), want %d", u, got, err, n)
		}
	}
	e.apply(sold[15:])
	e.exact(sku, "all applied")

	// Cancel three orders: the units go back to each buyer's home bucket.
	cancelled := map[string]int64{} // sold[:3] may hold one buyer twice
	for _, r := range sold[:3] {
		if _, _, err := e.store.Cancel(ctx, r.OrderID, r.User, sale.CancelByUser, time.Now()); err != nil {
			t.Fatal(err)
		}
		cancelled[r.User]++
	}
	e.restoreAll()
	if f := e.exact(sku, "cancelled"); f.Available != 3 {
		t.Fatalf("available after 3 cancellations: %d", f.Available)
	}
	for u, n := range cancelled {
		if got, err := e.gate.Held(ctx, sku, u); err != nil || got != held[u]-n {
			t.Fatalf("%s holds %d after %d cancellations (%v), want %d", u, got, n, err, held[u]-n)
		}
	}

	// Restock by PATCH semantics (buckets kept) and re-split to 2.
	if _, err := e.sync.Patch(ctx, sku, func(cur sale.SKU) (orderstore.SKUChange, error) {
		return orderstore.SKUChange{TotalStock: cur.TotalStock + 10, PerUserLimit: 3, Buckets: cur.Buckets}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if f := e.exact(sku, "restocked"); f.Available != 13 {
		t.Fatalf("available after a restock of 10: %d", f.Available)
	}
	old := stockgate.BucketNames(sku, 4)
	if _, _, err := e.sync.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 50, PerUserLimit: 3, Buckets: 2}); err != nil {
		t.Fatal(err)
	}
	if k, _ := e.gate.Buckets(ctx, sku); k != 2 {
		t.Fatalf("redis buckets after the re-split: %d", k)
	}
	if f := e.exact(sku, "re-split"); f.Available != 13 {
		t.Fatalf("available after the re-split: %d", f.Available)
	}
	for _, n := range old[2:] {
		if _, found, err := e.gate.Available(ctx, n); err != nil || found {
			t.Fatalf("bucket %s of the old split still loaded (%v)", n, err)
		}
	}
	for u, n := range held {
		want := n
		for _, r := range sold[:3] {
			if r.User == u {
				want--
			}
		}
		if got, _ := e.gate.Held(ctx, sku, u); got != want {
			t.Fatalf("%s holds %d after the re-split, want %d", u, got, want)
		}
	}

	// One reservation in flight: the split cannot change (409), nothing changed.
	fly := e.buy(sku, 2, 1, 1)
	if len(fly) != 1 {
		t.Fatal("no reservation")
	}
	_, _, err = e.sync.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 50, PerUserLimit: 3, Buckets: 3})
	if !errors.Is(err, sale.ErrBucketsInFlight) {
		t.Fatalf("re-split with a reservation in flight: %v", err)
	}
	if db, _ := e.store.SKU(ctx, sku); db.Buckets != 2 {
		t.Fatalf("database buckets after the refused change: %d", db.Buckets)
	}
	if f := e.exact(sku, "refused re-split"); f.Units() != 1 || f.Available != 12 {
		t.Fatalf("after the refused re-split: %d in flight, %d available", f.Units(), f.Available)
	}
	// A reduction larger than the units not in flight is refused too.
	if _, _, err := e.sync.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 37, PerUserLimit: 3, Buckets: 2}); !errors.Is(err, sale.ErrStockConflict) {
		t.Fatalf("reduction of 13 with 12 free: %v", err)
	}
	if _, _, err := e.sync.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 38, PerUserLimit: 3, Buckets: 2}); err != nil {
		t.Fatalf("reduction of 12 with 12 free: %v", err)
	}
	e.exact(sku, "reduced")
	e.apply(fly)
	f = e.exact(sku, "end")
	if f.Available != 0 || f.Units() != 0 {
		t.Fatalf("at the end: %d available, %d in flight", f.Available, f.Units())
	}
	rep, err := invariant.Check(ctx, e.store, e.gate, sku, nil, true)
	if err != nil || !rep.OK() {
		t.Fatalf("invariants: %v %v", rep.Violations, err)
	}
}

// A refusal by the database gives the units back to the reservation's own
// bucket, and the reconciler finds no drift on a split sale.
func TestSplitSaleRefusalAndReconcile(t *testing.T) {
	e := newSplitEnv(t)
	ctx := e.ctx
	const sku = "ref"
	if _, _, err := e.sync.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 12, PerUserLimit: 5, Buckets: 3}); err != nil {
		t.Fatal(err)
	}
	sold := e.buy(sku, 3, 12, 12)
	if len(sold) != 12 {
		t.Fatalf("%d sold", len(sold))
	}
	// An outside decrement of 4 while all 12 are in flight: the database
	// refuses 4 of them; their units pay the debt instead of selling again.
	if _, err := e.store.DB().ExecContext(ctx, e.store.Rebind("UPDATE inventory SET stock = stock - 4 WHERE sku_id = ?"), sku); err != nil {
		t.Fatal(err)
	}
	e.restoreAll() // the outside change reaches Redis
	e.apply(sold)
	f := e.exact(sku, "refused")
	if f.Available != 0 || f.Debt != 0 {
		t.Fatalf("after the refusals: available %d, debt %d", f.Available, f.Debt)
	}
	rec := reconcile.NewReconciler(e.sync, e.store, 100, "", slog.New(slog.DiscardHandler), nil)
	rep, err := rec.RunOnce(ctx, []string{sku}, time.Now())
	if err != nil || len(rep.SKUs) != 1 || rep.SKUs[0].Drift != 0 {
		t.Fatalf("reconcile: %+v %v", rep, err)
	}
	if r, err := invariant.Check(ctx, e.store, e.gate, sku, nil, true); err != nil || !r.OK() {
		t.Fatalf("invariants: %v %v", r.Violations, err)
	}

	// Units lost from one bucket (a restock of 6, then 2 of them gone from
	// bucket 2): the reconciler sees the sum short by 2, twice, and
	// repairs it by a rebuild of every bucket.
	if _, err := e.sync.Patch(ctx, sku, func(cur sale.SKU) (orderstore.SKUChange, error) {
		return orderstore.SKUChange{TotalStock: cur.TotalStock + 6, PerUserLimit: cur.PerUserLimit, Buckets: cur.Buckets}, nil
	}); err != nil {
		t.Fatal(err)
	}
	c := e.c
	if err := c.Do(ctx, c.B().Hincrby().Key(e.gate.KeysOf(stockgate.BucketNames(sku, 3)[2]).Meta).Field("avail").Increment(-2).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for pass := 1; pass <= 2; pass++ {
		rep, err := rec.RunOnce(ctx, []string{sku}, time.Now())
		if err != nil || rep.SKUs[0].Drift != -2 {
			t.Fatalf("pass %d: %+v %v, want a drift of -2", pass, rep, err)
		}
	}
	if f := e.exact(sku, "repaired"); f.Available != 6 {
		t.Fatalf("after the repair: %d available, want 6", f.Available)
	}
	if rep, err := rec.RunOnce(ctx, []string{sku}, time.Now()); err != nil || rep.SKUs[0].Drift != 0 {
		t.Fatalf("after the repair: %+v %v", rep, err)
	}
}

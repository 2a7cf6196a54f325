package reconcile_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/release"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// env is one deployment: a migrated database and a Redis prefix, shared by
// as many instances (Syncers) as a test makes.
type env struct {
	store *orderstore.Store
	gate  *stockgate.Gate
	log   *slog.Logger
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := t.Context()
	st, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	return &env{store: st, gate: stockgate.New(c, prefix), log: slog.New(slog.DiscardHandler)}
}

// dbStock reads the SKU's stock from the database itself.
func (e *env) dbStock(t *testing.T, sku string) int64 {
	t.Helper()
	var n int64
	if err := e.store.DB().QueryRowContext(t.Context(), e.store.Rebind(`SELECT stock FROM inventory WHERE sku_id = ?`), sku).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// redisSellable is what the gate may sell, net of its debt.
func (e *env) redisSellable(t *testing.T, sku string) int64 {
	t.Helper()
	f, err := e.gate.ReadInFlight(t.Context(), sku)
	if err != nil || !f.Loaded {
		t.Fatalf("read in-flight: %+v %v", f, err)
	}
	return f.Available
}

// restore runs the restorer once: what the database owes Redis is applied.
func (e *env) restore(t *testing.T) {
	t.Helper()
	svc := release.New(e.store, e.gate, nil, func(string) bool { return true }, e.log)
	if _, err := svc.RestoreOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func (e *env) put(t *testing.T, s *reconcile.Syncer, sku string, total int64) {
	t.Helper()
	if _, _, err := s.Put(t.Context(), orderstore.SKUChange{ID: sku, TotalStock: total, PerUserLimit: 5}); err != nil {
		t.Fatalf("put %s total %d: %v", sku, total, err)
	}
}

// hookStore runs a hook around the database calls of one instance, to put
// another instance's (or the outside world's) action at an exact point.
type hookStore struct {
	reconcile.Store
	afterSnapshot func()
	beforePut     func()
	afterPut      func()
}

func (h *hookStore) Snapshot(ctx context.Context, sku string, ids []string) (orderstore.Snapshot, error) {
	snap, err := h.Store.Snapshot(ctx, sku, ids)
	if h.afterSnapshot != nil {
		f := h.afterSnapshot
		h.afterSnapshot = nil // once: the retry reads a fresh snapshot
		f()
	}
	return snap, err
}

func (h *hookStore) LockedSnapshot(ctx context.Context, sku string, read func(context.Context) ([]string, error)) (orderstore.Snapshot, error) {
	snap, err := h.Store.LockedSnapshot(ctx, sku, read)
	if h.afterSnapshot != nil {
		f := h.afterSnapshot
		h.afterSnapshot = nil // once: the retry reads a fresh snapshot
		f()
	}
	return snap, err
}

func (h *hookStore) PutSKU(ctx context.Context, c orderstore.SKUChange) (sale.SKU, int64, bool, error) {
	if h.beforePut != nil {
		h.beforePut()
	}
	sku, d, created, err := h.Store.PutSKU(ctx, c)
	if h.afterPut != nil {
		h.afterPut()
	}
	return sku, d, created, err
}

// within runs f in a goroutine and waits for it at most d: an action another
// instance takes while this one is in the middle of a change. Where the fix
// serialises them, f waits for this instance's lock and the wait times out;
// the test waits for f at the end.
func within(d time.Duration, f func()) (wait func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
	}
	return func() { <-done }
}

// TestResyncRacingAMove: a resync whose database snapshot is taken before
// units leave Redis (a fallback sale's debit and an outside decrement,
// each applied by the restorer, or another instance's admin reduction)
// and whose write comes after must not write the stale snapshot: an idle
// sale ends with Redis available = database stock.
func TestResyncRacingAMove(t *testing.T) {
	cases := []struct {
		name string
		move func(t *testing.T, e *env, sku string)
	}{
		{"fallback sale debit", func(t *testing.T, e *env, sku string) {
			r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: "dora", Quantity: 3, AcceptedAt: time.Now().UnixMilli()}
			if _, _, err := e.store.BuyDirect(context.Background(), r, time.Now()); err != nil {
				t.Error(err)
				return
			}
			e.restore(t)
		}},
		{"outside decrement", func(t *testing.T, e *env, sku string) {
			if _, err := e.store.DB().ExecContext(context.Background(), e.store.Rebind(`UPDATE inventory SET stock = stock - 3 WHERE sku_id = ?`), sku); err != nil {
				t.Error(err)
				return
			}
			e.restore(t)
		}},
		{"admin reduction on another instance", func(t *testing.T, e *env, sku string) {
			other := reconcile.NewSyncer(e.store, e.gate, nil, e.log)
			if _, _, err := other.Put(context.Background(), orderstore.SKUChange{ID: sku, TotalStock: 7, PerUserLimit: 5}); err != nil {
				t.Error(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			const sku = "RACE"
			hs := &hookStore{Store: e.store}
			s := reconcile.NewSyncer(hs, e.gate, nil, e.log)
			e.put(t, s, sku, 10)
			var wait func()
			hs.afterSnapshot = func() { wait = within(time.Second, func() { tc.move(t, e, sku) }) }
			if _, err := s.Warm(t.Context(), sku); err != nil {
				t.Fatalf("warm: %v", err)
			}
			wait()
			e.restore(t)
			if got, want := e.redisSellable(t, sku), e.dbStock(t, sku); got != want || want != 7 {
				t.Fatalf("idle sale: redis available %d, database stock %d (want both 7)", got, want)
			}
		})
	}
}

// TestAdminChangesAcrossInstances: two instances change one SKU at the
// same time. B's reduction takes its units from Redis, then A's restock
// commits, then B's reduction (computed against A's new total) commits and
// cannot take the rest from Redis, then A adds its restock to Redis: with
// the changes serialised only per instance, Redis ends 10 above the
// database. Serialised across instances, they run one after the other and
// Redis ends equal to the database.
func TestAdminChangesAcrossInstances(t *testing.T) {
	e := newEnv(t)
	const sku = "ADMIN"
	hsA, hsB := &hookStore{Store: e.store}, &hookStore{Store: e.store}
	a := reconcile.NewSyncer(hsA, e.gate, nil, e.log)
	b := reconcile.NewSyncer(hsB, e.gate, nil, e.log)
	e.put(t, a, sku, 10)

	// Each wait is bounded: where the changes are serialised, the one
	// waited for cannot happen until the waiter is done.
	const bound = 3 * time.Second
	aCommitted, bDone, aDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	hsA.afterPut = func() {
		hsA.afterPut = nil
		close(aCommitted)
		select { // A's Redis half waits for B to finish
		case <-bDone:
		case <-time.After(bound):
		}
	}
	hsB.beforePut = func() {
		hsB.beforePut = nil
		// B has taken its 5 units from Redis: now A restocks to 20.
		go func() {
			defer close(aDone)
			if _, _, err := a.Put(context.Background(), orderstore.SKUChange{ID: sku, TotalStock: 20, PerUserLimit: 5}); err != nil {
				t.Errorf("A: %v", err)
			}
		}()
		select {
		case <-aCommitted:
		case <-time.After(bound):
		}
	}
	_, _, errB := b.Put(t.Context(), orderstore.SKUChange{ID: sku, TotalStock: 5, PerUserLimit: 5})
	close(bDone)
	<-aDone
	if errB != nil {
		t.Logf("B: %v", errB)
	}
	if got, want := e.redisSellable(t, sku), e.dbStock(t, sku); got != want {
		t.Fatalf("after concurrent admin changes: redis available %d, database stock %d", got, want)
	}
	var total int64
	if err := e.store.DB().QueryRowContext(t.Context(), e.store.Rebind(`SELECT total_stock FROM inventory WHERE sku_id = ?`), sku).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if st := e.dbStock(t, sku); st != total {
		t.Fatalf("database stock %d, total %d: nothing was sold", st, total)
	}
}

// TestReconcilerCorrectsUndersell: Redis 30 units below what the database
// can sell (beyond the threshold) is corrected on its own once seen twice,
// and the correction keeps the units in flight out of sale; Redis 30
// above is alerted and left alone.
func TestReconcilerCorrectsUndersell(t *testing.T) {
	for _, tc := range []struct {
		name       string
		skew       int64
		wantAction string
		wantAvail  int64
	}{
		{"redis below", -30, reconcile.ActionCorrected, 96},
		{"redis above", +30, reconcile.ActionAlert, 126},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			const sku = "DRIFT"
			s := reconcile.NewSyncer(e.store, e.gate, nil, e.log)
			e.put(t, s, sku, 100)
			for i := range 2 { // 4 units in flight: accepted, not yet in the database
				r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: fmt.Sprintf("u%d", i), Quantity: 2, AcceptedAt: time.Now().UnixMilli()}
				if _, err := e.gate.Reserve(t.Context(), r); err != nil {
					t.Fatal(err)
				}
			}
			// Redis alone drifts (no lock: an outside corruption).
			if _, err := e.gate.Adjust(t.Context(), sku, stockgate.Config{PerUserLimit: 5}, tc.skew); err != nil {
				t.Fatal(err)
			}
			rec := reconcile.NewReconciler(s, e.store, 5, "", e.log, nil)
			var actions []string
			for range 2 {
				rep, err := rec.RunOnce(t.Context(), []string{sku}, time.Now())
				if err != nil || len(rep.SKUs) != 1 {
					t.Fatalf("reconcile: %+v %v", rep, err)
				}
				actions = append(actions, rep.SKUs[0].Action)
			}
			if want := []string{reconcile.ActionWatch, tc.wantAction}; actions[0] != want[0] || actions[1] != want[1] {
				t.Fatalf("actions %v, want %v", actions, want)
			}
			if got := e.redisSellable(t, sku); got != tc.wantAvail {
				t.Fatalf("redis available %d, want %d (database stock %d, 4 units in flight)", got, tc.wantAvail, e.dbStock(t, sku))
			}
		})
	}
}

// staleFirstRead answers the first ReadInFlight of its SKU as Redis was
// before the sale was loaded: the reconciler's read that another
// instance's PUT (its seed) and the first purchases overtake.
type staleFirstRead struct {
	reconcile.Gate
	once bool
}

func (g *staleFirstRead) ReadInFlight(ctx context.Context, sku string) (stockgate.InFlight, error) {
	if !g.once {
		g.once = true
		return stockgate.InFlight{}, nil
	}
	return g.Gate.ReadInFlight(ctx, sku)
}

// TestReconcilerReadBeforeTheSeed: the reconciler lists a sale whose row
// is in the database while its PUT has not yet loaded it into Redis, reads
// it as not loaded, and warms it after the PUT did. The warm finds it
// loaded and changes nothing, so no "reseed" is audited (a CI run on
// MariaDB: a reseed row of 205 units in the middle of a clean sale).
func TestReconcilerReadBeforeTheSeed(t *testing.T) {
	e := newEnv(t)
	const sku = "LATE"
	s := reconcile.NewSyncer(e.store, e.gate, nil, e.log)
	e.put(t, s, sku, 100)
	r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: "u", Quantity: 2, AcceptedAt: time.Now().UnixMilli()}
	if _, err := e.gate.Reserve(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	stale := reconcile.NewSyncer(e.store, &staleFirstRead{Gate: e.gate}, nil, e.log)
	rec := reconcile.NewReconciler(stale, e.store, 5, "", e.log, nil)
	rep, err := rec.RunOnce(t.Context(), []string{sku}, time.Now())
	if err != nil || len(rep.SKUs) != 1 {
		t.Fatalf("reconcile: %+v %v", rep, err)
	}
	if got := rep.SKUs[0].Action; got == reconcile.ActionLoaded {
		t.Errorf("action %q for a sale Redis already held", got)
	}
	es, err := e.store.Audit(t.Context(), sku, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range es {
		if a.Store == "redis" && a.Reason == orderstore.AuditRedisReseed {
			t.Errorf("reseed audited for a sale Redis already held: %+v", a)
		}
	}
	if got := e.redisSellable(t, sku); got != 98 {
		t.Fatalf("redis available %d, want 98", got)
	}
}

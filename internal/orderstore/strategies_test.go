package orderstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// buyFunc is one purchase strategy as the purchase path calls it.
type buyFunc func(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error)

// strategyBuyers returns every database strategy of s. The fenced one takes
// a new token from a shared counter for each call, as redis-lock does for
// each lock it takes (without the lock: racing holders are what the fence
// is for).
func strategyBuyers(s *orderstore.Store) map[string]buyFunc {
	var tokens atomic.Int64
	return map[string]buyFunc{
		"pessimistic": s.BuyDirect,
		"conditional": s.BuyConditional,
		"optimistic": func(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
			return s.BuyOptimistic(ctx, r, now, 8)
		},
		"fenced": func(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
			return s.BuyFenced(ctx, r, now, tokens.Add(1))
		},
	}
}

var (
	stratStart = time.Date(2031, 3, 4, 5, 0, 0, 0, time.UTC)
	stratEnd   = stratStart.Add(time.Hour)
	stratOpen  = stratStart.Add(time.Minute)
)

// TestStrategiesDecideLikeBuyDirect runs BuyDirect's decisions through every
// strategy: window, unknown SKU, invalid input, duplicates by order id and
// by Idempotency-Key, limit before stock, sold out; refusals write nothing.
func TestStrategiesDecideLikeBuyDirect(t *testing.T) {
	s := newStore(t)
	c := 0
	for name, buy := range strategyBuyers(s) {
		c++ // distinct order ids per strategy
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			sku := "DEC-" + name
			putSKUChange(t, s, orderstore.SKUChange{ID: sku, TotalStock: 5, PerUserLimit: 3, StartsAt: stratStart, EndsAt: stratEnd})
			keyed := func(r sale.Reservation, key string) sale.Reservation { r.IdempotencyKey = key; return r }
			first := keyed(resv(oid(c, 1), sku, "alice", 2), "k1")
			steps := []struct {
				name      string
				r         sale.Reservation
				now       time.Time
				wantID    string // "" when an error is wanted
				wantDup   bool
				wantErr   error
				wantStock int64
			}{
				{name: "before the window", r: resv(oid(c, 9), sku, "alice", 1), now: stratStart.Add(-time.Millisecond), wantErr: sale.ErrSaleNotOpen, wantStock: 5},
				{name: "at the end of the window", r: resv(oid(c, 9), sku, "alice", 1), now: stratEnd, wantErr: sale.ErrSaleEnded, wantStock: 5},
				{name: "unknown sku", r: resv(oid(c, 9), "GHOST", "alice", 1), now: stratOpen, wantErr: sale.ErrUnknownSKU, wantStock: 5},
				{name: "invalid", r: resv(oid(c, 9), sku, "alice", 0), now: stratOpen, wantErr: sale.ErrInvalid, wantStock: 5},
				{name: "bad idempotency key", r: keyed(resv(oid(c, 9), sku, "alice", 1), "has space"), now: stratOpen, wantErr: sale.ErrInvalid, wantStock: 5},
				{name: "sells", r: first, now: stratOpen, wantID: first.OrderID, wantStock: 3},
				{name: "same order id again", r: first, now: stratOpen, wantID: first.OrderID, wantDup: true, wantStock: 3},
				{name: "same order id after the window", r: first, now: stratEnd, wantID: first.OrderID, wantDup: true, wantStock: 3},
				{name: "same key, new order id", r: keyed(resv(oid(c, 2), sku, "alice", 2), "k1"), now: stratOpen, wantID: first.OrderID, wantDup: true, wantStock: 3},
				{name: "over the limit", r: keyed(resv(oid(c, 3), sku, "alice", 2), "k2"), now: stratOpen, wantErr: sale.ErrLimitReached, wantStock: 3},
				{name: "same key, another user", r: keyed(resv(oid(c, 4), sku, "bob", 3), "k1"), now: stratOpen, wantID: oid(c, 4), wantStock: 0},
				{name: "sold out", r: resv(oid(c, 5), sku, "carol", 1), now: stratOpen, wantErr: sale.ErrSoldOut, wantStock: 0},
				{name: "limit before stock", r: resv(oid(c, 6), sku, "bob", 1), now: stratOpen, wantErr: sale.ErrLimitReached, wantStock: 0},
			}
			for _, st := range steps {
				got, dup, err := buy(ctx, st.r, st.now)
				switch {
				case st.wantErr != nil:
					if !errors.Is(err, st.wantErr) {
						t.Errorf("%s: err = %v, want %v", st.name, err, st.wantErr)
					}
				case err != nil:
					t.Errorf("%s: %v", st.name, err)
				default:
					if got.ID != st.wantID || dup != st.wantDup || got.Status != sale.StatusPendingPayment || got.SKU != sku {
						t.Errorf("%s: order %s (%s, %s), duplicate %v; want %s, pending_payment, duplicate %v", st.name, got.ID, got.SKU, got.Status, dup, st.wantID, st.wantDup)
					}
					if !dup && (got.ExpiresAt == nil || !got.CreatedAt.Equal(time.UnixMilli(st.r.AcceptedAt))) {
						t.Errorf("%s: created_at %v, expires_at %v: not written like BuyDirect", st.name, got.CreatedAt, got.ExpiresAt)
					}
				}
				if l := checkInvariants(t, s, sku); l.Stock != st.wantStock {
					t.Errorf("%s: stock = %d, want %d", st.name, l.Stock, st.wantStock)
				}
			}
			if l := checkInvariants(t, s, sku); l.Orders != 2 || l.Logged != 2 {
				t.Errorf("%d orders, %d process_log rows; want 2, 2 (refusals write nothing)", l.Orders, l.Logged)
			}
			// The queue delivering a sold reservation later applies nothing.
			out, err := s.ApplyBatch(ctx, []sale.Reservation{first})
			if err != nil || len(out) != 1 || !out[0].Duplicate {
				t.Errorf("ApplyBatch of a reservation sold by the strategy: %+v, %v; want a duplicate", out, err)
			}
		})
	}
}

// TestStrategiesConcurrent: many buyers at once, each retrying until told
// limit_reached or sold_out. Exactly the stock is sold, nobody holds more
// than the limit, and every success is one order row.
func TestStrategiesConcurrent(t *testing.T) {
	s := newStore(t)
	const (
		stock      = 40
		limit      = 2
		users      = 30 // demand 60 > 40
		perUser    = 4  // goroutines per user, racing each other
		maxRetries = 200
	)
	for name, buy := range strategyBuyers(s) {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			sku := "CONC-" + name
			putSKUChange(t, s, orderstore.SKUChange{ID: sku, TotalStock: stock, PerUserLimit: limit})
			var (
				mu    sync.Mutex
				sold  = map[string]int64{} // user -> units
				ids   = map[string]bool{}
				busy  atomic.Int64
				wg    sync.WaitGroup
				start = make(chan struct{})
			)
			for u := 0; u < users; u++ {
				for g := 0; g < perUser; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						user := fmt.Sprintf("u%d", u)
						for try := 0; try < maxRetries; try++ {
							o, dup, err := buy(ctx, newResv(sku, user, 1), time.Now())
							switch {
							case err == nil:
								mu.Lock()
								if dup || ids[o.ID] {
									t.Errorf("new reservation reported as duplicate %s", o.ID)
								}
								ids[o.ID] = true
								sold[user]++
								mu.Unlock()
							case errors.Is(err, sale.ErrLimitReached), errors.Is(err, sale.ErrSoldOut):
								return
							case errors.Is(err, sale.ErrBusy), errors.Is(err, orderstore.ErrStaleFence):
								busy.Add(1)
							default:
								t.Errorf("%s: %v", user, err)
								return
							}
						}
						t.Errorf("%s: still buying after %d tries", user, maxRetries)
					}()
				}
			}
			close(start)
			wg.Wait()
			var total int64
			for u, n := range sold {
				total += n
				if n > limit {
					t.Errorf("%s holds %d units, limit %d", u, n, limit)
				}
			}
			l := checkInvariants(t, s, sku)
			if total != stock || l.Live != stock || l.Stock != 0 || l.Orders != int64(len(ids)) {
				t.Errorf("sold %d to callers, database: live %d, stock %d, %d orders for %d ids; want exactly %d sold",
					total, l.Live, l.Stock, l.Orders, len(ids), stock)
			}
			t.Logf("%s: %d orders, %d busy/stale attempts retried", name, len(ids), busy.Load())
		})
	}
}

func TestStrategyFencedRefusesStaleTokens(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKUChange(t, s, orderstore.SKUChange{ID: "FENCE", TotalStock: 10, PerUserLimit: 5})
	steps := []struct {
		token   int64
		wantErr error
	}{
		{5, nil},
		{3, orderstore.ErrStaleFence},
		{5, orderstore.ErrStaleFence}, // a token changes the row once
		{6, nil},
		{0, sale.ErrInvalid},
	}
	for i, st := range steps {
		r := resv(oid(77, i), "FENCE", "alice", 1)
		_, _, err := s.BuyFenced(ctx, r, time.Now(), st.token)
		if !errors.Is(err, st.wantErr) {
			t.Errorf("token %d: err = %v, want %v", st.token, err, st.wantErr)
		}
		if st.wantErr != nil {
			if _, err := s.Order(ctx, r.OrderID); !errors.Is(err, sale.ErrOrderNotFound) {
				t.Errorf("token %d refused but the order exists (%v)", st.token, err)
			}
		}
	}
	if l := checkInvariants(t, s, "FENCE"); l.Live != 2 || l.Orders != 2 {
		t.Errorf("live %d, orders %d; want 2, 2", l.Live, l.Orders)
	}
	if f, err := s.Fence(ctx, "FENCE"); err != nil || f != 6 {
		t.Errorf("Fence = %d, %v; want 6", f, err)
	}
	if _, err := s.Fence(ctx, "GHOST"); !errors.Is(err, sale.ErrUnknownSKU) {
		t.Errorf("Fence of an unknown SKU: %v", err)
	}
	// A retry of the same reservation after a stale refusal sells it once.
	r := resv(oid(77, 1), "FENCE", "alice", 1)
	if _, dup, err := s.BuyFenced(ctx, r, time.Now(), 7); err != nil || dup {
		t.Errorf("retry with a fresh token: dup %v, %v", dup, err)
	}
}

// TestStrategyOptimisticBusy: the row changes between the optimistic read and
// its compare-and-set (a concurrent writer holds the row lock and commits
// while the compare-and-set waits), in every attempt: sale.ErrBusy, nothing
// written. TestStrategyConditionalWaitsAndRechecks: the conditional update waits
// for the same writer and re-evaluates stock >= n on the row it committed.
func TestStrategyOptimisticBusy(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKUChange(t, s, orderstore.SKUChange{ID: "OPT", TotalStock: 3, PerUserLimit: 3})
	r := resv(oid(78, 1), "OPT", "alice", 1)
	_, _, err := withRowChangedDuring(t, s, "OPT", `UPDATE inventory SET updated_at = now() WHERE sku_id = 'OPT'`, func() (sale.Order, bool, error) {
		return s.BuyOptimistic(ctx, r, time.Now(), 1)
	})
	if !errors.Is(err, sale.ErrBusy) {
		t.Fatalf("err = %v, want sale.ErrBusy", err)
	}
	if l := checkInvariants(t, s, "OPT"); l.Orders != 0 || l.Stock != 3 {
		t.Errorf("orders %d, stock %d after busy; want 0, 3", l.Orders, l.Stock)
	}
	// With retries left the next attempt reads the new version and sells.
	if _, _, err := s.BuyOptimistic(ctx, r, time.Now(), 3); err != nil {
		t.Errorf("BuyOptimistic after the writer committed: %v", err)
	}
}

func TestStrategyConditionalWaitsAndRechecks(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKUChange(t, s, orderstore.SKUChange{ID: "COND", TotalStock: 1, PerUserLimit: 1})
	// The other writer takes the last unit while the conditional update waits.
	_, _, err := withRowChangedDuring(t, s, "COND", `UPDATE inventory SET stock = 0 WHERE sku_id = 'COND'`, func() (sale.Order, bool, error) {
		return s.BuyConditional(ctx, resv(oid(79, 1), "COND", "alice", 1), time.Now())
	})
	if !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("err = %v, want sale.ErrSoldOut (stock >= n re-evaluated on the committed row)", err)
	}
	if stock := queryInt(t, s, `SELECT stock FROM inventory WHERE sku_id = 'COND'`); stock != 0 {
		t.Errorf("stock %d; want 0", stock)
	}
}

// lockWaiters counts the sessions of the test's database waiting for a row
// lock. On MySQL it counts the sessions running an UPDATE of inventory: the
// only one withRowChangedDuring lets run is blocked on the row it holds.
// (information_schema.innodb_trx would say LOCK WAIT, but it is a cache that
// InnoDB refreshes only after nobody read it for 100 ms: polling it starves it.)
func lockWaiters(t *testing.T, s *orderstore.Store) int64 {
	t.Helper()
	if s.Dialect() == orderstore.MySQL {
		return queryInt(t, s, `
SELECT count(*) FROM information_schema.processlist
WHERE db = database() AND id <> connection_id() AND command = 'Query' AND info LIKE '%UPDATE inventory%'`)
	}
	return queryInt(t, s, `
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = current_database()`)
}

// withRowChangedDuring runs stmt in a transaction that holds sku's row lock,
// starts buy, waits until buy is blocked on that lock, commits, and returns
// what buy returned.
func withRowChangedDuring(t *testing.T, s *orderstore.Store, sku, stmt string, buy func() (sale.Order, bool, error)) (sale.Order, bool, error) {
	t.Helper()
	ctx := testContext(t)
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		t.Fatal(err)
	}
	type result struct {
		o   sale.Order
		dup bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		o, dup, err := buy()
		done <- result{o, dup, err}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if lockWaiters(t, s) > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("buy returned before waiting for the row lock: %+v (%v)", r, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("buy never waited for the row lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	return r.o, r.dup, r.err
}

func TestStrategyVersionChangesOnEveryUpdate(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKUChange(t, s, orderstore.SKUChange{ID: "VER", TotalStock: 5, PerUserLimit: 5})
	version := func() int64 {
		return queryInt(t, s, `SELECT version FROM inventory WHERE sku_id = 'VER'`)
	}
	v0 := version()
	if _, _, err := s.BuyDirect(ctx, newResv("VER", "alice", 1), time.Now()); err != nil {
		t.Fatal(err)
	}
	v1 := version()
	putSKUChange(t, s, orderstore.SKUChange{ID: "VER", TotalStock: 6, PerUserLimit: 5})
	if _, err := s.ApplyBatch(ctx, []sale.Reservation{newResv("VER", "bob", 1)}); err != nil {
		t.Fatal(err)
	}
	v2 := version()
	if !(v0 < v1 && v1 < v2) {
		t.Errorf("versions %d, %d, %d: want increasing with every writer", v0, v1, v2)
	}
}

// TestStrategiesAudit: every comparison strategy writes its own audit row
// (not the trigger's external_change), so the trail says what sold the units.
func TestStrategiesAudit(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "AU", 10)
	now := time.Now()
	if _, _, err := s.BuyConditional(ctx, newResv("AU", "a", 1), now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.BuyOptimistic(ctx, newResv("AU", "b", 1), now, 8); err != nil {
		t.Fatal(err)
	}
	es, err := s.Audit(ctx, "AU", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, e := range es {
		sum += e.Delta
		if e.Reason == "external_change" {
			t.Errorf("strategy sale audited by the trigger: %+v", e)
		}
	}
	if l := checkInvariants(t, s, "AU"); sum != l.Stock || l.Stock != 8 {
		t.Fatalf("audit sum %d, stock %d", sum, l.Stock)
	}
}

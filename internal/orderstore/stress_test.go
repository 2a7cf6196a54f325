package orderstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/google/go-cmp/cmp"
)

// stressSeed returns the workload seed of a randomized test: the value of
// FLASHSALE_TEST_STRESS_SEED when set, else a new one. A failing run names
// it, so the same workload (not the same interleaving) can be run again.
func stressSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("FLASHSALE_TEST_STRESS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FLASHSALE_TEST_STRESS_SEED=%q: %v", v, err)
		}
		seed = n
	}
	t.Logf("seed %d", seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: run again with FLASHSALE_TEST_STRESS_SEED=%d", seed, seed)
		}
	})
	return seed
}

// stressApplied is one application of an order id: by ApplyBatch (the
// outcome it returned, not a Duplicate) or by BuyDirect (pending, direct).
type stressApplied struct {
	o      orderstore.Outcome
	direct bool
}

// TestApplyBatchStress races appliers of overlapping batches (new
// reservations, redeliveries, Idempotency-Keys shared by some reservations
// of one user, 1-3 units) on three SKUs with little stock and a small
// per-user limit against everything else that moves what a batch decides
// from: cancels, expiries, payments and cancellations of queued orders
// (RequestCancel), direct sales (BuyDirect, some on the batches' own ids and
// keys), restocks, reductions and raises of the limit (PutSKU). The limit is
// only ever raised, so live holdings above the limit of the same snapshot
// would have been above the limit when they were taken. While it runs a
// monitor reads, one statement at a time, that stock + live units = total
// and that no one holds more than the limit read with the holdings. Then
// it checks from the database:
// I1 and I5 per SKU (checkInvariants), no user above the limit, at most one
// live order per Idempotency-Key and a key owner for every refusal for its
// key, every reservation applied exactly once with its outcome consistent
// across redeliveries and with its order row and first transition, and a
// queued reservation whose cancellation did not land applied cancelled.
func TestApplyBatchStress(t *testing.T) {
	seed := stressSeed(t)
	s := newStore(t)
	ctx := testContext(t)
	const (
		skus      = 3
		users     = 4
		keys      = 3
		pool      = 800 // reservations the gate queued
		appliers  = 6
		maxBatch  = 8
		maxLimit  = 4
		startLim  = 2
		startStk  = 8
		directOps = 300
		lifeOps   = 800
		adminOps  = 100
	)
	rng := rand.New(rand.NewPCG(seed, 0))
	skuID := func(i int) string { return fmt.Sprintf("STRESS%d", i) }
	total := make([]int64, skus)
	limit := make([]int64, skus)
	for i := range skus {
		total[i], limit[i] = startStk, startLim
		putSKUChange(t, s, orderstore.SKUChange{ID: skuID(i), TotalStock: total[i], PerUserLimit: limit[i]})
	}
	randResv := func(rng *rand.Rand, id string) sale.Reservation {
		r := resv(id, skuID(rng.IntN(skus)), fmt.Sprintf("u%d", rng.IntN(users)), 1+rng.Int64N(3))
		if rng.IntN(4) == 0 {
			r.IdempotencyKey = fmt.Sprintf("key-%d", rng.IntN(keys))
		}
		return r
	}
	queued := make([]sale.Reservation, pool)
	byID := make(map[string]sale.Reservation)
	for i := range queued {
		queued[i] = randResv(rng, oid(0x5751, i))
		byID[queued[i].OrderID] = queued[i]
	}
	direct := make([]sale.Reservation, directOps)
	for i := range direct {
		direct[i] = randResv(rng, oid(0x5752, i))
	}

	var maxLim [skus]atomic.Int64 // the highest limit set so far, raised before PutSKU
	for i := range skus {
		maxLim[i].Store(startLim)
	}
	var (
		mu            sync.Mutex
		applied       = make(map[string][]stressApplied)
		dups          []orderstore.Outcome
		mustCancel    = make(map[string]bool) // RequestCancel found no order: the apply lands it cancelled
		directDup     = make(map[string]string)
		retries       atomic.Int64
		lifeTransient atomic.Int64
		done          = make(chan struct{})
	)
	record := func(id string, a stressApplied) {
		mu.Lock()
		defer mu.Unlock()
		applied[id] = append(applied[id], a)
	}

	var appliersWG, othersWG sync.WaitGroup
	for w := range appliers {
		appliersWG.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(1+w)))
			// Each applier owns a share of the reservations (as a consumer
			// gets distinct messages), mixed with redeliveries of any: batches
			// racing on the same users with distinct ids do not queue
			// behind each other's process_log rows.
			var seq []int
			for k := w; k < pool; k += appliers {
				seq = append(seq, k)
			}
			for range pool / appliers / 3 {
				seq = append(seq, rng.IntN(pool))
			}
			rng.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
			for len(seq) > 0 {
				size := min(1+rng.IntN(maxBatch), len(seq))
				batch := make([]sale.Reservation, size)
				for i, k := range seq[:size] {
					batch[i] = queued[k]
				}
				seq = seq[size:]
				var (
					out []orderstore.Outcome
					err error
				)
				// A transient error means rolled back (or a commit of unknown
				// outcome): the consumer retries the batch. Any other would
				// dead-letter it (the guard against oversell is one).
				for attempt := 0; attempt < 20; attempt++ {
					if out, err = s.ApplyBatch(ctx, batch); err == nil || !orderstore.IsTransient(err) {
						break
					}
					retries.Add(1)
				}
				if err != nil {
					t.Errorf("applier %d: batch of %d: %v", w, size, err)
					return
				}
				if len(out) != len(batch) {
					t.Errorf("applier %d: %d outcomes for %d reservations", w, len(out), len(batch))
					return
				}
				for i, o := range out {
					if o.OrderID != batch[i].OrderID {
						t.Errorf("applier %d: outcome %d is of %s, want %s", w, i, o.OrderID, batch[i].OrderID)
						continue
					}
					if o.Duplicate {
						mu.Lock()
						dups = append(dups, o)
						mu.Unlock()
						continue
					}
					record(o.OrderID, stressApplied{o: o})
				}
			}
		})
	}

	// Buyers: direct sales, a third of them of a queued reservation (its id,
	// its key), the others with fresh ids from the same keys.
	othersWG.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 100))
		for i, r := range direct {
			if rng.IntN(3) == 0 {
				r = queued[rng.IntN(pool)]
			}
			o, dup, err := s.BuyDirect(ctx, r, acceptedAt)
			switch {
			case errors.Is(err, sale.ErrLimitReached), errors.Is(err, sale.ErrSoldOut):
			case err != nil:
				t.Errorf("BuyDirect %d (%+v): %v", i, r, err)
			case dup:
				mu.Lock()
				directDup[r.OrderID] = o.ID
				mu.Unlock()
			default:
				if o.ID != r.OrderID || o.Status != sale.StatusPendingPayment {
					t.Errorf("BuyDirect %s: order %s %s", r.OrderID, o.ID, o.Status)
				}
				if _, ok := byID[r.OrderID]; !ok {
					mu.Lock()
					byID[r.OrderID] = r
					mu.Unlock()
				}
				record(r.OrderID, stressApplied{o: orderstore.Outcome{OrderID: r.OrderID, Status: sale.StatusPendingPayment}, direct: true})
			}
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
	})

	// Lifecycle: two goroutines cancelling, expiring, paying and cancelling
	// queued reservations, applied or not yet.
	for g := range 2 {
		othersWG.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(200+g)))
			for range lifeOps {
				r := queued[rng.IntN(pool)]
				var err error
				switch rng.IntN(4) {
				case 0:
					var landed bool
					_, landed, err = s.RequestCancel(ctx, r.OrderID, r.User, acceptedAt.Add(time.Minute))
					if err == nil && !landed {
						mu.Lock()
						mustCancel[r.OrderID] = true
						mu.Unlock()
					}
				case 1:
					_, _, err = s.Cancel(ctx, r.OrderID, r.User, sale.CancelByUser, acceptedAt.Add(time.Minute))
				case 2:
					_, _, err = s.Expire(ctx, r.OrderID, acceptedAt.Add(time.Hour))
				case 3:
					_, _, err = s.Pay(ctx, r.OrderID, r.User, "ref-"+r.OrderID, acceptedAt.Add(time.Minute))
				}
				switch {
				case err == nil, errors.Is(err, sale.ErrOrderNotFound), errors.Is(err, sale.ErrOrderPaid),
					errors.Is(err, sale.ErrOrderFailed), errors.Is(err, sale.ErrOrderExpired), errors.Is(err, sale.ErrUnavailable):
				case orderstore.IsTransient(err):
					// A deadlock victim five times over (each call runs
					// again on a deadlock): the client asks again; nothing
					// is asserted of this attempt.
					lifeTransient.Add(1)
				default:
					t.Errorf("lifecycle of %s: %v", r.OrderID, err)
				}
				time.Sleep(time.Duration(rng.IntN(2)) * time.Millisecond)
			}
		})
	}

	// Admin: restocks, reductions (refused when the units are sold) and raises
	// of the limit; one goroutine, so it knows each SKU's total.
	othersWG.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 300))
		for range adminOps {
			select {
			case <-done:
				return
			default:
			}
			i := rng.IntN(skus)
			c := orderstore.SKUChange{ID: skuID(i), TotalStock: total[i], PerUserLimit: limit[i]}
			switch rng.IntN(6) {
			case 0, 1:
				c.TotalStock += 1 + rng.Int64N(3)
			case 3, 4:
				c.TotalStock = max(0, c.TotalStock-1-rng.Int64N(2))
			case 2:
				c.PerUserLimit = min(maxLimit, c.PerUserLimit+1)
				maxLim[i].Store(c.PerUserLimit)
			}
			switch _, _, _, err := s.PutSKU(ctx, c); {
			case errors.Is(err, sale.ErrStockConflict):
			case err != nil:
				t.Errorf("PutSKU(%+v): %v", c, err)
			default:
				total[i], limit[i] = c.TotalStock, c.PerUserLimit
			}
			time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
		}
	})

	// Monitor: what the database says at moments between commits, each
	// read one statement (one snapshot): stock + live units = total, and
	// no holdings above the limit of the same snapshot (see
	// holdingsOverLimit), which is no higher than the highest set so far.
	othersWG.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for i := range skus {
				var stock, tot, live int64
				err := s.DB().QueryRowContext(ctx, s.Rebind(`SELECT stock, total_stock,
    (SELECT coalesce(sum(quantity), 0) FROM orders o WHERE o.sku_id = i.sku_id AND o.status IN ('pending_payment', 'paid'))
FROM inventory i WHERE sku_id = ?`), skuID(i)).Scan(&stock, &tot, &live)
				if err != nil {
					t.Errorf("monitor: %v", err)
					return
				}
				if stock < 0 || stock+live != tot {
					t.Errorf("monitor: %s: stock %d + live %d, total %d", skuID(i), stock, live, tot)
					return
				}
				over, dbLim, err := holdingsOverLimit(ctx, s, skuID(i))
				if err != nil {
					t.Errorf("monitor: %v", err)
					return
				}
				if len(over) > 0 {
					t.Errorf("monitor: %s: limit %d in the same snapshot, holdings above it %v", skuID(i), dbLim, over)
					return
				}
				// After the read: every limit set up to it is at most this one.
				if lim := maxLim[i].Load(); dbLim > lim {
					t.Errorf("monitor: %s: limit %d in the database, at most %d was set", skuID(i), dbLim, lim)
					return
				}
			}
		}
	})

	appliersWG.Wait()
	close(done)
	othersWG.Wait()
	by := make(map[string]int)
	for _, as := range applied {
		for _, a := range as {
			by[string(a.o.Status)+"/"+a.o.Reason+map[bool]string{true: "/direct"}[a.direct]]++
		}
	}
	t.Logf("applied %v; %d redeliveries, %d queued cancellations, %d ApplyBatch calls failed (transient) and retried, "+
		"%d lifecycle calls failed (transient)", by, len(dups), len(mustCancel), retries.Load(), lifeTransient.Load())
	if t.Failed() {
		return
	}

	// I1, I5 and the per-user limit, per SKU.
	for i := range skus {
		checkInvariants(t, s, skuID(i))
		held, err := s.LiveHoldings(ctx, skuID(i))
		if err != nil {
			t.Fatal(err)
		}
		for u, n := range held {
			if n > limit[i] {
				t.Errorf("%s: %s holds %d units, limit %d (only ever raised)", skuID(i), u, n, limit[i])
			}
		}
	}

	type row struct {
		sku, user, status, reason, key, cancel string
		qty                                    int64
	}
	rows := make(map[string]row)
	q, err := s.DB().QueryContext(ctx, `SELECT order_id, sku_id, user_id, quantity, status, coalesce(fail_reason, ''),
    coalesce(idempotency_key, ''), coalesce(cancel_reason, '') FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	for q.Next() {
		var (
			id string
			r  row
		)
		if err := q.Scan(&id, &r.sku, &r.user, &r.qty, &r.status, &r.reason, &r.key, &r.cancel); err != nil {
			t.Fatal(err)
		}
		rows[id] = r
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}

	// Exactly one application per reservation, agreeing with its order row
	// and its first transition.
	first := make(map[string]orderstore.Outcome)
	for id, r := range byID {
		as := applied[id]
		if len(as) != 1 {
			t.Errorf("order %s (%+v) applied %d times: %+v", id, r, len(as), as)
			continue
		}
		o := as[0].o
		first[id] = o
		db, ok := rows[id]
		switch {
		case !ok:
			t.Errorf("order %s applied as %s but has no row", id, o.Status)
			continue
		case db.sku != r.SKU || db.user != r.User || db.qty != r.Quantity:
			t.Errorf("order %s: row %+v for reservation %+v", id, db, r)
		case !successor(o, sale.Status(db.status), db.reason):
			t.Errorf("order %s applied as %s/%s, row is %s/%s", id, o.Status, o.Reason, db.status, db.reason)
		}
		if o.Status == sale.StatusCancelled && db.cancel != sale.CancelByUser {
			t.Errorf("order %s landed cancelled, cancel_reason %q", id, db.cancel)
		}
		if mustCancel[id] && !as[0].direct && o.Status != sale.StatusCancelled {
			t.Errorf("order %s: RequestCancel found it queued, but it was applied as %s/%s", id, o.Status, o.Reason)
		}
		if tr := transitions(t, s, id); len(tr) == 0 || !strings.HasPrefix(tr[0], ">"+string(o.Status)+":") {
			t.Errorf("order %s applied as %s, transitions %v", id, o.Status, tr)
		}
	}
	for _, d := range dups {
		if o, ok := first[d.OrderID]; ok && !successor(o, d.Status, d.Reason) {
			t.Errorf("order %s applied as %s/%s, redelivery reported %s/%s", d.OrderID, o.Status, o.Reason, d.Status, d.Reason)
		}
	}
	if len(rows) != len(byID) {
		t.Errorf("%d order rows, %d orders applied", len(rows), len(byID))
	}

	// Idempotency-Keys: per (sku, user, key) at most one live order and at
	// most one row carrying the key; a refusal for the key has an owner.
	type group struct{ live, carry int }
	groups := make(map[string]*group)
	gk := func(sku, user, key string) string { return sku + "/" + user + "/" + key }
	for id, r := range byID {
		if r.IdempotencyKey == "" {
			continue
		}
		k := gk(r.SKU, r.User, r.IdempotencyKey)
		if groups[k] == nil {
			groups[k] = &group{}
		}
		db := rows[id]
		if db.status == string(sale.StatusPendingPayment) || db.status == string(sale.StatusPaid) {
			groups[k].live++
		}
		if db.key != "" {
			groups[k].carry++
		}
	}
	for k, g := range groups {
		if g.live > 1 || g.carry > 1 {
			t.Errorf("key %s: %d live orders, %d rows carrying it", k, g.live, g.carry)
		}
	}
	for id, db := range rows {
		if db.reason == orderstore.ReasonDuplicateKey && (byID[id].IdempotencyKey == "" || groups[gk(db.sku, db.user, byID[id].IdempotencyKey)].carry != 1) {
			t.Errorf("order %s refused for its key %q, which no order carries", id, byID[id].IdempotencyKey)
		}
	}
	for id, got := range directDup {
		r, o := byID[id], rows[got]
		if _, ok := byID[id]; !ok {
			for _, d := range direct {
				if d.OrderID == id {
					r = d
				}
			}
		}
		if got != id && (r.IdempotencyKey == "" || o.sku != r.SKU || o.user != r.User || o.key != r.IdempotencyKey) {
			t.Errorf("BuyDirect %s (%+v) answered with order %s %+v", id, r, got, o)
		}
	}
}

const holdingsAndLimitSQL = `
SELECT o.user_id, sum(o.quantity), i.per_user_limit
FROM inventory i JOIN orders o ON o.sku_id = i.sku_id
WHERE i.sku_id = ? AND o.status IN ('pending_payment', 'paid')
GROUP BY o.user_id, i.per_user_limit`

// holdingsOverLimit reads, in one statement (one snapshot), the live units
// each user holds of sku and the SKU's per-user limit, and returns the users
// holding more than that limit, with the limit (0 when no one holds any).
// Where the limit is only raised, the limit of the snapshot is at least
// every limit those orders were taken under, so a holding above it broke
// the limit when it was taken. A limit read before the holdings, in another
// snapshot, is no such bound: a raise and a purchase under it can commit
// between the two reads.
func holdingsOverLimit(ctx context.Context, s *orderstore.Store, sku string) (map[string]int64, int64, error) {
	rows, err := s.DB().QueryContext(ctx, s.Rebind(holdingsAndLimitSQL), sku)
	if err != nil {
		return nil, 0, fmt.Errorf("holdings of %s: %w", sku, err)
	}
	defer rows.Close()
	var (
		over  = make(map[string]int64)
		limit int64
	)
	for rows.Next() {
		var (
			user string
			n    int64
		)
		if err := rows.Scan(&user, &n, &limit); err != nil {
			return nil, 0, fmt.Errorf("holdings of %s: %w", sku, err)
		}
		if n > limit {
			over[user] = n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("holdings of %s: %w", sku, err)
	}
	return over, limit, nil
}

// TestStressMonitorLimitRaised drives, one step at a time, the interleaving
// that made the stress monitor report a user above the limit while the
// database never held more than its limit: the monitor took the highest
// limit set so far (3), then the limit was raised to 4 and the user bought
// a fourth unit under it, then the monitor read the holdings (4 > 3). The
// limit and the holdings read in one snapshot (holdingsOverLimit) agree at
// every step, and still show holdings above a limit lowered under them.
func TestStressMonitorLimitRaised(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const sku = "MONITOR"
	putSKUChange(t, s, orderstore.SKUChange{ID: sku, TotalStock: 8, PerUserLimit: 3})
	apply := func(n int, qty int64) {
		t.Helper()
		out, err := s.ApplyBatch(ctx, []sale.Reservation{resv(oid(0x5753, n), sku, "u0", qty)})
		if err != nil {
			t.Fatal(err)
		}
		if out[0].Status != sale.StatusPendingPayment {
			t.Fatalf("order %d of %d units: %s/%s, want pending_payment", n, qty, out[0].Status, out[0].Reason)
		}
	}
	wantOver := func(step string, want map[string]int64, wantLimit int64) {
		t.Helper()
		over, limit, err := holdingsOverLimit(ctx, s, sku)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, over); diff != "" || limit != wantLimit {
			t.Errorf("%s: limit %d (want %d), holdings above it (-want +got):\n%s", step, limit, wantLimit, diff)
		}
	}

	apply(1, 3)
	wantOver("3 units, limit 3", map[string]int64{}, 3)
	staleLimit := int64(3) // the monitor's load of the highest limit set so far
	putSKUChange(t, s, orderstore.SKUChange{ID: sku, TotalStock: 8, PerUserLimit: 4})
	apply(2, 1)
	held, err := s.LiveHoldings(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if held["u0"] <= staleLimit {
		t.Fatalf("u0 holds %d: the interleaving did not happen", held["u0"])
	}
	wantOver("4 units, limit raised to 4 before the fourth", map[string]int64{}, 4)
	putSKUChange(t, s, orderstore.SKUChange{ID: sku, TotalStock: 8, PerUserLimit: 2})
	wantOver("4 units, limit lowered to 2", map[string]int64{"u0": 4}, 2)
}

// successor reports whether an order applied as o may now be in status
// (with fail reason): a pending order may since be paid or cancelled, a
// refused or cancelled one never changes.
func successor(o orderstore.Outcome, status sale.Status, reason string) bool {
	switch o.Status {
	case sale.StatusPendingPayment:
		return status == sale.StatusPendingPayment || status == sale.StatusPaid || status == sale.StatusCancelled
	default:
		return status == o.Status && reason == o.Reason
	}
}

package main

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestTwoInstances: two serve instances share PostgreSQL, Redis and an
// external JetStream; buyers are spread over both; the sale stays exact:
// every unit sold, each to a purchase answered accepted. In "redis_hangs"
// their Redis is frozen for 2.5 s from before the first buyer, so the
// breakers open and the database fallback sells while first attempts wait
// in Redis.
func TestTwoInstances(t *testing.T) {
	t.Parallel()
	t.Run("healthy", func(t *testing.T) { t.Parallel(); twoInstances(t, false) })
	t.Run("redis_hangs", func(t *testing.T) { t.Parallel(); twoInstances(t, true) })
}

func twoInstances(t *testing.T, hang bool) {
	var cfg config
	var rs *testenv.RedisServer
	if hang {
		rs = testenv.StartRedis(t)
		cfg = testConfig(t, "external", "FLASHSALE_REDIS_URL", rs.URL)
	} else {
		cfg = testConfig(t, "external")
	}
	a, b := newHarness(t, cfg), newHarness(t, cfg)
	wa, wb := watchBreaker(a), watchBreaker(b)
	a.mustPutSKU("shared", 60, 1)
	if err := b.a.buy.Catalog.Refresh(t.Context()); err != nil { // instead of waiting for the refresh period
		t.Fatal(err)
	}
	var mu sync.Mutex
	var accepted, users []string
	answers := map[string]reply{} // the last answer to each key
	if hang {
		// One purchase first, as on a sale already selling: Redis then
		// holds the reserve script, so the first attempts queued in the
		// frozen Redis run when it is back (by its hash; a script Redis
		// did not hold would be refused then, and only the gate call's
		// own retries would reach it).
		if r := a.buyUntilAnswered("early", "shared", 1, "early", 20*time.Second); purchaseAccepted(r) {
			accepted, users = append(accepted, r.str("order_id")), append(users, "early")
		} else {
			t.Fatalf("the purchase before the freeze: %d %s", r.Status, r.Raw)
		}
		// Frozen before the first buyer: every first attempt waits in
		// Redis past its gate call's timeout, so both breakers open
		// whatever the machine's speed, and the database fallback sells
		// while those attempts wait (they run when Redis is back).
		rs.Pause()
		go func() {
			time.Sleep(2500 * time.Millisecond)
			rs.Resume()
		}()
	}
	var wg sync.WaitGroup
	for i := 0; i < 300; i++ {
		h := a
		if i%2 == 1 {
			h = b
		}
		wg.Add(1)
		// Each attempt has its own Idempotency-Key and is sent again while
		// it is answered 503 (an unknown outcome: a gate call that timed
		// out on a busy machine may still have taken the unit), as a client
		// should; a keyless purchase answered 503 could be an order nobody
		// was told about.
		go func(i int, user string) {
			defer wg.Done()
			key := fmt.Sprintf("try-%d", i)
			r := h.buyUntilAnswered(user, "shared", 1, key, 20*time.Second)
			mu.Lock()
			defer mu.Unlock()
			answers[key] = r
			if purchaseAccepted(r) {
				accepted = append(accepted, r.str("order_id"))
				users = append(users, user)
			}
		}(i, fmt.Sprintf("u%d", i%250)) // 50 users try on both instances
	}
	wg.Wait()
	rep := settle(t, a.a, "shared", accepted, 30*time.Second)
	ends := readEnds(t, a, accepted, users, wa, wb)
	if rep.LiveOrders != 60 || len(ends.live) != 60 {
		t.Fatalf("%d accepted, %d live orders, want 60; accepted and not live: %v; live and not answered accepted: %v",
			len(accepted), rep.LiveOrders, ends.failed, liveUnanswered(t, a, "shared", accepted, answers))
	}
	if hang && !ends.opened {
		t.Fatal("redis hung 2.5s and neither breaker opened: the test proves nothing")
	}
	for u, n := range ends.units {
		if n > 1 {
			t.Errorf("user %s holds %d live units, limit 1", u, n)
		}
	}
	t.Logf("%d accepted, %d of them failed (a breaker opened: %v): %v", len(accepted), len(ends.failed), ends.opened, ends.failed)
}

// liveUnanswered lists sku's live orders whose key's last answer (answers)
// was not accepted, with that answer.
func liveUnanswered(t *testing.T, h *harness, sku string, accepted []string, answers map[string]reply) []string {
	t.Helper()
	rows, err := h.a.store.DB().QueryContext(t.Context(), h.a.store.Rebind(`SELECT order_id, user_id, COALESCE(idempotency_key, '') FROM orders WHERE sku_id = ? AND status = 'pending_payment'`), sku)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	told := map[string]bool{}
	for _, id := range accepted {
		told[id] = true
	}
	var out []string
	for rows.Next() {
		var id, user, key string
		if err := rows.Scan(&id, &user, &key); err != nil {
			t.Fatal(err)
		}
		if !told[id] {
			r := answers[key]
			out = append(out, fmt.Sprintf("%s of %s, key %q answered %d %s", id, user, key, r.Status, r.Raw))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// orderEnds sorts the purchases answered with an order id by how their
// orders ended.
type orderEnds struct {
	live   []int            // indexes of the live orders (pending payment)
	units  map[string]int64 // live units per buyer
	failed []string         // failed in the window of a slow Redis: "id of user: reason"
	opened bool             // a watched breaker opened
}

// readEnds reads, as its buyer does, the order of every purchase answered
// with an order id (ids[i], bought by users[i]). Such an order is live, or
// failed in the documented window of a slow Redis (docs/architecture.md):
// the database fallback sold to its buyer, or the units, while the purchase
// waited in Redis, and the database then refused it (duplicate_key,
// limit_reached, or insufficient_stock before the fallback's debit reached
// the gate). That window needs a breaker that opened (on a loaded machine
// gate calls time out, with the user's default timeouts): a failed order
// while none of ws saw its breaker open, or any other end, fails the test.
func readEnds(t *testing.T, h *harness, ids, users []string, ws ...*breakerWatch) orderEnds {
	t.Helper()
	ends := orderEnds{units: map[string]int64{}}
	var wrong []string
	for i, id := range ids {
		var r reply
		// A look-up out of its time on a busy machine answers 503: read again.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			r = h.do(http.MethodGet, "/api/v1/orders/"+id, "", "Authorization: Bearer "+userToken(t, users[i]))
			if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
				break
			}
		}
		st, why := r.str("status"), r.str("fail_reason")
		switch {
		case r.Status == http.StatusOK && st == string(sale.StatusPendingPayment):
			ends.live = append(ends.live, i)
			q, _ := r.Body["quantity"].(float64)
			ends.units[users[i]] += int64(q)
		case r.Status == http.StatusOK && st == string(sale.StatusFailed) && (why == orderstore.ReasonDuplicateKey || why == orderstore.ReasonLimitReached || why == orderstore.ReasonInsufficientStock):
			ends.failed = append(ends.failed, fmt.Sprintf("%s of %s: %s", id, users[i], why))
		default:
			wrong = append(wrong, fmt.Sprintf("%s of %s: %d %s %s", id, users[i], r.Status, st, why))
		}
	}
	if len(wrong) > 0 {
		t.Fatalf("purchases with an order id that is neither live nor failed in the fallback's window: %v", wrong)
	}
	for _, w := range ws {
		_, o := w.since("open", time.Time{})
		ends.opened = ends.opened || o
	}
	if len(ends.failed) > 0 && !ends.opened {
		t.Fatalf("%d of %d purchases with an order id ended failed and no breaker opened: %v", len(ends.failed), len(ids), ends.failed)
	}
	return ends
}

// TestRestockDuringSale: the admin raises and lowers the allocation while
// buyers are buying; in the end exactly the final allocation is sold, and a
// reduction never takes a unit already promised to a buyer.
func TestRestockDuringSale(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	bw := watchBreaker(h)
	h.mustPutSKU("live", 100, 1)
	var mu sync.Mutex
	var accepted, users []string
	var next atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Keyed and sent again while 503, as a client does: a
				// keyless purchase answered 503 (a gate call out of time on
				// a busy machine) may have taken a unit nobody was told of.
				n := next.Add(1)
				r := h.buyUntilAnswered(fmt.Sprintf("u%d", n), "live", 1, fmt.Sprintf("k%d", n), 20*time.Second)
				if purchaseAccepted(r) {
					mu.Lock()
					accepted = append(accepted, r.str("order_id"))
					users = append(users, fmt.Sprintf("u%d", n))
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	h.mustPutSKU("live", 150, 1) // restock 50 while selling
	time.Sleep(50 * time.Millisecond)
	// A reduction that would take sold or reserved units is refused;
	// one within what is left would be taken from Redis first.
	if r := h.putSKU("live", `{"stock":1,"per_user_limit":1}`); r.Status != http.StatusConflict && r.Status != http.StatusOK {
		t.Errorf("reduction: %d %s", r.Status, r.Raw)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := h.do(http.MethodGet, "/api/v1/skus/live", "")
		if v.Body["state"] == "sold_out" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	rep := settle(t, h.a, "live", accepted, 30*time.Second)
	ends := readEnds(t, h, accepted, users, bw)
	if rep.DBStock != 0 || rep.LiveUnits != rep.TotalStock || int64(len(ends.live)) != rep.LiveUnits {
		t.Fatalf("total %d, sold %d, accepted %d (%d live, failed in the fallback's window: %v), stock left %d",
			rep.TotalStock, rep.LiveUnits, len(accepted), len(ends.live), ends.failed, rep.DBStock)
	}
	t.Logf("allocation ended at %d, sold %d", rep.TotalStock, rep.LiveUnits)
}

// TestAdminStockChanges: the allocation is changed by delta; a reduction
// beyond the unsold units is refused and changes nothing; warm-up of an idle
// sale changes nothing.
func TestAdminStockChanges(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("a", 10, 5)
	var accepted []string
	if r := h.buy("u1", "a", 3, ""); r.Status == http.StatusAccepted {
		accepted = append(accepted, r.str("order_id"))
	}
	settle(t, h.a, "a", accepted, 10*time.Second)
	steps := []struct {
		body      string
		status    int
		available float64
	}{
		{`{"stock":5,"per_user_limit":5}`, http.StatusOK, 2},
		{`{"stock":2,"per_user_limit":5}`, http.StatusConflict, 2},
		{`{"stock":3,"per_user_limit":5}`, http.StatusOK, 0},
		{`{"stock":20,"per_user_limit":4}`, http.StatusOK, 17},
	}
	for i, s := range steps {
		if r := h.putSKU("a", s.body); r.Status != s.status {
			t.Fatalf("step %d: %d %s", i, r.Status, r.Raw)
		}
		v := h.do(http.MethodGet, "/api/v1/skus/a", "")
		if v.Body["available"] != s.available {
			t.Fatalf("step %d: %s, want available %v", i, v.Raw, s.available)
		}
		settle(t, h.a, "a", accepted, 5*time.Second)
	}
	w := h.do(http.MethodPost, "/admin/v1/skus/a/warmup", "", "Authorization: Bearer "+testAdmin)
	if w.Status != http.StatusOK || w.Body["available"] != float64(17) || w.Body["in_flight"] != float64(0) {
		t.Fatalf("warmup: %d %s", w.Status, w.Raw)
	}
	// The lowered per-user limit applies at once: u1 holds 3 of 4.
	if r := h.buy("u1", "a", 2, ""); r.Status != http.StatusConflict || r.code() != "limit_reached" {
		t.Fatalf("after lowering the limit: %d %s", r.Status, r.Raw)
	}
}

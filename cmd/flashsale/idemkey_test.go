package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// liveOrders returns the ids of user's live orders of sku (the users of
// these tests buy only with their one key).
func liveOrders(t *testing.T, h *harness, sku, user string) []string {
	t.Helper()
	db := h.a.store
	rows, err := db.DB().QueryContext(context.Background(), db.Rebind(`SELECT order_id FROM orders
WHERE sku_id = ? AND user_id = ? AND status IN ('pending_payment', 'paid') ORDER BY order_id`), sku, user)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// acceptInGate reserves one unit of sku for user with key straight in the
// gate, as a first attempt the relay has not published yet (its answer lost
// to the client): the reservation is in flight in Redis only.
func acceptInGate(t *testing.T, h *harness, sku, user, key string) string {
	t.Helper()
	r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: user, Quantity: 1,
		AcceptedAt: time.Now().UnixMilli(), IdempotencyKey: key}
	if res, err := h.a.gate.Reserve(context.Background(), r); err != nil || res.Duplicate {
		t.Fatalf("first attempt of %s: %+v, %v", key, res, err)
	}
	return r.OrderID
}

// TestKeyAcrossTheFallback: a client retries one Idempotency-Key while the
// circuit breaker around Redis is open and its first attempt is still in
// flight in Redis. Exactly one live order per key results (I11), whichever
// path served each attempt, and every later retry is answered with it:
//   - k1: Redis hangs, so the retry cannot ask it: the database fallback
//     sells; the first attempt, reaching the database later, is refused
//     (duplicate_key) and its unit goes back;
//   - k2: Redis answers again while the breaker is still open: the retry is
//     answered with the reservation in flight, the fallback sells nothing,
//     if Redis answers the look-up within its bound (100 ms). On a loaded
//     machine it may not (a new connection through the proxy, the backlog
//     of the commands held by the black hole): then the fallback sells, as
//     for k1, and the database keeps that order (TestKeyLookupBeforeFallbackSale
//     in internal/purchase makes both outcomes deterministic);
//   - k3: as k2, but Redis hangs for the retry's look-up alone: the
//     fallback sells while Redis, answering again, still holds the
//     reservation in flight (k2's outcome on a loaded machine, made certain).
//
// Either way the key ends with one live order, the one its retry was
// answered with; a first attempt that is not it ends failed (duplicate_key)
// with its unit given back (settle checks the stock).
func TestKeyAcrossTheFallback(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	rs := testenv.StartRedis(t)
	px := testenv.StartProxy(t, rs.Addr)
	cfg := testConfig(t, "external",
		"FLASHSALE_REDIS_URL", "redis://"+px.Addr()+"/0", "FLASHSALE_REDIS_TIMEOUT", "200ms",
		"FLASHSALE_BREAKER_OPEN_FOR", "25s", "FLASHSALE_BREAKER_MIN_REQUESTS", "10",
		"FLASHSALE_RELAY_GRACE", "30s", "FLASHSALE_REDIS_MONITOR_EVERY", "200ms")
	h := newHarness(t, cfg)
	h.mustPutSKU("f", 100, 2)

	first1 := acceptInGate(t, h, "f", "alice", "k1")
	first2 := acceptInGate(t, h, "f", "bob", "k2")
	first3 := acceptInGate(t, h, "f", "carol", "k3")

	// Redis hangs: purchases time out until the breaker opens.
	px.Blackhole()
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; h.a.buy.BreakerState() != "open"; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("breaker %s while redis hangs", h.a.buy.BreakerState())
		}
		var wg sync.WaitGroup
		for j := range 6 {
			wg.Go(func() { h.buy(fmt.Sprintf("opener-%d-%d", i, j), "f", 1, "") })
		}
		wg.Wait()
	}
	// A 503 is an unknown outcome: the client retries with the same key.
	retry1 := retryKey(h, "alice", "f", "k1")
	if !purchaseAccepted(retry1) {
		t.Fatalf("k1's retry through the fallback: %d %s", retry1.Status, retry1.Raw)
	}
	kept1 := retry1.str("order_id")

	// Redis answers again; the breaker stays open a while.
	px.Restore()
	if st := h.a.buy.BreakerState(); st != "open" {
		t.Fatalf("breaker %s, want still open", st)
	}
	retry2 := retryKey(h, "bob", "f", "k2")
	kept2 := retry2.str("order_id")
	switch {
	case !purchaseAccepted(retry2):
		t.Fatalf("k2's retry while the breaker is open and redis answers: %d %s", retry2.Status, retry2.Raw)
	case kept2 == first2:
	case retry2.str("status") == string(sale.StatusPendingPayment):
		// Redis did not answer the look-up within its bound: the fallback sold.
		t.Logf("k2's look-up in redis did not answer in time: the fallback sold %s beside the reservation in flight %s", kept2, first2)
	default:
		t.Fatalf("k2's retry while the breaker is open: %d %s, want the reservation in flight %s or a fallback sale",
			retry2.Status, retry2.Raw, first2)
	}

	px.Blackhole()
	retry3 := retryKey(h, "carol", "f", "k3")
	px.Restore()
	kept3 := retry3.str("order_id")
	if !purchaseAccepted(retry3) || retry3.str("status") != string(sale.StatusPendingPayment) || kept3 == first3 {
		t.Fatalf("k3's retry while its look-up hangs: %d %s, want a fallback sale", retry3.Status, retry3.Raw)
	}

	// The breaker closes (Redis rebuilt), the first attempts reach the database.
	deadline = time.Now().Add(60 * time.Second)
	for h.a.buy.BreakerState() != "closed" && time.Now().Before(deadline) {
		h.buy("late-buyer", "f", 1, "")
		time.Sleep(100 * time.Millisecond)
	}
	settle(t, h.a, "f", []string{first1, first2, first3, kept1, kept2, kept3}, 30*time.Second)
	keys := []struct{ user, key, first, want string }{
		{"alice", "k1", first1, kept1}, {"bob", "k2", first2, kept2}, {"carol", "k3", first3, kept3},
	}
	for _, c := range keys {
		if live := liveOrders(t, h, "f", c.user); len(live) != 1 || live[0] != c.want {
			t.Errorf("%s's key %s: live orders %v, want exactly [%s]", c.user, c.key, live, c.want)
		}
		// A 503 here is a gate call past its timeout (200 ms in this test)
		// on a busy machine: an unknown outcome, retried with the key. The
		// answer is the order: 200 with its state from the database, or
		// 202 queued when the database did not say within its bound (200
		// ms: Service.settled) on a busy machine.
		r := retryKey(h, c.user, "f", c.key)
		if !purchaseAccepted(r) || r.str("order_id") != c.want || r.Status == http.StatusOK && r.str("status") != string(sale.StatusPendingPayment) {
			t.Errorf("%s retrying %s through the gate: %d %s, want order %s", c.user, c.key, r.Status, r.Raw, c.want)
		}
	}
	for _, c := range keys {
		if c.want == c.first {
			continue
		}
		o, err := h.a.store.Order(context.Background(), c.first)
		if err != nil || o.Status != sale.StatusFailed || o.FailReason != "duplicate_key" {
			t.Errorf("%s's first attempt %s: %+v, %v; want failed, duplicate_key", c.key, c.first, o, err)
		}
	}
}

// retryKey buys one unit of sku for user with key as a client does: a 503
// (the database slow on a busy machine, a gate call past its timeout) is an
// unknown outcome, so it retries with the same key, backing off, until
// another answer or 30 s (buyUntilAnswered). Enough such timeouts open the
// breaker; the retry is then answered from the database, which holds the
// key's order once it settled.
func retryKey(h *harness, user, sku, key string) reply {
	h.t.Helper()
	return h.buyUntilAnswered(user, sku, 1, key, 30*time.Second)
}

// TestKeyRetryFindsItsOrder: a retry of an Idempotency-Key that made an
// order gets that order back, not 429 while its user is rate limited, and
// not 503 while the sale is being loaded into Redis (fenced for a rebuild).
func TestKeyRetryFindsItsOrder(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "embedded", "FLASHSALE_RATE_LIMIT_USER", "0.2", "FLASHSALE_RATE_LIMIT_USER_BURST", "1")
	h := newHarness(t, cfg)
	h.mustPutSKU("k", 10, 2)
	first := h.buy("carol", "k", 1, "c1")
	if first.Status != http.StatusAccepted {
		t.Fatalf("first attempt: %d %s", first.Status, first.Raw)
	}
	id := first.str("order_id")
	other := h.buy("dave", "k", 1, "d1")
	if other.Status != http.StatusAccepted {
		t.Fatalf("dave's first attempt: %d %s", other.Status, other.Raw)
	}
	if r := h.buy("carol", "k", 1, ""); r.Status != http.StatusTooManyRequests {
		t.Fatalf("a new purchase within the user's interval: %d %s, want 429", r.Status, r.Raw)
	}
	if r := h.buy("carol", "k", 1, "c1"); !purchaseAccepted(r) || r.str("order_id") != id {
		t.Errorf("retry while rate limited: %d %s, want order %s", r.Status, r.Raw, id)
	}
	settle(t, h.a, "k", []string{id, other.str("order_id")}, 20*time.Second)
	if err := h.a.gate.Fence(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	// dave is not rate limited here: what stood in the way was the fence.
	// (On a busy machine the load may be over before the retry: the
	// order, still, whether from the database or from the reloaded gate.)
	if r := h.buy("dave", "k", 1, "d1"); !purchaseAccepted(r) || r.str("order_id") != other.str("order_id") {
		t.Errorf("retry while the sale is being loaded: %d %s, want order %s", r.Status, r.Raw, other.str("order_id"))
	}
}

// TestKeyFallbackThenAnotherInstance: instance a is cut off from Redis and
// sells from the database (breaker open); the client's retry of the same
// Idempotency-Key goes through instance b, whose gate is healthy. The direct
// sale's key reaches the gate (its debit records it), so b answers with the
// order a sold, and no second order is made.
func TestKeyFallbackThenAnotherInstance(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	px := testenv.StartProxy(t, rs.Addr)
	cfgA := testConfig(t, "external",
		"FLASHSALE_REDIS_URL", "redis://"+px.Addr()+"/0", "FLASHSALE_REDIS_TIMEOUT", "200ms",
		"FLASHSALE_BREAKER_OPEN_FOR", "30s", "FLASHSALE_BREAKER_MIN_REQUESTS", "10")
	cfgB := cfgA
	cfgB.RedisURL = rs.URL
	a, b := newHarness(t, cfgA), newHarness(t, cfgB)
	a.mustPutSKU("m", 50, 2)
	if err := b.a.buy.Catalog.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}

	px.Cut()
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; a.a.buy.BreakerState() != "open"; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("breaker of a %s while its redis is cut off", a.a.buy.BreakerState())
		}
		var wg sync.WaitGroup
		for j := range 6 {
			wg.Go(func() { a.buy(fmt.Sprintf("opener-%d-%d", i, j), "m", 1, "") })
		}
		wg.Wait()
	}
	sold := a.buy("erin", "m", 1, "e1")
	if sold.Status != http.StatusAccepted || sold.str("status") != string(sale.StatusPendingPayment) {
		t.Fatalf("direct sale through a: %d %s", sold.Status, sold.Raw)
	}
	id := sold.str("order_id")
	// b's restorer gives Redis the direct sale (the units and the key).
	db := b.a.store
	for deadline := time.Now().Add(15 * time.Second); ; {
		var n int
		if err := db.DB().QueryRowContext(t.Context(), db.Rebind(`SELECT count(*) FROM redis_restores WHERE order_id = ?`), "sale-"+id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the direct sale's debit was not applied to redis")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// As the client does: again while 503 (b's gate calls have 200 ms too,
	// which a loaded machine can outlast: "retry with the same key").
	r := settledRetry(b, "erin", "m", "e1")
	if r.Status != http.StatusOK || r.str("order_id") != id || r.str("status") != string(sale.StatusPendingPayment) {
		t.Errorf("retry through b's gate: %d %s, want the direct sale %s", r.Status, r.Raw, id)
	}
	settle(t, b.a, "m", []string{id}, 20*time.Second)
	if live := liveOrders(t, b, "m", "erin"); len(live) != 1 || live[0] != id {
		t.Errorf("erin's live orders %v, want exactly [%s]", live, id)
	}
}

// purchaseAccepted reports whether r accepts a purchase: 202 (queued, or sold by
// the database fallback), or 200 with the order for a retry of a purchase
// the database has decided.
func purchaseAccepted(r reply) bool {
	return r.Status == http.StatusAccepted || r.Status == http.StatusOK && r.str("order_id") != "" && r.str("status") != ""
}

// settledRetry retries user's key for an order the database already has,
// as a client does: again while 503 (an unknown outcome), and again while
// 202 queued, which is the answer when the database did not say within the
// retry's bound (200 ms, Service.settled) on a busy machine; until another
// answer or 30 s.
func settledRetry(h *harness, user, sku, key string) reply {
	h.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := h.buyUntilAnswered(user, sku, 1, key, 30*time.Second)
		if r.Status != http.StatusAccepted || r.str("status") != "queued" || time.Now().After(deadline) {
			return r
		}
	}
}

// TestKeyRetryAnswersTheOrdersState: a retry with an Idempotency-Key
// answers the order's real state: 202 queued while it is in flight, then
// 200 with the order (as GET shows it) once the database has it: pending
// payment, paid (with its payment_ref), cancelled. Nothing more is taken.
func TestKeyRetryAnswersTheOrdersState(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_RELAY_GRACE", "30s", "FLASHSALE_STREAM_ACK_TIMEOUT", "0s"))
	h.mustPutSKU("r", 10, 2)
	h.mustPutSKU("rq", 10, 2)

	// In flight: accepted in Redis, not published yet (its own SKU, which
	// is never settled).
	queued := acceptInGate(t, h, "rq", "quinn", "q1")
	if r := h.buy("quinn", "rq", 1, "q1"); r.Status != http.StatusAccepted || r.str("order_id") != queued || r.str("status") != "queued" {
		t.Errorf("retry of an order in flight: %d %s, want 202 queued %s", r.Status, r.Raw, queued)
	}

	pay := h.buy("paula", "r", 1, "p1")
	cancel := h.buy("carl", "r", 1, "c1")
	pend := h.buy("pete", "r", 1, "e1")
	for _, r := range []reply{pay, cancel, pend} {
		if r.Status != http.StatusAccepted {
			t.Fatalf("first attempt: %d %s", r.Status, r.Raw)
		}
	}
	settle(t, h.a, "r", []string{pay.str("order_id"), cancel.str("order_id"), pend.str("order_id")}, 20*time.Second)
	if r := h.pay("paula", pay.str("order_id"), `{"payment_ref":"psp-42"}`); r.Status != http.StatusOK || r.str("payment_ref") != "psp-42" {
		t.Fatalf("pay: %d %s, want 200 with payment_ref psp-42", r.Status, r.Raw)
	}
	if r := h.do(http.MethodPost, "/api/v1/orders/"+cancel.str("order_id")+"/cancel", "", "Authorization: Bearer "+userToken(t, "carl")); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	for _, c := range []struct {
		user, key, id string
		status        sale.Status
		field, value  string
	}{
		{"pete", "e1", pend.str("order_id"), sale.StatusPendingPayment, "", ""},
		{"paula", "p1", pay.str("order_id"), sale.StatusPaid, "payment_ref", "psp-42"},
		{"carl", "c1", cancel.str("order_id"), sale.StatusCancelled, "cancel_reason", sale.CancelByUser},
	} {
		r := settledRetry(h, c.user, "r", c.key)
		if r.Status != http.StatusOK || r.str("order_id") != c.id || r.str("status") != string(c.status) {
			t.Errorf("retry of a %s order: %d %s, want 200 %s %s", c.status, r.Status, r.Raw, c.status, c.id)
		}
		if c.field != "" && r.str(c.field) != c.value {
			t.Errorf("retry of a %s order: %s %q, want %q", c.status, c.field, r.str(c.field), c.value)
		}
		get := h.do(http.MethodGet, "/api/v1/orders/"+c.id, "", "Authorization: Bearer "+userToken(t, c.user))
		if get.Raw != r.Raw {
			t.Errorf("retry of a %s order answers\n%s\nGET answers\n%s", c.status, r.Raw, get.Raw)
		}
	}
	if live := liveOrders(t, h, "r", "carl"); len(live) != 0 {
		t.Errorf("carl's live orders after the cancel and its retry: %v, want none", live)
	}
}

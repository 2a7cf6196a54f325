package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestPayRacesTimeout: payment timeout 2 s; 1,000 orders; each order's
// payment is sent at about its deadline, racing the timer and the sweeper.
// Every order ends paid (stock kept) or cancelled (stock back once), never
// both; the payer is told which; nothing is released early; Redis and the
// database agree once idle; the released units are bought again by others,
// exactly as many as were released.
func TestPayRacesTimeout(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	h := newHarness(t, testConfig(t, "external", "FLASHSALE_PAYMENT_TIMEOUT", "2s", "FLASHSALE_SWEEP_EVERY", "300ms"))
	const n = 1000
	h.mustPutSKU("pay", n, 1)
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			// A retry of a key whose order is in the database answers 200
			// with that order, in whatever state it is by then (on a busy
			// machine the 503s can outlast the 2 s timeout: cancelled).
			r := h.buyUntilAnswered(fmt.Sprintf("payer-%d", i), "pay", 1, fmt.Sprintf("pay-%d", i), 30*time.Second)
			if !purchaseAccepted(r) {
				t.Errorf("buy %d: %d %s", i, r.Status, r.Raw)
			}
			ids[i] = r.str("order_id")
		}(i)
	}
	wg.Wait()
	settle(t, h.a, "pay", ids, 30*time.Second)

	// Pay each order at its deadline (expires_at), give or take 100 ms.
	ctx := context.Background()
	expiresAt := map[string]time.Time{}
	rows, err := h.a.store.DB().QueryContext(ctx, `SELECT order_id, expires_at FROM orders WHERE sku_id = 'pay'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var e time.Time
		_ = rows.Scan(&id, &e)
		expiresAt[id] = e
	}
	rows.Close()
	told := make([]string, n)
	for i, id := range ids {
		wg.Add(1)
		go func(i int, id string) {
			defer wg.Done()
			at := expiresAt[id].Add(time.Duration(i%200-100) * time.Millisecond)
			time.Sleep(time.Until(at))
			// At most as many payers at once as buyers: the deadlines of
			// 1,000 orders bought within a second or two fall together, and
			// 1,000 payments at one instant time out in the database of a
			// busy machine (500) before they race anything. A payment kept
			// waiting past its deadline is told order_expired, also an
			// answer this test checks.
			sem <- struct{}{}
			defer func() { <-sem }()
			r := h.pay(fmt.Sprintf("payer-%d", i), id, "")
			switch {
			case r.Status == http.StatusOK && r.str("status") == "paid":
				told[i] = "paid"
			case r.Status == http.StatusConflict && r.code() == "order_expired":
				told[i] = "cancelled"
			default:
				t.Errorf("pay %s: %d %s", id, r.Status, r.Raw)
			}
		}(i, id)
	}
	wg.Wait()

	var paid, cancelled int64
	for i, id := range ids {
		var status, reason string
		var cancelledAt *time.Time
		var transitions, terminal int
		err := h.a.store.DB().QueryRowContext(ctx, h.a.store.Rebind(`
SELECT o.status, coalesce(o.cancel_reason, ''), o.cancelled_at,
       (SELECT count(*) FROM order_transitions x WHERE x.order_id = o.order_id),
       (SELECT count(*) FROM order_transitions x WHERE x.order_id = o.order_id AND x.to_status IN ('paid','cancelled'))
FROM orders o WHERE o.order_id = ?`), id).Scan(&status, &reason, &cancelledAt, &transitions, &terminal)
		if err != nil {
			t.Fatal(err)
		}
		if terminal != 1 || transitions != 2 {
			t.Fatalf("order %s: %d transitions, %d terminal", id, transitions, terminal)
		}
		if status != told[i] {
			t.Fatalf("order %s is %s, its payer was told %s", id, status, told[i])
		}
		switch status {
		case "paid":
			paid++
		case "cancelled":
			cancelled++
			if reason != "payment_timeout" || cancelledAt.Before(expiresAt[id]) {
				t.Fatalf("order %s released early or for the wrong cause: %s at %v, deadline %v", id, reason, cancelledAt, expiresAt[id])
			}
		}
	}
	t.Logf("%d paid, %d cancelled by the timeout", paid, cancelled)
	if paid == 0 || cancelled == 0 {
		t.Logf("warning: the race was one-sided (%d paid, %d cancelled)", paid, cancelled)
	}
	rep := settle(t, h.a, "pay", ids, 30*time.Second)
	if rep.DBStock != cancelled || rep.LiveUnits != paid {
		t.Fatalf("stock %d for %d cancelled, live %d for %d paid", rep.DBStock, cancelled, rep.LiveUnits, paid)
	}

	// Others buy the released units: exactly as many as were released. An
	// instance may answer sold_out from its memory for up to
	// FLASHSALE_SOLD_OUT_TTL after units came back, so keep buying until
	// sold_out has been the answer for longer than that. Each second buyer
	// pays at once, so that the unit stays sold; on a busy machine the
	// purchase and its payment can outlast the 2 s timeout, and then the
	// timeout releases the unit (order_expired) and it is sold again: the
	// count is of the resold units that were paid.
	//
	// Sixteen buyers at once: hundreds of released units bought and paid
	// one after the other took minutes on a busy machine.
	var (
		mu           sync.Mutex
		more         []string
		paidMore     int64
		lastAccepted = time.Now()
		stop         atomic.Bool
		next         atomic.Int64
	)
	quiet := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Since(lastAccepted) >= 2500*time.Millisecond
	}
	for range 16 {
		wg.Go(func() {
			for !stop.Load() && !quiet() {
				user := fmt.Sprintf("second-%d", next.Add(1))
				r := h.buy(user, "pay", 1, "")
				switch {
				case r.Status == http.StatusAccepted:
					id := r.str("order_id")
					mu.Lock()
					more = append(more, id)
					mu.Unlock()
					for deadline := time.Now().Add(5 * time.Second); ; {
						p := h.pay(user, id, "")
						if p.Status == http.StatusOK {
							mu.Lock()
							paidMore++
							mu.Unlock()
							break
						}
						if p.code() == "order_expired" {
							// Released by the timeout, never before its deadline;
							// the unit is sold again.
							g := h.do(http.MethodGet, "/api/v1/orders/"+id, "", "Authorization: Bearer "+userToken(t, user))
							exp, _ := time.Parse(time.RFC3339Nano, g.str("expires_at"))
							at, _ := time.Parse(time.RFC3339Nano, g.str("cancelled_at"))
							if g.str("status") != "cancelled" || g.str("cancel_reason") != "payment_timeout" || at.Before(exp) {
								t.Errorf("resold order %s refused payment as expired: %s", id, g.Raw)
								stop.Store(true)
							}
							break
						}
						if p.code() != "order_queued" || time.Now().After(deadline) {
							g := h.do(http.MethodGet, "/api/v1/orders/"+id, "", "Authorization: Bearer "+userToken(t, user))
							t.Errorf("paying resold order %s: %d %s (order %s)", id, p.Status, p.Raw, g.Raw)
							stop.Store(true)
							break
						}
						time.Sleep(5 * time.Millisecond)
					}
					mu.Lock()
					lastAccepted = time.Now()
					mu.Unlock()
				case r.code() == "sold_out":
					time.Sleep(10 * time.Millisecond)
				case r.Status == http.StatusServiceUnavailable:
					// Retry shortly, as a buyer does (a new buyer: no key).
					time.Sleep(50 * time.Millisecond)
				default:
					t.Errorf("second buyer: %d %s", r.Status, r.Raw)
					stop.Store(true)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if paidMore != cancelled {
		t.Fatalf("%d released units sold again and paid (%d resold in all), want %d", paidMore, len(more), cancelled)
	}
	rep = settle(t, h.a, "pay", append(ids, more...), 30*time.Second)
	if rep.DBStock != 0 {
		t.Fatalf("after resale: %+v", rep)
	}
}

// TestCancelAndQueuedCancel: a user cancels a pending order (stock back in
// the database and in Redis) and a queued one (cancelled when it lands);
// another user cannot cancel or pay it; paying a cancelled order is 409.
func TestCancelAndQueuedCancel(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	ns := testenv.StartNATS(t, "")
	h := newHarness(t, testConfig(t, "", "FLASHSALE_NATS_URL", ns.URL, "FLASHSALE_PAYMENT_SECRET", "psecret"))
	h.mustPutSKU("cx", 5, 2)
	auth := func(u string) string { return "Authorization: Bearer " + userToken(t, u) }
	a := h.buy("amy", "cx", 2, "")
	settle(t, h.a, "cx", []string{a.str("order_id")}, 10*time.Second)
	id := a.str("order_id")
	if r := h.do(http.MethodPost, "/api/v1/orders/"+id+"/cancel", "", auth("eve")); r.Status != http.StatusNotFound {
		t.Fatalf("another user cancels: %d %s", r.Status, r.Raw)
	}
	if r := h.do(http.MethodPost, "/api/v1/orders/"+id+"/pay", "", auth("eve")); r.Status != http.StatusNotFound {
		t.Fatalf("another user pays: %d %s", r.Status, r.Raw)
	}
	r := h.do(http.MethodPost, "/api/v1/orders/"+id+"/cancel", "", auth("amy"))
	if r.Status != http.StatusOK || r.str("status") != "cancelled" || r.str("cancel_reason") != "user_cancel" || r.Body["cancelled_at"] == nil {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	if r := h.do(http.MethodPost, "/api/v1/orders/"+id+"/pay", "", auth("amy")); r.Status != http.StatusConflict || r.code() != "order_expired" {
		t.Fatalf("pay after cancel: %d %s", r.Status, r.Raw)
	}
	rep := settle(t, h.a, "cx", []string{id}, 10*time.Second)
	if rep.DBStock != 5 || rep.RedisAvailable != 5 {
		t.Fatalf("after cancel: %+v", rep)
	}
	// Paid through the provider's signed callback; a bad signature is refused.
	b := h.buy("bea", "cx", 1, "")
	settle(t, h.a, "cx", []string{b.str("order_id")}, 10*time.Second)
	body := `{"order_id":"` + b.str("order_id") + `","payment_ref":"psp-42"}`
	if r := h.do(http.MethodPost, "/api/v1/payments/callback", body, "X-Flashsale-Signature: sha256=00"); r.Status != http.StatusUnauthorized {
		t.Fatalf("forged callback: %d %s", r.Status, r.Raw)
	}
	sig := httpapi.SignPayment("psecret", []byte(body))
	for i := 0; i < 2; i++ {
		if r := h.do(http.MethodPost, "/api/v1/payments/callback", body, "X-Flashsale-Signature: "+sig); r.Status != http.StatusOK || r.str("status") != "paid" {
			t.Fatalf("callback %d: %d %s", i, r.Status, r.Raw)
		}
	}
	if r := h.do(http.MethodPost, "/api/v1/orders/"+b.str("order_id")+"/cancel", "", auth("bea")); r.code() != "order_paid" {
		t.Fatalf("cancel a paid order: %d %s", r.Status, r.Raw)
	}

	// A queued order: the broker is down, so it cannot land yet.
	ns.Shutdown()
	q := h.buy("cal", "cx", 1, "")
	r = h.do(http.MethodPost, "/api/v1/orders/"+q.str("order_id")+"/cancel", "", auth("cal"))
	if r.Status != http.StatusAccepted || r.str("status") != "queued" {
		t.Fatalf("cancel a queued order: %d %s", r.Status, r.Raw)
	}
	ns.Restart()
	rep = settle(t, h.a, "cx", []string{q.str("order_id")}, 20*time.Second)
	o := h.do(http.MethodGet, "/api/v1/orders/"+q.str("order_id"), "", auth("cal"))
	if o.str("status") != "cancelled" || rep.DBStock != 4 || rep.RedisAvailable != 4 {
		t.Fatalf("queued cancel landed as %s; %+v", o.Raw, rep)
	}
}

// TestKillBetweenReleaseAndRestore: the service dies after a release
// committed in the database and before the units went back to Redis. After
// a restart Redis gets them back, once.
func TestKillBetweenReleaseAndRestore(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	env := procEnv(t)
	env["FLASHSALE_FAILPOINTS"] = failpoint.ReleaseAfterStatusBeforeRestock + "=exit"
	p := startProc(t, env)
	h := procClient(t, p.url)
	h.mustPutSKU("k", 5, 1)
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, h.buy(fmt.Sprintf("u%d", i), "k", 1, "").str("order_id"))
	}
	chk := newChecker(t, env)
	deadline := time.Now().Add(20 * time.Second)
	for chk.check("k", ids, false).LiveOrders != 5 {
		if time.Now().After(deadline) {
			t.Fatal("orders did not land")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The cancel commits the release and kicks the restorer, whose
	// failpoint ends the process: on a busy machine before the answer is
	// written (no answer, as a crash gives). The checks below read the
	// release from the database either way.
	r := h.do(http.MethodPost, "/api/v1/orders/"+ids[0]+"/cancel", "", "Authorization: Bearer "+userToken(t, "u0"))
	if r.Status != http.StatusOK && r.Status != 0 {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("failpoint did not end the process")
	}
	if !strings.Contains(p.log(), "failpoint "+failpoint.ReleaseAfterStatusBeforeRestock+" fired") {
		t.Fatalf("failpoint did not fire:\n%s", p.log())
	}
	if rep := chk.check("k", ids, false); rep.DBStock != 1 || rep.RedisAvailable != 0 {
		t.Fatalf("between release and restore: %+v", rep)
	}
	delete(env, "FLASHSALE_FAILPOINTS")
	startProc(t, env)
	rep := chk.settle("k", ids, 20*time.Second)
	time.Sleep(time.Second) // more restorer passes: still once
	if rep = chk.check("k", ids, true); rep.RedisAvailable != 1 || rep.DBStock != 1 {
		t.Fatalf("after restart: %+v", rep)
	}
}

// TestPayAfterDeadline: an order whose payment deadline has passed but that
// the timer has not released yet cannot be paid: 409 order_expired, and the
// sweeper then releases it as usual, its units back once.
func TestPayAfterDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external", "FLASHSALE_SWEEP_EVERY", "1h"))
	h.mustPutSKU("pd", 5, 1)
	auth := "Authorization: Bearer " + userToken(t, "dan")
	id := h.buy("dan", "pd", 1, "").str("order_id")
	settle(t, h.a, "pd", []string{id}, 10*time.Second)
	// The timer is late: the deadline passed a moment ago, the order is
	// still pending_payment.
	past := time.Now().Add(-50 * time.Millisecond).UTC()
	if _, err := h.a.store.DB().ExecContext(context.Background(), h.a.store.Rebind(`UPDATE orders SET expires_at = ? WHERE order_id = ? AND status = 'pending_payment'`), past, id); err != nil {
		t.Fatal(err)
	}
	if r := h.do(http.MethodPost, "/api/v1/orders/"+id+"/pay", "", auth); r.Status != http.StatusConflict || r.code() != "order_expired" {
		t.Fatalf("pay after the deadline: %d %s", r.Status, r.Raw)
	}
	// The payer heard order_expired: the order is released by then, not
	// when the sweeper next runs.
	o := h.do(http.MethodGet, "/api/v1/orders/"+id, "", auth)
	rep := settle(t, h.a, "pd", []string{id}, 10*time.Second)
	if o.str("status") != "cancelled" || rep.DBStock != 5 || rep.RedisAvailable != 5 {
		t.Fatalf("after a refused late pay: %s; %+v", o.Raw, rep)
	}
}

// TestPayOutOfTimeThenAgain: a payment that runs out of the request's time
// in the database (here its order row is locked by another transaction past
// the 5 s request timeout, as a loaded database can hold it) is answered 503
// unavailable with Retry-After and leaves the order unpaid; the same payment
// sent again pays it, once, and a third answers 200 with the same order.
// This is what the tests' payers (harness.pay) and a payer's client rely on.
func TestPayOutOfTimeThenAgain(t *testing.T) {
	t.Parallel()
	// The wait ends by the request's deadline (lock_timeout and
	// innodb_lock_wait_timeout are 5 s too, but start later), or by the
	// database's lock timeout first, which a loaded machine can also give
	// (the cancel of the deadline reaching the database late).
	for _, lockTimeout := range []bool{false, true} {
		t.Run(map[bool]string{false: "request_deadline", true: "lock_timeout"}[lockTimeout], func(t *testing.T) {
			t.Parallel()
			payOutOfTimeThenAgain(t, lockTimeout)
		})
	}
}

func payOutOfTimeThenAgain(t *testing.T, lockTimeout bool) {
	cfg := testConfig(t, "external")
	if lockTimeout {
		u, err := url.Parse(cfg.DatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		if testenv.Dialect() == "mysql" {
			q.Set("innodb_lock_wait_timeout", "1")
		} else {
			q.Set("lock_timeout", "300ms")
		}
		u.RawQuery = q.Encode()
		cfg.DatabaseURL = u.String()
	}
	h := newHarness(t, cfg)
	h.mustPutSKU("pt", 5, 1)
	id := h.buy("pat", "pt", 1, "").str("order_id")
	settle(t, h.a, "pt", []string{id}, 10*time.Second)

	ctx := context.Background()
	tx, err := h.a.store.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Before the harness closes its pool, which waits for this connection.
	t.Cleanup(func() { _ = tx.Rollback() })
	var locked string
	if err := tx.QueryRowContext(ctx, h.a.store.Rebind(`SELECT order_id FROM orders WHERE order_id = ? FOR UPDATE`), id).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	r := h.do(http.MethodPost, "/api/v1/orders/"+id+"/pay", `{"payment_ref":"p-1"}`, "Authorization: Bearer "+userToken(t, "pat"))
	if r.Status != http.StatusServiceUnavailable || r.code() != "unavailable" {
		t.Fatalf("pay while its row is held: %d %s, want 503 unavailable", r.Status, r.Raw)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if o := h.do(http.MethodGet, "/api/v1/orders/"+id, "", "Authorization: Bearer "+userToken(t, "pat")); o.str("status") != "pending_payment" {
		t.Fatalf("after a 503 pay: %s, want pending_payment", o.Raw)
	}
	for i := 0; i < 2; i++ {
		if r := h.pay("pat", id, `{"payment_ref":"p-1"}`); r.Status != http.StatusOK || r.str("status") != "paid" || r.str("payment_ref") != "p-1" {
			t.Fatalf("pay again (%d): %d %s", i, r.Status, r.Raw)
		}
	}
	var transitions int
	if err := h.a.store.DB().QueryRowContext(ctx, h.a.store.Rebind(`SELECT count(*) FROM order_transitions WHERE order_id = ? AND to_status = 'paid'`), id).Scan(&transitions); err != nil {
		t.Fatal(err)
	}
	if transitions != 1 {
		t.Fatalf("%d paid transitions, want 1", transitions)
	}
	if rep := settle(t, h.a, "pt", []string{id}, 10*time.Second); rep.LiveUnits != 1 {
		t.Fatalf("after paying: %+v", rep)
	}
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/invariant"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/testenv"
)

// erp changes a SKU's stock the way another system would: a plain UPDATE
// through a client that is not flashsale's (the store's outside client).
func erp(t *testing.T, s *orderstore.Store, sku string, delta int) {
	t.Helper()
	res, err := s.DB().ExecContext(context.Background(), s.Rebind(`UPDATE inventory SET stock = stock + ? WHERE sku_id = ?`), delta, sku)
	if err != nil {
		t.Fatalf("erp update of %s by %d: %v", sku, delta, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("erp update of %s: %d rows", sku, n)
	}
}

// externalChanges counts the stock_audit rows the trigger wrote for changes
// made outside flashsale, and their sum.
func externalChanges(t *testing.T, s *orderstore.Store, sku string) (n, sum int64) {
	t.Helper()
	err := s.DB().QueryRowContext(context.Background(), s.Rebind(
		`SELECT count(*), coalesce(sum(delta), 0) FROM stock_audit WHERE sku_id = ? AND reason = 'external_change'`), sku).Scan(&n, &sum)
	if err != nil {
		t.Fatal(err)
	}
	return n, sum
}

// watchInvariants checks I1, I2, I5 and I6 (those that hold at every
// instant) every 20 ms until stop is closed, and fails the test on a violation.
func watchInvariants(t *testing.T, a *app, sku string, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			rep, err := invariant.Check(context.Background(), a.store, a.gate, sku, nil, false)
			if err != nil {
				t.Errorf("invariant check: %v", err)
				return
			}
			if !rep.OK() {
				t.Errorf("invariants violated during the sale: %v\n%+v", rep.Violations, rep)
				return
			}
		}
	})
	return &wg
}

// waitAvailable waits until the gate offers want units of sku.
func waitAvailable(t *testing.T, a *app, sku string, want int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		f, err := a.gate.ReadInFlight(context.Background(), sku)
		if err != nil {
			t.Fatal(err)
		}
		if f.Available == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: redis offers %d units after %v, want %d", sku, f.Available, within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestExternalRestockDuringSale: another system adds 50 units straight in the
// database while 400 buyers compete for 100. Redis follows: buyers get exactly
// the 150 units, no more; I1, I2, I5, I6 hold throughout, and all of them
// (with I3: Redis = database) once idle. The change is audited once, as
// external_change, and flashsale's own changes are not.
func TestExternalRestockDuringSale(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded"))
	h.mustPutSKU("erp", 100, 1)
	stop := make(chan struct{})
	watch := watchInvariants(t, h.a, "erp", stop)
	done := make(chan *history)
	go func() { done <- runBuyers(t, h, "erp", 400, 100, 16) }()
	time.Sleep(500 * time.Millisecond)
	erp(t, h.a.store, "erp", 50)
	hs := <-done
	// Whatever the first wave left (the restock may land after it), a second wave takes.
	more := runBuyers(t, h, "erp", 100, 200, 16)
	close(stop)
	watch.Wait()
	ids := append(hs.ids(), more.ids()...)
	rep := settle(t, h.a, "erp", ids, 30*time.Second)
	if rep.LiveUnits != 150 || rep.DBStock != 0 || rep.RedisAvailable != 0 || rep.TotalStock != 150 {
		t.Fatalf("after an external restock of 50 on 100: %+v", rep)
	}
	if n, sum := externalChanges(t, h.a.store, "erp"); n != 1 || sum != 50 {
		t.Fatalf("external_change audit rows: %d summing to %d, want 1 of 50", n, sum)
	}
	t.Logf("%d accepted; %d live units; codes %v / %v", len(ids), rep.LiveUnits, hs.codes, more.codes)
}

// decrementWithReservationsInFlight sets up the debt case: 15 of 20 units
// reserved while the broker is down (in flight, not in the database), then
// another system takes 12 units straight from the database (20 -> 8). Redis
// had 5 available: it takes them and owes 7 (debt). It returns once Redis
// shows that, with the harness, the stopped broker and the 15 order ids.
// I1, I2, I5 and I6 are checked every 20 ms until the test ends.
func decrementWithReservationsInFlight(t *testing.T) (*harness, *testenv.NATSServer, []string) {
	t.Helper()
	ns := testenv.StartNATS(t, "")
	h := newHarness(t, testConfig(t, "", "FLASHSALE_NATS_URL", ns.URL, "FLASHSALE_RELAY_GRACE", "300ms"))
	h.mustPutSKU("dec", 20, 1)
	stop := make(chan struct{})
	watch := watchInvariants(t, h.a, "dec", stop)
	t.Cleanup(func() { close(stop); watch.Wait() })
	ns.Shutdown()
	var ids []string
	for i := 0; i < 15; i++ {
		r := h.buy(fmt.Sprintf("early-%d", i), "dec", 1, "")
		if r.Status != http.StatusAccepted {
			t.Fatalf("buy %d while the broker is down: %d %s", i, r.Status, r.Raw)
		}
		ids = append(ids, r.str("order_id"))
	}
	erp(t, h.a.store, "dec", -12)
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := h.a.gate.ReadInFlight(context.Background(), "dec")
		if err != nil {
			t.Fatal(err)
		}
		if f.Debt == 7 && f.Available == -7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis did not follow the external decrement: available %d, debt %d", f.Available, f.Debt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return h, ns, ids
}

// TestExternalDecrementWithReservationsInFlight: after
// decrementWithReservationsInFlight nothing more is sold; when the broker is
// back 8 reservations apply and 7 are refused, whose give-back pays the debt
// instead of re-selling units that no longer exist. Idle: Redis = database = 0.
func TestExternalDecrementWithReservationsInFlight(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	h, ns, ids := decrementWithReservationsInFlight(t)
	if r := h.buy("late", "dec", 1, ""); r.Status == http.StatusAccepted {
		t.Fatalf("a unit was sold while redis owed 7: %s", r.Raw)
	}
	ns.Restart()
	rep := settle(t, h.a, "dec", ids, 30*time.Second)
	if rep.LiveUnits != 8 || rep.FailedOrders != 7 || rep.DBStock != 0 || rep.RedisAvailable != 0 || rep.RedisDebt != 0 || rep.TotalStock != 8 {
		t.Fatalf("after the broker came back: %+v", rep)
	}
	// A restock now reaches Redis (at once on PostgreSQL, within a poll on
	// MySQL) and is sold exactly.
	erp(t, h.a.store, "dec", 3)
	waitAvailable(t, h.a, "dec", 3, 10*time.Second)
	more := runBuyers(t, h, "dec", 50, 200, 8)
	rep = settle(t, h.a, "dec", append(ids, more.ids()...), 30*time.Second)
	if rep.LiveUnits != 11 || rep.DBStock != 0 || rep.RedisAvailable != 0 {
		t.Fatalf("after a restock of 3: %+v", rep)
	}
}

// TestExternalChangesAcrossKill: the service dies after applying external
// changes in Redis and before marking them done in the database
// (restore_after_redis_before_done=exit), and more changes are made while it
// is down. After a restart every change is in Redis exactly once: no loss,
// no double application (Redis = database, from both stores' own records).
func TestExternalChangesAcrossKill(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	env := procEnv(t)
	env["FLASHSALE_FAILPOINTS"] = failpoint.RestoreAfterRedisBeforeDone + "=exit"
	p := startProc(t, env)
	h := procClient(t, p.url)
	h.mustPutSKU("cdc", 10, 2)
	chk := newChecker(t, env)
	erp(t, chk.a.store, "cdc", 5)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("failpoint did not end the process")
	}
	if !strings.Contains(p.log(), "failpoint "+failpoint.RestoreAfterRedisBeforeDone+" fired") {
		t.Fatalf("failpoint did not fire:\n%s", p.log())
	}
	if rep := chk.check("cdc", nil, false); rep.RedisAvailable != 15 || rep.DBStock != 15 {
		t.Fatalf("between redis and done: %+v", rep)
	}
	// Changes made while flashsale is down wait in the database.
	erp(t, chk.a.store, "cdc", -4)
	erp(t, chk.a.store, "cdc", 7)
	delete(env, "FLASHSALE_FAILPOINTS")
	p2 := startProc(t, env)
	chk.settle("cdc", nil, 20*time.Second)
	time.Sleep(time.Second) // more restorer passes: still once
	if rep := chk.check("cdc", nil, true); !rep.OK() || rep.RedisAvailable != 18 || rep.DBStock != 18 {
		t.Fatalf("after restart: %+v", rep)
	}
	// And buyers get exactly those 18 units.
	h2 := procClient(t, p2.url)
	var ids []string
	for i := 0; i < 12; i++ {
		for _, q := range []int{2, 1} {
			if r := h2.buy(fmt.Sprintf("b%d", i), "cdc", q, ""); r.Status == http.StatusAccepted {
				ids = append(ids, r.str("order_id"))
			}
		}
	}
	rep := chk.settle("cdc", ids, 20*time.Second)
	if rep.LiveUnits != 18 || rep.DBStock != 0 {
		t.Fatalf("sold after restart: %+v", rep)
	}
}

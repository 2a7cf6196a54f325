package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestKeyedRetryNeverSoldOut: no retry of an Idempotency-Key that made an
// order is ever answered sold_out, whichever instance it reaches, however
// the sale's stock came and went, and after an instance restarts. Two
// instances share Redis, the stream and the database; a sale sells out,
// and then, cycle after cycle, one unit comes back (a buyer's cancel, an
// admin restock), a new buyer takes it through instance a, and the
// winner's retry goes to instance b while b answers the sale sold out from
// memory: first with b's flag set before the unit came back (the flag a
// memory answer could have gone stale with), then again once the sale is
// sold out again. Halfway, b is stopped and a new instance takes its
// place, which hears no notice of a unit's return (core NATS, at most
// once: as when they are lost), so in the second half its flags outlive
// the units' return and the first retry of each cycle meets a stale flag.
// At the end every key that made an order, cancelled or not, is retried
// through both instances and must be answered with its order.
// This is the guarantee any answer of a keyed sold out from memory must
// keep (docs/architecture.md, "Sold-out answers").
func TestKeyedRetryNeverSoldOut(t *testing.T) { keyedRetryNeverSoldOut(t, false) }

// TestKeyedRetryNeverSoldOutLeased is TestKeyedRetryNeverSoldOut with
// sold-out leases on (FLASHSALE_SOLD_OUT_LEASE): the instances answer
// keyed sold-out from snapshots of the sale's key holders, and must be seen
// doing it.
func TestKeyedRetryNeverSoldOutLeased(t *testing.T) { keyedRetryNeverSoldOut(t, true) }

func keyedRetryNeverSoldOut(t *testing.T, leased bool) {
	slowEndToEnd(t)
	t.Parallel()
	// b's flags last (the default is 1 s): only a notice of returned units
	// ends one early, so the retries meet flags set before their units came
	// back. a, which sells the returned units, keeps the default: its flag
	// of the sale is set each time it sells the last unit.
	env := []string{"FLASHSALE_SOLD_OUT_TTL", "30s"}
	if leased {
		env = append(env, "FLASHSALE_SOLD_OUT_LEASE", "1s")
	}
	cfg := testConfig(t, "external", env...)
	cfgA := cfg
	cfgA.Protect.SoldOutTTL = time.Second
	a := newHarness(t, cfgA)
	b := newHarness(t, cfg)
	// A breaker that opens (gate calls out of time on a loaded machine)
	// sells from the database, which may hold a unit the gate has not yet
	// been told is sold: then a buyer expected to be told sold out may buy.
	watches := []*breakerWatch{watchBreaker(a), watchBreaker(b)}
	opened := func() bool {
		for _, w := range watches {
			if _, o := w.since("open", time.Time{}); o {
				return true
			}
		}
		return false
	}
	const sku, stock = "so", 8
	a.mustPutSKU(sku, stock, 1)
	if err := b.a.buy.Catalog.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	var orders []made
	n := 0
	fresh := func() (string, string) { n++; return fmt.Sprintf("u%d", n), fmt.Sprintf("k%d", n) }

	// buyOne buys through h with fresh buyers until one is accepted.
	buyOne := func(h *harness, why string) made {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			u, k := fresh()
			if r := h.buyUntilAnswered(u, sku, 1, k, 20*time.Second); purchaseAccepted(r) {
				m := made{u, k, r.str("order_id")}
				orders = append(orders, m)
				return m
			} else if r.code() != "sold_out" {
				t.Fatalf("%s: %s's purchase: %d %s", why, u, r.Status, r.Raw)
			}
		}
		t.Fatalf("%s: no unit to buy within 30 s", why)
		return made{}
	}
	// leaseUsed sends fresh buyers to h until one is answered sold_out
	// from a lease's snapshot (h takes one on the first keyed sold-out
	// answer and keeps it while asked), so that the retries after it meet
	// a live snapshot.
	// refused sends a fresh buyer to h, who should be told sold_out; it
	// reports false (the order recorded) when the buyer was accepted,
	// which only a breaker that opened explains.
	refused := func(h *harness, why string) (reply, bool) {
		t.Helper()
		u, k := fresh()
		r := h.buyUntilAnswered(u, sku, 1, k, 20*time.Second)
		if purchaseAccepted(r) {
			if !opened() {
				t.Fatalf("%s: %s bought %s, but the sale should be sold out", why, u, r.str("order_id"))
			}
			orders = append(orders, made{u, k, r.str("order_id")})
			return r, false
		}
		return r, true
	}
	leaseUsed := func(h *harness, why string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			before := h.a.buy.SoldOutFromLease()
			if _, ok := refused(h, why); !ok {
				continue
			}
			if h.a.buy.SoldOutFromLease() > before {
				return
			}
		}
		t.Fatalf("%s: no sold-out answer from a lease's snapshot within 15 s", why)
	}
	// flag makes h answer the sale sold out from memory: a fresh buyer
	// told sold_out sets h's flag.
	flag := func(h *harness, why string) {
		t.Helper()
		for range 50 {
			r, ok := refused(h, why)
			if !ok {
				continue
			}
			if r.code() != "sold_out" {
				t.Fatalf("%s: purchase: %d %s, want sold_out", why, r.Status, r.Raw)
			}
			if h.a.buy.SoldOutFlagged(sku) {
				if leased {
					leaseUsed(h, why)
				}
				return
			}
		}
		t.Fatalf("%s: the instance does not answer the sale sold out from memory", why)
	}
	flaggedRetries := 0
	// retry sends m's key again through h: its order, never sold_out. It
	// reports whether h had the sale flagged sold out as it was sent.
	retry := func(h *harness, m made, why string) bool {
		t.Helper()
		flagged := h.a.buy.SoldOutFlagged(sku)
		if flagged {
			flaggedRetries++
		}
		r := h.buyUntilAnswered(m.user, sku, 1, m.key, 20*time.Second)
		if !purchaseAccepted(r) || r.str("order_id") != m.id {
			t.Errorf("%s: retry of %s's key %s (order %s): %d %s", why, m.user, m.key, m.id, r.Status, r.Raw)
		}
		return flagged
	}
	staleFlags := 0     // retries that met a flag set before their unit came back
	var fromLease int64 // b's sold-out answers from a lease's snapshot

	for range stock {
		buyOne(a, "selling out")
	}
	flag(a, "sold out")
	flag(b, "sold out")
	const cycles = 8
	for c := range cycles {
		if c == cycles/2 {
			// A restart: b stops, a new instance takes its place (no flag,
			// nothing in memory).
			fromLease += b.a.buy.SoldOutFromLease()
			b.stop()
			b = newHarness(t, cfg)
			watches = append(watches, watchBreaker(b))
			if err := b.a.buy.Catalog.Refresh(t.Context()); err != nil {
				t.Fatal(err)
			}
			for _, m := range orders {
				retry(b, m, "after the restart")
			}
			// The notices that units came back are core NATS, at most
			// once: the new b hears none, so its flag outlives the unit's
			// return (until its TTL), as after a lost notice.
			if err := b.a.notices.Unsubscribe(); err != nil {
				t.Fatal(err)
			}
		}
		// b answers sold out from memory, then one unit comes back.
		flag(b, fmt.Sprintf("cycle %d, before the unit comes back", c))
		how := "a cancel"
		if c%2 == 0 {
			m := orders[c]
			if r := a.do(http.MethodPost, "/api/v1/orders/"+m.id+"/cancel", "", "Authorization: Bearer "+userToken(t, m.user)); r.Status != http.StatusOK {
				// Still queued: cancel waits for the database.
				settle(t, a.a, sku, ids(orders), 30*time.Second)
				if r = a.do(http.MethodPost, "/api/v1/orders/"+m.id+"/cancel", "", "Authorization: Bearer "+userToken(t, m.user)); r.Status != http.StatusOK {
					t.Fatalf("cycle %d: cancel %s: %d %s", c, m.id, r.Status, r.Raw)
				}
			}
		} else {
			how = "a restock"
			r := a.putSKUAnswered(sku, fmt.Sprintf(`{"stock":%d,"per_user_limit":1}`, stock+(c+1)/2))
			if !saved(r) {
				t.Fatalf("cycle %d: restock: %d %s", c, r.Status, r.Raw)
			}
		}
		why := fmt.Sprintf("cycle %d (%s)", c, how)
		won := buyOne(a, why)
		// The winner's retry through b: b's flag was set before the unit
		// came back (unless a notice of the unit's return cleared it: in
		// the first half).
		if retry(b, won, why+", b flagged before") {
			staleFlags++
		}
		// Sold out again (b's flag set again, or still set in the second
		// half).
		flag(b, why+", after the unit was taken")
		retry(b, won, why+", b flagged after")
		retry(a, won, why+", through a")
	}
	if flaggedRetries == 0 || staleFlags < 2 {
		t.Errorf("%d retries reached b while it answered the sale sold out from memory, %d with a flag set before their unit came back: the test did not test it",
			flaggedRetries, staleFlags)
	}
	settle(t, a.a, sku, ids(orders), 30*time.Second)
	for _, m := range orders {
		retry(a, m, "at the end, through a")
		retry(b, m, "at the end, through b")
	}
	fromLease += b.a.buy.SoldOutFromLease()
	if leased && fromLease == 0 {
		t.Error("b gave no sold-out answer from a lease's snapshot: the test did not test it")
	}
	t.Logf("%d orders, %d retries answered while the instance had the sale flagged sold out, %d of them with a flag set before their unit came back; %d sold-out answers from a lease's snapshot on b",
		len(orders), flaggedRetries, staleFlags, fromLease)
}

// made is an order a buyer's key made.
type made struct{ user, key, id string }

func ids(ms []made) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.id
	}
	return out
}

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderqueue"
)

// TestConcurrentBuyers is the pipeline's acceptance test: thousands of
// distinct buyers, some clicking twice, against a small stock, through real
// HTTP, Redis, JetStream and PostgreSQL.
func TestConcurrentBuyers(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	cases := []struct {
		name         string
		nats         string
		buyers       int
		stock, limit int
		maxQty       int
		env          []string
	}{
		// The default: several reservations per stream message (schema
		// version 2) once the instance's beat is in the fleet registry.
		{"limit1-embedded", "embedded", 2000, 100, 1, 1, nil},
		{"limit1-external", "external", 2000, 100, 1, 1, nil},
		{"quantity-external", "external", 2000, 100, 3, 3, nil},
		// One reservation per message (schema version 1), what an instance
		// publishes beside an older release.
		{"quantity-schema1", "external", 2000, 100, 3, 3, []string{"FLASHSALE_ORDER_SCHEMA", "1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, testConfig(t, c.nats, c.env...))
			w := watchBreaker(h)
			// With the default the instance turns schema 2 on once its own
			// beat is in the fleet registry (within a check, 2 s).
			want := orderqueue.SchemaBatch
			if len(c.env) > 0 {
				want = 1
			}
			deadline := time.Now().Add(15 * time.Second)
			for h.a.queue.PublishSchema() != want {
				if time.Now().After(deadline) {
					t.Fatalf("publishes schema %d after 15 s, want %d", h.a.queue.PublishSchema(), want)
				}
				time.Sleep(50 * time.Millisecond)
			}
			sku := "hot-" + c.name
			h.mustPutSKU(sku, c.stock, c.limit)

			var mu sync.Mutex
			var accepted, owners []string
			statuses := map[string]int{}
			var wg sync.WaitGroup
			sem := make(chan struct{}, 256)
			for i := 0; i < c.buyers; i++ {
				user := fmt.Sprintf("buyer-%d", i)
				clicks := 1 + i%3/2 // one in three clicks twice
				for k := 0; k < clicks; k++ {
					wg.Add(1)
					go func(qty int) {
						defer wg.Done()
						sem <- struct{}{}
						defer func() { <-sem }()
						// Each click with its own Idempotency-Key, sent again
						// while answered 503 (a gate call out of time on a
						// loaded machine: outcome unknown), as a client does:
						// the answer that counts is the first other one, 200
						// with the order if the first attempt made it.
						r := h.buyUntilAnswered(user, sku, qty, fmt.Sprintf("%s-%d", user, k), 30*time.Second)
						mu.Lock()
						defer mu.Unlock()
						switch r.Status {
						case http.StatusAccepted, http.StatusOK:
							accepted = append(accepted, r.str("order_id"))
							owners = append(owners, user)
							statuses["accepted"]++
						case http.StatusConflict:
							statuses[r.code()]++
						default:
							t.Errorf("unexpected reply %d %s", r.Status, r.Raw)
						}
					}(1 + rand.IntN(c.maxQty))
				}
			}
			wg.Wait()
			t.Logf("%s: %v", c.name, statuses)
			rep := settle(t, h.a, sku, accepted, 60*time.Second)
			// Every order answered accepted is live, or (on a machine so
			// loaded that the breaker opened) failed in the fallback's
			// documented window; no buyer holds more than the limit.
			ends := readEnds(t, h, accepted, owners, w)
			for u, n := range ends.units {
				if n > int64(c.limit) {
					t.Errorf("user %s holds %d live units, limit %d", u, n, c.limit)
				}
			}
			if len(ends.failed) > 0 {
				t.Logf("breaker opened: %d accepted purchases ended failed in the fallback's window: %v", len(ends.failed), ends.failed)
			}
			if st, err := h.a.queue.Stats(context.Background()); err != nil {
				t.Error(err)
			} else {
				t.Logf("%d reservations accepted, %d messages on the stream", len(accepted), st.Messages)
				// A burst of 256 buyers at once: the relay's rounds carry
				// several reservations each, one message per round.
				if want == orderqueue.SchemaBatch && st.Messages >= uint64(len(accepted)) {
					t.Errorf("schema 2: %d messages for %d reservations, want fewer", st.Messages, len(accepted))
				}
				// Schema 1: one message per reservation (the database
				// fallback's sales, after a breaker opened, take none).
				if want == 1 && !ends.opened && st.Messages < uint64(len(accepted)) {
					t.Errorf("schema 1: %d messages for %d reservations, want one each", st.Messages, len(accepted))
				}
			}
			if rep.DBStock != 0 && c.maxQty == 1 {
				t.Errorf("stock left %d, want 0 (sold out)", rep.DBStock)
			}
			if rep.LiveUnits+rep.DBStock != int64(c.stock) {
				t.Errorf("live units %d + stock %d != %d", rep.LiveUnits, rep.DBStock, c.stock)
			}
			if c.maxQty == 1 && rep.LiveOrders != int64(c.stock) {
				t.Errorf("%d orders, want %d", rep.LiveOrders, c.stock)
			}
			// Every live order was answered accepted. A failed order row
			// nobody was told of is an attempt answered 503 whose retry was
			// refused (sold out) and which the database then refused too:
			// only in the fallback's window, so only when the breaker opened.
			if rep.LiveOrders != int64(len(ends.live)) || rep.FailedOrders < int64(len(ends.failed)) || rep.FailedOrders > 0 && !ends.opened {
				t.Errorf("%d order rows (%d live, %d failed) for %d accepted purchases (%d live, %d failed in the fallback's window; breaker opened: %v)",
					rep.Orders, rep.LiveOrders, rep.FailedOrders, len(accepted), len(ends.live), len(ends.failed), ends.opened)
			}
			// Accepted orders are visible to their owners only.
			for _, i := range ends.live[:5] {
				id, owner := accepted[i], owners[i]
				r := h.do(http.MethodGet, "/api/v1/orders/"+id, "", "Authorization: Bearer "+userToken(t, owner))
				if r.Status != http.StatusOK || r.str("status") != "pending_payment" || r.str("user_id") != owner {
					t.Errorf("owner reads order: %d %s", r.Status, r.Raw)
				}
				r = h.do(http.MethodGet, "/api/v1/orders/"+id, "", "Authorization: Bearer "+userToken(t, "someone-else"))
				if r.Status != http.StatusNotFound || r.code() != "order_not_found" {
					t.Errorf("another user reads order: %d %s", r.Status, r.Raw)
				}
			}
			sv := h.do(http.MethodGet, "/api/v1/skus/"+sku, "")
			if sv.Status != http.StatusOK || sv.Body["available"] != float64(rep.DBStock) {
				t.Errorf("sku view: %d %s", sv.Status, sv.Raw)
			}
		})
	}
}

package main

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestCancelRightAfterBuying: buyers cancel at once, while their orders are
// queued, landing or landed: every cancel is accepted (200 or 202), every
// order ends cancelled, and all the stock comes back. 300 releases of one
// SKU take turns on its inventory row, so on a busy machine some outlast
// the request's 5 s and are answered 503 (retry shortly); the buyer sends
// the cancel again, as a client does, until it is accepted.
func TestCancelRightAfterBuying(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("cr", 300, 1)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ids []string
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			user := fmt.Sprintf("c%d", i)
			// With a key, sent again while 503 (retry shortly: 300 at once
			// on a busy machine can outlast the gate's timeout and open the
			// breaker), as a client does: the answer is then the order.
			b := h.buyUntilAnswered(user, "cr", 1, "k-"+user, 60*time.Second)
			if b.Status != http.StatusAccepted && b.Status != http.StatusOK {
				t.Errorf("buy: %d %s", b.Status, b.Raw)
				return
			}
			id := b.str("order_id")
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
			var c reply
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				c = h.do(http.MethodPost, "/api/v1/orders/"+id+"/cancel", "", "Authorization: Bearer "+userToken(t, user))
				if c.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
					break
				}
			}
			if c.Status != http.StatusOK && c.Status != http.StatusAccepted {
				t.Errorf("cancel %s: %d %s (bought: %d %s)", id, c.Status, c.Raw, b.Status, b.Raw)
			}
		}(i)
	}
	wg.Wait()
	rep := settle(t, h.a, "cr", ids, 30*time.Second)
	if rep.LiveOrders != 0 || rep.DBStock != 300 || rep.RedisAvailable != 300 {
		t.Fatalf("after cancelling everything: %+v", rep)
	}
}

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
// order ends cancelled, and all the stock comes back.
func TestCancelRightAfterBuying(t *testing.T) {
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
			b := h.buy(user, "cr", 1, "")
			if b.Status != http.StatusAccepted {
				t.Errorf("buy: %d %s", b.Status, b.Raw)
				return
			}
			id := b.str("order_id")
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
			c := h.do(http.MethodPost, "/api/v1/orders/"+id+"/cancel", "", "Authorization: Bearer "+userToken(t, user))
			if c.Status != http.StatusOK && c.Status != http.StatusAccepted {
				t.Errorf("cancel %s: %d %s", id, c.Status, c.Raw)
			}
		}(i)
	}
	wg.Wait()
	rep := settle(t, h.a, "cr", ids, 30*time.Second)
	if rep.LiveOrders != 0 || rep.DBStock != 300 || rep.RedisAvailable != 300 {
		t.Fatalf("after cancelling everything: %+v", rep)
	}
}

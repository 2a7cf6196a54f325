package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestServeNATSCluster runs serve on a 3-node JetStream cluster with
// FLASHSALE_NATS_REPLICAS=3: with one node shut down, purchases are still
// accepted, applied and checked.
func TestServeNATSCluster(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	nc := testenv.StartNATSCluster(t, 3)
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_NATS_URL", nc.URL, "FLASHSALE_NATS_REPLICAS", "3"))
	const sku = "NC"
	h.mustPutSKU(sku, 1000, 5)
	var accepted []string
	buy := func(user string) {
		t.Helper()
		r := h.buy(user, sku, 1, "")
		if r.Status != http.StatusAccepted {
			t.Fatalf("buy: %d %s", r.Status, r.Raw)
		}
		accepted = append(accepted, r.str("order_id"))
	}
	for i := range 20 {
		buy(fmt.Sprintf("a%d", i))
	}
	nc.WaitCurrent(orderqueue.StreamName, orderqueue.DeadLetterStream, orderqueue.EventStream)
	nc.Servers[0].Shutdown()
	for i := range 20 {
		buy(fmt.Sprintf("b%d", i))
	}
	settle(t, h.a, sku, accepted, 60*time.Second)
}

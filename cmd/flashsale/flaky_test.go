package main

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestDatabaseFlakyNetwork: the database is up, but 5% of the chunks of
// bytes between flashsale and it are reset (RST) while buyers buy. Resets,
// timeouts and broken transactions are transient: no message is
// dead-lettered, the consumer keeps retrying until each is applied, and
// every 202 ends as exactly one order with every invariant holding.
func TestDatabaseFlakyNetwork(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel() // its own database (through its own proxy), prefix and JetStream
	db := testenv.Database(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	px := testenv.StartProxy(t, u.Host)
	u.Host = px.Addr()
	cfg := testConfig(t, "external", "FLASHSALE_DATABASE_URL", u.String(), "FLASHSALE_APPLY_BACKOFF", "100ms,200ms,400ms")
	h := newHarness(t, cfg)
	h.mustPutSKU("f", 400, 1)

	px.Flaky(0.05)
	hs := runBuyers(t, h, "f", 800, 200, 16)
	// Let the consumer work through its retries on the flaky network.
	time.Sleep(5 * time.Second)
	px.Restore()

	admin := "Authorization: Bearer " + testAdmin
	list := h.do(http.MethodGet, "/admin/v1/dlq", "", admin)
	if list.Status != http.StatusOK || list.Body["count"] != float64(0) {
		t.Fatalf("dead letters after a flaky network: %d %s", list.Status, list.Raw)
	}
	rep := settle(t, h.a, "f", hs.ids(), 60*time.Second)
	if extra := rep.Orders - int64(len(hs.ids())); extra < 0 || extra > int64(hs.unknown()) || rep.FailedOrders != 0 {
		t.Fatalf("%d orders (%d failed) for %d accepted and %d unknown answers: %+v", rep.Orders, rep.FailedOrders, len(hs.ids()), hs.unknown(), rep)
	}
	t.Logf("%d accepted, %d orders; codes %v", len(hs.ids()), rep.Orders, hs.codes)
}

package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReconcileDrift: drift injected into Redis behind the service's back
// while idle is detected; after the second pass a small one is corrected
// (with an audit row) and a large one is alerted (webhook, metric) and left.
func TestReconcileDrift(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var alerts []map[string]any
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		_ = json.NewDecoder(r.Body).Decode(&m)
		mu.Lock()
		alerts = append(alerts, m)
		mu.Unlock()
	}))
	defer hook.Close()
	h := newHarness(t, testConfig(t, "external", "FLASHSALE_ALERT_WEBHOOK_URL", hook.URL))
	h.mustPutSKU("rc", 20, 1)
	var ids []string
	for _, u := range []string{"a", "b", "c"} {
		ids = append(ids, h.buy(u, "rc", 1, "").str("order_id"))
	}
	settle(t, h.a, "rc", ids, 10*time.Second)
	ctx := context.Background()
	c := h.a.redis
	meta := h.a.gate.KeysOf("rc").Meta
	pass := func() string {
		t.Helper()
		var out strings.Builder
		env := func(k string) string {
			return map[string]string{"FLASHSALE_URL": h.srvURL, "FLASHSALE_ADMIN_TOKEN": testAdmin}[k]
		}
		if err := run(ctx, []string{"reconcile", "-json"}, env, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		var rep struct {
			SKUs []struct {
				SKU    string `json:"sku_id"`
				Drift  int64  `json:"drift"`
				Action string `json:"action"`
			} `json:"skus"`
		}
		if err := json.Unmarshal([]byte(out.String()), &rep); err != nil || len(rep.SKUs) != 1 {
			t.Fatalf("report %s: %v", out.String(), err)
		}
		return rep.SKUs[0].Action
	}
	if a := pass(); a != "ok" {
		t.Fatalf("clean sale: %s", a)
	}
	// Small drift: two extra units appear in Redis.
	if err := c.Do(ctx, c.B().Hincrby().Key(meta).Field("avail").Increment(2).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if a := pass(); a != "watch" {
		t.Fatalf("first sighting: %s", a)
	}
	if a := pass(); a != "corrected" {
		t.Fatalf("second sighting: %s", a)
	}
	rep := settle(t, h.a, "rc", ids, 5*time.Second)
	if rep.RedisAvailable != 17 {
		t.Fatalf("after correction: %+v", rep)
	}
	es, err := h.a.store.Audit(ctx, "rc", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range es {
		if e.Store == "redis" && e.Reason == "reconcile_correction" && e.Delta == -2 {
			found = true
		}
	}
	if !found {
		t.Fatalf("no redis audit row for the correction: %+v", es)
	}
	// Large undersell: ten units vanish from Redis. Corrected on its own:
	// it can only put back units the database has.
	if err := c.Do(ctx, c.B().Hincrby().Key(meta).Field("avail").Increment(-10).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	pass()
	if a := pass(); a != "corrected" {
		t.Fatalf("large undersell: %s", a)
	}
	if n, _, _ := h.a.gate.Available(ctx, "rc"); n != 17 {
		t.Fatalf("large undersell not corrected: available %d", n)
	}
	// Large over-admission: ten units appear in Redis. Alerted, left alone.
	if err := c.Do(ctx, c.B().Hincrby().Key(meta).Field("avail").Increment(10).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	pass()
	if a := pass(); a != "alert" {
		t.Fatalf("large drift: %s", a)
	}
	if n, _, _ := h.a.gate.Available(ctx, "rc"); n != 27 {
		t.Fatalf("large drift was touched: available %d", n)
	}
	mu.Lock()
	got := len(alerts)
	mu.Unlock()
	if got != 1 || alerts[0]["sku_id"] != "rc" || alerts[0]["drift"] != float64(10) {
		t.Fatalf("webhook alerts %v", alerts)
	}
	m := h.do(http.MethodGet, "/metrics", "")
	if !strings.Contains(m.Raw, "flashsale_reconcile_alerts_total 1") || !strings.Contains(m.Raw, `flashsale_reconcile_drift_units{sku_id="rc"} 10`) {
		t.Fatalf("metrics lack the alert:\n%s", m.Raw)
	}
}

// TestReconcileDuringSale: the reconciler running every 100 ms during a
// 2,000-buyer sale never causes oversell, and finds nothing to correct.
func TestReconcileDuringSale(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	h := newHarness(t, testConfig(t, "external", "FLASHSALE_RECONCILE_EVERY", "100ms"))
	h.mustPutSKU("rs", 300, 1)
	hs := runBuyers(t, h, "rs", 2000, 2000, 64)
	checkSoldExactly(t, h, "rs", hs, 300)
	if last := h.a.reconciler.Last(); last == nil {
		t.Fatal("the reconciler never ran")
	}
	es, _ := h.a.store.Audit(context.Background(), "rs", 0, 10000)
	for _, e := range es {
		if e.Store == "redis" {
			t.Errorf("reconciler changed redis during a clean sale: %+v", e)
		}
	}
}

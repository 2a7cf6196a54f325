package main

import (
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// metricValue returns the value of the first sample of metric matching the
// labels regexp (or -1 when absent).
func metricValue(body, metric, labels string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(metric) + `(\{[^}]*` + labels + `[^}]*\})? ([0-9.eE+-]+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[2], 64)
	return v
}

// TestMetricsMove: the metrics the operators' alerts and dashboards use
// exist and move during a sale.
func TestMetricsMove(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("m", 50, 1)
	before := h.do(http.MethodGet, "/metrics", "").Raw
	hs := runBuyers(t, h, "m", 200, 1000, 32)
	settle(t, h.a, "m", hs.ids(), 20*time.Second)
	after := h.do(http.MethodGet, "/metrics", "").Raw

	moved := []struct{ metric, labels string }{
		{"flashsale_purchases_total", `outcome="accepted"`},
		{"flashsale_purchases_total", `outcome="sold_out"`},
		{"flashsale_http_request_duration_seconds_count", `route="POST /api/v1/orders"`},
		{"flashsale_gate_duration_seconds_count", ``},
		{"flashsale_apply_batch_size_count", ``},
		{"flashsale_apply_batch_duration_seconds_count", ``},
		{"flashsale_apply_reservations_total", `result="applied"`},
	}
	for _, m := range moved {
		b, a := metricValue(before, m.metric, m.labels), metricValue(after, m.metric, m.labels)
		if a <= 0 || a <= b {
			t.Errorf("%s{%s}: %v before, %v after: did not move", m.metric, m.labels, b, a)
		}
	}
	present := []struct {
		metric, labels string
		want           float64
	}{
		{"flashsale_stock_units", `sku_id="m",store="db"`, 0},
		{"flashsale_stock_units", `sku_id="m",store="redis"`, 0},
		{"flashsale_in_flight_units", `sku_id="m"`, 0},
		{"flashsale_outbox_entries", `sku_id="m"`, 0},
		{"flashsale_queue_pending_messages", ``, 0},
		{"flashsale_queue_ack_pending_messages", ``, 0},
		{"flashsale_dead_letters_pending", ``, 0},
		{"flashsale_breaker_state", `state="closed"`, 1},
		{"flashsale_db_pool_connections", `state="max"`, 16},
	}
	for _, m := range present {
		if got := metricValue(after, m.metric, m.labels); got != m.want {
			t.Errorf("%s{%s} = %v, want %v", m.metric, m.labels, got, m.want)
		}
	}
	if v := metricValue(before, "flashsale_stock_units", `sku_id="m",store="redis"`); v != 50 {
		t.Errorf("redis stock before the sale: %v, want 50", v)
	}
}

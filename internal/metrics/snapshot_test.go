package metrics_test

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/internal/metrics"
)

func TestSnapshot(t *testing.T) {
	m := metrics.New()
	for range 3 {
		m.Purchase("accepted")
	}
	m.Purchase("sold_out")
	m.Batch(4, 3, 1, 0, time.Millisecond, nil)
	m.DeadLettered()
	const route = "POST /api/v1/orders"
	m.HTTP(route, 202, 700*time.Microsecond)      // <= 1ms
	m.HTTP(route, 409, 800*time.Microsecond)      // <= 1ms, another status: merged
	m.HTTP(route, 202, 20*time.Millisecond)       // <= 25ms
	m.HTTP(route, 202, 5*time.Second)             // above the last bound
	m.HTTP("GET /healthz", 200, time.Millisecond) // another route

	s := m.Snapshot()
	if diff := cmp.Diff(map[string]uint64{"accepted": 3, "sold_out": 1}, s.Purchases); diff != "" {
		t.Errorf("purchases (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]uint64{"applied": 3, "refused": 1, "duplicate": 0}, s.Applied); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	if s.DeadLettered != 1 || s.BatchErrors != 0 {
		t.Errorf("dead lettered %d, batch errors %d; want 1, 0", s.DeadLettered, s.BatchErrors)
	}
	h := s.Latency[route]
	if h.Count != 4 || len(h.Buckets) != 12 {
		t.Fatalf("orders latency: count %d, %d buckets; want 4, 12", h.Count, len(h.Buckets))
	}
	if got := h.Buckets[1]; got.LE != .001 || got.Count != 2 {
		t.Errorf("bucket le=0.001: %+v, want 2 observations", got)
	}
	if got := h.Buckets[len(h.Buckets)-1].Count; got != 3 {
		t.Errorf("last finite bucket: %d, want 3 (one is above it)", got)
	}
	if got := s.Latency["GET /healthz"].Count; got != 1 {
		t.Errorf("healthz count %d, want 1", got)
	}
}

func TestQuantile(t *testing.T) {
	h := metrics.Histogram{Count: 10, Buckets: []metrics.Bucket{{LE: .001, Count: 5}, {LE: .01, Count: 9}, {LE: .1, Count: 9}}}
	for _, tc := range []struct {
		q, want float64
	}{
		{0, 0},
		{.5, .001},            // rank 5: top of the first bucket
		{.25, .0005},          // halfway through the first bucket
		{.7, .001 + .009*2/4}, // rank 7: 2 of the 4 in (1ms, 10ms]
		{.99, .1},             // rank 9.9: above every bound
		{1, .1},
	} {
		got, ok := h.Quantile(tc.q)
		if !ok || math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Quantile(%v) = %v, %v; want %v", tc.q, got, ok, tc.want)
		}
	}
	if _, ok := (metrics.Histogram{}).Quantile(.5); ok {
		t.Error("empty histogram: ok")
	}
}

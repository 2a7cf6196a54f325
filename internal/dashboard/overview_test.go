package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/dashboard"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

var errDown = errors.New("down")

type fakeDB struct {
	skus []sale.SKU
	err  error
}

func (d fakeDB) SKUs(context.Context) ([]sale.SKU, error) { return d.skus, d.err }
func (d fakeDB) Dialect() orderstore.Dialect              { return orderstore.Postgres }
func (d fakeDB) Stats() orderstore.PoolStats {
	return orderstore.PoolStats{Max: 10, Total: 4, Idle: 3, InUse: 1, Waits: 7}
}

type fakeCatalog []sale.SKU

func (c fakeCatalog) All() []sale.SKU { return append([]sale.SKU(nil), c...) }

type fakeGate struct {
	gauges  map[string]stockgate.Gauges
	buckets map[string][]stockgate.BucketState // by the first bucket's name
	oldest  map[string]time.Time
	err     error
}

func (g fakeGate) Available(_ context.Context, sku string) (int64, bool, error) {
	gs, ok := g.gauges[sku]
	return gs.Available, ok && gs.Loaded, g.err
}

func (g fakeGate) ReadGauges(_ context.Context, sku string) (stockgate.Gauges, error) {
	return g.gauges[sku], g.err
}

func (g fakeGate) ReadBuckets(_ context.Context, names []string, _ bool) ([]stockgate.BucketState, error) {
	return g.buckets[names[0]], g.err
}

func (g fakeGate) SKUs(context.Context) ([]string, error) {
	var out []string
	for sku := range g.gauges {
		out = append(out, sku)
	}
	return out, g.err
}

func (g fakeGate) OldestInFlight(_ context.Context, sku string) (time.Time, bool, error) {
	t, ok := g.oldest[sku]
	return t, ok, g.err
}

type fakeQueue struct{ err error }

func (q fakeQueue) Stats(context.Context) (orderqueue.Stats, error) {
	return orderqueue.Stats{Messages: 9, Pending: 4, AckPending: 2}, q.err
}
func (q fakeQueue) DeadLetterCount(context.Context) (uint64, error) { return 1, q.err }

// body is the part of the overview's JSON the tests read.
type body struct {
	Sales []struct {
		SKU             string  `json:"sku_id"`
		State           string  `json:"state"`
		DBStock         int64   `json:"db_stock"`
		RedisLoaded     *bool   `json:"redis_loaded"`
		RedisAvailable  *int64  `json:"redis_available"`
		InFlightUnits   *int64  `json:"in_flight_units"`
		Outbox          *int64  `json:"outbox"`
		Buckets         int     `json:"buckets"`
		BucketAvailable []int64 `json:"bucket_available"`
	} `json:"sales"`
	MoreSales int `json:"more_sales"`
	Pipeline  struct {
		QueuePending *uint64 `json:"queue_pending"`
		DeadLetters  *uint64 `json:"dead_letters"`
		Breaker      string  `json:"breaker"`
		// DatabaseOutage is a pointer: null and absent differ for the page.
		DatabaseOutage *struct {
			Since  time.Time `json:"since"`
			Reason string    `json:"reason"`
		} `json:"database_outage"`
	} `json:"pipeline"`
	Counters struct {
		Purchases    map[string]uint64 `json:"purchases"`
		OrderLatency struct {
			Buckets []any `json:"buckets"`
		} `json:"order_latency"`
	} `json:"counters"`
	History *json.RawMessage  `json:"history"`
	Errors  map[string]string `json:"errors"`
}

func readOverview(t *testing.T, l *dashboard.Live) body {
	t.Helper()
	v, err := l.Overview(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out body
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func testSales(now time.Time) []sale.SKU {
	return []sale.SKU{
		{ID: "a", TotalStock: 10, Stock: 8, PerUserLimit: 2, UpdatedAt: now.Add(-2 * time.Minute)},
		{ID: "b", TotalStock: 10, Stock: 0, PerUserLimit: 2, UpdatedAt: now.Add(-time.Minute), Buckets: 2},
		{ID: "ended-long-ago", TotalStock: 1, Stock: 1, EndsAt: now.Add(-2 * time.Hour), UpdatedAt: now},
		{ID: "upcoming", TotalStock: 1, Stock: 1, StartsAt: now.Add(time.Hour), UpdatedAt: now.Add(-3 * time.Minute)},
	}
}

func testLive(now time.Time) *dashboard.Live {
	m := metrics.New()
	m.Purchase("accepted")
	return &dashboard.Live{
		DB:      fakeDB{skus: testSales(now)},
		Catalog: fakeCatalog(testSales(now)),
		Gate: fakeGate{
			gauges: map[string]stockgate.Gauges{
				"a": {Loaded: true, Available: 3, InFlight: 1, Units: 2, Outbox: 1},
				"b": {Loaded: true, Available: 0},
			},
			buckets: map[string][]stockgate.BucketState{"b": {{Avail: 1, Debt: 1}, {Avail: 0}}},
			oldest:  map[string]time.Time{"a": now.Add(-3 * time.Second)},
		},
		Queue:   fakeQueue{},
		Breaker: func() string { return "closed" },
		History: dashboard.NewHistory(4),
		Metrics: m,
	}
}

// TestOverview: the sales not ended over an hour ago, most recently changed
// first, with the gate's figures; the pipeline; the counters.
func TestOverview(t *testing.T) {
	ov := readOverview(t, testLive(time.Now()))
	type row struct {
		SKU, State      string
		Avail, Units    *int64
		Buckets         int
		BucketAvailable []int64
	}
	var got []row
	for _, s := range ov.Sales {
		got = append(got, row{s.SKU, s.State, s.RedisAvailable, s.InFlightUnits, s.Buckets, s.BucketAvailable})
	}
	n := func(v int64) *int64 { return &v }
	want := []row{
		{"b", "sold_out", n(0), n(0), 2, []int64{0, 0}},
		{"a", "on_sale", n(3), n(2), 1, nil},
		{"upcoming", "upcoming", nil, n(0), 1, nil}, // not loaded: no available units
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sales (-want +got):\n%s", diff)
	}
	if ov.Errors != nil {
		t.Errorf("errors %v, want none", ov.Errors)
	}
	if p := ov.Pipeline; p.QueuePending == nil || *p.QueuePending != 4 || p.DeadLetters == nil || *p.DeadLetters != 1 || p.Breaker != "closed" {
		t.Errorf("pipeline %+v", p)
	}
	if ov.Counters.Purchases["accepted"] != 1 || ov.Counters.OrderLatency.Buckets == nil {
		t.Errorf("counters %+v, want 1 accepted and latency buckets [] (not null)", ov.Counters)
	}
	if ov.History == nil {
		t.Error("history null, want the samples")
	}
}

// TestOverviewDatabaseOutage: while the consumer holds batches for a
// database that refuses writes, the pipeline says since when and why; null
// otherwise.
func TestOverviewDatabaseOutage(t *testing.T) {
	l := testLive(time.Now())
	if ov := readOverview(t, l); ov.Pipeline.DatabaseOutage != nil {
		t.Errorf("no Outage source: database_outage %+v, want null", ov.Pipeline.DatabaseOutage)
	}
	since := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	held := true
	l.Outage = func() (time.Time, string, bool) { return since, "the database refuses writes", held }
	ov := readOverview(t, l)
	if o := ov.Pipeline.DatabaseOutage; o == nil || !o.Since.Equal(since) || o.Reason != "the database refuses writes" {
		t.Errorf("during the outage: database_outage %+v, want since %v with the reason", o, since)
	}
	held = false
	if ov := readOverview(t, l); ov.Pipeline.DatabaseOutage != nil {
		t.Errorf("after the outage: database_outage %+v, want null", ov.Pipeline.DatabaseOutage)
	}
}

// TestOverviewSourcesDown: a source that fails leaves its figures null and
// is named in errors; the catalog stands in for the database's sales.
func TestOverviewSourcesDown(t *testing.T) {
	l := testLive(time.Now())
	l.DB = fakeDB{err: errDown}
	l.Gate = fakeGate{err: errDown}
	l.Queue = fakeQueue{err: errDown}
	ov := readOverview(t, l)
	if diff := cmp.Diff(map[string]string{"postgres": "down", "redis": "down", "jetstream": "down"}, ov.Errors); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	if len(ov.Sales) != 3 || ov.Sales[0].SKU != "b" {
		t.Fatalf("sales %+v, want the catalog's 3 listed", ov.Sales)
	}
	for _, s := range ov.Sales {
		if s.RedisLoaded != nil || s.RedisAvailable != nil || s.Outbox != nil {
			t.Errorf("%s: gate figures %+v, want null", s.SKU, s)
		}
	}
	if ov.Pipeline.QueuePending != nil || ov.Pipeline.DeadLetters != nil {
		t.Errorf("pipeline %+v, want null figures", ov.Pipeline)
	}
}

// TestOverviewMoreSales: at most 50 sales are listed, the rest counted.
func TestOverviewMoreSales(t *testing.T) {
	now := time.Now()
	var skus []sale.SKU
	for i := range 53 {
		skus = append(skus, sale.SKU{ID: string(rune('a'+i%26)) + string(rune('a'+i/26)), UpdatedAt: now})
	}
	l := testLive(now)
	l.DB = fakeDB{skus: skus}
	ov := readOverview(t, l)
	if len(ov.Sales) != 50 || ov.MoreSales != 3 {
		t.Errorf("%d sales, %d more; want 50 and 3", len(ov.Sales), ov.MoreSales)
	}
}

// TestCollector: the live state as gauges, from the same sources.
func TestCollector(t *testing.T) {
	r := prometheus.NewPedanticRegistry()
	r.MustRegister(testLive(time.Now()).Collector())
	fams, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			got[f.GetName()] += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"flashsale_db_pool_connections":          10 + 4 + 3 + 1,
		"flashsale_db_pool_empty_acquires_total": 7,
		"flashsale_queue_pending_messages":       4,
		"flashsale_queue_ack_pending_messages":   2,
		"flashsale_dead_letters_pending":         1,
		"flashsale_stock_units":                  8 + 3 + 0 + 0 + 1, // db and redis of a and b, db of upcoming
		"flashsale_in_flight_units":              2,
		"flashsale_outbox_entries":               1,
		"flashsale_stream_publish_failing":       0,
	}
	age, ok := got["flashsale_inflight_oldest_age_seconds"]
	if !ok || age < 3 || age > 60 {
		t.Errorf("oldest age %v (exported %v), want about 3 s", age, ok)
	}
	delete(got, "flashsale_inflight_oldest_age_seconds")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sums of the series (-want +got):\n%s", diff)
	}
}

// TestPublishFailing: a stream that acknowledges no publish shows on the
// overview (stream_publish "failing" and why) and as the gauge
// flashsale_stream_publish_failing 1.
func TestPublishFailing(t *testing.T) {
	l := testLive(time.Now())
	l.Publish = func() error { return errors.New("store: no space left on device") }
	v, err := l.Overview(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	var ov struct {
		Pipeline struct {
			StreamPublish      string `json:"stream_publish"`
			StreamPublishError string `json:"stream_publish_error"`
		} `json:"pipeline"`
	}
	if err := json.Unmarshal(b, &ov); err != nil {
		t.Fatal(err)
	}
	if ov.Pipeline.StreamPublish != "failing" || !strings.Contains(ov.Pipeline.StreamPublishError, "no space") {
		t.Errorf("pipeline: %+v", ov.Pipeline)
	}
	r := prometheus.NewPedanticRegistry()
	r.MustRegister(l.Collector())
	fams, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "flashsale_stream_publish_failing" {
			if v := f.GetMetric()[0].GetGauge().GetValue(); v != 1 {
				t.Errorf("flashsale_stream_publish_failing %v, want 1", v)
			}
			return
		}
	}
	t.Error("flashsale_stream_publish_failing not exported")
}

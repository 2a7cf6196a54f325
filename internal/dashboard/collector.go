package dashboard

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stateCollector exports, on each scrape, the live state the dashboard
// shows: queue backlog, outbox, dead letters, per-SKU stock in Redis and in
// the database (sales listed by the overview: active ones and those ended
// within the hour), and the database pool. Reads are bounded by a timeout;
// a figure that cannot be read is left out of that scrape.
type stateCollector struct{ l *Live }

var (
	descQueuePending = prometheus.NewDesc("flashsale_queue_pending_messages", "Messages of the order stream not yet delivered to the consumer (a reservation each; several with order-schema 2).", nil, nil)
	descAckPending   = prometheus.NewDesc("flashsale_queue_ack_pending_messages", "Messages of the order stream delivered to the consumer and not yet acknowledged (a reservation each; several with order-schema 2).", nil, nil)
	descDeadLetters  = prometheus.NewDesc("flashsale_dead_letters_pending", "Reservations waiting in the dead-letter stream for an operator.", nil, nil)
	descOutbox       = prometheus.NewDesc("flashsale_outbox_entries", "Reservations in the Redis outbox not yet acknowledged by the stream, per SKU.", []string{"sku_id"}, nil)
	descStock        = prometheus.NewDesc("flashsale_stock_units", "Stock per SKU: store=redis is what the gate will still sell, store=db the database stock.", []string{"sku_id", "store"}, nil)
	descInFlight     = prometheus.NewDesc("flashsale_in_flight_units", "Units reserved by the gate and not yet decided by the database, per SKU.", []string{"sku_id"}, nil)
	descPool         = prometheus.NewDesc("flashsale_db_pool_connections", "Database pool connections by state (acquired, idle, total, max).", []string{"state"}, nil)
	descOldest       = prometheus.NewDesc("flashsale_inflight_oldest_age_seconds", "Age of the oldest reservation in flight (accepted, not yet decided by the database), over every loaded SKU; 0 when none is.", nil, nil)
	descPubFailing   = prometheus.NewDesc("flashsale_stream_publish_failing", "1 while the order stream acknowledges no publish (a full disk under its store, a stream that cannot store): accepted purchases wait in the Redis outbox.", nil, nil)
	descPoolWaits    = prometheus.NewDesc("flashsale_db_pool_empty_acquires_total", "Acquires that had to wait for a connection.", nil, nil)
)

// Collector returns the Prometheus collector of the live state: the
// queue's backlog, the outbox, the dead letters, each listed sale's stock
// and units in flight, the age of the oldest reservation in flight and the
// database pool, read from l's sources on each scrape. Its Describe reads
// nothing, so the collector of a zero Live lists the series exported.
func (l *Live) Collector() prometheus.Collector { return stateCollector{l} }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueuePending, descAckPending, descDeadLetters, descOutbox, descStock, descInFlight, descOldest, descPool, descPoolWaits, descPubFailing} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	st := c.l.DB.Stats()
	gauge(descPool, float64(st.InUse), "acquired")
	gauge(descPool, float64(st.Idle), "idle")
	gauge(descPool, float64(st.Total), "total")
	gauge(descPool, float64(st.Max), "max")
	ch <- prometheus.MustNewConstMetric(descPoolWaits, prometheus.CounterValue, float64(st.Waits))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if age, ok := c.oldestInFlight(ctx, time.Now()); ok {
		gauge(descOldest, age.Seconds())
	}
	ov, _ := c.l.overview(ctx)
	if p := ov.Pipeline; p.QueuePending != nil {
		gauge(descQueuePending, float64(*p.QueuePending))
	}
	if p := ov.Pipeline; p.QueueAckPending != nil {
		gauge(descAckPending, float64(*p.QueueAckPending))
	}
	failing := 0.0
	if ov.Pipeline.StreamPublish == "failing" {
		failing = 1
	}
	gauge(descPubFailing, failing)
	if p := ov.Pipeline; p.DeadLetters != nil {
		gauge(descDeadLetters, float64(*p.DeadLetters))
	}
	for _, s := range ov.Sales {
		gauge(descStock, float64(s.DBStock), s.SKU, "db")
		if s.RedisLoaded != nil && *s.RedisLoaded && s.RedisAvailable != nil {
			gauge(descStock, float64(*s.RedisAvailable), s.SKU, "redis")
		}
		if s.InFlightUnits != nil {
			gauge(descInFlight, float64(*s.InFlightUnits), s.SKU)
		}
		if s.Outbox != nil {
			gauge(descOutbox, float64(*s.Outbox), s.SKU)
		}
	}
}

// oldestInFlight returns the age of the oldest reservation in flight over
// every loaded SKU: two first elements of sorted sets per SKU.
func (c stateCollector) oldestInFlight(ctx context.Context, now time.Time) (time.Duration, bool) {
	skus, err := c.l.Gate.SKUs(ctx)
	if err != nil {
		return 0, false
	}
	var age time.Duration
	for _, sku := range skus {
		t, ok, err := c.l.Gate.OldestInFlight(ctx, sku)
		if err != nil {
			return 0, false
		}
		if ok {
			age = max(age, now.Sub(t))
		}
	}
	return age, true
}

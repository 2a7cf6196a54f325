// Package metrics defines flashsale's Prometheus metrics. Label values are
// routes and outcomes, never user ids.
package metrics

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/buildinfo"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds every collector; create one per process with New.
type Metrics struct {
	Registry *prometheus.Registry

	purchases    *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	batchSize    prometheus.Histogram
	batchTime    prometheus.Histogram
	applied      *prometheus.CounterVec
	batchErrors  prometheus.Counter
	deadLetters  prometheus.Counter
	// unknownVersion: no labels (the version is in the consumer's log).
	unknownVersion prometheus.Counter
	orderSchema    prometheus.Gauge
	breaker        *prometheus.GaugeVec
	breakerTrans   *prometheus.CounterVec
	drift          *prometheus.GaugeVec
	alerts         prometheus.Counter
	gate           prometheus.Histogram
	shadow         *prometheus.CounterVec
	shadowDropped  prometheus.Counter
	shadowSame     prometheus.Counter
	group          *prometheus.GaugeVec
	challenges     *prometheus.CounterVec
	roomEvents     *prometheus.CounterVec
	roomEtaError   prometheus.Histogram
	ticketsRefused *prometheus.CounterVec

	// The series of purchases and httpDuration once used, by label
	// values: a request finds its own without hashing its labels and
	// formatting its status code again (the vectors' children are never
	// deleted, so a series found stays the one exposed).
	purchaseSeries sync.Map // outcome -> prometheus.Counter
	httpSeries     sync.Map // httpKey -> prometheus.Observer
}

type httpKey struct {
	route  string
	status int
}

// New registers the metrics on a fresh registry (plus Go and process collectors).
func New() *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		Registry: r,
		purchases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_purchases_total", Help: "Purchase requests by outcome (accepted, sold_out, limit_reached, unknown_sku, not_open, invalid, busy, rate_limited, ticket_required, not_admitted, blocked, error).",
		}, []string{"outcome"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flashsale_http_request_duration_seconds", Help: "HTTP request latency by route and status code.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route", "code"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_apply_batch_size", Help: "Reservations per database transaction of the consumer.",
			Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000},
		}),
		batchTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_apply_batch_duration_seconds", Help: "Time to apply one batch: transaction plus gate update.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_apply_reservations_total", Help: "Reservations decided by the consumer: applied, refused (compensated), duplicate.",
		}, []string{"result"}),
		batchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_apply_batch_errors_total", Help: "Batches that failed and were handed back to the queue for redelivery.",
		}),
	}
	m.deadLetters = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_dead_letters_total", Help: "Reservations moved to the dead-letter stream.",
	})
	m.breaker = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "flashsale_breaker_state", Help: "1 for the current state of the Redis circuit breaker (closed, half-open, open).",
	}, []string{"state"})
	m.breakerTrans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_breaker_transitions_total", Help: "Redis circuit breaker state changes, by new state.",
	}, []string{"to"})
	m.drift = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "flashsale_reconcile_drift_units", Help: "Units of Redis/database difference that in-flight work does not explain, at the last reconcile pass.",
	}, []string{"sku_id"})
	m.alerts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_reconcile_alerts_total", Help: "Reconcile passes that found a large drift and left it for an operator.",
	})
	m.gate = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "flashsale_gate_duration_seconds", Help: "Latency of one Redis gate call (the reserve script).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	})
	m.unknownVersion = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_messages_unknown_version_total",
		Help: "Deliveries of stream messages whose schema version this release does not know, left (nak'ed with a delay) for an instance that knows it; growing while any waits.",
	})
	r.MustRegister(m.unknownVersion)
	m.orderSchema = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flashsale_order_schema_published",
		Help: "Schema version of the reservations this instance publishes on the order stream now: 1, or 2 (several per message) while FLASHSALE_ORDER_SCHEMA=2 and every instance reads it.",
	})
	m.orderSchema.Set(1)
	r.MustRegister(m.orderSchema)
	m.shadow = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_shadow_decisions_total",
		Help: "Live gate decisions this instance's shadow replayed with its own reserve script, by result: match or mismatch (FLASHSALE_SHADOW_SKUS).",
	}, []string{"result"})
	m.shadowDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_shadow_dropped_total",
		Help: "Live gate decisions the shadow did not compare: over FLASHSALE_SHADOW_RATE, trimmed from the journal before it was read, or a failed comparison.",
	})
	m.shadowSame = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_shadow_same_script_total",
		Help: "Live gate decisions the shadow did not compare because a script identical to its candidate made them (its own instance's purchases, or a group running the same build).",
	})
	m.group = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "flashsale_release_group", Help: "Always 1; the label is the group this instance serves in during a release (FLASHSALE_RELEASE_GROUP: stable or canary).",
	}, []string{"group"})
	r.MustRegister(m.shadow, m.shadowDropped, m.shadowSame, m.group)
	m.challenges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_challenges_total",
		Help: "Proof-of-work challenges by result: issued (handed out), solved (redeemed for a ticket) or refused (a solution refused; flashsale_tickets_refused_total says why).",
	}, []string{"result"})
	m.ticketsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_tickets_refused_total",
		Help: "Solutions refused a ticket, by reason (the API's error code); purchases refused for want of a ticket or an admission are flashsale_purchases_total's ticket_required and not_admitted.",
	}, []string{"reason"})
	for _, r := range []string{"issued", "solved", "refused"} {
		m.challenges.WithLabelValues(r)
	}
	r.MustRegister(m.challenges, m.ticketsRefused)
	m.roomEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_room_events_total",
		Help: "Waiting-room events by kind: joined, polled, admitted (buyers let through), sold_out (answers that the stock is gone).",
	}, []string{"event"})
	m.roomEtaError = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "flashsale_room_eta_error_seconds", Help: "How far a buyer's admission came from the time predicted when the buyer joined (absolute, either way).",
		Buckets: []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300},
	})
	for _, e := range []string{"joined", "polled", "admitted", "sold_out"} {
		m.roomEvents.WithLabelValues(e)
	}
	r.MustRegister(m.roomEvents, m.roomEtaError)
	r.MustRegister(m.deadLetters, m.breaker, m.breakerTrans, m.drift, m.alerts, m.gate)
	bi := buildinfo.Get()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "flashsale_build_info", Help: "Always 1; the labels name the running build: module version, VCS commit, Go version (\"devel\"/\"unknown\" when the build was not stamped).",
	}, []string{"version", "commit", "goversion"})
	build.WithLabelValues(bi.Version, bi.Commit, bi.GoVersion).Set(1)
	r.MustRegister(build)
	r.MustRegister(m.purchases, m.httpDuration, m.batchSize, m.batchTime, m.applied, m.batchErrors)
	return m
}

// Purchase counts one purchase decision.
func (m *Metrics) Purchase(outcome string) {
	if c, ok := m.purchaseSeries.Load(outcome); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := m.purchases.WithLabelValues(outcome)
	m.purchaseSeries.Store(outcome, c)
	c.Inc()
}

// HTTP records one request.
func (m *Metrics) HTTP(route string, status int, d time.Duration) {
	k := httpKey{route, status}
	if o, ok := m.httpSeries.Load(k); ok {
		o.(prometheus.Observer).Observe(d.Seconds())
		return
	}
	o := m.httpDuration.WithLabelValues(route, strconv.Itoa(status))
	m.httpSeries.Store(k, o)
	o.Observe(d.Seconds())
}

// Batch records one consumer batch.
func (m *Metrics) Batch(size, applied, refused, dups int, d time.Duration, err error) {
	m.batchSize.Observe(float64(size))
	m.batchTime.Observe(d.Seconds())
	if err != nil {
		m.batchErrors.Inc()
		return
	}
	m.applied.WithLabelValues("applied").Add(float64(applied))
	m.applied.WithLabelValues("refused").Add(float64(refused))
	m.applied.WithLabelValues("duplicate").Add(float64(dups))
}

// DeadLettered counts one dead-lettered reservation.
func (m *Metrics) DeadLettered() { m.deadLetters.Inc() }

// WatchSoldLeases exports the sold-out lease this instance answers from
// now (0: leases off; purchase.Service.SoldLeaseInUse) and how many keyed
// sold-out answers it gave from a lease's snapshot (SoldOutFromLease).
func (m *Metrics) WatchSoldLeases(inUse func() time.Duration, answered func() int64) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashsale_sold_out_lease_seconds",
			Help: "Length of the sold-out lease this instance answers keyed sold-out purchases from now: FLASHSALE_SOLD_OUT_LEASE while every instance honours leases, 0 otherwise.",
		}, func() float64 { return inUse().Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "flashsale_sold_out_from_lease_total",
			Help: "Keyed purchases answered sold_out from a sold-out lease's snapshot of the sale's key holders, without a Redis read.",
		}, func() float64 { return float64(answered()) }),
	)
}

// OrderSchema records the schema version this instance publishes on the order stream.
func (m *Metrics) OrderSchema(v int) { m.orderSchema.Set(float64(v)) }

// UnknownVersion counts one delivery of a message of an unknown schema version.
func (m *Metrics) UnknownVersion() { m.unknownVersion.Inc() }

// BreakerState records the breaker's new state.
func (m *Metrics) BreakerState(state string) {
	for _, s := range []string{"closed", "half-open", "open"} {
		v := 0.0
		if s == state {
			v = 1
		}
		m.breaker.WithLabelValues(s).Set(v)
	}
	m.breakerTrans.WithLabelValues(state).Inc()
}

// Drift records the drift of sku at the last reconcile pass.
func (m *Metrics) Drift(sku string, units int64) { m.drift.WithLabelValues(sku).Set(float64(units)) }

// ReconcileAlert counts one reconcile alert.
func (m *Metrics) ReconcileAlert() { m.alerts.Inc() }

// Challenge counts a challenge issued or solved, or a refused solution
// (result "refused") with its reason, the API error code.
func (m *Metrics) Challenge(result, reason string) {
	if result != "" {
		m.challenges.WithLabelValues(result).Inc()
	}
	if reason != "" {
		m.ticketsRefused.WithLabelValues(reason).Inc()
	}
}

// RoomObserver returns the waiting room's observer (room.Observer).
func (m *Metrics) RoomObserver() RoomObserver { return RoomObserver{m} }

// RoomObserver counts the waiting room's events.
type RoomObserver struct{ m *Metrics }

func (o RoomObserver) Joined(string)  { o.m.roomEvents.WithLabelValues("joined").Inc() }
func (o RoomObserver) Polled(string)  { o.m.roomEvents.WithLabelValues("polled").Inc() }
func (o RoomObserver) SoldOut(string) { o.m.roomEvents.WithLabelValues("sold_out").Inc() }
func (o RoomObserver) Admitted(_ string, n int64) {
	o.m.roomEvents.WithLabelValues("admitted").Add(float64(n))
}
func (o RoomObserver) EtaError(_ string, s float64) { o.m.roomEtaError.Observe(math.Abs(s)) }

// Shadow counts n shadow results: match, mismatch, dropped or same (script).
func (m *Metrics) Shadow(result string, n int) {
	switch result {
	case "dropped":
		m.shadowDropped.Add(float64(n))
		return
	case "same":
		m.shadowSame.Add(float64(n))
		return
	}
	m.shadow.WithLabelValues(result).Add(float64(n))
}

// ReleaseGroup records the group this instance serves in.
func (m *Metrics) ReleaseGroup(group string) { m.group.WithLabelValues(group).Set(1) }

// Gate records the latency of one gate call.
func (m *Metrics) Gate(d time.Duration) { m.gate.Observe(d.Seconds()) }

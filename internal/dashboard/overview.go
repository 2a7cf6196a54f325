package dashboard

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/fleet"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/room"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// overviewRoute is the route whose latency the overview reports: purchases.
const overviewRoute = "POST /api/v1/orders"

const (
	// overviewMaxSales bounds the sales listed (most recently changed first).
	overviewMaxSales = 50
	// overviewEndedFor keeps a sale listed this long after it ended.
	overviewEndedFor = time.Hour
	// overviewTimeout bounds each source, so one hung dependency still
	// leaves an answer with the others' figures.
	overviewTimeout = 2 * time.Second
)

// Live reads the live state of an instance's sales and pipeline from its
// sources: the overview the page polls (Overview), the samples its charts
// draw (Recorder) and the same figures as Prometheus gauges (Collector).
// Every field must be set except Reconciler and History; its methods are
// safe for concurrent use.
type Live struct {
	DB      DB
	Catalog Catalog
	Gate    Gate
	Queue   Queue
	// Breaker returns the state of the purchase path's breaker.
	Breaker func() string
	// Reconciler, if set, reports this instance's last reconcile pass.
	Reconciler Reconciler
	// History, if set, holds the recent samples of the charted figures.
	History *History
	Metrics *metrics.Metrics
	// Publish, if set, is nil while the order stream acknowledges publishes
	// (else why not: a full disk under the embedded store, rounds failing).
	Publish func() error
	// Outage, if set, reports the consumer's wait for a database that
	// refuses writes (apply.Consumer.Outage).
	Outage func() (since time.Time, reason string, ok bool)
	// Fleet, if set, lists the running instances and the canary trial.
	Fleet Fleet
	// Rooms, if set, reads the waiting rooms (room.Room).
	Rooms Rooms
}

// Rooms reads a sale's waiting room (room.Room.Stats).
type Rooms interface {
	Stats(ctx context.Context, sku string) (room.Stats, error)
}

// Fleet is where instances report themselves (fleet.Registry).
type Fleet interface {
	Instances(ctx context.Context, now time.Time) ([]fleet.Instance, error)
	Canary(ctx context.Context) (*fleet.Canary, error)
}

// DB is the database of record (orderstore.Store): the sales'
// configuration and stock, and the connection pool's figures.
type DB interface {
	SKUs(ctx context.Context) ([]sale.SKU, error)
	Dialect() orderstore.Dialect
	Stats() orderstore.PoolStats
}

// Catalog is the in-memory SKU catalog (purchase.Catalog): it stands in
// for the database's sales while the database does not answer.
type Catalog interface {
	All() []sale.SKU
}

// Gate is the Redis gate (stockgate.Gate): the gate's view of each sale.
type Gate interface {
	Stock
	ReadGauges(ctx context.Context, sku string) (stockgate.Gauges, error)
	ReadBuckets(ctx context.Context, names []string, withRes bool) ([]stockgate.BucketState, error)
	SKUs(ctx context.Context) ([]string, error)
	OldestInFlight(ctx context.Context, sku string) (time.Time, bool, error)
}

// Queue is the order stream (orderqueue.Queue): backlog and dead letters.
type Queue interface {
	Stats(ctx context.Context) (orderqueue.Stats, error)
	DeadLetterCount(ctx context.Context) (uint64, error)
}

// Reconciler is the reconciler (reconcile.Reconciler).
type Reconciler interface {
	Last() *reconcile.Report
}

// overview is the body of GET /admin/v1/overview, the dashboard's data. A
// figure that could not be read is null and its source is named in Errors.
type overview struct {
	Now       time.Time         `json:"now"`
	Sales     []saleOverview    `json:"sales"`
	MoreSales int               `json:"more_sales"` // listed sales left out (over overviewMaxSales)
	Pipeline  pipelineOverview  `json:"pipeline"`
	Counters  countersOverview  `json:"counters"`
	Reconcile *reconcile.Report `json:"reconcile"` // this instance's last reconcile pass; null before the first
	// History is this instance's recent samples of the charted figures
	// (the last ten minutes), so that a page opened now draws at once.
	History *Series `json:"history"`
	// Release is what runs: every instance's version and group, and the
	// canary trial (null without a Fleet).
	Release *releaseOverview `json:"release"`
	// Crowd is this instance's challenge and waiting-room counters and
	// every listed sale's waiting room.
	Crowd  crowdOverview     `json:"crowd"`
	Errors map[string]string `json:"errors,omitempty"`
}

// crowdOverview is tickets and waiting rooms.
type crowdOverview struct {
	metrics.Crowd
	// EtaErrorP50 and EtaErrorP90 are the waiting rooms' ETA error
	// (seconds, absolute) since this instance started; null before any.
	EtaErrorP50 *float64       `json:"eta_error_p50_s"`
	EtaErrorP90 *float64       `json:"eta_error_p90_s"`
	Rooms       []roomOverview `json:"rooms"`
}

// roomOverview is one sale's waiting room as the controller last wrote it.
type roomOverview struct {
	SKU      string  `json:"sku_id"`
	Joined   int64   `json:"joined"`
	Waiting  int64   `json:"waiting"`
	Admitted int64   `json:"admitted"`
	Rate     float64 `json:"rate"`
	Avail    *int64  `json:"avail"`
	Lottery  *int64  `json:"lottery"` // buyers in the opening's lottery; null before the draw
}

// releaseOverview is the fleet during a release.
type releaseOverview struct {
	Instances []fleet.Instance `json:"instances"`
	// Canary is the last canary trial (null: none ever ran).
	Canary *fleet.Canary `json:"canary"`
}

// saleOverview is one sale: configuration from PostgreSQL, live figures from
// Redis (the gate's view) and PostgreSQL (the record).
type saleOverview struct {
	SKU          string     `json:"sku_id"`
	State        string     `json:"state"`
	StartsAt     *time.Time `json:"starts_at"`
	EndsAt       *time.Time `json:"ends_at"`
	PerUserLimit int64      `json:"per_user_limit"`
	TotalStock   int64      `json:"total_stock"`
	DBStock      int64      `json:"db_stock"`
	UpdatedAt    time.Time  `json:"updated_at"`
	RedisLoaded  *bool      `json:"redis_loaded"`
	// RedisAvailable is the units the gate will still sell.
	RedisAvailable *int64 `json:"redis_available"`
	// InFlight counts reservations accepted by the gate and not yet decided
	// by the database (Redis res entries); InFlightUnits their units.
	InFlight      *int64 `json:"in_flight"`
	InFlightUnits *int64 `json:"in_flight_units"`
	// Outbox counts reservations not yet acknowledged by the stream.
	Outbox *int64 `json:"outbox"`
	// Buckets is the number of stock buckets of the sale; BucketAvailable,
	// for a split sale, each bucket's units (net of its debt) in bucket
	// order. The figures above are sums over the buckets.
	Buckets         int     `json:"buckets"`
	BucketAvailable []int64 `json:"bucket_available,omitempty"`
}

type pipelineOverview struct {
	QueueMessages   *uint64 `json:"queue_messages"`
	QueuePending    *uint64 `json:"queue_pending"`     // not yet delivered to the consumer
	QueueAckPending *int    `json:"queue_ack_pending"` // delivered, not yet acknowledged
	DeadLetters     *uint64 `json:"dead_letters"`
	Breaker         string  `json:"breaker"`
	// StreamPublish is "ok" while the stream acknowledges publishes,
	// "failing" while it does not (StreamPublishError says why; accepted
	// purchases wait in the Redis outbox meanwhile).
	StreamPublish      string `json:"stream_publish"`
	StreamPublishError string `json:"stream_publish_error,omitempty"`
	// DatabaseOutage is set while this instance's consumer holds batches
	// because the database refuses writes (read-only during a switchover,
	// out of disk): purchases go on through Redis, their orders wait. Null
	// otherwise.
	DatabaseOutage *outageOverview `json:"database_outage"`
}

// outageOverview is a database outage as the consumer sees it.
type outageOverview struct {
	Since  time.Time `json:"since"`
	Reason string    `json:"reason"`
}

// countersOverview is this instance's counters since it started.
type countersOverview struct {
	metrics.Snapshot
	// OrderLatency is the latency of POST /api/v1/orders: cumulative
	// buckets (a reader takes the difference of two readings for a window)
	// and percentiles since the start.
	OrderLatency latencyOverview `json:"order_latency"`
}

type latencyOverview struct {
	metrics.Histogram
	P50ms *float64 `json:"p50_ms"`
	P95ms *float64 `json:"p95_ms"`
	P99ms *float64 `json:"p99_ms"`
}

// Overview reads the live state of every recent sale and of the pipeline:
// the body of GET /admin/v1/overview (httpapi.Config.Overview). It
// returns an error only for a context that is done: a source that fails
// leaves its figures null and is named in the answer's errors.
func (l *Live) Overview(ctx context.Context) (any, error) {
	return l.overview(ctx)
}

func (l *Live) overview(ctx context.Context) (overview, error) {
	now := time.Now()
	ov := overview{Now: now.UTC(), Sales: []saleOverview{}}
	var mu sync.Mutex
	fail := func(source string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if ov.Errors == nil {
			ov.Errors = map[string]string{}
		}
		if _, ok := ov.Errors[source]; !ok {
			ov.Errors[source] = err.Error()
		}
	}

	var wg sync.WaitGroup
	wg.Go(func() { l.overviewPipeline(ctx, &ov.Pipeline, fail) })
	if l.Fleet != nil {
		ov.Release = &releaseOverview{Instances: []fleet.Instance{}}
		wg.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, overviewTimeout)
			defer cancel()
			if in, err := l.Fleet.Instances(fctx, now); err != nil {
				fail("redis", err)
			} else {
				ov.Release.Instances = in
			}
			if c, err := l.Fleet.Canary(fctx); err != nil {
				fail("redis", err)
			} else {
				ov.Release.Canary = c
			}
		})
	}

	// The database's figures are fresh; the catalog (refreshed every few
	// seconds) stands in while the database does not answer.
	dctx, cancel := context.WithTimeout(ctx, overviewTimeout)
	skus, err := l.DB.SKUs(dctx)
	cancel()
	if err != nil {
		fail(string(l.DB.Dialect()), err)
		skus = l.Catalog.All()
	}
	skus = listed(skus, now)
	if len(skus) > overviewMaxSales {
		ov.MoreSales = len(skus) - overviewMaxSales
		skus = skus[:overviewMaxSales]
	}
	ov.Sales = make([]saleOverview, len(skus))
	rctx, cancel := context.WithTimeout(ctx, overviewTimeout)
	defer cancel()
	for i, s := range skus {
		ov.Sales[i] = saleOverview{SKU: s.ID, StartsAt: timePtr(s.StartsAt), EndsAt: timePtr(s.EndsAt),
			PerUserLimit: s.PerUserLimit, TotalStock: s.TotalStock, DBStock: s.Stock, UpdatedAt: s.UpdatedAt, Buckets: s.BucketCount()}
		wg.Go(func() { l.overviewRedis(rctx, &ov.Sales[i], fail) })
	}

	if l.Reconciler != nil {
		ov.Reconcile = l.Reconciler.Last()
	}
	if l.History != nil {
		sr := l.History.Series(now)
		ov.History = &sr
	}
	snap := l.Metrics.Snapshot()
	ov.Counters = countersOverview{Snapshot: snap, OrderLatency: latencyOf(snap.Latency[overviewRoute])}
	ov.Crowd = crowdOverview{Crowd: l.Metrics.CrowdSnapshot(), Rooms: []roomOverview{}}
	ov.Crowd.EtaErrorP50, ov.Crowd.EtaErrorP90 = quantile(ov.Crowd.EtaError, .5), quantile(ov.Crowd.EtaError, .9)
	if l.Rooms != nil {
		for _, s := range skus {
			if !s.Crowd.WaitingRoom {
				continue
			}
			st, err := l.Rooms.Stats(rctx, s.ID)
			if err != nil {
				fail("redis", err)
				continue
			}
			ro := roomOverview{SKU: s.ID, Joined: st.Joined, Waiting: st.Waiting, Admitted: st.Admitted, Rate: st.Rate}
			if st.AvailKnown {
				ro.Avail = &st.Avail
			}
			if st.Drawn {
				ro.Lottery = &st.Lottery
			}
			ov.Crowd.Rooms = append(ov.Crowd.Rooms, ro)
		}
	}
	wg.Wait()

	for i, s := range skus {
		avail := s.Stock
		if so := ov.Sales[i]; so.RedisAvailable != nil && *so.RedisLoaded {
			avail = *so.RedisAvailable
		}
		ov.Sales[i].State = string(s.State(now, avail))
	}
	return ov, ctx.Err()
}

// listed keeps the sales the overview lists (not ended over
// overviewEndedFor ago), most recently changed first.
func listed(skus []sale.SKU, now time.Time) []sale.SKU {
	skus = slices.DeleteFunc(skus, func(s sale.SKU) bool {
		return !s.EndsAt.IsZero() && now.Sub(s.EndsAt) > overviewEndedFor
	})
	slices.SortFunc(skus, func(x, y sale.SKU) int {
		return cmp.Or(y.UpdatedAt.Compare(x.UpdatedAt), cmp.Compare(x.ID, y.ID))
	})
	return skus
}

// Recorder returns the sampler of the charted figures into History: the
// counters, and the stock of the first sales the overview lists, from the
// catalog (no database read).
func (l *Live) Recorder() *Recorder {
	return &Recorder{
		History: l.History,
		Counters: func() (map[string]uint64, map[string]uint64) {
			s := l.Metrics.Snapshot()
			return s.Purchases, s.Applied
		},
		Sales: func(now time.Time) []string {
			var ids []string
			for _, s := range listed(l.Catalog.All(), now) {
				ids = append(ids, s.ID)
			}
			return ids
		},
		Stock: l.Gate,
	}
}

// overviewRedis fills in the gate's figures of one sale.
func (l *Live) overviewRedis(ctx context.Context, so *saleOverview, fail func(string, error)) {
	// Counts, not entries: a scrape or a page load reads no reservation.
	gs, err := l.Gate.ReadGauges(ctx, so.SKU)
	if err != nil {
		fail("redis", err)
		return
	}
	so.RedisLoaded, so.InFlight, so.InFlightUnits, so.Outbox = &gs.Loaded, &gs.InFlight, &gs.Units, &gs.Outbox
	if gs.Loaded {
		so.RedisAvailable = &gs.Available
	}
	if so.Buckets > 1 {
		bs, err := l.Gate.ReadBuckets(ctx, stockgate.BucketNames(so.SKU, so.Buckets), false)
		if err != nil {
			fail("redis", err)
			return
		}
		for _, b := range bs {
			so.BucketAvailable = append(so.BucketAvailable, b.Avail-b.Debt)
		}
	}
}

// overviewPipeline fills in the queue's backlog, the dead letters, the
// breaker and the consumer's database outage.
func (l *Live) overviewPipeline(ctx context.Context, p *pipelineOverview, fail func(string, error)) {
	p.Breaker = l.Breaker()
	p.StreamPublish = "ok"
	if l.Publish != nil {
		if err := l.Publish(); err != nil {
			p.StreamPublish, p.StreamPublishError = "failing", err.Error()
		}
	}
	if l.Outage != nil {
		if since, reason, ok := l.Outage(); ok {
			p.DatabaseOutage = &outageOverview{Since: since.UTC(), Reason: reason}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, overviewTimeout)
	defer cancel()
	if st, err := l.Queue.Stats(ctx); err != nil {
		fail("jetstream", err)
	} else {
		p.QueueMessages, p.QueuePending, p.QueueAckPending = &st.Messages, &st.Pending, &st.AckPending
	}
	if n, err := l.Queue.DeadLetterCount(ctx); err != nil {
		fail("jetstream", err)
	} else {
		p.DeadLetters = &n
	}
}

func quantile(h metrics.Histogram, q float64) *float64 {
	v, ok := h.Quantile(q)
	if !ok {
		return nil
	}
	return &v
}

func latencyOf(h metrics.Histogram) latencyOverview {
	l := latencyOverview{Histogram: h}
	if l.Buckets == nil {
		l.Buckets = []metrics.Bucket{}
	}
	ms := func(q float64) *float64 {
		s, ok := h.Quantile(q)
		if !ok {
			return nil
		}
		v := s * 1000
		return &v
	}
	l.P50ms, l.P95ms, l.P99ms = ms(.5), ms(.95), ms(.99)
	return l
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/rueidis"
	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/buildinfo"
	"github.com/flashsale/flashsale/internal/buyerpage"
	"github.com/flashsale/flashsale/internal/crowd"
	"github.com/flashsale/flashsale/internal/dashboard"
	"github.com/flashsale/flashsale/internal/deadletter"
	"github.com/flashsale/flashsale/internal/events"
	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/fleet"
	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/notice"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/relay"
	"github.com/flashsale/flashsale/internal/release"
	"github.com/flashsale/flashsale/internal/risk"
	"github.com/flashsale/flashsale/internal/room"
	"github.com/flashsale/flashsale/internal/salehistory"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/ticket"
	"github.com/flashsale/flashsale/internal/tracing"
)

func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig("serve", args, getenv, stderr, nil)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	raiseFileLimit(log)                              // every client connection is an open file
	memLimit, _ := parseMemoryLimit(cfg.MemoryLimit) // checked by parseConfig
	applyMemoryLimit(memLimit, log)
	a, err := start(ctx, cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		a.close()
		return err
	}
	if cfg.PprofAddr != "" {
		// Its own listener: the profiling endpoints are never on the API's.
		if a.pprofLn, err = net.Listen("tcp", cfg.PprofAddr); err != nil {
			ln.Close()
			a.close()
			return fmt.Errorf("pprof-addr: %w", err)
		}
		fmt.Fprintf(stdout, "flashsale profiling on http://%s/debug/pprof/ (admin token required)\n", a.pprofLn.Addr())
	}
	log.Info("flashsale serving", "addr", ln.Addr().String(), "nats", hidePassword(cfg.NATSURL), "tracing", cfg.Tracing)
	fmt.Fprintf(stdout, "flashsale listening on http://%s\n", ln.Addr())
	return a.serve(ctx, ln)
}

func newLogger(cfg config, w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("log-level: %q is not a level: debug, info, warn or error", cfg.LogLevel)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch cfg.LogFormat {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("log-format must be text or json")
	}
	if cfg.tracing().On() {
		h = tracing.LogHandler(h) // trace_id and span_id on lines logged within a span
	}
	return slog.New(h), nil
}

// app is one running instance: every component wired, workers started.
type app struct {
	cfg        config
	log        *slog.Logger
	store      *orderstore.Store
	redis      rueidis.Client
	embedded   *orderqueue.Embedded
	nc         *nats.Conn
	queue      *orderqueue.Queue
	gate       *stockgate.Gate
	relay      *relay.Relay
	buy        *purchase.Service
	catalog    *purchase.Catalog
	lifecycle  *release.Service
	reconciler *reconcile.Reconciler
	// shadow, if set, compares the live decisions of FLASHSALE_SHADOW_SKUS.
	shadow *stockgate.Shadow
	// id names this instance (leases, the fleet's list); fleet is where it
	// reports itself.
	id      string
	fleet   *fleet.Registry
	sync    *reconcile.Syncer
	metrics *metrics.Metrics
	history *dashboard.History
	handler http.Handler
	// tracer is nil with tracing off; traceStop flushes and stops it.
	tracer    *tracing.Tracer
	traceStop func(context.Context) error
	// pprofLn, if set, is the profiling endpoints' own listener.
	pprofLn net.Listener

	room     *room.Room
	riskSync *risk.Syncer
	// tally counts purchases per SKU and second; recorder writes the
	// sale history from every instance's counts.
	tally    *salehistory.Tally
	recorder *salehistory.Recorder
	// notices is the subscription to the instances' change notices
	// (notice.Subject); a test unsubscribes it to stand for lost notices.
	notices *nats.Subscription

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// start wires every component and starts the background workers. The caller
// serves a.handler and calls close when done.
func start(ctx context.Context, cfg config, log *slog.Logger) (_ *app, err error) {
	if cfg.UserTokenSecret == "" {
		return nil, errors.New("FLASHSALE_USER_TOKEN_SECRET (or -user-token-secret) is required: it verifies buyers' tokens")
	}
	if err := failpoint.Parse(cfg.Failpoints); err != nil {
		return nil, err
	}
	a := &app{cfg: cfg, log: log, metrics: metrics.New(), history: dashboard.NewHistory(dashboard.HistorySamples), id: instanceID()}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	octx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	tc := cfg.tracing()
	tc.Log = log
	if a.tracer, a.traceStop, err = tracing.Setup(octx, tc); err != nil {
		return nil, err
	}
	if err = a.openStores(octx); err != nil {
		return nil, err
	}
	if err = a.gate.CheckEviction(octx); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if err = a.store.Migrate(octx); err != nil {
		return nil, fmt.Errorf("database migrations: %w", err)
	}
	// Before anything reads or writes under the prefix: it must be ours.
	if err = reconcile.ClaimPrefix(octx, a.store, a.gate); err != nil {
		return nil, err
	}

	if cfg.NATSURL == "embedded" {
		if a.embedded, err = orderqueue.StartEmbedded(cfg.DataDir, cfg.NATSSyncAlways, log); err != nil {
			return nil, err
		}
		if a.nc, err = a.embedded.Connect("flashsale"); err != nil {
			return nil, fmt.Errorf("embedded JetStream: %w", err)
		}
	} else {
		if !strings.HasPrefix(cfg.NATSURL, "nats://") && !strings.HasPrefix(cfg.NATSURL, "tls://") {
			return nil, fmt.Errorf("nats-url must be \"embedded\" or nats://host:port, got %q", hidePassword(cfg.NATSURL))
		}
		a.nc, err = orderqueue.Connect(cfg.NATSURL, "flashsale")
	}
	if err != nil {
		if a.embedded != nil || errors.Is(err, orderqueue.ErrDataDirInUse) {
			return nil, err
		}
		a.log.Debug("nats", "err", err)
		return nil, connectError("NATS", "nats-url", hidePassword(cfg.NATSURL), err)
	}
	if a.queue, err = orderqueue.Open(octx, a.nc, orderqueue.Config{AckWait: cfg.AckWait, MaxAge: cfg.StreamRetention, Replicas: cfg.NATSReplicas, Log: log}); err != nil {
		return nil, err
	}
	if err = a.queue.EnsureEventStream(octx, orderqueue.Config{Replicas: cfg.NATSReplicas, Log: log}); err != nil {
		return nil, err
	}

	a.relay = relay.New(a.gate, a.queue, log, relay.Config{Grace: cfg.RelayGrace, Tracer: a.tracer})
	cat := purchase.NewCatalog(a.store)
	if err = cat.Refresh(octx); err != nil {
		return nil, fmt.Errorf("loading sku catalog: %w", err)
	}
	a.sync = reconcile.NewSyncer(a.store, a.gate, a.queue, log)
	a.catalog = cat
	ann := notice.NewAnnouncer(a.nc, log)
	if err = cfg.Risk.Check(); err != nil {
		return nil, err
	}
	riskList := &risk.List{}
	riskSync := risk.NewSyncer(riskList, a.store, log, risk.DefaultPeriod)
	if err := riskSync.Refresh(octx, time.Now()); err != nil {
		log.Warn("risk lists not loaded at start (they block nobody until loaded)", "err", err)
	}
	if _, err = risk.Subscribe(a.nc, riskSync); err != nil {
		return nil, fmt.Errorf("nats: risk notices: %w", err)
	}
	riskAnn := risk.NewAnnouncer(a.nc, log)
	strikes, err := risk.NewStrikes(a.redis, cfg.RedisPrefix, a.store, cfg.Risk, riskAnn.Changed, log)
	if err != nil {
		return nil, err
	}
	a.riskSync = riskSync
	if cfg.ChallengeCost < 1 || cfg.ChallengeCost > 1<<20 {
		return nil, fmt.Errorf("FLASHSALE_CHALLENGE_COST %d: want 1..%d", cfg.ChallengeCost, 1<<20)
	}
	tickets, err := ticket.New(ticket.Config{Key: cfg.crowdKey(), TicketTTL: cfg.TicketTTL, Cost: cfg.ChallengeCost, BaseWork: uint32(max(cfg.ChallengeWork, 1)),
		ChallengeLimit: rate.NewLimiter(rate.Limit(cfg.ChallengeRate), max(1, int(cfg.ChallengeRate/10))),
		VerifyLimit:    rate.NewLimiter(rate.Limit(cfg.TicketRate), max(1, int(cfg.TicketRate/10))),
		OnFailure: func(ctx context.Context, user, kind string) {
			if _, err := strikes.Strike(ctx, user, kind); err != nil {
				log.Warn("risk strike not counted", "user_id", user, "kind", kind, "err", err)
			}
		}},
		ticket.RedisReplays{Client: a.redis, Prefix: cfg.RedisPrefix})
	if err != nil {
		return nil, err
	}
	a.room, err = room.New(a.redis, room.Config{Prefix: cfg.RedisPrefix, Key: cfg.crowdKey(), AdmissionTTL: cfg.AdmissionTTL, DefaultRate: cfg.RoomCapacity},
		a.metrics.RoomObserver(), a.remaining)
	if err != nil {
		return nil, err
	}
	a.tally = salehistory.NewTally(a.redis, cfg.RedisPrefix)
	a.recorder = salehistory.NewRecorder(a.tally, a.store, log)
	a.recorder.Joined = func(ctx context.Context, sku string) (int64, error) {
		st, err := a.room.Stats(ctx, sku)
		return st.Joined, err
	}
	crowdGate := crowd.Gate{Tickets: tickets, Room: crowd.RoomAdmissions{Room: a.room}}
	deps := purchase.Deps{
		Catalog: cat, Gate: purchase.BoundedGate{PingGate: a.gate, Timeout: cfg.RedisTimeout, Observe: a.metrics.Gate}, Relay: a.relay, Orders: a.store,
		Loader: a.sync, RebuildAll: a.rebuildAll, Log: log, Observer: a.metrics, Breaker: a.metrics,
		StreamAck: cfg.StreamAck,
		Limits:    cfg.Protect.Limits(), Announcer: ann, Tracer: a.tracer, Crowd: crowdGate,
		Counter: a.tally, Leaser: a.gate,
	}
	if cfg.FallbackConc > 0 {
		deps.Direct = a.store
	}
	if deps.Seller, err = sellerFor(a); err != nil {
		return nil, err
	}
	a.buy = purchase.New(deps, purchase.BreakerConfig{
		Window: cfg.BreakerWindow, FailureRatio: cfg.BreakerRatio, MinRequests: uint32(cfg.BreakerMinReqs),
		OpenFor: cfg.BreakerOpenFor, FallbackConcurrency: cfg.FallbackConc, Disabled: cfg.FallbackConc == 0,
		CallTimeout: cfg.RedisTimeout,
	})
	a.metrics.WatchSoldLeases(a.buy.SoldLeaseInUse, a.buy.SoldOutFromLease)
	if a.notices, err = notice.Subscribe(a.nc, a.buy, log); err != nil {
		return nil, fmt.Errorf("nats: catalog notices: %w", err)
	}

	// A Redis that is new or restarted since the sales were loaded is rebuilt
	// from the database; otherwise every sale that is not over is warmed (a
	// resync for those already there, a load for the others), so Redis is
	// never sold against stale.
	// The loads below (a rebuild, the warm-ups) start with the sold-out
	// lease the fleet answers from, before seedLeases runs (see there).
	configuredLease := time.Duration(0)
	if cfg.Protect.SoldOutTTL > 0 {
		configuredLease = cfg.Protect.SoldOutLease
	}
	a.gate.SetSeedLease(fleetLease(octx, fleet.New(a.redis, cfg.RedisPrefix), configuredLease))
	monitor := reconcile.NewMonitor(a.gate, a.rebuildAll, log)
	rebuilt, merr := monitor.RunOnce(octx)
	if merr != nil {
		log.Warn("redis monitor", "err", merr)
	}
	if !rebuilt {
		for _, s := range a.activeSKUs() {
			if _, err := a.sync.Warm(octx, s); err != nil {
				log.Warn("warm-up at start", "sku_id", s, "err", err)
			}
		}
	}

	a.lifecycle = release.New(a.store, notice.AnnouncingGate{Gate: a.gate, Announcer: ann}, a.buy, a.isActive, log)
	a.reconciler = reconcile.NewReconciler(a.sync, a.store, int64(cfg.ReconcileLimit), cfg.AlertWebhook, log, a.metrics)
	backoff, _ := cfg.backoff()
	consumer := apply.New(a.store, notice.AnnouncingGate{Gate: a.gate, Announcer: ann}, a.queue, log, a.metrics, apply.Config{
		Batch: cfg.ApplyBatch, Workers: cfg.ApplyWorkers, MaxDeliver: cfg.MaxDeliver, Backoff: backoff, AckWait: cfg.AckWait, Tracer: a.tracer})
	a.fleet = fleet.New(a.redis, cfg.RedisPrefix)
	live := &dashboard.Live{DB: a.store, Catalog: cat, Gate: a.gate, Queue: a.queue, Breaker: a.buy.BreakerState, Fleet: a.fleet,
		Reconciler: a.reconciler, History: a.history, Metrics: a.metrics, Outage: consumer.Outage, Publish: a.publishHealth, Rooms: a.room}
	a.handler = httpapi.New(a.buy, a.sync, log, httpapi.Config{
		Lifecycle: a.lifecycle,
		Audit:     a.store,
		Reconcile: func(ctx context.Context) (any, error) {
			return a.reconciler.RunOnce(ctx, a.activeSKUs(), time.Now())
		},
		PaymentSecret: cfg.PaymentSecret,
		AdminToken:    cfg.AdminToken,
		Users:         httpapi.NewUserAuth(cfg.UserTokenSecret).WithGateway(cfg.Protect.GatewayHeader, cfg.Protect.TrustedProxies()),
		Limiter:       cfg.Protect.Limiter(),
		Proxies:       cfg.Protect.TrustedProxies(),
		DeadLetters:   deadletter.New(a.queue, a.store, a.gate),
		Breaker:       a.buy.BreakerState,
		Dashboard:     dashboard.Handler(),
		BuyerPage:     buyerpage.Handler(),
		Overview:      live.Overview,
		Metrics:       promhttp.HandlerFor(a.metrics.Registry, promhttp.HandlerOpts{}),
		Observe:       a.metrics.HTTP,
		Tracer:        a.tracer,
		Ready:         a.readyChecks(consumer),
		Transient:     orderstore.IsTransient,
		Risk:          risk.Admin{Store: a.store, Changed: riskAnn.Changed},
		CrowdReady: func(ctx context.Context) ([]string, error) {
			in, err := a.fleet.Instances(ctx, time.Now())
			return fleet.Lacking(in, fleet.FeatureCrowd), err
		},
		Blocklist: riskList,
		History:   a.recorder,
		Crowd: httpapi.Crowd{Gate: crowdGate, Observe: a.metrics.Challenge, Room: a.room,
			QueueLimit: &httpapi.BuyerLimit{PerSecond: 10}},
	})

	a.metrics.Registry.MustRegister(live.Collector())
	wctx, wcancel := context.WithCancel(context.Background())
	a.cancel = wcancel
	a.goRun(func() { consumer.Run(wctx, a.queue.Consumer()) })
	a.goRun(func() { a.relay.Run(wctx) })
	if cfg.OrderSchema == orderqueue.SchemaBatch {
		a.goRun(func() { publishSchema(wctx, a.queue, a.fleet, 2*time.Second, log, a.metrics.OrderSchema) })
	}
	if cfg.Protect.SoldOutLease > 0 && cfg.Protect.SoldOutTTL > 0 {
		a.goRun(func() { useSoldLeases(wctx, a.buy, a.fleet, 2*time.Second, log) })
	}
	a.goRun(func() {
		seedLeases(wctx, a.gate, a.fleet, func() time.Duration { return configuredLease }, 2*time.Second, log)
	})
	a.goRun(func() { a.queue.RunEnsure(wctx, time.Second, log) })
	a.goRun(func() { a.queue.RunRetention(wctx, retentionEvery(cfg.StreamRetention), log) })
	republisher := relay.NewRepublisher(a.gate, a.queue, a.queue, log, relay.RepublishConfig{After: cfg.RepublishAfter})
	a.goRun(func() { republisher.Run(wctx) })
	a.goRun(func() {
		cat.Run(wctx, cfg.CatalogRefresh, func(err error) { log.Warn("catalog refresh", "err", err) })
	})
	a.goRun(func() { stockgate.NewJanitor(a.gate, cfg.KeyRetention, log).Run(wctx, time.Minute) })
	a.goRun(func() { stockgate.NewTransferSweeper(a.gate, cat, log).Run(wctx, time.Second) })
	a.goRun(func() { live.Recorder().Run(wctx) })
	a.goRun(func() { a.room.Run(wctx, a.rooms) })
	a.goRun(func() { a.riskSync.Run(wctx) })
	a.goRun(func() { a.recorder.Run(wctx, cfg.HistoryEvery, a.catalog.All, a.sampleHistory) })
	a.goRun(func() { monitor.Run(wctx, cfg.MonitorEvery) })
	a.goRun(func() { a.lifecycle.RunRestorer(wctx, 500*time.Millisecond) })
	// Stock changes made outside flashsale are owed to Redis by the database
	// trigger (redis_restores); on PostgreSQL a NOTIFY wakes the restorer at
	// once, elsewhere (MySQL) its 500 ms poll finds them.
	a.goRun(func() { release.ListenRestores(wctx, a.store, a.lifecycle.Kick, a.log) })
	a.goRun(func() { a.lifecycle.RunSweeper(wctx, cfg.SweepEvery) })
	a.goRun(func() { a.reconciler.Run(wctx, cfg.ReconcileEvery, a.gate, a.id, a.activeSKUs) })
	a.goRun(func() { events.New(a.store, a.queue, log).Run(wctx, 250*time.Millisecond) })
	a.metrics.ReleaseGroup(cfg.ReleaseGroup)
	skus := cfg.shadowSKUs()
	if len(skus) > 0 {
		a.metrics.Shadow("match", 0)
		a.metrics.Shadow("mismatch", 0)
		a.shadow = a.gate.NewShadow(stockgate.ShadowConfig{Instance: a.id, Script: cfg.shadowScript, Rate: cfg.ShadowRate, Observe: a.metrics.Shadow, Log: log})
		log.Info("shadow decisions", "sku_ids", skus, "rate", cfg.ShadowRate)
		a.goRun(func() {
			a.shadow.RunSKUs(wctx, skus, func(id string) int {
				if s, ok := cat.Get(id); ok {
					return s.BucketCount()
				}
				return 0
			})
		})
	}
	bi, started := buildinfo.Get(), time.Now().UTC()
	a.goRun(func() {
		a.fleet.Run(wctx, 5*time.Second, func() fleet.Instance {
			in := fleet.Instance{ID: a.id, Version: bi.Version, Commit: bi.Commit, Group: cfg.ReleaseGroup, StartedAt: started,
				Features:       []string{fleet.FeatureCrowd, fleet.FeatureSchema2, fleet.FeatureSoldLease},
				SoldOutLeaseMs: configuredLease.Milliseconds()}
			if a.shadow != nil {
				st := a.shadow.Stats()
				in.Shadow = &fleet.ShadowCounts{SKUs: skus, Match: st.Match, Mismatch: st.Mismatch, Dropped: st.Dropped, Same: st.Same}
			}
			return in
		})
	})
	return a, nil
}

// databaseWrites is the readiness check of the consumer's database outage
// (apply.Consumer.Outage).
func databaseWrites(c *apply.Consumer) func(context.Context) error {
	return func(context.Context) error {
		if since, reason, ok := c.Outage(); ok {
			return fmt.Errorf("the consumer holds batches since %s: %s", since.UTC().Format(time.RFC3339), reason)
		}
		return nil
	}
}

// retentionEvery is the period of the order stream's retention pass.
func retentionEvery(retention time.Duration) time.Duration {
	return min(time.Minute, max(retention/2, 100*time.Millisecond))
}

// minDialTimeout is the least time a Redis connection is given to be set
// up (TCP and handshake), whatever FLASHSALE_REDIS_TIMEOUT: a busy machine
// can take longer than a short call deadline to handshake, and a bound
// that fails every set-up would keep the gate from reconnecting at all.
// (1 s failed a start in a fresh-clone CI run at load average 8.)
const minDialTimeout = 3 * time.Second

// openStores connects to the database and Redis.
func (a *app) openStores(ctx context.Context) (err error) {
	if err = checkDatabaseURL(a.cfg.DatabaseURL); err != nil {
		return err
	}
	if a.store, err = orderstore.Open(ctx, a.cfg.DatabaseURL, orderstore.Options{MaxConns: int32(a.cfg.DBMaxConns), Logger: a.log, PaymentTimeout: a.cfg.PaymentTimeout}); err != nil {
		a.log.Debug("database", "err", err)
		return connectError("the database", "database-url", urlHost(a.cfg.DatabaseURL), err)
	}
	if _, err = stockgate.ClientOption(a.cfg.RedisURL); err != nil {
		return fmt.Errorf("redis-url: %q: %s; use redis://[:password@]host:6379/0, rediss:// for TLS, or redis://node1:6379?addr=node2:6379 for a Redis Cluster", hidePassword(a.cfg.RedisURL), innermost(err))
	}
	if a.redis, err = stockgate.DialWithin(a.cfg.RedisURL, max(a.cfg.RedisTimeout, minDialTimeout)); err != nil {
		if strings.Contains(err.Error(), "not a Redis Cluster") {
			return err
		}
		a.log.Debug("redis", "err", err)
		return connectError("Redis", "redis-url", urlHost(a.cfg.RedisURL), err)
	}
	if err = checkRedisVersion(ctx, a.redis, urlHost(a.cfg.RedisURL)); err != nil {
		return err
	}
	a.gate = stockgate.New(a.redis, a.cfg.RedisPrefix)
	if a.cfg.reserveScript != "" {
		a.gate.ReplaceReserveScript(a.cfg.reserveScript)
	}
	if a.cfg.ClosedRetention > 0 {
		a.gate.SetClosedRetention(a.cfg.ClosedRetention)
	}
	return nil
}

// openForCheck connects to the stores only, with no workers: for tools that
// inspect a deployment (and tests that check a killed process's state).
func openForCheck(ctx context.Context, cfg config) (*app, error) {
	a := &app{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	if err := a.openStores(ctx); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

func (a *app) goRun(f func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f()
	}()
}

// activeSKUs lists the sales that have not ended.
func (a *app) activeSKUs() []string {
	var out []string
	now := time.Now()
	for _, s := range a.catalog.All() {
		if s.EndsAt.IsZero() || now.Before(s.EndsAt) {
			out = append(out, s.ID)
		}
	}
	return out
}

// instanceID names this process for leases: host, pid and a random suffix.
func instanceID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomHex(4))
}

// isActive reports whether sku's sale has not ended.
func (a *app) isActive(sku string) bool {
	s, ok := a.catalog.Get(sku)
	return ok && (s.EndsAt.IsZero() || time.Now().Before(s.EndsAt))
}

// rebuildAll rebuilds every active sale in Redis from the database.
func (a *app) rebuildAll(ctx context.Context) error {
	// A Redis that lost its keys lost its owner key too: claim the prefix
	// again before loading anything, or refuse to load another's.
	if err := reconcile.ClaimPrefix(ctx, a.store, a.gate); err != nil {
		return err
	}
	if err := a.catalog.Refresh(ctx); err != nil {
		return err
	}
	_, err := a.sync.RebuildAll(ctx, a.activeSKUs())
	return err
}

// serve answers HTTP on ln until ctx is done, then shuts down in order.
func (a *app) serve(ctx context.Context, ln net.Listener) error {
	// On SIGTERM the instance first fails /readyz (503 "draining") and keeps
	// serving for DrainDelay, so the load balancer's health checks take it
	// out while its requests still succeed; each response meanwhile says
	// Connection: close, so keep-alive clients reconnect (to another
	// instance). Only then does Shutdown close the listener and wait for
	// the requests in flight.
	drain := httpapi.NewDrain(a.handler)
	srv := &http.Server{
		Handler:           drain,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    httpapi.ServerMaxHeaderBytes, // headers past httpapi.MaxHeaderBytes: 431 in JSON
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var prof *http.Server
	if a.pprofLn != nil {
		prof = &http.Server{
			Handler:           httpapi.Profiler(a.cfg.AdminToken, a.log),
			ReadHeaderTimeout: 5 * time.Second,
			// No WriteTimeout: a CPU profile or execution trace streams for
			// as long as its ?seconds= asks.
			IdleTimeout: 60 * time.Second,
			ErrorLog:    slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
		}
		go func() { _ = prof.Serve(a.pprofLn) }()
	}
	var err error
	select {
	case <-ctx.Done():
		drain.Begin()
		a.log.Info("draining: /readyz answers 503 until shutdown", "drain_delay", a.cfg.DrainDelay)
		select {
		case <-time.After(a.cfg.DrainDelay):
		case err = <-errc:
		}
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if prof != nil {
		_ = prof.Close() // a profile in progress is of no use any more
	}
	a.close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// close stops the workers, then the connections, in dependency order.
func (a *app) close() {
	a.once.Do(func() {
		if a.cancel != nil {
			a.cancel()
		}
		a.wg.Wait()
		if a.nc != nil {
			_ = a.nc.Drain()
			for i := 0; i < 50 && !a.nc.IsClosed(); i++ {
				time.Sleep(20 * time.Millisecond)
			}
			a.nc.Close()
		}
		if a.embedded != nil {
			a.embedded.Shutdown()
		}
		if a.redis != nil {
			a.redis.Close()
		}
		if a.store != nil {
			a.store.Close()
		}
		if a.traceStop != nil {
			// Last: every span has ended once the workers and the server stopped.
			ctx, cancel := context.WithTimeout(context.Background(), tracing.ShutdownTimeout)
			if err := a.traceStop(ctx); err != nil {
				a.log.Warn("tracing: flushing spans at exit", "err", err)
			}
			cancel()
		}
	})
}

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig("migrate", args, getenv, stderr, nil)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	st, err := orderstore.Open(ctx, cfg.DatabaseURL, orderstore.Options{MaxConns: 2, Logger: log})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "migrations applied")
	return nil
}

// rooms are the waiting rooms the controller runs: every sale with one
// that has not ended.
func (a *app) rooms() []room.Settings {
	now := time.Now()
	var out []room.Settings
	for _, s := range a.catalog.All() {
		if s.Crowd.WaitingRoom && (s.EndsAt.IsZero() || now.Before(s.EndsAt)) {
			out = append(out, httpapi.RoomSettings(s))
		}
	}
	return out
}

// remaining is the units a waiting room's sale has left, from the gate.
func (a *app) remaining(ctx context.Context, sku string) (int64, bool, error) {
	return a.gate.Available(ctx, sku)
}

// sampleHistory samples, for every SKU this instance sold in the last few
// seconds, the gauges the sale history keeps the maximum of: the backlog
// (reservations in the Redis outbox, not yet in the database) and, for a
// sale with a waiting room, the buyers waiting.
func (a *app) sampleHistory(ctx context.Context, now time.Time) {
	for _, id := range a.tally.Active(now, 3*time.Second) {
		if n, err := a.gate.OutboxLen(ctx, id); err == nil {
			_ = a.tally.Sample(ctx, id, salehistory.FieldBacklog, n, now)
		}
		if s, ok := a.catalog.Get(id); ok && s.Crowd.WaitingRoom {
			if st, err := a.room.Stats(ctx, id); err == nil {
				_ = a.tally.Sample(ctx, id, salehistory.FieldQueue, st.Waiting, now)
			}
		}
	}
}

// schemaHold is how many of publishSchema's periods version 1 is kept
// after an instance that does not read version 2 was last listed (60 s at
// the 2 s period): longer than a restart of such an instance takes to beat
// again, and than the registry's beat period (5 s).
const schemaHold = 30

// publishSchema lets the queue publish schema version 2 (several
// reservations per message) while every instance the fleet registry lists
// reports reading it, and version 1 otherwise, checking every period until
// ctx ends. An instance of a release that reads only version 1 and beats
// in the registry turns it off within a period of its first beat, and it
// stays off for schemaHold periods after such an instance was last listed:
// one that restarts leaves the registry on its way down and starts its
// consumer before its first beat, and a registry Redis lost is beaten
// back by every instance within 5 s. Releases that do not beat at all are
// the operator's to rule out (docs/releasing.md). The hold is this
// instance's memory: one that starts while an older instance is between
// its exit and its first beat does not know of it (docs/releasing.md).
func publishSchema(ctx context.Context, q *orderqueue.Queue, reg *fleet.Registry, every time.Duration, log *slog.Logger, observe func(int)) {
	followFleet(ctx, reg, fleet.FeatureSchema2, every, func(all bool, in []fleet.Instance, lacking []string, err error) {
		want := 1
		if all {
			want = orderqueue.SchemaBatch
		}
		if have := q.PublishSchema(); have != want {
			q.SetPublishSchema(want)
			observe(want)
			log.Info("order stream: publishing schema version "+strconv.Itoa(want), "instances", len(in), "lacking", lacking, "err", err)
		}
	})
}

// useSoldLeases turns the purchase path's sold-out leases on while every
// instance in the fleet registry runs scripts that honour them (as
// publishSchema does version 2).
func useSoldLeases(ctx context.Context, buy *purchase.Service, reg *fleet.Registry, every time.Duration, log *slog.Logger) {
	on := false
	followFleet(ctx, reg, fleet.FeatureSoldLease, every, func(all bool, in []fleet.Instance, lacking []string, err error) {
		if all == on {
			return
		}
		on = all
		buy.SetSoldLeases(on)
		log.Info("sold-out leases "+map[bool]string{true: "on", false: "off"}[on], "instances", len(in), "lacking", lacking, "err", err)
	})
	buy.SetSoldLeases(false) // the snapshots' keepers stop
}

// seedLeases makes every load of a sale this instance runs start with a
// sold-out lease as long as the longest any instance is set to (its own
// setting, and those the fleet registry lists: set, not in use, so that
// an instance whose leases the fleet gate has just turned on is covered
// before its next beat), kept for schemaHold periods
// after that one was last seen: a Redis that lost a sale lost its lease
// and the registry with it, and the snapshots read before are used until
// their holders' deadlines, so the reloaded sale makes no reservation
// before they end. It runs on every instance, whatever its own setting.
func seedLeases(ctx context.Context, g *stockgate.Gate, reg *fleet.Registry, own func() time.Duration, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	timeout := max(every, time.Second) // as followFleet's
	var held time.Duration
	var seen time.Time
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		cur := fleetLease(cctx, reg, own())
		cancel()
		if now := time.Now(); cur >= held || now.Sub(seen) >= schemaHold*every {
			if cur != held {
				log.Info("loads start with a sold-out lease", "lease", cur)
			}
			held, seen = cur, now
		}
		g.SetSeedLease(held)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fleetLease returns the longest of own and the sold-out leases the
// instances in the fleet registry say they are set to (own alone when the
// registry cannot be read).
func fleetLease(ctx context.Context, reg *fleet.Registry, own time.Duration) time.Duration {
	in, _ := reg.Instances(ctx, time.Now())
	for _, i := range in {
		own = max(own, time.Duration(i.SoldOutLeaseMs)*time.Millisecond)
	}
	return own
}

// followFleet calls apply every period until ctx ends with all true while
// every instance the fleet registry lists reports feature, and false from
// the first period one does not until schemaHold periods after such an
// instance was last listed (see publishSchema), or while the registry
// cannot be read or lists nobody (this instance's own beat is not in yet).
func followFleet(ctx context.Context, reg *fleet.Registry, feature string, every time.Duration, apply func(all bool, in []fleet.Instance, lacking []string, err error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	// A read that runs out of its deadline breaks the Redis connection it
	// shares with other calls (the client drops it): never shorter than a
	// second, whatever the period.
	timeout := max(every, time.Second)
	var lastLacking time.Time // when an instance without feature was last listed
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		in, err := reg.Instances(cctx, time.Now())
		cancel()
		all := false
		var lacking []string
		if err == nil && len(in) > 0 {
			lacking = fleet.Lacking(in, feature)
			switch {
			case len(lacking) > 0:
				lastLacking = time.Now()
			case lastLacking.IsZero() || time.Since(lastLacking) >= schemaHold*every:
				all = true
			}
		}
		apply(all, in, lacking, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

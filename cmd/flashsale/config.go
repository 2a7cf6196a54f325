package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/flashsale/flashsale/internal/risk"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/tracing"
)

// config is every setting of serve (and demo). Each flag falls back to an
// environment variable; docs/configuration.md lists them.
type config struct {
	Args            []string // the subcommand's arguments after its flags (commandArgs)
	HTTPAddr        string
	DatabaseURL     string
	RedisURL        string
	RedisPrefix     string
	NATSURL         string
	DataDir         string
	AdminToken      string
	UserTokenSecret string
	DBMaxConns      int
	ApplyBatch      int
	ApplyWorkers    int
	NATSSyncAlways  bool
	NATSReplicas    int
	OrderSchema     int
	KeyRetention    time.Duration
	ClosedRetention time.Duration
	CatalogRefresh  time.Duration
	RelayGrace      time.Duration
	RepublishAfter  time.Duration
	StreamRetention time.Duration
	AckWait         time.Duration
	MaxDeliver      int
	ApplyBackoff    string
	BreakerWindow   time.Duration
	BreakerRatio    float64
	BreakerMinReqs  int
	BreakerOpenFor  time.Duration
	FallbackConc    int
	RedisTimeout    time.Duration
	MonitorEvery    time.Duration
	DrainDelay      time.Duration
	StreamAck       time.Duration
	PaymentTimeout  time.Duration
	PaymentSecret   string
	SweepEvery      time.Duration
	ReconcileEvery  time.Duration
	HistoryEvery    time.Duration
	ReconcileLimit  int
	AlertWebhook    string
	Failpoints      string
	MemoryLimit     string
	LogLevel        string
	LogFormat       string

	// Tracing is the traces exporter (otlp or none), TraceServiceName,
	// TraceSampler and TraceSamplerArg the OTEL_* settings read with it.
	Tracing          string
	TraceServiceName string
	TraceSampler     string
	TraceSamplerArg  string
	// PprofAddr is the profiling listener's address ("" = off).
	PprofAddr string

	// spanExporter, if set (tests), receives the spans and turns tracing on.
	spanExporter sdktrace.SpanExporter

	// PurchaseStrategy is pipeline or a comparison strategy (flashsale bench).
	PurchaseStrategy string

	// Protect is the rate limits, sold-out flag and trusted proxies.
	Protect httpapi.Protection

	// ReleaseGroup is the group this instance serves in during a release
	// (stable or canary): shown on the dashboard, compared by flashsale canary.
	ReleaseGroup string
	// ShadowSKUs are the SKUs whose live decisions this instance compares
	// with its own reserve script (comma-separated; empty: none);
	// ShadowRate the most decisions compared a second per SKU bucket.
	ShadowSKUs string
	ShadowRate float64

	// CrowdSecret signs challenges, tickets and admissions (default:
	// derived from UserTokenSecret); ChallengeRate and TicketRate bound the
	// challenges handed out and the solutions verified a second per
	// instance (each costs one PBKDF2 derivation); TicketTTL is how long a
	// ticket is good after the later of its issue and the sale's start.
	CrowdSecret   string
	ChallengeCost int
	ChallengeRate float64
	TicketRate    float64
	TicketTTL     time.Duration
	// ChallengeWork is the most derivations a challenge at level 0 takes
	// (ticket.Config.BaseWork).
	ChallengeWork int
	// AdmissionTTL is how long a waiting room's admission lasts;
	// RoomCapacity the admissions a second of a room whose sale gives no
	// admission_rate (the formula may admit fewer: docs/waiting-room.md).
	AdmissionTTL time.Duration
	RoomCapacity float64
	// Risk is when failed proofs and spent solutions sent again list a buyer automatically.
	Risk risk.Config
	// shadowScript, if set (tests), is the shadow's candidate reserve
	// script instead of this build's: a deliberately different gate.
	shadowScript string
	// reserveScript, if set (tests), replaces the live gate's reserve
	// script: a canary whose gate decides wrongly.
	reserveScript string
}

type envFlags struct {
	fs     *flag.FlagSet
	getenv func(string) string
	err    error
	// only names the settings registered as flags (commandFlags); nil: all.
	// A setting left out still takes its value from the environment or its
	// default, so the command behaves the same, it just does not offer it.
	only map[string]bool
}

// commandFlags names the settings a subcommand offers as flags, for those
// that use only a few of them; serve, demo and bench (which run the
// service) offer every one.
// commandArgs is how many arguments a subcommand takes after its flags
// (none unless listed); parseConfig returns them in config.Args.
var commandArgs = map[string]int{"drill": 1}

var commandFlags = map[string][]string{
	"migrate": {"database-url", "log-level", "log-format"},
	"token":   {"user-token-secret"},
	"canary":  canaryFlags,
	"drill":   drillFlags,
}

func (e *envFlags) wants(name string) bool { return e.only == nil || e.only[name] }

func (e *envFlags) str(p *string, name, env, def, usage string) {
	if v := e.getenv(env); v != "" {
		def = v
	}
	*p = def
	if e.wants(name) {
		e.fs.StringVar(p, name, def, usage+" ($"+env+")")
	}
}

// secret is str for a value that is never printed: -h says whether it is
// set from the environment, not what it is.
func (e *envFlags) secret(p *string, name, env, usage string) {
	*p = e.getenv(env)
	if e.wants(name) {
		secretVar(e.fs, p, name, env, usage)
	}
}

// url is str for a URL whose password -h must not print (it shows the
// URL with the password replaced by xxxxx).
func (e *envFlags) url(p *string, name, env, def, usage string) {
	if v := e.getenv(env); v != "" {
		def = v
	}
	*p = def
	if e.wants(name) {
		e.fs.Var(&urlValue{p}, name, usage+" ($"+env+")")
	}
}

func (e *envFlags) int(p *int, name, env string, def int, usage string) {
	if v := e.getenv(env); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			e.err = fmt.Errorf("$%s: %q is not a whole number", env, v)
		}
		def = n
	}
	*p = def
	if e.wants(name) {
		e.fs.IntVar(p, name, def, usage+" ($"+env+")")
	}
}

func (e *envFlags) float(p *float64, name, env string, def float64, usage string) {
	if v := e.getenv(env); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			e.err = fmt.Errorf("$%s: %q is not a number", env, v)
		}
		def = f
	}
	*p = def
	if e.wants(name) {
		e.fs.Float64Var(p, name, def, usage+" ($"+env+")")
	}
}

func (e *envFlags) bool(p *bool, name, env string, def bool, usage string) {
	if v := e.getenv(env); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			e.err = fmt.Errorf("$%s: %q is not true or false", env, v)
		}
		def = b
	}
	*p = def
	if e.wants(name) {
		e.fs.BoolVar(p, name, def, usage+" ($"+env+")")
	}
}

func (e *envFlags) dur(p *time.Duration, name, env string, def time.Duration, usage string) {
	if v := e.getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			e.err = fmt.Errorf("$%s: %q is not a duration (e.g. 90s, 15m)", env, v)
		}
		def = d
	}
	*p = def
	if e.wants(name) {
		e.fs.DurationVar(p, name, def, usage+" ($"+env+")")
	}
}

// secretVar registers a string flag whose value -h never prints; p must
// already hold the value from the environment (env), if any. A `word` in
// usage names the value in -h (else it reads "value").
func secretVar(fs *flag.FlagSet, p *string, name, env, usage string) {
	state := "not set"
	if *p != "" {
		state = "set, not shown"
	}
	fs.Var(&secretValue{p}, name, usage+" ($"+env+": "+state+")")
}

// secretValue is a flag.Value that never shows its value (the flag package
// prints String() as the default in -h).
type secretValue struct{ p *string }

func (v *secretValue) String() string { return "" }

func (v *secretValue) Set(s string) error { *v.p = s; return nil }

// urlValue is a flag.Value that shows its URL with the password redacted.
type urlValue struct{ p *string }

func (v *urlValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return hidePassword(*v.p)
}

func (v *urlValue) Set(s string) error { *v.p = s; return nil }

var (
	dsnPassword  = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)
	userPassword = regexp.MustCompile(`^([^:@/]*):[^@]*@`)
)

// hidePassword replaces the password of a database, Redis or NATS URL (or of a
// PostgreSQL keyword/value or MySQL DSN) with xxxxx.
// A NATS URL's lone user part is a token (nats://TOKEN@host), hidden too;
// a NATS list (nats://a,nats://b) is hidden server by server. A database
// URL's lone user part is a user name and stays.
func hidePassword(s string) string {
	if strings.HasPrefix(s, "nats://") || strings.HasPrefix(s, "tls://") {
		parts := strings.Split(s, ",")
		for i, p := range parts {
			if u, err := url.Parse(p); err == nil && u.User != nil {
				if _, has := u.User.Password(); has {
					parts[i] = u.Redacted()
				} else {
					u.User = url.User("xxxxx")
					parts[i] = u.String()
				}
			}
		}
		return strings.Join(parts, ",")
	}
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.User != nil {
		if _, has := u.User.Password(); has {
			return u.Redacted()
		}
		return s
	}
	if dsnPassword.MatchString(s) {
		return dsnPassword.ReplaceAllString(s, "${1}xxxxx")
	}
	if !strings.Contains(s, "://") {
		return userPassword.ReplaceAllString(s, "${1}:xxxxx@")
	}
	return s
}

// parseConfig reads flags (args) over environment variables over defaults.
// defaultDatabaseURL is -database-url's default.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/flashsale?sslmode=disable"

func parseConfig(name string, args []string, getenv func(string) string, out io.Writer, extra func(*flag.FlagSet)) (config, error) {
	var c config
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	e := &envFlags{fs: fs, getenv: getenv}
	if names, ok := commandFlags[name]; ok {
		e.only = map[string]bool{}
		for _, n := range names {
			e.only[n] = true
		}
	}
	fs.Usage = func() { commandUsage(fs, name) }
	e.str(&c.HTTPAddr, "http-addr", "FLASHSALE_HTTP_ADDR", "127.0.0.1:8080", "HTTP listen address")
	e.url(&c.DatabaseURL, "database-url", "FLASHSALE_DATABASE_URL", defaultDatabaseURL, "database `URL`: postgres://... or mysql://user:pass@host:3306/db (the database is created if missing)")
	e.url(&c.RedisURL, "redis-url", "FLASHSALE_REDIS_URL", "redis://127.0.0.1:6379/0", "Redis `URL`")
	e.str(&c.RedisPrefix, "redis-prefix", "FLASHSALE_REDIS_PREFIX", "fs", "prefix of every Redis key")
	e.url(&c.NATSURL, "nats-url", "FLASHSALE_NATS_URL", "embedded", "NATS `URL`: \"embedded\" (in-process JetStream, one instance) or nats://host:port")
	e.str(&c.DataDir, "data-dir", "FLASHSALE_DATA_DIR", "./data", "directory of the embedded JetStream store")
	e.secret(&c.AdminToken, "admin-token", "FLASHSALE_ADMIN_TOKEN", "bearer `token` of the admin API (admin API disabled when empty)")
	e.secret(&c.UserTokenSecret, "user-token-secret", "FLASHSALE_USER_TOKEN_SECRET", "HS256 `secret` of user tokens (required)")
	e.int(&c.DBMaxConns, "db-max-conns", "FLASHSALE_DB_MAX_CONNS", 16, "database pool size")
	e.int(&c.ApplyBatch, "apply-batch", "FLASHSALE_APPLY_BATCH", 1000, "most reservations applied in one database transaction")
	e.int(&c.ApplyWorkers, "apply-workers", "FLASHSALE_APPLY_WORKERS", 2, "concurrent batch appliers per instance")
	e.int(&c.NATSReplicas, "nats-replicas", "FLASHSALE_NATS_REPLICAS", 1, "replicas of the JetStream streams and durable consumers (3 on a 3-node JetStream cluster; a stream with more is never lowered)")
	e.int(&c.OrderSchema, "order-schema", "FLASHSALE_ORDER_SCHEMA", 2, "schema version of the reservations published on the order stream: 2 (several of a SKU per message, published only while every instance in the fleet registry reads it) or 1 (one per message, what every release reads; set it before rolling back past 07132d2: docs/releasing.md)")
	e.bool(&c.NATSSyncAlways, "nats-sync-always", "FLASHSALE_NATS_SYNC_ALWAYS", false, "embedded JetStream fsyncs every write (survives power loss; slower)")
	e.dur(&c.KeyRetention, "key-retention", "FLASHSALE_KEY_RETENTION", 24*time.Hour, "how long after a sale ends its Redis keys are kept (never while work is in flight)")
	e.dur(&c.ClosedRetention, "closed-retention", "FLASHSALE_CLOSED_RETENTION", stockgate.DefaultClosedRetention, "how long Redis remembers a closed order id (a retry of it is a duplicate); an older retry is answered from the database")
	e.dur(&c.CatalogRefresh, "catalog-refresh", "FLASHSALE_CATALOG_REFRESH", 2*time.Second, "how often the in-memory SKU catalog is reloaded from the database")
	e.dur(&c.RelayGrace, "relay-grace", "FLASHSALE_RELAY_GRACE", 2*time.Second, "age of an outbox entry before the relay's sweeper re-publishes it")
	e.dur(&c.RepublishAfter, "inflight-republish-after", "FLASHSALE_INFLIGHT_REPUBLISH_AFTER", 30*time.Second, "a reservation the stream acknowledged and still undecided this long after its acceptance is published again from Redis (the broker lost it); must exceed the normal drain time")
	e.dur(&c.StreamRetention, "stream-retention", "FLASHSALE_STREAM_RETENTION", 72*time.Hour, "how long reservations every consumer acknowledged stay in the order stream (an unacknowledged one is never removed)")
	e.dur(&c.AckWait, "ack-wait", "FLASHSALE_ACK_WAIT", 3*time.Second, "how long the broker waits for the consumer's ack before redelivering: how long a dead consumer's messages wait for another (a batch being applied is kept alive with in-progress acks)")
	e.int(&c.MaxDeliver, "max-deliver", "FLASHSALE_MAX_DELIVER", 3, "deliveries of a failing message (database healthy) before it is dead-lettered")
	e.str(&c.ApplyBackoff, "apply-backoff", "FLASHSALE_APPLY_BACKOFF", "200ms,1s,5s", "redelivery delays after a failed apply, by attempt (the last repeats)")
	e.dur(&c.BreakerWindow, "breaker-window", "FLASHSALE_BREAKER_WINDOW", 10*time.Second, "rolling window of the Redis circuit breaker")
	e.float(&c.BreakerRatio, "breaker-ratio", "FLASHSALE_BREAKER_RATIO", 0.5, "error ratio in the window that opens the breaker")
	e.int(&c.BreakerMinReqs, "breaker-min-requests", "FLASHSALE_BREAKER_MIN_REQUESTS", 20, "calls the window must hold before the breaker may open")
	e.dur(&c.BreakerOpenFor, "breaker-open-for", "FLASHSALE_BREAKER_OPEN_FOR", 5*time.Second, "how long the breaker stays open before a half-open probe")
	e.int(&c.FallbackConc, "fallback-concurrency", "FLASHSALE_FALLBACK_CONCURRENCY", 8, "database fallback purchases in flight per instance; beyond it 503 busy (0 disables the fallback)")
	e.dur(&c.RedisTimeout, "redis-timeout", "FLASHSALE_REDIS_TIMEOUT", time.Second, "deadline of one gate call (a timeout is an unknown outcome, asked again with the same order id)")
	e.dur(&c.MonitorEvery, "redis-monitor-every", "FLASHSALE_REDIS_MONITOR_EVERY", time.Second, "how often the Redis run id is checked (a restart triggers a rebuild from the database)")
	e.dur(&c.DrainDelay, "drain-delay", "FLASHSALE_DRAIN_DELAY", 5*time.Second, "on SIGTERM, how long /readyz answers 503 draining (and responses say Connection: close) while requests are still served, before the server shuts down: longer than the load balancer takes to take the instance out (HAProxy: inter x fall)")
	e.dur(&c.StreamAck, "stream-ack-timeout", "FLASHSALE_STREAM_ACK_TIMEOUT", 250*time.Millisecond, "a purchase waits this long for the stream's ack before answering 202 (0: answer once Redis accepted; the outbox delivers)")
	e.dur(&c.PaymentTimeout, "payment-timeout", "FLASHSALE_PAYMENT_TIMEOUT", 15*time.Minute, "an unpaid order is cancelled and its stock released this long after it was accepted")
	e.secret(&c.PaymentSecret, "payment-secret", "FLASHSALE_PAYMENT_SECRET", "HMAC-SHA256 `secret` of payment-provider callbacks (callback route disabled when empty)")
	e.dur(&c.SweepEvery, "sweep-every", "FLASHSALE_SWEEP_EVERY", time.Second, "period of the database sweeper that releases unpaid orders past their deadline (FOR UPDATE SKIP LOCKED, in batches of 500); a pay after the deadline is refused whatever the sweeper's delay")
	e.dur(&c.HistoryEvery, "history-every", "FLASHSALE_HISTORY_EVERY", 5*time.Second, "period of the check for sales that ended, which records each in sale_history (every instance checks; one row is written per sale)")
	e.dur(&c.ReconcileEvery, "reconcile-every", "FLASHSALE_RECONCILE_EVERY", 5*time.Minute, "period of the reconciler (one instance at a time, under a lease)")
	e.int(&c.ReconcileLimit, "reconcile-threshold", "FLASHSALE_RECONCILE_THRESHOLD", 2, "largest drift (units, seen twice) the reconciler corrects itself; above it alerts and leaves Redis alone")
	e.secret(&c.AlertWebhook, "alert-webhook-url", "FLASHSALE_ALERT_WEBHOOK_URL", "`URL` that receives reconcile alerts as JSON POSTs (optional)")
	e.str(&c.Failpoints, "failpoints", "FLASHSALE_FAILPOINTS", "", "crash sites for fault tests only (name=exit|hang,...)")
	e.str(&c.PurchaseStrategy, "purchase-strategy", "FLASHSALE_PURCHASE_STRATEGY", "pipeline", "pipeline, or a comparison strategy selling straight from the database: db-conditional, db-pessimistic, db-optimistic, redis-lock")
	protectFlags(e, &c.Protect)
	e.str(&c.LogLevel, "log-level", "FLASHSALE_LOG_LEVEL", "info", "debug, info, warn or error")
	e.str(&c.LogFormat, "log-format", "FLASHSALE_LOG_FORMAT", "text", "text or json")
	e.str(&c.Tracing, "tracing", "FLASHSALE_TRACING", or(getenv("OTEL_TRACES_EXPORTER"), "none"), "traces exporter: none, or otlp (OTLP over HTTP to $OTEL_EXPORTER_OTLP_ENDPOINT); defaults to $OTEL_TRACES_EXPORTER")
	e.str(&c.TraceServiceName, "trace-service-name", "OTEL_SERVICE_NAME", "flashsale", "service.name of the traces")
	e.str(&c.TraceSampler, "trace-sampler", "OTEL_TRACES_SAMPLER", "parentbased_always_on", "trace sampler: always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio")
	e.str(&c.TraceSamplerArg, "trace-sampler-arg", "OTEL_TRACES_SAMPLER_ARG", "", "probability of the ratio samplers, 0..1 (default 1)")
	e.str(&c.MemoryLimit, "memory-limit", "FLASHSALE_MEMORY_LIMIT", "auto", "soft memory limit of the Go runtime (the garbage collector works harder near it; never a hard cap): auto (90% of the cgroup's memory limit, none outside a container with one), off, or a size such as 240MiB; GOMEMLIMIT wins")
	e.str(&c.ReleaseGroup, "release-group", "FLASHSALE_RELEASE_GROUP", "stable", "the group this instance serves in during a release: stable or canary (shown on the dashboard and as flashsale_release_group in /metrics; flashsale canary compares the groups)")
	e.str(&c.ShadowSKUs, "shadow-skus", "FLASHSALE_SHADOW_SKUS", "", "comma-separated SKUs whose live gate decisions, made by every instance, this instance replays with its own reserve script and compares (flashsale_shadow_decisions_total); empty: none")
	e.float(&c.ShadowRate, "shadow-rate", "FLASHSALE_SHADOW_RATE", 5000, "most decisions a second the shadow compares per SKU (per stock bucket of a split sale); the rest are counted dropped")
	e.secret(&c.CrowdSecret, "crowd-secret", "FLASHSALE_CROWD_SECRET", "HMAC `secret` of proof-of-work challenges, tickets and waiting-room admissions, the same on every instance (default: derived from the user token secret)")
	e.int(&c.ChallengeCost, "challenge-cost", "FLASHSALE_CHALLENGE_COST", 5000, "PBKDF2 iterations of one derivation of a proof-of-work challenge: a browser takes about 1.2 ms per derivation at 5000, a solution about 250 derivations at the lowest level (docs/crowd.md)")
	e.float(&c.ChallengeRate, "challenge-rate", "FLASHSALE_CHALLENGE_RATE", 200, "most proof-of-work challenges this instance hands out a second (each costs it one PBKDF2 derivation, about 1.5 ms of CPU); beyond it 429")
	e.int(&c.ChallengeWork, "challenge-work", "FLASHSALE_CHALLENGE_WORK", 500, "most PBKDF2 derivations a proof-of-work challenge at level 0 takes a buyer (a mean of half; each level doubles it)")
	e.float(&c.TicketRate, "ticket-rate", "FLASHSALE_TICKET_RATE", 200, "most solved challenges this instance verifies a second (one PBKDF2 derivation each), checked before any work; beyond it 429")
	e.dur(&c.TicketTTL, "ticket-ttl", "FLASHSALE_TICKET_TTL", 5*time.Minute, "how long a ticket is good after the later of its issue and the sale's start")
	e.dur(&c.AdmissionTTL, "admission-ttl", "FLASHSALE_ADMISSION_TTL", 2*time.Minute, "how long a waiting room's admission lets its buyer buy")
	e.float(&c.RoomCapacity, "room-capacity", "FLASHSALE_ROOM_CAPACITY", 200, "admissions a second of a waiting room whose sale sets no admission_rate: what the gate and the database take for one SKU (the room admits fewer when little stock is left)")
	rd := risk.DefaultConfig()
	e.int(&c.Risk.ProofStrikes, "risk-proof-strikes", "FLASHSALE_RISK_PROOF_STRIKES", rd.ProofStrikes, "failed proofs of work by one buyer within the risk window that list the buyer automatically (0: never)")
	e.int(&c.Risk.ReplayStrikes, "risk-replay-strikes", "FLASHSALE_RISK_REPLAY_STRIKES", rd.ReplayStrikes, "spent solutions one buyer sent again within the risk window that list the buyer automatically (0: never)")
	e.dur(&c.Risk.Window, "risk-window", "FLASHSALE_RISK_WINDOW", rd.Window, "the window failures are counted in, from a buyer's first failure")
	e.dur(&c.Risk.AutoTTL, "risk-auto-ttl", "FLASHSALE_RISK_AUTO_TTL", rd.AutoTTL, "how long an automatic risk list entry blocks")
	e.str(&c.PprofAddr, "pprof-addr", "FLASHSALE_PPROF_ADDR", "", "listen address of the profiling endpoints /debug/pprof/ (admin token required; empty: off), e.g. 127.0.0.1:6060")
	if extra != nil {
		extra(fs)
	}
	if e.err != nil {
		return c, e.err
	}
	if err := parseFlags(fs, args); err != nil {
		return c, err
	}
	if fs.NArg() > commandArgs[name] {
		return c, noArguments(fs)
	}
	c.Args = fs.Args()
	switch {
	case c.DBMaxConns < 1:
		return c, fmt.Errorf("db-max-conns must be at least 1")
	case c.ApplyBatch < 1 || c.ApplyBatch > 10000:
		return c, fmt.Errorf("apply-batch must be 1..10000")
	case c.ApplyWorkers < 1:
		return c, fmt.Errorf("apply-workers must be at least 1")
	case c.MaxDeliver < 1:
		return c, fmt.Errorf("max-deliver must be at least 1")
	case c.RedisTimeout <= 0:
		// Every gate call and key look-up is bounded by it: zero or less
		// would fail each one at once.
		return c, fmt.Errorf("redis-timeout must be positive, got %v", c.RedisTimeout)
	case c.DrainDelay < 0:
		return c, fmt.Errorf("drain-delay must be 0 or more")
	case c.BreakerRatio <= 0 || c.BreakerRatio > 1:
		return c, fmt.Errorf("breaker-ratio must be in (0, 1]")
	case c.FallbackConc < 0:
		return c, fmt.Errorf("fallback-concurrency must be 0 or more")
	case c.PaymentTimeout < time.Second:
		return c, fmt.Errorf("payment-timeout must be at least 1s")
	case c.ClosedRetention < 10*time.Second:
		return c, fmt.Errorf("closed-retention must be at least 10s")
	case c.SweepEvery <= 0:
		return c, fmt.Errorf("sweep-every must be positive")
	case c.ReconcileEvery <= 0:
		return c, fmt.Errorf("reconcile-every must be positive")
	case c.HistoryEvery < time.Second:
		return c, fmt.Errorf("history-every must be at least 1s")
	case c.RepublishAfter < time.Second:
		return c, fmt.Errorf("inflight-republish-after must be at least 1s")
	case c.StreamRetention < time.Second:
		return c, fmt.Errorf("stream-retention must be at least 1s")
	case c.ReconcileLimit < 0:
		return c, fmt.Errorf("reconcile-threshold must be 0 or more")
	case c.OrderSchema != 1 && c.OrderSchema != orderqueue.SchemaBatch:
		return c, fmt.Errorf("order-schema must be 1 or 2, got %d", c.OrderSchema)
	case c.NATSReplicas < 1 || c.NATSReplicas > 5:
		return c, fmt.Errorf("nats-replicas must be 1..5 (JetStream's limit), got %d", c.NATSReplicas)
	case c.NATSReplicas > 1 && c.NATSURL == "embedded":
		return c, fmt.Errorf("nats-replicas %d needs a JetStream cluster (nats-url nats://host1,nats://host2,...): the embedded server is one node", c.NATSReplicas)
	}
	if _, err := c.backoff(); err != nil {
		return c, err
	}
	if c.ReleaseGroup != "stable" && c.ReleaseGroup != "canary" {
		return c, fmt.Errorf("release-group must be stable or canary, got %q", c.ReleaseGroup)
	}
	if c.ShadowRate <= 0 {
		return c, fmt.Errorf("shadow-rate must be more than 0, got %v", c.ShadowRate)
	}
	for _, id := range c.shadowSKUs() {
		if !sale.ValidSKU(id) {
			return c, fmt.Errorf("shadow-skus: %q is not a SKU id", id)
		}
	}
	if err := c.Protect.Check(); err != nil {
		return c, err
	}
	if _, err := parseMemoryLimit(c.MemoryLimit); err != nil {
		return c, err
	}
	if err := validStrategy(c.PurchaseStrategy); err != nil {
		return c, fmt.Errorf("purchase-strategy: %w", err)
	}
	if err := c.tracing().Check(); err != nil {
		return c, err
	}
	if c.Tracing == tracing.ExporterOTLP {
		// The exporter speaks OTLP over HTTP only.
		for _, env := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
			if v := getenv(env); v != "" && v != "http/protobuf" {
				return c, fmt.Errorf("$%s: %q is not supported: flashsale exports traces as http/protobuf", env, v)
			}
		}
	}
	if c.PprofAddr != "" {
		if _, _, err := net.SplitHostPort(c.PprofAddr); err != nil {
			return c, fmt.Errorf("pprof-addr: %q is not host:port", c.PprofAddr)
		}
		if c.AdminToken == "" {
			return c, fmt.Errorf("pprof-addr needs the admin token (FLASHSALE_ADMIN_TOKEN): the profiling endpoints require it")
		}
	}
	return c, nil
}

// protectFlags registers the settings of the protections in front of the
// gate: rate limits, the sold-out flag, trusted proxies and the trusted
// gateway (httpapi.Protection).
func protectFlags(e *envFlags, p *httpapi.Protection) {
	e.float(&p.InstanceRate, "rate-limit-instance", "FLASHSALE_RATE_LIMIT_INSTANCE", 20000, "buyer API requests per second this instance takes before answering 429 (0: no limit)")
	e.int(&p.InstanceBurst, "rate-limit-instance-burst", "FLASHSALE_RATE_LIMIT_INSTANCE_BURST", 20000, "burst of the instance limit (0: one second's worth)")
	e.float(&p.SKURate, "rate-limit-sku", "FLASHSALE_RATE_LIMIT_SKU", 0, "purchase attempts per second per SKU, over all instances (0: no limit)")
	e.int(&p.SKUBurst, "rate-limit-sku-burst", "FLASHSALE_RATE_LIMIT_SKU_BURST", 0, "burst of the SKU limit (0: one second's worth)")
	e.float(&p.UserRate, "rate-limit-user", "FLASHSALE_RATE_LIMIT_USER", 2, "purchase attempts per second per user and SKU, over all instances (0: no limit)")
	e.int(&p.UserBurst, "rate-limit-user-burst", "FLASHSALE_RATE_LIMIT_USER_BURST", 5, "burst of the user limit (0: one second's worth)")
	e.float(&p.IPRate, "rate-limit-ip", "FLASHSALE_RATE_LIMIT_IP", 0, "purchase attempts per second per client IP (IPv6: per /64) and SKU, over all instances (0: no limit)")
	e.int(&p.IPBurst, "rate-limit-ip-burst", "FLASHSALE_RATE_LIMIT_IP_BURST", 0, "burst of the IP limit (0: one second's worth)")
	e.dur(&p.SoldOutTTL, "sold-out-ttl", "FLASHSALE_SOLD_OUT_TTL", time.Second, "how long a sold-out SKU is answered from memory before one request asks Redis again (0: no sold-out flag)")
	e.dur(&p.SoldOutLease, "sold-out-lease", "FLASHSALE_SOLD_OUT_LEASE", 0, "length of the sold-out lease under which a keyed purchase of a sold-out SKU is answered from a snapshot of the sale's key holders instead of one Redis read, used while every instance in the fleet registry runs scripts that honour it (0: off, this release's default; 1s: docs/architecture.md)")
	e.str(&p.Proxies, "trusted-proxies", "FLASHSALE_TRUSTED_PROXIES", "", "CIDRs or addresses of proxies whose X-Forwarded-For is believed (empty: the socket peer is the client)")
	e.str(&p.GatewayHeader, "trusted-gateway-header", "FLASHSALE_TRUSTED_GATEWAY_HEADER", "", "header (e.g. X-User-Id) naming the authenticated user, believed only from trusted proxies (empty: off; every buyer needs a token)")
}

// tracing is the tracing setup c describes.
func (c config) tracing() tracing.Config {
	return tracing.Config{Exporter: c.Tracing, ServiceName: c.TraceServiceName, Sampler: c.TraceSampler,
		SamplerArg: c.TraceSamplerArg, SpanExporter: c.spanExporter}
}

// or returns v, or def when v is empty.
func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// backoff parses ApplyBackoff.
func (c config) backoff() ([]time.Duration, error) {
	var out []time.Duration
	for _, part := range strings.Split(c.ApplyBackoff, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("apply-backoff: %q is not a list of positive durations (e.g. 1s,5s,15s)", c.ApplyBackoff)
		}
		out = append(out, d)
	}
	return out, nil
}

// shadowSKUs returns the SKUs of ShadowSKUs.
func (c config) shadowSKUs() []string {
	var out []string
	for _, id := range strings.Split(c.ShadowSKUs, ",") {
		if id = strings.TrimSpace(id); id != "" {
			out = append(out, id)
		}
	}
	return out
}

// crowdKey is the key of challenges, tickets and admissions: the crowd
// secret, or one derived from the user token secret (every instance has
// that already), labelled so that it never equals a user-token key.
func (c config) crowdKey() []byte {
	if c.CrowdSecret != "" {
		return []byte(c.CrowdSecret)
	}
	m := hmac.New(sha256.New, []byte(c.UserTokenSecret))
	m.Write([]byte("flashsale crowd key v1"))
	return m.Sum(nil)
}

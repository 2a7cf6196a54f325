package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"
)

// config is every setting of serve (and demo). Each flag falls back to an
// environment variable; the README's configuration table lists them.
type config struct {
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
	KeyRetention    time.Duration
	CatalogRefresh  time.Duration
	RelayGrace      time.Duration
	AckWait         time.Duration
	Failpoints      string
	LogLevel        string
	LogFormat       string
}

type envFlags struct {
	fs     *flag.FlagSet
	getenv func(string) string
	err    error
}

func (e *envFlags) str(p *string, name, env, def, usage string) {
	if v := e.getenv(env); v != "" {
		def = v
	}
	e.fs.StringVar(p, name, def, usage+" ($"+env+")")
}

func (e *envFlags) int(p *int, name, env string, def int, usage string) {
	if v := e.getenv(env); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			e.err = fmt.Errorf("$%s: %q is not a whole number", env, v)
		}
		def = n
	}
	e.fs.IntVar(p, name, def, usage+" ($"+env+")")
}

func (e *envFlags) bool(p *bool, name, env string, def bool, usage string) {
	if v := e.getenv(env); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			e.err = fmt.Errorf("$%s: %q is not true or false", env, v)
		}
		def = b
	}
	e.fs.BoolVar(p, name, def, usage+" ($"+env+")")
}

func (e *envFlags) dur(p *time.Duration, name, env string, def time.Duration, usage string) {
	if v := e.getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			e.err = fmt.Errorf("$%s: %q is not a duration (e.g. 90s, 15m)", env, v)
		}
		def = d
	}
	e.fs.DurationVar(p, name, def, usage+" ($"+env+")")
}

// parseConfig reads flags (args) over environment variables over defaults.
func parseConfig(name string, args []string, getenv func(string) string, out io.Writer, extra func(*flag.FlagSet)) (config, error) {
	var c config
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	e := &envFlags{fs: fs, getenv: getenv}
	e.str(&c.HTTPAddr, "http-addr", "FLASHSALE_HTTP_ADDR", "127.0.0.1:8080", "HTTP listen address")
	e.str(&c.DatabaseURL, "database-url", "FLASHSALE_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/flashsale?sslmode=disable", "PostgreSQL URL (the database is created if missing)")
	e.str(&c.RedisURL, "redis-url", "FLASHSALE_REDIS_URL", "redis://127.0.0.1:6379/0", "Redis URL")
	e.str(&c.RedisPrefix, "redis-prefix", "FLASHSALE_REDIS_PREFIX", "fs", "prefix of every Redis key")
	e.str(&c.NATSURL, "nats-url", "FLASHSALE_NATS_URL", "embedded", `"embedded" (in-process JetStream, one instance) or nats://host:port`)
	e.str(&c.DataDir, "data-dir", "FLASHSALE_DATA_DIR", "./data", "directory of the embedded JetStream store")
	e.str(&c.AdminToken, "admin-token", "FLASHSALE_ADMIN_TOKEN", "", "bearer token of the admin API (admin API disabled when empty)")
	e.str(&c.UserTokenSecret, "user-token-secret", "FLASHSALE_USER_TOKEN_SECRET", "", "HS256 secret of user tokens (required)")
	e.int(&c.DBMaxConns, "db-max-conns", "FLASHSALE_DB_MAX_CONNS", 16, "PostgreSQL pool size")
	e.int(&c.ApplyBatch, "apply-batch", "FLASHSALE_APPLY_BATCH", 256, "most reservations applied in one database transaction")
	e.int(&c.ApplyWorkers, "apply-workers", "FLASHSALE_APPLY_WORKERS", 2, "concurrent batch appliers per instance")
	e.bool(&c.NATSSyncAlways, "nats-sync-always", "FLASHSALE_NATS_SYNC_ALWAYS", false, "embedded JetStream fsyncs every write (survives power loss; slower)")
	e.dur(&c.KeyRetention, "key-retention", "FLASHSALE_KEY_RETENTION", 24*time.Hour, "how long after a sale ends its Redis keys are kept (never while work is in flight)")
	e.dur(&c.CatalogRefresh, "catalog-refresh", "FLASHSALE_CATALOG_REFRESH", 2*time.Second, "how often the in-memory SKU catalog is reloaded from the database")
	e.dur(&c.RelayGrace, "relay-grace", "FLASHSALE_RELAY_GRACE", 2*time.Second, "age of an outbox entry before the relay's sweeper re-publishes it")
	e.dur(&c.AckWait, "ack-wait", "FLASHSALE_ACK_WAIT", 30*time.Second, "how long the broker waits for the consumer's ack before redelivering")
	e.str(&c.Failpoints, "failpoints", "FLASHSALE_FAILPOINTS", "", "crash sites for fault tests only (name=exit|hang,...)")
	e.str(&c.LogLevel, "log-level", "FLASHSALE_LOG_LEVEL", "info", "debug, info, warn or error")
	e.str(&c.LogFormat, "log-format", "FLASHSALE_LOG_FORMAT", "text", "text or json")
	if extra != nil {
		extra(fs)
	}
	if e.err != nil {
		return c, e.err
	}
	if err := fs.Parse(args); err != nil {
		return c, errUsage
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	switch {
	case c.DBMaxConns < 1:
		return c, fmt.Errorf("db-max-conns must be at least 1")
	case c.ApplyBatch < 1 || c.ApplyBatch > 10000:
		return c, fmt.Errorf("apply-batch must be 1..10000")
	case c.ApplyWorkers < 1:
		return c, fmt.Errorf("apply-workers must be at least 1")
	}
	return c, nil
}

package orderstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// PostgreSQL error codes this package reacts to.
const (
	pgInvalidCatalogName = "3D000" // database does not exist
	pgDuplicateDatabase  = "42P04"
	pgUniqueViolation    = "23505" // concurrent CREATE DATABASE can also end so
)

// maintenanceDB is where Open connects to create a missing database.
const maintenanceDB = "postgres"

// sessionDefaults are set on every connection of the pool unless the URL sets
// them.
//
// lock_timeout and statement_timeout: a stuck lock or a runaway statement
// fails the call (SQLSTATE 55P03, 57014) instead of holding an applier or a
// buyer forever. A lock wait on a hot inventory row is milliseconds. "0" in
// the URL turns one off.
//
// plan_cache_mode: pgx prepares every statement, and after five calls
// PostgreSQL may keep one generic plan per statement, costed with the
// statistics of that moment. A sale starts on an almost empty orders table
// and grows it faster than autovacuum re-analyses it, so a plan chosen at the
// start (a sequential scan) stays while the table grows to 100,000s of rows:
// in BenchmarkApplyBatch the per-user holdings read made batches of 500 take
// 20 ms instead of 8.6 ms (100: 7.7 ms instead of 2.5 ms). Custom plans see
// the table's current size on every call; planning these short statements
// costs tens of microseconds (not measurable in that benchmark).
var sessionDefaults = map[string]string{
	"lock_timeout":      "5s",
	"statement_timeout": "15s",
	"plan_cache_mode":   "force_custom_plan",
}

// pgStore is the PostgreSQL backend.
type pgStore struct {
	common
	pool *pgxpool.Pool
	db   *sql.DB // database/sql over pool, for DB
}

// openPostgres connects to the PostgreSQL database named in url (a postgres:// URL or
// a keyword/value DSN) with a pgxpool of o.MaxConns connections, and checks
// the connection. If the database does not exist, Open creates it first
// through the "postgres" maintenance database of the same server, when the
// role may; several processes doing so at once is safe. Open does not migrate:
// call Migrate. The caller must Close the Store.
//
// Connections default to lock_timeout=5s, statement_timeout=15s and
// plan_cache_mode=force_custom_plan (see sessionDefaults); the URL may set
// others (e.g. ?lock_timeout=1s, or 0 for none).
func openPostgres(ctx context.Context, url string, o Options) (*pgStore, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("orderstore: parse database url: %w", err)
	}
	for k, v := range sessionDefaults {
		if _, set := cfg.ConnConfig.RuntimeParams[k]; !set {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
	}
	cfg.MaxConns = o.MaxConns
	log := o.Logger

	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("orderstore: open pool: %w", err)
	}
	err = pool.Ping(ctx)
	if pgCode(err) == pgInvalidCatalogName {
		if cerr := createDatabase(ctx, cfg.ConnConfig, log); cerr != nil {
			pool.Close()
			return nil, fmt.Errorf("orderstore: %w (creating it: %w)", err, cerr)
		}
		err = pool.Ping(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("orderstore: connect: %w", err)
	}
	return &pgStore{common: newCommon(log, o), pool: pool, db: stdlib.OpenDBFromPool(pool)}, nil
}

// createDatabase creates the database named in cc through the maintenance
// database of the same server. A database created meanwhile by someone else
// counts as success.
func createDatabase(ctx context.Context, cc *pgx.ConnConfig, log *slog.Logger) error {
	name := cc.Database
	mc := cc.Copy()
	mc.Database = maintenanceDB
	conn, err := pgx.ConnectConfig(ctx, mc)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	switch pgCode(err) {
	case "":
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "orderstore: created database", "database", name)
		return nil
	case pgDuplicateDatabase, pgUniqueViolation:
		return nil
	}
	return err
}

// pgCode returns the SQLSTATE of err, or "" if err is not a PostgreSQL error.
func pgCode(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	return ""
}

// Close closes every connection of the pool, waiting for acquired ones to be released.
func (s *pgStore) Close() {
	_ = s.db.Close()
	s.pool.Close()
}

// Ping checks that the database answers.
func (s *pgStore) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("orderstore: ping: %w", err)
	}
	return nil
}

// DB returns a database/sql handle over the pool, for tests and invariant
// checks that read the tables directly (write statements with ? and pass
// them through Store.Rebind). Writes through it bypass the rules of this package.
func (s *pgStore) DB() *sql.DB { return s.db }

// Stats describes the pool.
func (s *pgStore) Stats() PoolStats {
	st := s.pool.Stat()
	return PoolStats{Max: int64(st.MaxConns()), Total: int64(st.TotalConns()), Idle: int64(st.IdleConns()),
		InUse: int64(st.AcquiredConns()), Waits: st.EmptyAcquireCount()}
}

//go:embed migrations/postgres/*.sql
var postgresMigrations embed.FS

// migrateLockPeriod and migrateLockTries bound how long Migrate waits for
// another instance's migration (period times tries, in seconds).
const (
	migrateLockPeriod = 1
	migrateLockTries  = 300
)

// Migrate brings the schema up to the newest embedded migration (goose,
// numbered SQL files). It is idempotent, and safe when several instances
// start at once: a PostgreSQL session advisory lock serialises them and the
// later ones find nothing to do. It waits up to 5 minutes for the lock.
func (s *pgStore) Migrate(ctx context.Context) error {
	fsys, err := fs.Sub(postgresMigrations, "migrations/postgres")
	if err != nil {
		return fmt.Errorf("orderstore: migrate: %w", err)
	}
	// goose needs database/sql. Its own short-lived connections, not the pool's:
	// the advisory lock dies with its session even if unlocking fails, and
	// migrating never starves the pool.
	// No time limits: building an index may take longer than any call should.
	cc := s.pool.Config().ConnConfig.Copy()
	cc.RuntimeParams["lock_timeout"] = "0"
	cc.RuntimeParams["statement_timeout"] = "0"
	db := stdlib.OpenDB(*cc)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(migrateLockPeriod, migrateLockTries))
	if err != nil {
		return fmt.Errorf("orderstore: migrate: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(s.log),
	)
	if err != nil {
		return fmt.Errorf("orderstore: migrate: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return fmt.Errorf("orderstore: migrate: %w", err)
	}
	for _, r := range results {
		s.log.InfoContext(ctx, "orderstore: migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
	}
	return nil
}

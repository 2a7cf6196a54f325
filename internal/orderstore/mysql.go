package orderstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"
)

// myStore is the MySQL/MariaDB backend (database/sql, go-sql-driver/mysql).
//
// Every transaction runs at READ COMMITTED, like the PostgreSQL one: each
// statement sees what committed before it, and locking reads and writes wait
// for row locks (no gap locks, so fewer deadlocks). Deadlocks that
// InnoDB still reports (1213) roll the transaction back and inTx runs it
// again.
type myStore struct {
	common
	db      *sql.DB // flashsale's pool: its sessions set @flashsale_audited
	outside *sql.DB // an ordinary client, for DB (tests, invariant checks)
	cfg     *mysql.Config

	beforeWrite func(lockFirst bool) // tests: runs in ApplyBatch between its reads and its writes
}

// MySQL error numbers this package reacts to.
const (
	myUnknownDatabase  = 1049
	myLockWaitTimeout  = 1205
	myDeadlock         = 1213
	myDuplicateKey     = 1062
	myCheckConstraint  = 4025 // MariaDB: CONSTRAINT failed
	myCheckConstraint8 = 3819 // MySQL 8: check constraint violated
)

// mysqlCode returns the error number of a MySQL error, or 0.
func mysqlCode(err error) uint16 {
	if me, ok := errors.AsType[*mysql.MySQLError](err); ok {
		return me.Number
	}
	return 0
}

// mysqlConfig turns a mysql:// (or mariadb://) URL into a driver config:
// mysql://user:pass@host:3306/db?param=value. Query parameters are the
// driver's DSN parameters (timeout, tls, ...) or session variables. flashsale
// always sets parseTime, loc=UTC, interpolateParams, time_zone '+00:00' and a
// strict sql_mode; innodb_lock_wait_timeout defaults to 5 s (like
// lock_timeout on PostgreSQL) unless the URL sets it.
func mysqlConfig(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1:3306"
	} else if u.Port() == "" {
		host += ":3306"
	}
	var dsn strings.Builder
	if u.User != nil {
		dsn.WriteString(u.User.Username())
		if p, ok := u.User.Password(); ok {
			dsn.WriteString(":" + p)
		}
		dsn.WriteString("@")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" {
		return nil, errors.New("mysql url names no database")
	}
	fmt.Fprintf(&dsn, "tcp(%s)/%s", host, db)
	if u.RawQuery != "" {
		dsn.WriteString("?" + u.RawQuery)
	}
	cfg, err := mysql.ParseDSN(dsn.String())
	if err != nil {
		return nil, err
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	cfg.Params["sql_mode"] = "'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'"
	if _, set := cfg.Params["innodb_lock_wait_timeout"]; !set {
		cfg.Params["innodb_lock_wait_timeout"] = "5"
	}
	return cfg, nil
}

// openMySQL connects to the MySQL/MariaDB database named in a mysql:// URL,
// creating it (utf8mb4) when it does not exist and the user may.
func openMySQL(ctx context.Context, raw string, o Options) (*myStore, error) {
	cfg, err := mysqlConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("orderstore: parse database url: %w", err)
	}
	outside, err := openMySQLPool(ctx, cfg, o)
	if err != nil {
		return nil, err
	}
	// The session's isolation level variable is tx_isolation on MariaDB and
	// MySQL 5.7, transaction_isolation on MySQL 8.
	isoVar := "transaction_isolation"
	var v string
	if err := outside.QueryRowContext(ctx, "SELECT @@transaction_isolation").Scan(&v); err != nil {
		isoVar = "tx_isolation"
	}
	own := cfg.Clone()
	own.Params[isoVar] = "'READ-COMMITTED'"
	// flashsale's sessions write their own stock_audit rows: the audit
	// trigger records only changes made by other clients (see migrations).
	own.Params["@flashsale_audited"] = "1"
	// ApplyBatch sends a few statements per round trip (see applyUnique).
	// Every statement of this package is a constant with ? placeholders the
	// driver fills in, escaped, so a value never ends a statement.
	own.MultiStatements = true
	db, err := openMySQLPool(ctx, own, o)
	if err != nil {
		outside.Close()
		return nil, err
	}
	outside.SetMaxOpenConns(4)
	return &myStore{common: newCommon(o.Logger, o), db: db, outside: outside, cfg: own}, nil
}

func openMySQLPool(ctx context.Context, cfg *mysql.Config, o Options) (*sql.DB, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("orderstore: %w", err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(int(o.MaxConns))
	db.SetMaxIdleConns(int(o.MaxConns))
	db.SetConnMaxLifetime(30 * time.Minute)
	err = db.PingContext(ctx)
	if mysqlCode(err) == myUnknownDatabase {
		if cerr := createMySQLDatabase(ctx, cfg, o); cerr != nil {
			db.Close()
			return nil, fmt.Errorf("orderstore: %w (creating it: %w)", err, cerr)
		}
		err = db.PingContext(ctx)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("orderstore: connect: %w", err)
	}
	return db, nil
}

func createMySQLDatabase(ctx context.Context, cfg *mysql.Config, o Options) error {
	err := onMySQLServer(ctx, cfg, "CREATE DATABASE IF NOT EXISTS "+quoteMySQL(cfg.DBName)+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
	if err == nil {
		o.Logger.InfoContext(ctx, "orderstore: created database", "database", cfg.DBName)
	}
	return err
}

// onMySQLServer runs stmt on the server of cfg, outside any database.
func onMySQLServer(ctx context.Context, cfg *mysql.Config, stmt string) error {
	mc := cfg.Clone()
	mc.DBName = ""
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// quoteMySQL quotes an identifier.
func quoteMySQL(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

func (s *myStore) Close() {
	_ = s.db.Close()
	_ = s.outside.Close()
}

func (s *myStore) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("orderstore: ping: %w", err)
	}
	return nil
}

// DB returns an ordinary client of the database (not flashsale's pool): a
// stock change made through it is recorded as an external change.
func (s *myStore) DB() *sql.DB { return s.outside }

func (s *myStore) Stats() PoolStats {
	st := s.db.Stats()
	return PoolStats{Max: int64(st.MaxOpenConnections), Total: int64(st.OpenConnections), Idle: int64(st.Idle),
		InUse: int64(st.InUse), Waits: st.WaitCount}
}

//go:embed migrations/mysql/*.sql
var mysqlMigrations embed.FS

// mysqlLocker serialises migrations of several instances with GET_LOCK (a
// session lock: it dies with the connection).
type mysqlLocker struct{}

const mysqlMigrateLock = "flashsale_migrate"

func (mysqlLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", mysqlMigrateLock, migrateLockPeriod*migrateLockTries).Scan(&got); err != nil {
		return err
	}
	if !got.Valid || got.Int64 != 1 {
		return errors.New("orderstore: migrate: another instance holds the migration lock")
	}
	return nil
}

func (mysqlLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	_, err := conn.ExecContext(ctx, "SELECT RELEASE_LOCK(?)", mysqlMigrateLock)
	return err
}

// Migrate brings the schema up to the newest embedded MySQL migration
// (migrations/mysql, numbered on their own). Safe when several instances
// start at once (GET_LOCK).
func (s *myStore) Migrate(ctx context.Context) error {
	fsys, err := fs.Sub(mysqlMigrations, "migrations/mysql")
	if err != nil {
		return fmt.Errorf("orderstore: migrate: %w", err)
	}
	mc := s.cfg.Clone()
	delete(mc.Params, "@flashsale_audited")
	mc.MultiStatements = false
	mc.Params["innodb_lock_wait_timeout"] = "300"
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return fmt.Errorf("orderstore: migrate: %w", err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectMySQL, db, fsys,
		goose.WithSessionLocker(mysqlLocker{}),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(s.log),
	)
	if err != nil {
		return fmt.Errorf("orderstore: migrate: %w", err)
	}
	results, err := p.Up(ctx)
	for attempt := 0; err != nil && strings.Contains(err.Error(), "missing zero version") && attempt < 5; attempt++ {
		// goose creates its version table outside the migration lock; on
		// MySQL CREATE TABLE commits at once, so another instance can see
		// the table before its zero row. That row follows within moments.
		select {
		case <-ctx.Done():
			return fmt.Errorf("orderstore: migrate: %w", errors.Join(err, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
		results, err = p.Up(ctx)
	}
	if err != nil {
		return fmt.Errorf("orderstore: migrate: %w", err)
	}
	for _, r := range results {
		s.log.InfoContext(ctx, "orderstore: migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
	}
	return nil
}

// retryable reports whether a transaction failed only because InnoDB chose
// it as a deadlock victim: run it again. A lock wait timeout is not retried:
// something held the lock for innodb_lock_wait_timeout already, and the
// caller's own retry policy (with its deadline) decides.
func retryable(err error) bool {
	return mysqlCode(err) == myDeadlock
}

// inTx runs fn in a READ COMMITTED transaction on flashsale's pool and
// commits, running it again (up to 5 times in all) when InnoDB reports a
// deadlock. fn must not keep state across attempts
// beyond what it returns.
func (s *myStore) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return againOnDeadlock(ctx, func() error { return s.tx(ctx, fn) })
}

// againOnDeadlock runs fn, and again (up to 5 times in all, backing off)
// while InnoDB chooses it as a deadlock victim: fn is a whole transaction,
// or a statement that is one by itself, and safe to repeat.
func againOnDeadlock(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(time.Duration(attempt*attempt) * 5 * time.Millisecond):
			}
		}
		err = fn()
		if !retryable(err) {
			return err
		}
	}
	return err
}

func (s *myStore) tx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// placeholders returns "?, ?, ..., ?" (n of them).
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}

// anys returns ss as []any, for IN (...) arguments.
func anys[T any](ss []T) []any {
	out := make([]any, len(ss))
	for i, v := range ss {
		out[i] = v
	}
	return out
}

package orderstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// IsTransient reports whether err is a failure of the database or of the
// way to it rather than of the statement: asked again later, the same
// request may well succeed. Transient are connection errors (network errors,
// a connection closed or reset mid-statement, a refused or failed connect,
// an administrator or crash shutdown), timeouts (a context deadline, a
// statement timeout), serialization failures, deadlocks and lock timeouts,
// in either dialect, and a cancelled context. Everything else (a constraint
// a row breaks, a bad statement, a trigger's refusal) would fail the same
// way again: IsTransient returns false for it, and for nil.
//
// Callers above this package classify failures with IsTransient, so they
// need not know the drivers.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if pgconn.Timeout(err) || pgconn.SafeToRetry(err) {
		return true
	}
	if code := pgCode(err); code != "" {
		return transientSQLState(code)
	}
	if n := mysqlCode(err); n != 0 {
		return transientMySQL(n)
	}
	// pgx reports a connection that broke under it with plain errors.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "connection reset by peer") ||
		strings.Contains(msg, "broken pipe")
}

// transientSQLState reports whether a PostgreSQL SQLSTATE names a transient failure.
func transientSQLState(code string) bool {
	switch {
	case strings.HasPrefix(code, "08"): // connection exception
		return true
	}
	switch code {
	case "57P01", "57P02", "57P03", // admin shutdown, crash shutdown, cannot connect now
		"57014",          // query canceled (statement_timeout)
		"40001", "40P01", // serialization failure, deadlock detected
		"55P03", // lock not available (lock_timeout)
		"53300": // too many connections
		return true
	}
	return false
}

// MySQL error numbers of transient failures besides lock waits and deadlocks.
const (
	myTooManyConnections = 1040
	myServerShutdown     = 1053
	myQueryInterrupted   = 1317 // max_statement_time / KILL QUERY
	myConnectionKilled   = 1927 // MariaDB
	myQueryTimeout       = 3024 // MySQL 8: max_execution_time
)

// transientMySQL reports whether a MySQL error number names a transient failure.
func transientMySQL(n uint16) bool {
	switch n {
	case myLockWaitTimeout, myDeadlock, myTooManyConnections, myServerShutdown,
		myQueryInterrupted, myConnectionKilled, myQueryTimeout:
		return true
	}
	return false
}

package orderstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
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

// Outage reports whether err says the database as a whole will not take
// writes for now, whatever the statement, and names the cause for
// operators. It is true when the database refuses writes (a standby, a
// switchover or failover in progress, read_only set: PostgreSQL SQLSTATE
// 25006; MySQL and MariaDB 1290 with read_only, 1792, 1836), when it lacks
// the resources to take them (out of disk or memory: SQLSTATE 53000, 53100,
// 53200, 58030; MySQL 1021, 1037, 1041, 1114), and when a Galera node is not
// ready for statements (1047). Connections and pings succeed meanwhile, so a
// caller that tells a message's own failure from the database's by a ping
// would blame the message.
//
// Unlike a transient failure (IsTransient), an outage may last minutes and
// every request fails the same way until it ends: callers wait for the
// database rather than retry each request on its own. Outage returns false
// for nil and for every other error.
func Outage(err error) (reason string, ok bool) {
	if err == nil {
		return "", false
	}
	if code := pgCode(err); code != "" {
		switch code {
		case "25006":
			return "the database refuses writes (read-only transaction, SQLSTATE 25006)", true
		case "53000", "53100", "53200":
			return "the database lacks resources (SQLSTATE " + code + ")", true
		case "58030":
			return "the database cannot write to its disk (SQLSTATE 58030)", true
		}
		return "", false
	}
	switch n := mysqlCode(err); n {
	case myOptionPreventsStatement, myReadOnlyTransaction, myReadOnlyMode:
		return fmt.Sprintf("the database refuses writes (read only, error %d)", n), true
	case myDiskFull, myOutOfMemory, myOutOfResources, myTableFull:
		return fmt.Sprintf("the database lacks resources (error %d)", n), true
	case myNodeNotReady:
		return "the database node is not ready for statements (error 1047)", true
	}
	return "", false
}

// MySQL error numbers of outages (see Outage).
const (
	myDiskFull                = 1021 // ER_DISK_FULL
	myOutOfMemory             = 1037 // ER_OUTOFMEMORY
	myOutOfResources          = 1041 // ER_OUT_OF_RESOURCES
	myNodeNotReady            = 1047 // ER_UNKNOWN_COM_ERROR: Galera "WSREP has not yet prepared node"
	myTableFull               = 1114 // ER_RECORD_FILE_FULL: InnoDB out of tablespace
	myOptionPreventsStatement = 1290 // ER_OPTION_PREVENTS_STATEMENT: --read-only
	myReadOnlyTransaction     = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	myReadOnlyMode            = 1836 // ER_READ_ONLY_MODE
)

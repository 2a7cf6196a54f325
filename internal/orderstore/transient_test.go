package orderstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// TestIsTransient: connection errors, timeouts, serialization failures,
// deadlocks and lock timeouts of both drivers are transient, wrapped or
// not; what a statement or a row gets wrong is not.
func TestIsTransient(t *testing.T) {
	// A real connect failure: nothing listens on a port we just closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, connectErr := pgconn.Connect(ctx, fmt.Sprintf("postgres://u@127.0.0.1:%d/db?connect_timeout=2", addr.Port))
	if connectErr == nil {
		t.Fatal("connected to a closed port")
	}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	wrap := func(err error) error { return fmt.Errorf("orderstore: apply batch: %w", err) }
	pg := func(code string) error { return wrap(&pgconn.PgError{Code: code, Message: "x"}) }
	my := func(n uint16) error { return wrap(&mysql.MySQLError{Number: n, Message: "x"}) }

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"context deadline", wrap(context.DeadlineExceeded), true},
		{"context canceled", wrap(context.Canceled), true},
		{"io.EOF", wrap(io.EOF), true},
		{"unexpected EOF", wrap(io.ErrUnexpectedEOF), true},
		{"connection reset", wrap(reset), true},
		{"connection refused", wrap(refused), true},
		{"net.ErrClosed", wrap(net.ErrClosed), true},
		{"pgconn connect error", wrap(connectErr), true},
		{"pgx conn closed", wrap(errors.New("conn closed")), true},
		{"sql.ErrConnDone", wrap(sql.ErrConnDone), true},
		{"driver.ErrBadConn", wrap(driver.ErrBadConn), true},
		{"mysql.ErrInvalidConn", wrap(mysql.ErrInvalidConn), true},
		{"pg 08006 connection failure", pg("08006"), true},
		{"pg 08P01 protocol violation", pg("08P01"), true},
		{"pg 57P01 admin shutdown", pg("57P01"), true},
		{"pg 57P02 crash shutdown", pg("57P02"), true},
		{"pg 57P03 cannot connect now", pg("57P03"), true},
		{"pg 57014 statement timeout", pg("57014"), true},
		{"pg 40001 serialization failure", pg("40001"), true},
		{"pg 40P01 deadlock", pg("40P01"), true},
		{"pg 55P03 lock timeout", pg("55P03"), true},
		{"mysql 1213 deadlock", my(1213), true},
		{"mysql 1205 lock wait timeout", my(1205), true},
		{"mysql 1053 server shutdown", my(1053), true},
		{"mariadb 1927 connection killed", my(1927), true},

		{"pg 23514 check violation", pg("23514"), false},
		{"pg 23505 unique violation", pg("23505"), false},
		{"pg P0001 raised by a trigger", pg("P0001"), false},
		{"pg 42P01 undefined table", pg("42P01"), false},
		{"mysql 4025 check constraint", my(4025), false},
		{"mysql 1062 duplicate key", my(1062), false},
		{"mysql 1644 signal from a trigger", my(1644), false},
		{"sale error", wrap(sale.ErrInvalid), false},
		{"plain error", errors.New("something else"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := orderstore.IsTransient(tt.err); got != tt.want {
				t.Errorf("IsTransient(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

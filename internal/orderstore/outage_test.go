package orderstore_test

import (
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestOutageReadOnly: a database that refuses writes while it answers pings
// (a switchover: PostgreSQL's default_transaction_read_only on the
// database, MariaDB's read_only with flashsale connecting as a user without
// the privilege to bypass it) fails ApplyBatch with an error Outage
// recognizes, changing nothing; once writes come back the same batch
// applies.
func TestOutageReadOnly(t *testing.T) {
	ctx := testContext(t)
	var s *orderstore.Store
	var on, off func()
	if testenv.Dialect() == "mysql" {
		srv := testenv.StartMariaDB(t)
		name := testenv.RandomName("flashsale_t_")
		admin := mysqlAdmin(t, srv.URL(""))
		user := testenv.RandomName("fs_")
		for _, q := range []string{
			fmt.Sprintf("CREATE USER '%s'@'%%'", user),
			fmt.Sprintf("GRANT ALL PRIVILEGES ON `%s`.* TO '%s'@'%%'", name, user),
		} {
			if _, err := admin.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		u, _ := url.Parse(srv.URL(name))
		u.User = url.User(user)
		s = newStoreAt(t, u.String())
		on = func() { mustExec(t, admin, "SET GLOBAL read_only = 1") }
		off = func() { mustExec(t, admin, "SET GLOBAL read_only = 0") }
	} else {
		dbURL := testenv.Database(t)
		s = newStoreAt(t, dbURL)
		u, _ := url.Parse(dbURL)
		name := strings.TrimPrefix(u.Path, "/")
		u.Path = "/postgres"
		set := func(setting string) {
			conn, err := pgx.Connect(ctx, u.String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			for _, q := range []string{"ALTER DATABASE " + pgx.Identifier{name}.Sanitize() + " " + setting,
				"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" + name + "'"} {
				if _, err := conn.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
		}
		on = func() { set("SET default_transaction_read_only = on") }
		off = func() { set("RESET default_transaction_read_only") }
	}
	putSKU(t, s, "s", 10)
	batch := []sale.Reservation{newResv("s", "u1", 1), newResv("s", "u2", 2)}

	// apply tries the batch until the answer is not a connection the
	// server ended (the pool then reconnects) and returns it.
	apply := func() ([]orderstore.Outcome, error) {
		for try := 0; ; try++ {
			outs, err := s.ApplyBatch(ctx, batch)
			if err == nil || !orderstore.IsTransient(err) || try == 20 {
				return outs, err
			}
		}
	}

	on()
	_, err := apply()
	reason, ok := orderstore.Outage(err)
	if !ok {
		t.Fatalf("ApplyBatch on a read-only database: %v; Outage = false, want true", err)
	}
	t.Logf("refused: %v (%s)", err, reason)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping on a read-only database: %v, want nil (the fault is writes only)", err)
	}
	if got := readLedger(t, s, "s"); got.Orders != 0 || got.Stock != 10 {
		t.Fatalf("after the refusal: %+v, want nothing changed", got)
	}

	off()
	outs, err := apply()
	if err != nil {
		t.Fatalf("ApplyBatch once writes are back: %v", err)
	}
	for i, o := range outs {
		if o.Status != sale.StatusPendingPayment || o.Duplicate {
			t.Errorf("outcome %d: %+v, want applied", i, o)
		}
	}
	checkInvariants(t, s, "s")
}

// TestOutageClassifies: the errors of a database refusing writes or out of
// resources are outages, wrapped or not; a statement's or a row's own
// failure, and a transient one, are not.
func TestOutageClassifies(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("orderstore: apply batch: %w", err) }
	pg := func(code string) error { return wrap(&pgconn.PgError{Code: code, Message: "x"}) }
	my := func(n uint16) error { return wrap(&mysql.MySQLError{Number: n, Message: "x"}) }
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"pg 25006 read-only transaction", pg("25006"), true},
		{"pg 53100 disk full", pg("53100"), true},
		{"pg 53200 out of memory", pg("53200"), true},
		{"pg 58030 io error", pg("58030"), true},
		{"mysql 1290 read_only", my(1290), true},
		{"mysql 1792 read-only transaction", my(1792), true},
		{"mysql 1836 read-only mode", my(1836), true},
		{"mysql 1021 disk full", my(1021), true},
		{"mysql 1114 table full", my(1114), true},
		{"galera 1047 node not ready", my(1047), true},

		{"pg 40001 serialization failure", pg("40001"), false},
		{"pg P0001 raised by a trigger", pg("P0001"), false},
		{"pg 23514 check violation", pg("23514"), false},
		{"mysql 1213 deadlock", my(1213), false},
		{"mysql 1644 signal from a trigger", my(1644), false},
		{"plain error", fmt.Errorf("read-only"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reason, got := orderstore.Outage(tt.err)
			if got != tt.want || (got && reason == "") {
				t.Errorf("Outage(%v) = %q, %v; want %v with a reason", tt.err, reason, got, tt.want)
			}
		})
	}
}

func mysqlAdmin(t *testing.T, raw string) *sql.DB {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = u.User.Username(), "tcp", u.Host
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.ExecContext(testContext(t), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

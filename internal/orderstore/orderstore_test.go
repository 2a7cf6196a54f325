package orderstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// testTimeout bounds every test's database calls (the pool has no acquire timeout).
const testTimeout = 2 * time.Minute

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newStore returns a migrated Store on a fresh database.
func newStore(t testing.TB) *orderstore.Store {
	t.Helper()
	return newStoreAt(t, testenv.Database(t))
}

// putSKU creates a SKU without a window and with a per-user limit of 5.
func putSKU(t testing.TB, s *orderstore.Store, id string, total int64) {
	t.Helper()
	putSKUChange(t, s, orderstore.SKUChange{ID: id, TotalStock: total, PerUserLimit: 5})
}

func putSKUChange(t testing.TB, s *orderstore.Store, c orderstore.SKUChange) {
	t.Helper()
	if _, _, _, err := s.PutSKU(testContext(t), c); err != nil {
		t.Fatalf("PutSKU(%+v): %v", c, err)
	}
}

// acceptedAt is a fixed acceptance time, so order rows can be compared exactly.
var acceptedAt = time.Date(2030, 5, 6, 7, 8, 9, 123_000_000, time.UTC)

// oid returns a deterministic, valid order id: case c, number n.
func oid(c, n int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", c, n) }

func resv(id, sku, user string, qty int64) sale.Reservation {
	return sale.Reservation{OrderID: id, SKU: sku, User: user, Quantity: qty, AcceptedAt: acceptedAt.UnixMilli()}
}

func newResv(sku, user string, qty int64) sale.Reservation {
	return resv(uuid.Must(uuid.NewV7()).String(), sku, user, qty)
}

// ledger is what the database says about one SKU, read in one snapshot.
type ledger struct {
	Stock, Total, Live int64
	Orders, Logged     int64 // order rows and process_log rows of the SKU
	Orphans            int64 // process_log rows without an order row, or the reverse
}

func readLedger(t testing.TB, s *orderstore.Store, sku string) ledger {
	t.Helper()
	ctx := testContext(t)
	var l ledger
	tx, err := s.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		t.Fatalf("read ledger of %s: %v", sku, err)
	}
	defer tx.Rollback()
	q := func(query string, dest ...any) {
		t.Helper()
		if err := tx.QueryRowContext(ctx, s.Rebind(query), sku).Scan(dest...); err != nil && err != sql.ErrNoRows {
			t.Fatalf("read ledger of %s: %s: %v", sku, query, err)
		}
	}
	q(`SELECT stock, total_stock FROM inventory WHERE sku_id = ?`, &l.Stock, &l.Total)
	q(`SELECT coalesce(sum(CASE WHEN status IN ('pending_payment', 'paid') THEN quantity ELSE 0 END), 0), count(*)
FROM orders WHERE sku_id = ?`, &l.Live, &l.Orders)
	q(`SELECT count(*) FROM process_log WHERE sku_id = ?`, &l.Logged)
	var a, b int64
	q(`SELECT count(*) FROM process_log p WHERE p.sku_id = ? AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = p.tx_id)`, &a)
	q(`SELECT count(*) FROM orders o WHERE o.sku_id = ? AND NOT EXISTS (SELECT 1 FROM process_log p WHERE p.tx_id = o.order_id)`, &b)
	l.Orphans = a + b
	return l
}

// queryInt runs a query returning one integer through the store's outside
// client (write it with ? placeholders).
func queryInt(t testing.TB, s *orderstore.Store, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := s.DB().QueryRowContext(testContext(t), s.Rebind(query), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// execSQL runs a statement through the store's outside client (? placeholders).
// On both dialects a stock change made this way is an external change.
func execSQL(t testing.TB, s *orderstore.Store, query string, args ...any) int64 {
	t.Helper()
	res, err := s.DB().ExecContext(testContext(t), s.Rebind(query), args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	n, _ := res.RowsAffected()
	return n
}

// checkInvariants checks I1 and I5 for sku from SQL: stock >= 0, stock + live
// = total, and exactly one process_log row per order row.
func checkInvariants(t testing.TB, s *orderstore.Store, sku string) ledger {
	t.Helper()
	l := readLedger(t, s, sku)
	if l.Stock < 0 {
		t.Errorf("%s: stock %d < 0", sku, l.Stock)
	}
	if l.Stock+l.Live != l.Total {
		t.Errorf("%s: stock %d + live %d != total %d", sku, l.Stock, l.Live, l.Total)
	}
	if l.Orders != l.Logged || l.Orphans != 0 {
		t.Errorf("%s: %d order rows, %d process_log rows, %d without a partner", sku, l.Orders, l.Logged, l.Orphans)
	}
	return l
}

func TestMigrateTwiceIsNoop(t *testing.T) {
	s := newStore(t) // migrated once
	ctx := testContext(t)
	before := schemaVersions(t, s)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if got := schemaVersions(t, s); got != before {
		t.Errorf("goose_db_version rows: %d after second Migrate, %d before", got, before)
	}
	for _, table := range []string{"inventory", "orders", "process_log"} {
		var n int64
		if err := s.DB().QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Errorf("table %s: %v", table, err)
		}
	}
}

func schemaVersions(t testing.TB, s *orderstore.Store) int64 {
	t.Helper()
	return queryInt(t, s, `SELECT count(*) FROM goose_db_version WHERE version_id > 0`)
}

// migrationFiles counts the embedded migrations, from their source directory.
func migrationFiles(t testing.TB) int64 {
	t.Helper()
	files, err := filepath.Glob("migrations/" + testenv.Dialect() + "/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migrations: %v (%d files)", err, len(files))
	}
	return int64(len(files))
}

func TestMigrateConcurrently(t *testing.T) {
	dbURL := testenv.Database(t)
	ctx := testContext(t)
	const instances = 4
	var wg sync.WaitGroup
	errs := make([]error, instances)
	for i := range instances {
		wg.Go(func() {
			s, err := orderstore.Open(ctx, dbURL, orderstore.Options{})
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			errs[i] = s.Migrate(ctx)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("instance %d: %v", i, err)
		}
	}
	s, err := orderstore.Open(ctx, dbURL, orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := schemaVersions(t, s), migrationFiles(t); got != want {
		t.Errorf("goose_db_version rows = %d, want %d", got, want)
	}
}

func TestOpenCreatesMissingDatabase(t *testing.T) {
	base := testenv.Database(t) // skips when there is no server
	ctx := testContext(t)
	name := testenv.RandomName("flashsale_t_")
	missing := withDatabase(t, base, name)
	t.Cleanup(func() {
		s, err := orderstore.Open(context.Background(), base, orderstore.Options{MaxConns: 1})
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer s.Close()
		drop := "DROP DATABASE IF EXISTS " + name
		if s.Dialect() == orderstore.Postgres {
			drop += " WITH (FORCE)"
		}
		if _, err := s.DB().ExecContext(context.Background(), drop); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})

	// Several instances starting at once all succeed.
	const instances = 4
	var wg sync.WaitGroup
	errs := make([]error, instances)
	for i := range instances {
		wg.Go(func() {
			s, err := orderstore.Open(ctx, missing, orderstore.Options{MaxConns: 2})
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			q := "SELECT current_database()"
			if s.Dialect() == orderstore.MySQL {
				q = "SELECT database()"
			}
			var got string
			if err := s.DB().QueryRowContext(ctx, q).Scan(&got); err != nil {
				errs[i] = err
				return
			}
			if got != name {
				errs[i] = fmt.Errorf("connected to %q, want %q", got, name)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("instance %d: %v", i, err)
		}
	}
}

// withDatabase returns the connection string base (URL or keyword/value DSN)
// naming database name instead.
func withDatabase(t *testing.T, base, name string) string {
	t.Helper()
	u, err := orderstore.WithDatabase(base, name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestOpenUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// Port 1 on loopback: nothing listens there.
	_, err := orderstore.Open(ctx, "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2", orderstore.Options{})
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
}

func TestSessionDefaults(t *testing.T) {
	if testenv.Dialect() == "mysql" {
		testMySQLSessionDefaults(t)
		return
	}
	dbURL := testenv.Postgres(t)
	ctx := testContext(t)
	show := func(s *orderstore.Store) map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, k := range []string{"lock_timeout", "statement_timeout", "plan_cache_mode"} {
			var v string
			if err := s.DB().QueryRowContext(ctx, "SHOW "+k).Scan(&v); err != nil {
				t.Fatal(err)
			}
			got[k] = v
		}
		return got
	}

	s := newStoreAt(t, dbURL)
	want := map[string]string{"lock_timeout": "5s", "statement_timeout": "15s", "plan_cache_mode": "force_custom_plan"}
	if diff := cmp.Diff(want, show(s)); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}

	// The URL wins, and a lock held too long fails the call, changing nothing.
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Skipf("FLASHSALE_TEST_DATABASE_URL is not a URL: %v", err)
	}
	q := u.Query()
	q.Set("lock_timeout", "200ms")
	u.RawQuery = q.Encode()
	short := newStoreAt(t, u.String())
	want["lock_timeout"] = "200ms"
	if diff := cmp.Diff(want, show(short)); diff != "" {
		t.Errorf("with lock_timeout in the URL (-want +got):\n%s", diff)
	}
	putSKU(t, short, "LOCKED", 5)
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM inventory WHERE sku_id = 'LOCKED' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = short.ApplyBatch(ctx, []sale.Reservation{resv(oid(1, 1), "LOCKED", "u1", 1)})
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "55P03" {
		t.Errorf("ApplyBatch against a held row lock: err = %v, want lock_not_available (55P03)", err)
	}
	if _, _, err := short.BuyDirect(ctx, resv(oid(1, 2), "LOCKED", "u1", 1), time.Now()); err == nil {
		t.Error("BuyDirect against a held row lock succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("two calls took %v to give up", d)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if l := checkInvariants(t, s, "LOCKED"); l.Stock != 5 || l.Logged != 0 {
		t.Errorf("timed-out calls changed the database: %+v", l)
	}
}

// newStoreAt returns a migrated Store on the database at dbURL.
func newStoreAt(t testing.TB, dbURL string) *orderstore.Store {
	t.Helper()
	ctx := testContext(t)
	s, err := orderstore.Open(ctx, dbURL, orderstore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// testMySQLSessionDefaults: flashsale's MySQL sessions run at READ COMMITTED
// in UTC with innodb_lock_wait_timeout 5 s unless the URL says otherwise, and
// a lock held too long fails the call, changing nothing.
func testMySQLSessionDefaults(t *testing.T) {
	dbURL := testenv.MySQL(t)
	ctx := testContext(t)
	s := newStoreAt(t, dbURL)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("innodb_lock_wait_timeout", "1")
	u.RawQuery = q.Encode()
	short := newStoreAt(t, u.String())
	putSKU(t, short, "LOCKED", 5)
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM inventory WHERE sku_id = 'LOCKED' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := short.ApplyBatch(ctx, []sale.Reservation{resv(oid(1, 1), "LOCKED", "u1", 1)}); err == nil || !strings.Contains(err.Error(), "1205") {
		t.Errorf("ApplyBatch against a held row lock: err = %v, want lock wait timeout (1205)", err)
	}
	if _, _, err := short.BuyDirect(ctx, resv(oid(1, 2), "LOCKED", "u1", 1), time.Now()); err == nil {
		t.Error("BuyDirect against a held row lock succeeded")
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("two calls took %v to give up", d)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if l := checkInvariants(t, s, "LOCKED"); l.Stock != 5 || l.Logged != 0 {
		t.Errorf("timed-out calls changed the database: %+v", l)
	}
}

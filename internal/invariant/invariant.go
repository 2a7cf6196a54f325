// Package invariant checks the sale's invariants (listed in docs/faults.md) for a SKU directly
// from the database (PostgreSQL or MySQL) and Redis, never from the service's
// own counters. Tests, the demo and the load generator all use it.
package invariant

import (
	"context"
	"fmt"

	"database/sql"
	"strings"

	"github.com/flashsale/flashsale/internal/stockgate"
)

// Report is what the database and Redis say about one SKU.
type Report struct {
	SKU            string
	TotalStock     int64 // allocation (S0 plus restocks)
	DBStock        int64
	PerUserLimit   int64
	LiveUnits      int64 // units of pending_payment and paid orders
	LiveOrders     int64
	FailedOrders   int64
	Orders         int64 // order rows of every status
	ProcessLog     int64 // idempotency rows
	MaxUserUnits   int64 // the most live units one user holds
	RedisLoaded    bool
	RedisAvailable int64 // net of RedisDebt
	RedisDebt      int64
	InFlight       int64 // units reserved in Redis, not yet applied
	Outbox         int64
	AuditSum       int64 // sum of the db deltas in stock_audit
	DoubledKeys    int64 // (user, Idempotency-Key) pairs with more than one live order
	Violations     []string
}

// OK reports whether no invariant was violated.
func (r Report) OK() bool { return len(r.Violations) == 0 }

func (r *Report) failf(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// The statements are plain SQL that PostgreSQL and MySQL both run; DB.Rebind
// adapts the placeholders. (MariaDB does not let a derived table refer to the
// outer query: the per-user maximum takes the sku as a second argument.)
const snapshotSQL = `
SELECT i.stock, i.total_stock, i.per_user_limit,
       COALESCE(SUM(CASE WHEN o.status IN ('pending_payment','paid') THEN o.quantity ELSE 0 END), 0),
       COUNT(CASE WHEN o.status IN ('pending_payment','paid') THEN 1 END),
       COUNT(CASE WHEN o.status = 'failed' THEN 1 END),
       COUNT(o.order_id),
       (SELECT COUNT(*) FROM process_log p WHERE p.sku_id = i.sku_id),
       COALESCE((SELECT MAX(u.n) FROM (SELECT SUM(quantity) AS n FROM orders
           WHERE sku_id = ? AND status IN ('pending_payment','paid') GROUP BY user_id) u), 0)
FROM inventory i LEFT JOIN orders o ON o.sku_id = i.sku_id
WHERE i.sku_id = ?
GROUP BY i.sku_id, i.stock, i.total_stock, i.per_user_limit`

const unloggedSQL = `
SELECT COUNT(*) FROM orders o WHERE o.sku_id = ?
AND NOT EXISTS (SELECT 1 FROM process_log p WHERE p.tx_id = o.order_id)`

// I11: an Idempotency-Key of a user on a SKU with two live orders. The
// unique index forbids two rows with a key; this reads the rows themselves.
const doubledKeysSQL = `
SELECT COUNT(*) FROM (SELECT user_id, idempotency_key FROM orders
    WHERE sku_id = ? AND idempotency_key IS NOT NULL AND status IN ('pending_payment','paid')
    GROUP BY user_id, idempotency_key HAVING COUNT(*) > 1) d`

const auditSumSQL = `SELECT COALESCE(SUM(delta), 0) FROM stock_audit WHERE sku_id = ? AND store = 'db'`

// DB is the database to read: the order store's outside client (DB) and its
// placeholder style (Rebind). *orderstore.Store is one.
type DB interface {
	DB() *sql.DB
	Rebind(query string) string
}

// countAccepted returns how many order rows, and distinct order ids among
// them, the ids have (in chunks: IN lists stay short).
func countAccepted(ctx context.Context, db DB, ids []string) (rows, distinct int64, err error) {
	const chunk = 500
	for i := 0; i < len(ids); i += chunk {
		part := ids[i:min(i+chunk, len(ids))]
		q := "SELECT COUNT(*), COUNT(DISTINCT order_id) FROM orders WHERE order_id IN (" +
			strings.TrimSuffix(strings.Repeat("?,", len(part)), ",") + ")"
		args := make([]any, len(part))
		for j, id := range part {
			args[j] = id
		}
		var r, d int64
		if err := db.DB().QueryRowContext(ctx, db.Rebind(q), args...).Scan(&r, &d); err != nil {
			return 0, 0, err
		}
		rows, distinct = rows+r, distinct+d
	}
	return rows, distinct, nil
}

// Check reads sku's state and checks I1 (stock >= 0, stock + live = total,
// in one snapshot), I3 when idle is true (Redis available = database stock,
// nothing in flight or in the outbox), I4 for the accepted order ids (each is
// exactly one order row), I5 (one idempotency row per order), I6 (no user
// over the limit) and I11 (no Idempotency-Key with two live orders). gate may be nil to skip Redis.
func Check(ctx context.Context, db DB, gate *stockgate.Gate, sku string, accepted []string, idle bool) (Report, error) {
	r := Report{SKU: sku}
	// Redis first, then the database: a reservation leaves the in-flight set
	// only after the database committed its decision, so a database read
	// that follows an empty in-flight set sees every decision. (Read the
	// other way round, a batch committing in between looks idle with its
	// orders missing from the snapshot.)
	var f stockgate.InFlight
	if gate != nil {
		var err error
		if f, err = gate.ReadInFlight(ctx, sku); err != nil {
			return r, err
		}
		if r.Outbox, err = gate.OutboxLen(ctx, sku); err != nil {
			return r, err
		}
		r.RedisLoaded, r.RedisAvailable, r.RedisDebt, r.InFlight = f.Loaded, f.Available, f.Debt, f.Units()
	}
	err := db.DB().QueryRowContext(ctx, db.Rebind(snapshotSQL), sku, sku).Scan(&r.DBStock, &r.TotalStock, &r.PerUserLimit,
		&r.LiveUnits, &r.LiveOrders, &r.FailedOrders, &r.Orders, &r.ProcessLog, &r.MaxUserUnits)
	if err != nil {
		return r, fmt.Errorf("invariant: snapshot of %s: %w", sku, err)
	}
	if r.DBStock < 0 {
		r.failf("I1: database stock %d < 0", r.DBStock)
	}
	if r.DBStock+r.LiveUnits != r.TotalStock {
		r.failf("I1: database stock %d + live units %d != total %d (oversold or leaked %d)", r.DBStock, r.LiveUnits, r.TotalStock, r.DBStock+r.LiveUnits-r.TotalStock)
	}
	if r.LiveUnits > r.TotalStock {
		r.failf("I2: live units %d exceed total %d", r.LiveUnits, r.TotalStock)
	}
	if r.MaxUserUnits > r.PerUserLimit {
		r.failf("I6: a user holds %d units, limit %d", r.MaxUserUnits, r.PerUserLimit)
	}
	if r.ProcessLog != r.Orders {
		r.failf("I5: %d idempotency rows for %d orders", r.ProcessLog, r.Orders)
	}
	var unlogged int64
	if err := db.DB().QueryRowContext(ctx, db.Rebind(unloggedSQL), sku).Scan(&unlogged); err != nil {
		return r, fmt.Errorf("invariant: %w", err)
	}
	if unlogged != 0 {
		r.failf("I5: %d orders without an idempotency row", unlogged)
	}
	if err := db.DB().QueryRowContext(ctx, db.Rebind(doubledKeysSQL), sku).Scan(&r.DoubledKeys); err != nil {
		return r, fmt.Errorf("invariant: %w", err)
	}
	if r.DoubledKeys != 0 {
		r.failf("I11: %d Idempotency-Keys with more than one live order", r.DoubledKeys)
	}
	if err := db.DB().QueryRowContext(ctx, db.Rebind(auditSumSQL), sku).Scan(&r.AuditSum); err != nil {
		return r, fmt.Errorf("invariant: %w", err)
	}
	if idle && r.AuditSum != r.DBStock {
		r.failf("audit: db deltas sum to %d, database stock is %d", r.AuditSum, r.DBStock)
	}
	if accepted != nil {
		u := uniq(accepted)
		ids := make([]string, 0, len(u))
		for id := range u {
			ids = append(ids, id)
		}
		rows, distinct, err := countAccepted(ctx, db, ids)
		if err != nil {
			return r, fmt.Errorf("invariant: %w", err)
		}
		want := int64(len(u))
		if rows != want || distinct != want {
			r.failf("I4: %d accepted order ids, %d order rows (%d distinct)", want, rows, distinct)
		}
	}
	if gate != nil {
		if f.Loaded && (r.RedisAvailable+r.RedisDebt < 0 || r.RedisDebt < 0) {
			r.failf("I2: redis available %d < 0 (debt %d)", r.RedisAvailable+r.RedisDebt, r.RedisDebt)
		}
		if idle && f.Loaded {
			if r.RedisAvailable != r.DBStock {
				r.failf("I3: idle, redis available %d != database stock %d", r.RedisAvailable, r.DBStock)
			}
			if r.InFlight != 0 || r.Outbox != 0 || r.RedisDebt != 0 {
				r.failf("I3: idle, %d units still in flight, %d outbox entries, debt %d", r.InFlight, r.Outbox, r.RedisDebt)
			}
		}
	}
	return r, nil
}

// Missing returns how many of the distinct order ids have no order row.
func Missing(ctx context.Context, db DB, ids []string) (int64, error) {
	u := uniq(ids)
	list := make([]string, 0, len(u))
	for id := range u {
		list = append(list, id)
	}
	_, distinct, err := countAccepted(ctx, db, list)
	return int64(len(list)) - distinct, err
}

func uniq(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

package orderstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/jackc/pgx/v5"
)

// orderColumnList is the column list scanOrder reads.
const orderColumnList = `order_id, sku_id, user_id, quantity, status, created_at, fail_reason, updated_at,
	expires_at, paid_at, cancelled_at, cancel_reason, payment_ref`

const orderSQL = `SELECT ` + orderColumnList + ` FROM orders WHERE order_id = $1`

// Order returns the order with id as the database knows it. An order the
// database has not applied (absent, or still queued upstream) gives an error
// wrapping sale.ErrOrderNotFound. Times are in UTC.
func (s *pgStore) Order(ctx context.Context, id string) (sale.Order, error) {
	o, err := scanOrder(s.pool.QueryRow(ctx, orderSQL, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return sale.Order{}, fmt.Errorf("orderstore: order %q: %w", id, sale.ErrOrderNotFound)
	}
	if err != nil {
		return sale.Order{}, fmt.Errorf("orderstore: order %q: %w", id, err)
	}
	return o, nil
}

// OrderByKey returns the order user's Idempotency-Key key made on sku, as
// the database knows it (one at most: orders_idempotency_idx), whatever its
// status; none gives an error wrapping sale.ErrOrderNotFound. A reservation
// still queued upstream is not seen.
func (s *pgStore) OrderByKey(ctx context.Context, sku, user, key string) (sale.Order, error) {
	o, err := scanOrder(s.pool.QueryRow(ctx, orderByIdempotencyKeySQL, sku, user, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return sale.Order{}, fmt.Errorf("orderstore: order of key %q: %w", key, sale.ErrOrderNotFound)
	}
	if err != nil {
		return sale.Order{}, fmt.Errorf("orderstore: order of key %q: %w", key, err)
	}
	return o, nil
}

// scanOrder scans the columns of orderColumnList. Times come back in UTC.
func scanOrder(row scanner) (sale.Order, error) {
	var (
		o                          sale.Order
		status                     string
		reason, cancelReason, ref  *string
		updatedAt                  time.Time
		expires, paid, cancelledAt *time.Time
	)
	if err := row.Scan(&o.ID, &o.SKU, &o.User, &o.Quantity, &status, &o.CreatedAt, &reason, &updatedAt,
		&expires, &paid, &cancelledAt, &cancelReason, &ref); err != nil {
		return sale.Order{}, err
	}
	o.ExpiresAt, o.PaidAt, o.CancelledAt = utcPtr(expires), utcPtr(paid), utcPtr(cancelledAt)
	if cancelReason != nil {
		o.CancelReason = *cancelReason
	}
	if ref != nil {
		o.PaymentRef = *ref
	}
	o.Status = sale.Status(status)
	o.CreatedAt = o.CreatedAt.UTC()
	if reason != nil {
		o.FailReason = *reason
	}
	updatedAt = updatedAt.UTC()
	o.UpdatedAt = &updatedAt
	return o, nil
}

const snapshotStockSQL = `SELECT stock FROM inventory WHERE sku_id = $1`

const snapshotProcessedSQL = `
SELECT p.tx_id, coalesce(o.status, '')
FROM process_log p LEFT JOIN orders o ON o.order_id = p.tx_id
WHERE p.tx_id = ANY($1::text[])`

// Snapshot is a SKU's database state read at one instant.
type Snapshot struct {
	Stock int64
	// Processed maps the order ids asked about that are in process_log to
	// their order's status now; ids absent have not been applied.
	Processed map[string]sale.Status
	// Restores are releases whose Redis give-back is still pending: Stock
	// already includes their units.
	Restores []Restore
	// Holdings (user -> units of live orders) and IdempotencyKeys (user NUL
	// key -> order id of live orders) are filled by SeedSnapshot only.
	Holdings        map[string]int64
	IdempotencyKeys map[string]string
}

// Snapshot reads, in ONE read-only REPEATABLE READ transaction (so all parts
// describe the same instant), the database stock of sku, the Redis restores
// it still owes, the newest external stock change it includes and, for the
// given order ids, which are already in process_log and the status of their
// order. An absent SKU gives an error wrapping sale.ErrUnknownSKU.
//
// The reconciler and the gate's loaders use it to tell reservations in
// flight (not processed) from those the database stock already accounts for.
func (s *pgStore) Snapshot(ctx context.Context, sku string, ids []string) (Snapshot, error) {
	return s.snapshot(ctx, sku, ids, false)
}

const liveKeysSQL = `
SELECT user_id, idempotency_key, order_id FROM orders
WHERE sku_id = $1 AND idempotency_key IS NOT NULL AND status IN ('pending_payment', 'paid')`

// SeedSnapshot is Snapshot plus, in the same transaction, the buyers'
// live holdings and the Idempotency-Keys of live orders: what a load of the
// gate from scratch needs, all describing one instant.
func (s *pgStore) SeedSnapshot(ctx context.Context, sku string, ids []string) (Snapshot, error) {
	return s.snapshot(ctx, sku, ids, true)
}

func (s *pgStore) snapshot(ctx context.Context, sku string, ids []string, full bool) (Snapshot, error) {
	snap := Snapshot{Processed: make(map[string]sale.Status)}
	found := false
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if full {
		snap.Holdings, snap.IdempotencyKeys = map[string]int64{}, map[string]string{}
		b.Queue(liveHoldingsSQL, sku).Query(func(rows pgx.Rows) error {
			var user string
			var n int64
			_, err := pgx.ForEachRow(rows, []any{&user, &n}, func() error { snap.Holdings[user] = n; return nil })
			return err
		})
		b.Queue(liveKeysSQL, sku).Query(func(rows pgx.Rows) error {
			var user, key, id string
			_, err := pgx.ForEachRow(rows, []any{&user, &key, &id}, func() error {
				snap.IdempotencyKeys[user+"\x00"+key] = id
				return nil
			})
			return err
		})
	}
	b.Queue(`SELECT order_id, sku_id, user_id, quantity FROM redis_restores WHERE sku_id = $1`, sku).Query(func(rows pgx.Rows) error {
		var r Restore
		_, err := pgx.ForEachRow(rows, []any{&r.OrderID, &r.SKU, &r.User, &r.Quantity}, func() error {
			snap.Restores = append(snap.Restores, r)
			return nil
		})
		return err
	})
	b.Queue(snapshotStockSQL, sku).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&snap.Stock)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	if len(ids) > 0 {
		b.Queue(snapshotProcessedSQL, ids).Query(func(rows pgx.Rows) error {
			var id, status string
			_, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error {
				snap.Processed[id] = sale.Status(status)
				return nil
			})
			return err
		})
	}
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := br.Close(); err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: commit: %w", sku, err)
	}
	if !found {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, sale.ErrUnknownSKU)
	}
	return snap, nil
}

// LockedSnapshot is Snapshot for a resync: it takes a share lock on sku's
// inventory row, calls read (the caller's read of Redis' reservations in
// flight, which returns the order ids to ask about), then reads the
// snapshot, and only then lets the row go. Every writer that decides a
// reservation or sells (ApplyBatch, BuyDirect) or gives units back holds
// that row's lock to commit, so no unit reserved after read can be in the
// snapshot's stock: what the caller counts as reserved since its read
// (stockgate.Resync) is never also taken in the database. (Without the
// lock, a unit reserved after the read and applied before the snapshot was
// counted twice and stayed out of Redis for good.) The lock is held for
// read's round trip: one Redis call.
func (s *pgStore) LockedSnapshot(ctx context.Context, sku string, read func(ctx context.Context) ([]string, error)) (Snapshot, error) {
	snap := Snapshot{Processed: make(map[string]sale.Status)}
	// READ COMMITTED: each statement below sees what committed before it,
	// and nothing that changes the stock can commit while the lock is held.
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	err = tx.QueryRow(ctx, `SELECT stock FROM inventory WHERE sku_id = $1 FOR SHARE`, sku).Scan(&snap.Stock)
	if errors.Is(err, pgx.ErrNoRows) {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, sale.ErrUnknownSKU)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	ids, err := read(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT order_id, sku_id, user_id, quantity FROM redis_restores WHERE sku_id = $1`, sku).Query(func(rows pgx.Rows) error {
		var r Restore
		_, err := pgx.ForEachRow(rows, []any{&r.OrderID, &r.SKU, &r.User, &r.Quantity}, func() error {
			snap.Restores = append(snap.Restores, r)
			return nil
		})
		return err
	})
	if len(ids) > 0 {
		b.Queue(snapshotProcessedSQL, ids).Query(func(rows pgx.Rows) error {
			var id, status string
			_, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error {
				snap.Processed[id] = sale.Status(status)
				return nil
			})
			return err
		})
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: commit: %w", sku, err)
	}
	return snap, nil
}

// Processed returns, for the given order ids, which are in process_log
// (applied by ApplyBatch, sold by BuyDirect or discarded) and the status of
// their order now; ids absent from the map have not been processed. It is
// Snapshot without the stock, for re-seeding the gate from the database.
func (s *pgStore) Processed(ctx context.Context, ids []string) (map[string]sale.Status, error) {
	processed := make(map[string]sale.Status, len(ids))
	if len(ids) == 0 {
		return processed, nil
	}
	rows, err := s.pool.Query(ctx, snapshotProcessedSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("orderstore: processed: %w", err)
	}
	var id, status string
	if _, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error {
		processed[id] = sale.Status(status)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("orderstore: processed: %w", err)
	}
	return processed, nil
}

const liveHoldingsSQL = `
SELECT user_id, sum(quantity)::bigint
FROM orders
WHERE sku_id = $1 AND status IN ('pending_payment', 'paid')
GROUP BY user_id`

// LiveHoldings returns, per user, the quantity of sku held by live orders
// (pending_payment and paid). Users holding nothing are absent; an unknown
// SKU gives an empty map. Re-seeding the gate's buyer counts uses it.
func (s *pgStore) LiveHoldings(ctx context.Context, sku string) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, liveHoldingsSQL, sku)
	if err != nil {
		return nil, fmt.Errorf("orderstore: live holdings %q: %w", sku, err)
	}
	held := make(map[string]int64)
	var (
		user string
		n    int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&user, &n}, func() error { held[user] = n; return nil }); err != nil {
		return nil, fmt.Errorf("orderstore: live holdings %q: %w", sku, err)
	}
	return held, nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

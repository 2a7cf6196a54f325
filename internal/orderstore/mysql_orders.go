package orderstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/flashsale/flashsale/internal/sale"
)

// Order keeps the contract of pgStore.Order: the order with id as the
// database knows it (times in UTC), or an error wrapping sale.ErrOrderNotFound
// when the database has not applied it.
func (s *myStore) Order(ctx context.Context, id string) (sale.Order, error) {
	o, found, err := myOptionalOrder(ctx, s.db, id)
	if err != nil {
		return sale.Order{}, fmt.Errorf("orderstore: order %q: %w", id, err)
	}
	if !found {
		return sale.Order{}, fmt.Errorf("orderstore: order %q: %w", id, sale.ErrOrderNotFound)
	}
	return o, nil
}

// OrderByKey keeps the contract of pgStore.OrderByKey.
func (s *myStore) OrderByKey(ctx context.Context, sku, user, key string) (sale.Order, error) {
	o, found, err := scanOptionalOrder(s.db.QueryRowContext(ctx, myOrderByIdempotencyKeySQL, sku, user, key))
	if err != nil {
		return sale.Order{}, fmt.Errorf("orderstore: order of key %q: %w", key, err)
	}
	if !found {
		return sale.Order{}, fmt.Errorf("orderstore: order of key %q: %w", key, sale.ErrOrderNotFound)
	}
	return o, nil
}

// Snapshot keeps the contract of pgStore.Snapshot: the stock of sku, the
// Redis restores it still owes and, for ids, which are in process_log and
// their order's status, all read at one instant; an absent SKU gives an
// error wrapping sale.ErrUnknownSKU.
func (s *myStore) Snapshot(ctx context.Context, sku string, ids []string) (Snapshot, error) {
	return s.snapshot(ctx, sku, ids, false)
}

// SeedSnapshot keeps the contract of pgStore.SeedSnapshot: Snapshot plus, at
// the same instant, the buyers' live holdings and the Idempotency-Keys of
// live orders.
func (s *myStore) SeedSnapshot(ctx context.Context, sku string, ids []string) (Snapshot, error) {
	return s.snapshot(ctx, sku, ids, true)
}

// snapshot reads in one read-only REPEATABLE READ transaction. InnoDB gives
// such a transaction one read view, created by its first consistent
// (non-locking) read and used by every later one: like a PostgreSQL
// REPEATABLE READ snapshot, taken at the first statement, all the reads below
// describe the database as of that first read, whatever commits meanwhile.
func (s *myStore) snapshot(ctx context.Context, sku string, ids []string, full bool) (Snapshot, error) {
	snap := Snapshot{Processed: make(map[string]sale.Status)}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	defer tx.Rollback()
	found := true
	err = tx.QueryRowContext(ctx, `SELECT stock FROM inventory WHERE sku_id = ?`, sku).Scan(&snap.Stock)
	if noRows(err) {
		found, err = false, nil
	}
	if err == nil && full {
		snap.Holdings, err = myLiveHoldings(ctx, tx, sku)
		if err == nil {
			snap.IdempotencyKeys, err = myLiveKeys(ctx, tx, sku)
		}
	}
	if err == nil {
		snap.Restores, err = mySKURestores(ctx, tx, sku)
	}
	if err == nil && len(ids) > 0 {
		err = myProcessed(ctx, tx, ids, snap.Processed)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	if err := tx.Commit(); err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: commit: %w", sku, err)
	}
	if !found {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, sale.ErrUnknownSKU)
	}
	return snap, nil
}

// LockedSnapshot keeps the contract of pgStore.LockedSnapshot: a share
// lock on sku's inventory row (every writer of the stock takes it FOR
// UPDATE) from before read until the snapshot is read.
func (s *myStore) LockedSnapshot(ctx context.Context, sku string, read func(ctx context.Context) ([]string, error)) (Snapshot, error) {
	snap := Snapshot{Processed: make(map[string]sale.Status)}
	// READ COMMITTED: every read below sees what committed before it (no
	// read view fixed at the first one), and nothing that changes the
	// stock can commit while the lock is held.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	defer tx.Rollback()
	err = tx.QueryRowContext(ctx, `SELECT stock FROM inventory WHERE sku_id = ? LOCK IN SHARE MODE`, sku).Scan(&snap.Stock)
	if noRows(err) {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, sale.ErrUnknownSKU)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	ids, err := read(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	snap.Restores, err = mySKURestores(ctx, tx, sku)
	if err == nil && len(ids) > 0 {
		err = myProcessed(ctx, tx, ids, snap.Processed)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: %w", sku, err)
	}
	if err := tx.Commit(); err != nil {
		return Snapshot{}, fmt.Errorf("orderstore: snapshot %q: commit: %w", sku, err)
	}
	return snap, nil
}

// myQuerier is what the read helpers need: *sql.DB or *sql.Tx.
type myQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// myLiveHoldings returns, per user, the units of sku held by live orders
// (pending_payment and paid); users holding nothing are absent.
func myLiveHoldings(ctx context.Context, q myQuerier, sku string) (map[string]int64, error) {
	rows, err := q.QueryContext(ctx, `
SELECT user_id, CAST(SUM(quantity) AS SIGNED)
FROM orders
WHERE sku_id = ? AND status IN ('pending_payment', 'paid')
GROUP BY user_id`, sku)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := make(map[string]int64)
	for rows.Next() {
		var (
			user string
			n    int64
		)
		if err := rows.Scan(&user, &n); err != nil {
			return nil, err
		}
		held[user] = n
	}
	return held, rows.Err()
}

// myLiveKeys returns the Idempotency-Keys of the live orders of sku: user NUL
// key -> order id.
func myLiveKeys(ctx context.Context, q myQuerier, sku string) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, `
SELECT user_id, idempotency_key, order_id FROM orders
WHERE sku_id = ? AND idempotency_key IS NOT NULL AND status IN ('pending_payment', 'paid')`, sku)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	keys := make(map[string]string)
	for rows.Next() {
		var user, key, id string
		if err := rows.Scan(&user, &key, &id); err != nil {
			return nil, err
		}
		keys[user+"\x00"+key] = id
	}
	return keys, rows.Err()
}

// mySKURestores returns the Redis work still owed for sku.
func mySKURestores(ctx context.Context, q myQuerier, sku string) ([]Restore, error) {
	rows, err := q.QueryContext(ctx, `SELECT order_id, sku_id, user_id, quantity FROM redis_restores WHERE sku_id = ?`, sku)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Restore
	for rows.Next() {
		var r Restore
		if err := rows.Scan(&r.OrderID, &r.SKU, &r.User, &r.Quantity); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// myProcessed adds to processed the ids (non-empty) that are in process_log,
// with the status of their order ("" if it has none).
func myProcessed(ctx context.Context, q myQuerier, ids []string, processed map[string]sale.Status) error {
	rows, err := q.QueryContext(ctx, `
SELECT p.tx_id, coalesce(o.status, '')
FROM process_log p LEFT JOIN orders o ON o.order_id = p.tx_id
WHERE p.tx_id IN (`+placeholders(len(ids))+`)`, anys(ids)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return err
		}
		processed[id] = sale.Status(status)
	}
	return rows.Err()
}

// Processed keeps the contract of pgStore.Processed: for ids, those in
// process_log mapped to their order's status now; absent ids were not
// processed. No ids give an empty map.
func (s *myStore) Processed(ctx context.Context, ids []string) (map[string]sale.Status, error) {
	processed := make(map[string]sale.Status, len(ids))
	if len(ids) == 0 {
		return processed, nil
	}
	if err := myProcessed(ctx, s.db, ids, processed); err != nil {
		return nil, fmt.Errorf("orderstore: processed: %w", err)
	}
	return processed, nil
}

// LiveHoldings keeps the contract of pgStore.LiveHoldings: per user, the
// units of sku held by live orders (pending_payment and paid); an unknown SKU
// gives an empty map.
func (s *myStore) LiveHoldings(ctx context.Context, sku string) (map[string]int64, error) {
	held, err := myLiveHoldings(ctx, s.db, sku)
	if err != nil {
		return nil, fmt.Errorf("orderstore: live holdings %q: %w", sku, err)
	}
	return held, nil
}

package orderstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const insertOneProcessLogSQL = `INSERT INTO process_log (tx_id, sku_id) VALUES ($1, $2) ON CONFLICT (tx_id) DO NOTHING`

const lockSKUForBuySQL = `SELECT ` + skuColumns + ` FROM inventory WHERE sku_id = $1 FOR UPDATE`

// Served by orders_idempotency_idx (unique since migration 00009; the ORDER
// BY only matters for rows older than it).
const orderByIdempotencyKeySQL = `
SELECT ` + orderColumnList + `
FROM orders
WHERE sku_id = $1 AND user_id = $2 AND idempotency_key = $3
ORDER BY created_at, order_id
LIMIT 1`

// A FILTER, not a WHERE, for the status: see liveHeldSQL.
const userLiveHeldSQL = `
SELECT coalesce(sum(quantity) FILTER (WHERE status IN ('pending_payment', 'paid')), 0)::bigint
FROM orders
WHERE sku_id = $1 AND user_id = $2`

const insertOrderSQL = `
INSERT INTO orders (order_id, sku_id, user_id, quantity, status, idempotency_key, created_at, expires_at)
VALUES ($1, $2, $3, $4, 'pending_payment', $5, $6, $7)
RETURNING ` + orderColumnList

// BuyDirect sells r straight from the database in one READ COMMITTED
// transaction, without the Redis gate and the queue: the purchase path's
// fallback while the gate is unavailable (circuit breaker open), and the
// db-pessimistic strategy of flashsale bench. It returns the order and whether it existed
// before this call.
//
// It decides, in this order (all but the first under the inventory row lock
// of r.SKU):
//   - r.OrderID already processed (sold here before, applied by ApplyBatch,
//     or discarded): that order, duplicate = true, whatever its status (it
//     may be failed); nothing changes;
//   - no inventory row: sale.ErrUnknownSKU;
//   - r.IdempotencyKey set and an order of the same user and SKU in the
//     database has it: that order, duplicate = true (a retry gets the same
//     order even after the window closed; a reservation still queued
//     upstream with that key is not seen here: if it reaches the database
//     later, ApplyBatch refuses it, duplicate_key);
//   - the window at now: before starts_at sale.ErrSaleNotOpen, at or after
//     ends_at sale.ErrSaleEnded;
//   - the user's live units (pending_payment, paid) plus r.Quantity above
//     per_user_limit: sale.ErrLimitReached;
//   - fewer than r.Quantity units in stock: sale.ErrSoldOut;
//
// and otherwise takes the units (guarded by stock >= quantity) and writes the
// process_log row and a pending_payment order (created_at = r.AcceptedAt)
// before committing. A refusal writes nothing. Errors wrap the sale sentinels
// above; an r failing Validate or with a bad idempotency key wraps
// sale.ErrInvalid.
//
// Any other error means a rollback or, if the commit failed, an unknown
// outcome: retrying with the same r is safe and returns the order with
// duplicate = true if the first attempt committed. A reservation sold here is
// never applied by ApplyBatch (same OrderID: reported Duplicate). It never went
// through Redis: re-seeding the gate from the database counts it (Snapshot or
// SKU for the stock, LiveHoldings for the buyers).
//
// Purchases of one SKU serialise on its row (one commit, about one fsync,
// each): the caller bounds how many run at once.
func (s *pgStore) BuyDirect(ctx context.Context, r sale.Reservation, now time.Time) (order sale.Order, duplicate bool, err error) {
	if err := r.Validate(); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy: %w: %v", sale.ErrInvalid, err)
	}
	if r.IdempotencyKey != "" && !sale.ValidIdempotencyKey(r.IdempotencyKey) {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy: %w: bad idempotency key", sale.ErrInvalid)
	}
	for attempt := 1; ; attempt++ {
		order, duplicate, err = s.buyDirect(ctx, r, now)
		if !pgKeyConflict(err) || attempt == keyConflictAttempts {
			break
		}
	}
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s): %w", r.SKU, r.OrderID, err)
	}
	return order, duplicate, nil
}

// buyDirect runs the transaction of BuyDirect: three round trips (begin +
// log + lock + reads, take + insert, commit). The process_log row is written
// before the inventory row is locked, the order ApplyBatch takes them in, so
// a BuyDirect and an ApplyBatch of the same order id wait for each other
// instead of deadlocking.
func (s *pgStore) buyDirect(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
	var (
		inserted, known, prior, byKey bool
		existing, keyed               sale.Order
		sku                           sale.SKU
		held                          int64
	)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(markAuditedSQL) // this transaction writes its own stock_audit rows
	b.Queue(insertOneProcessLogSQL, r.OrderID, r.SKU).Exec(func(ct pgconn.CommandTag) error {
		inserted = ct.RowsAffected() == 1
		return nil
	})
	// At READ COMMITTED each statement below sees what committed before it
	// started: the order of a transaction the insert above waited for, and
	// every live order of the SKU once the row lock is granted (their
	// writers hold it: see liveHeldSQL).
	b.Queue(orderSQL, r.OrderID).QueryRow(func(row pgx.Row) error {
		var err error
		existing, prior, err = scanOptionalOrder(row)
		return err
	})
	b.Queue(lockSKUForBuySQL, r.SKU).QueryRow(func(row pgx.Row) error {
		var err error
		sku, err = scanSKU(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		known = err == nil
		return err
	})
	if r.IdempotencyKey != "" {
		b.Queue(orderByIdempotencyKeySQL, r.SKU, r.User, r.IdempotencyKey).QueryRow(func(row pgx.Row) error {
			var err error
			keyed, byKey, err = scanOptionalOrder(row)
			return err
		})
	}
	b.Queue(userLiveHeldSQL, r.SKU, r.User).QueryRow(func(row pgx.Row) error { return row.Scan(&held) })
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := br.Close(); err != nil {
		return sale.Order{}, false, fmt.Errorf("log, lock and read: %w", err)
	}

	switch {
	case !inserted && !prior:
		return sale.Order{}, false, errors.New("in process_log but has no order row")
	case !inserted:
		return existing, true, nil
	case !known:
		return sale.Order{}, false, sale.ErrUnknownSKU
	case byKey:
		return keyed, true, nil
	}
	if err := checkDirect(sku, held, r.Quantity, now); err != nil {
		return sale.Order{}, false, err
	}

	var order sale.Order
	b = &pgx.Batch{}
	b.Queue(takeStockSQL, r.SKU, r.Quantity).Exec(func(ct pgconn.CommandTag) error {
		if ct.RowsAffected() != 1 {
			return fmt.Errorf("stock below %d under row lock: refusing to oversell", r.Quantity)
		}
		return nil
	})
	b.Queue(insertOrderSQL, r.OrderID, r.SKU, r.User, r.Quantity, nullString(r.IdempotencyKey), time.UnixMilli(r.AcceptedAt), s.expiry(r.AcceptedAt)).
		QueryRow(func(row pgx.Row) error {
			var err error
			order, err = scanOrder(row)
			return err
		})
	queueTransitions(b, []transition{{r: r, to: sale.StatusPendingPayment, cause: causeDirect, at: now}})
	queueAudit(b, []auditRow{{sku: r.SKU, delta: -r.Quantity, reason: AuditDirectSale, orderID: r.OrderID, actor: "user:" + r.User, ip: r.ClientIP}})
	// Owed to the gate: take these units and the buyer's slot in Redis too.
	queueRestores(b, []Restore{{OrderID: DebitPrefix + r.OrderID, SKU: r.SKU, User: r.User, Quantity: -r.Quantity, IdempotencyKey: r.IdempotencyKey}})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return sale.Order{}, false, fmt.Errorf("take stock and insert order: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return sale.Order{}, false, fmt.Errorf("commit: %w", err)
	}
	return order, false, nil
}

// scanOptionalOrder is scanOrder that reports a missing row as found = false.
func scanOptionalOrder(row scanner) (o sale.Order, found bool, err error) {
	o, err = scanOrder(row)
	if noRows(err) {
		return sale.Order{}, false, nil
	}
	return o, err == nil, err
}

// nullString maps "" to SQL NULL.
func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

package orderstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// errMyNoCommit is returned by a transaction closure that decided on an
// answer without writing anything it may keep (a duplicate): inTx rolls the
// transaction back (dropping the process_log row it may have inserted) and
// the caller returns the answer it stored.
var errMyNoCommit = errors.New("orderstore: answered without writing")

const myInsertOneProcessLogSQL = `INSERT IGNORE INTO process_log (tx_id, sku_id) VALUES (?, ?)`

const myLockSKUForBuySQL = `SELECT ` + skuColumns + ` FROM inventory WHERE sku_id = ? FOR UPDATE`

// Served by orders_idempotency_idx. Keys are not unique in the table
// (ApplyBatch records what the gate admitted): the oldest order wins.
const myOrderByIdempotencyKeySQL = `
SELECT ` + orderColumnList + `
FROM orders
WHERE sku_id = ? AND user_id = ? AND idempotency_key = ?
ORDER BY created_at, order_id
LIMIT 1`

// The user's live units of the SKU (0 when none), served by orders_sku_user_idx.
const myUserLiveHeldSQL = `
SELECT coalesce(sum(CASE WHEN status IN ('pending_payment', 'paid') THEN quantity ELSE 0 END), 0)
FROM orders
WHERE sku_id = ? AND user_id = ?`

// The WHERE is the guard against oversell; CHECK (stock >= 0) is the second
// line. The statement always changes stock (quantity >= 1), so the driver's
// affected rows (changed rows) is the number of rows it matched.
const myDirectTakeStockSQL = `UPDATE inventory SET stock = stock - ?, updated_at = now(6) WHERE sku_id = ? AND stock >= ?`

const myInsertDirectOrderSQL = `
INSERT INTO orders (order_id, sku_id, user_id, quantity, status, idempotency_key, created_at, expires_at)
VALUES (?, ?, ?, ?, 'pending_payment', ?, ?, ?)`

// BuyDirect sells r straight from the database, with the contract of
// pgStore.BuyDirect (the same decisions in the same order, the same errors,
// the same rows: process_log, a pending_payment order, its transition, a
// fallback_sale audit row and the negative redis_restores row owed to the
// gate). Retrying with the same r is safe.
func (s *myStore) BuyDirect(ctx context.Context, r sale.Reservation, now time.Time) (order sale.Order, duplicate bool, err error) {
	if err := r.Validate(); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy: %w: %v", sale.ErrInvalid, err)
	}
	if r.IdempotencyKey != "" && !sale.ValidIdempotencyKey(r.IdempotencyKey) {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy: %w: bad idempotency key", sale.ErrInvalid)
	}
	for attempt := 1; ; attempt++ {
		order, duplicate, err = s.buyDirect(ctx, r, now)
		if !myKeyConflict(err) || attempt == keyConflictAttempts {
			break
		}
	}
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s): %w", r.SKU, r.OrderID, err)
	}
	return order, duplicate, nil
}

// buyDirect runs the transaction of BuyDirect. As on PostgreSQL the
// process_log row is written before the inventory row is locked, the order
// ApplyBatch takes them in, so a BuyDirect and an ApplyBatch of the same
// order id wait for each other instead of deadlocking. The INSERT IGNORE
// waits for a transaction holding the same id and then reports 0 rows if
// that transaction committed; at READ COMMITTED the next statement sees its
// order row.
func (s *myStore) buyDirect(ctx context.Context, r sale.Reservation, now time.Time) (order sale.Order, duplicate bool, err error) {
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		order, duplicate = sale.Order{}, false
		inserted, existing, prior, err := myLogAndReadOrder(ctx, tx, r)
		if err != nil {
			return err
		}
		switch {
		case !inserted && !prior:
			return errors.New("in process_log but has no order row")
		case !inserted:
			order, duplicate = existing, true
			return errMyNoCommit
		}
		sku, err := scanSKU(tx.QueryRowContext(ctx, myLockSKUForBuySQL, r.SKU))
		if noRows(err) {
			return sale.ErrUnknownSKU
		}
		if err != nil {
			return fmt.Errorf("lock inventory: %w", err)
		}
		// Read under the row lock: every writer of a live order of the SKU
		// holds it until it commits, so these reads see all of them.
		keyed, byKey, held, err := myUserState(ctx, tx, r)
		if err != nil {
			return err
		}
		if byKey {
			order, duplicate = keyed, true
			return errMyNoCommit
		}
		if err := checkDirect(sku, held, r.Quantity, now); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, myDirectTakeStockSQL, r.Quantity, r.SKU, r.Quantity)
		if err != nil {
			return fmt.Errorf("take stock: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("stock below %d under row lock: refusing to oversell (%d rows, %v)", r.Quantity, n, err)
		}
		if order, err = s.myWriteDirectOrder(ctx, tx, r, now); err != nil {
			return err
		}
		// Owed to the gate: take these units and the buyer's slot in Redis too.
		if err := myInsertRestores(ctx, tx, []Restore{{OrderID: DebitPrefix + r.OrderID, SKU: r.SKU, User: r.User, Quantity: -r.Quantity, IdempotencyKey: r.IdempotencyKey}}); err != nil {
			return fmt.Errorf("insert redis restore: %w", err)
		}
		return nil
	})
	if errors.Is(err, errMyNoCommit) {
		return order, duplicate, nil
	}
	if err != nil {
		return sale.Order{}, false, err
	}
	return order, false, nil
}

// myLogAndReadOrder inserts r's process_log row unless the id is there
// (inserted reports which) and then reads r's order row, if any.
func myLogAndReadOrder(ctx context.Context, tx *sql.Tx, r sale.Reservation) (inserted bool, existing sale.Order, prior bool, err error) {
	res, err := tx.ExecContext(ctx, myInsertOneProcessLogSQL, r.OrderID, r.SKU)
	if err != nil {
		return false, sale.Order{}, false, fmt.Errorf("insert process_log: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, sale.Order{}, false, fmt.Errorf("insert process_log: %w", err)
	}
	existing, prior, err = myOptionalOrder(ctx, tx, r.OrderID)
	if err != nil {
		return false, sale.Order{}, false, fmt.Errorf("read order: %w", err)
	}
	return n == 1, existing, prior, nil
}

// queryRower is what the reads of the direct paths run on: a transaction or
// a single pooled connection.
type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// myUserState reads what the per-user rules need of r's user: the oldest
// order of the same user and SKU with r's idempotency key (byKey false when
// r has no key or none matches) and the user's live units of the SKU.
func myUserState(ctx context.Context, q queryRower, r sale.Reservation) (keyed sale.Order, byKey bool, held int64, err error) {
	if r.IdempotencyKey != "" {
		keyed, byKey, err = scanOptionalOrder(q.QueryRowContext(ctx, myOrderByIdempotencyKeySQL, r.SKU, r.User, r.IdempotencyKey))
		if err != nil {
			return sale.Order{}, false, 0, fmt.Errorf("read order by idempotency key: %w", err)
		}
	}
	if err := q.QueryRowContext(ctx, myUserLiveHeldSQL, r.SKU, r.User).Scan(&held); err != nil {
		return sale.Order{}, false, 0, fmt.Errorf("read holdings: %w", err)
	}
	return keyed, byKey, held, nil
}

// myWriteDirectOrder writes what every direct sale writes once its units are
// taken: the pending_payment order (created_at = r.AcceptedAt, with its
// expiry), its transition and its fallback_sale audit row. It returns the
// order as the database stored it (no RETURNING: read back in tx, which sees
// its own insert).
func (s *myStore) myWriteDirectOrder(ctx context.Context, tx *sql.Tx, r sale.Reservation, now time.Time) (sale.Order, error) {
	if _, err := tx.ExecContext(ctx, myInsertDirectOrderSQL, r.OrderID, r.SKU, r.User, r.Quantity, nullString(r.IdempotencyKey),
		time.UnixMilli(r.AcceptedAt).UTC(), s.expiry(r.AcceptedAt).UTC()); err != nil {
		return sale.Order{}, fmt.Errorf("insert order: %w", err)
	}
	order, found, err := myOptionalOrder(ctx, tx, r.OrderID)
	if err == nil && !found {
		err = errors.New("inserted order not found")
	}
	if err != nil {
		return sale.Order{}, fmt.Errorf("read inserted order: %w", err)
	}
	if err := myInsertTransitions(ctx, tx, []transition{{r: r, to: sale.StatusPendingPayment, cause: causeDirect, at: now}}); err != nil {
		return sale.Order{}, fmt.Errorf("insert transition: %w", err)
	}
	if err := myInsertAudit(ctx, tx, []auditRow{{sku: r.SKU, delta: -r.Quantity, reason: AuditDirectSale, orderID: r.OrderID, actor: "user:" + r.User, ip: r.ClientIP}}); err != nil {
		return sale.Order{}, fmt.Errorf("insert audit: %w", err)
	}
	return order, nil
}

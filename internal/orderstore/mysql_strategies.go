package orderstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// The comparison strategies of flashsale bench on MySQL/MariaDB, with the
// contracts of their PostgreSQL versions (postgres_strategies.go). Each
// writes exactly what BuyDirect writes but the redis_restores row (these
// strategies sell without the gate).

// The conditional update that takes the stock and the row lock. At READ
// COMMITTED InnoDB evaluates the WHERE of a locked row on its last committed
// version first (semi-consistent read): a row that would match is waited for
// and re-read after the holder commits, so it cannot oversell; a row that
// would not match is skipped without waiting. Every update here changes
// stock, so affected (changed) rows is matched rows.
const myTakeConditionalSQL = `
UPDATE inventory SET stock = stock - ?, updated_at = now(6)
WHERE sku_id = ? AND stock >= ?`

// As myTakeConditionalSQL, and refused unless the token is above every token
// that changed the row before.
const myTakeFencedSQL = `
UPDATE inventory SET stock = stock - ?, fence = ?, updated_at = now(6)
WHERE sku_id = ? AND stock >= ? AND fence < ?`

// The inventory_version trigger bumps version on every update of the row.
const myTakeIfVersionSQL = `
UPDATE inventory SET stock = stock - ?, updated_at = now(6)
WHERE sku_id = ? AND stock >= ? AND version = ?`

const mySKUVersionFenceSQL = `SELECT ` + skuColumns + `, version, fence FROM inventory WHERE sku_id = ?`

const myFenceSQL = `SELECT fence FROM inventory WHERE sku_id = ?`

// BuyConditional sells r like BuyDirect with the contract of
// pgStore.BuyConditional: the conditional update is the only statement on
// the inventory row, and the window, idempotency key and per-user limit are
// checked after it, under the row lock it took; a refusal rolls back.
func (s *myStore) BuyConditional(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
	if err := validateDirect(r); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy (conditional): %w", err)
	}
	o, dup, err := s.myBuyTaking(ctx, r, now, 0)
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s, conditional): %w", r.SKU, r.OrderID, err)
	}
	return o, dup, nil
}

// BuyFenced is BuyConditional for a caller holding a lock with fencing token
// token, with the contract of pgStore.BuyFenced: a token not above the one
// that last changed the row gives an error wrapping ErrStaleFence and writes
// nothing.
func (s *myStore) BuyFenced(ctx context.Context, r sale.Reservation, now time.Time, token int64) (sale.Order, bool, error) {
	if err := validateDirect(r); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy (fenced): %w", err)
	}
	if token < 1 {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy (fenced): %w: token %d", sale.ErrInvalid, token)
	}
	o, dup, err := s.myBuyTaking(ctx, r, now, token)
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s, fence %d): %w", r.SKU, r.OrderID, token, err)
	}
	return o, dup, nil
}

// Fence returns the highest lock token that changed sku's row (0: none);
// sale.ErrUnknownSKU if there is no such row.
func (s *myStore) Fence(ctx context.Context, sku string) (int64, error) {
	var f int64
	err := s.db.QueryRowContext(ctx, myFenceSQL, sku).Scan(&f)
	if noRows(err) {
		return 0, fmt.Errorf("orderstore: fence of %s: %w", sku, sale.ErrUnknownSKU)
	}
	if err != nil {
		return 0, fmt.Errorf("orderstore: fence of %s: %w", sku, err)
	}
	return f, nil
}

// BuyOptimistic sells r like BuyDirect with optimistic concurrency, with the
// contract of pgStore.BuyOptimistic: read without a lock, decide, then take
// the stock only if the row's version is unchanged; a changed version means
// another attempt (at most attempts, at least 1), then an error wrapping
// sale.ErrBusy with nothing written. An attempt InnoDB picks as a deadlock
// victim wrote nothing either and counts as a failed attempt.
func (s *myStore) BuyOptimistic(ctx context.Context, r sale.Reservation, now time.Time, attempts int) (sale.Order, bool, error) {
	if err := validateDirect(r); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy (optimistic): %w", err)
	}
	attempts = max(attempts, 1)
	for i := 0; i < attempts; i++ {
		if i > 0 {
			// Full jitter, growing: 0-0.2 ms, 0-0.4 ms ... capped at 0-5 ms.
			pause := time.Duration(rand.Int64N(int64(min(200*time.Microsecond<<(i-1), 5*time.Millisecond))))
			select {
			case <-ctx.Done():
				return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s, optimistic): %w", r.SKU, r.OrderID, ctx.Err())
			case <-time.After(pause):
			}
		}
		o, dup, done, err := s.myBuyOptimisticOnce(ctx, r, now)
		if err != nil {
			return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s, optimistic): %w", r.SKU, r.OrderID, err)
		}
		if done {
			return o, dup, nil
		}
	}
	return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s, optimistic): %w: version changed in each of %d attempts",
		r.SKU, r.OrderID, sale.ErrBusy, attempts)
}

// myScanSKURow reads an inventory row with the strategy columns
// (mySKUVersionFenceSQL); found is false when there is none.
func myScanSKURow(ctx context.Context, q queryRower, sku string) (skuRow, bool, error) {
	k, found, err := scanSKURow(q.QueryRowContext(ctx, mySKUVersionFenceSQL, sku))
	if err != nil {
		return skuRow{}, false, fmt.Errorf("read inventory: %w", err)
	}
	return k, found, nil
}

// myBuyTaking is BuyConditional (token 0) and BuyFenced: one transaction
// logging the id, taking the stock by the conditional (or fenced) update,
// then deciding on what it reads after the update. The process_log row goes
// first, the order BuyDirect and ApplyBatch take their locks in.
func (s *myStore) myBuyTaking(ctx context.Context, r sale.Reservation, now time.Time, token int64) (order sale.Order, duplicate bool, err error) {
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
		takeSQL, takeArgs := myTakeConditionalSQL, []any{r.Quantity, r.SKU, r.Quantity}
		if token > 0 {
			takeSQL, takeArgs = myTakeFencedSQL, []any{r.Quantity, token, r.SKU, r.Quantity, token}
		}
		res, err := tx.ExecContext(ctx, takeSQL, takeArgs...)
		if err != nil {
			return fmt.Errorf("take stock: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("take stock: %w", err)
		}
		took := n == 1
		// From here on the reads run after the update: under the row lock
		// when it took the stock (no RETURNING: the row as it is now, with
		// our change), so they see every live order of the SKU.
		cur, known, err := myScanSKURow(ctx, tx, r.SKU)
		if err != nil {
			return err
		}
		if !known {
			return sale.ErrUnknownSKU
		}
		keyed, byKey, held, err := myUserState(ctx, tx, r)
		if err != nil {
			return err
		}
		switch {
		case byKey:
			order, duplicate = keyed, true
			return errMyNoCommit
		case !took && token > 0 && cur.Fence >= token:
			return fmt.Errorf("%w: token %d, row changed under %d", ErrStaleFence, token, cur.Fence)
		case !took:
			if err := checkDirect(cur.SKU, held, r.Quantity, now); err != nil {
				return err
			}
			return fmt.Errorf("%w: fewer than %d left when the update ran", sale.ErrSoldOut, r.Quantity)
		}
		before := cur.SKU
		before.Stock += r.Quantity
		if err := checkDirect(before, held, r.Quantity, now); err != nil {
			return err // rolled back: the units stay
		}
		order, err = s.myWriteDirectOrder(ctx, tx, r, now)
		return err
	})
	if errors.Is(err, errMyNoCommit) {
		return order, duplicate, nil
	}
	if err != nil {
		return sale.Order{}, false, err
	}
	return order, false, nil
}

// myBuyOptimisticOnce is one attempt of BuyOptimistic on one pooled
// connection (the time between the read and the compare-and-set is a round
// trip, not a wait for the pool); done is false when the version had changed
// or the attempt lost a deadlock (nothing written: try again).
func (s *myStore) myBuyOptimisticOnce(ctx context.Context, r sale.Reservation, now time.Time) (order sale.Order, dup, done bool, err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return sale.Order{}, false, false, err
	}
	defer conn.Close()

	// Each read is its own READ COMMITTED statement. The version is read
	// before the holdings: any live order committed after the version was
	// read changed the version, so the compare-and-set fails.
	existing, prior, err := myOptionalOrder(ctx, conn, r.OrderID)
	if err != nil {
		return sale.Order{}, false, false, fmt.Errorf("read order: %w", err)
	}
	if prior {
		return existing, true, true, nil
	}
	k, known, err := myScanSKURow(ctx, conn, r.SKU)
	if err != nil {
		return sale.Order{}, false, false, err
	}
	if !known {
		return sale.Order{}, false, true, sale.ErrUnknownSKU
	}
	keyed, byKey, held, err := myUserState(ctx, conn, r)
	if err != nil {
		return sale.Order{}, false, false, err
	}
	if byKey {
		return keyed, true, true, nil
	}
	if err := checkDirect(k.SKU, held, r.Quantity, now); err != nil {
		return sale.Order{}, false, true, err
	}

	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return sale.Order{}, false, false, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	inserted, took, err := myLogAndCompareAndSet(ctx, tx, r, k.Version)
	if retryable(err) {
		return sale.Order{}, false, false, nil
	}
	if err != nil {
		return sale.Order{}, false, false, err
	}
	if !inserted || !took {
		// !inserted: the same order id was sold meanwhile; the next read finds it.
		return sale.Order{}, false, false, nil
	}
	if order, err = s.myWriteDirectOrder(ctx, tx, r, now); err != nil {
		if retryable(err) {
			return sale.Order{}, false, false, nil
		}
		return sale.Order{}, false, false, err
	}
	if err := tx.Commit(); err != nil {
		return sale.Order{}, false, false, fmt.Errorf("commit: %w", err)
	}
	return order, false, true, nil
}

// myLogAndCompareAndSet inserts r's process_log row and takes the stock if
// the row's version is still version, reporting which of the two happened.
func myLogAndCompareAndSet(ctx context.Context, tx *sql.Tx, r sale.Reservation, version int64) (inserted, took bool, err error) {
	res, err := tx.ExecContext(ctx, myInsertOneProcessLogSQL, r.OrderID, r.SKU)
	if err != nil {
		return false, false, fmt.Errorf("insert process_log: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil || n != 1 {
		return false, false, err
	}
	res, err = tx.ExecContext(ctx, myTakeIfVersionSQL, r.Quantity, r.SKU, r.Quantity, version)
	if err != nil {
		return true, false, fmt.Errorf("compare-and-set: %w", err)
	}
	n, err = res.RowsAffected()
	if err != nil {
		return true, false, fmt.Errorf("compare-and-set: %w", err)
	}
	return true, n == 1, nil
}

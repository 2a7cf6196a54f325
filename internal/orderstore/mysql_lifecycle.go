package orderstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// MySQL has no RETURNING: each compare-and-set below is an UPDATE whose
// affected-row count says whether it won, followed by a read of the row in
// the same transaction (which sees its own write).

const myPayOrderSQL = `
UPDATE orders SET status = 'paid', paid_at = ?, payment_ref = ?, updated_at = CURRENT_TIMESTAMP(6)
WHERE order_id = ? AND (? = '' OR user_id = ?) AND status = 'pending_payment' AND expires_at > ?`

// Pay moves order id from pending_payment to paid, with the contract of
// pgStore.Pay: one compare-and-set on the order row (a payment racing with
// the payment timeout or a cancel ends in exactly one terminal state); user,
// if not empty, must own the order; paying a paid order again returns it with
// again = true. Errors wrap sale.ErrOrderNotFound (absent, or not user's),
// sale.ErrOrderExpired (cancelled, or past its deadline: the caller refunds) or
// sale.ErrOrderFailed.
func (s *myStore) Pay(ctx context.Context, id, user, ref string, now time.Time) (o sale.Order, again bool, err error) {
	for attempt := 0; ; attempt++ {
		o, again, err = s.pay(ctx, id, user, ref, now)
		if !errors.Is(err, errRaced) || attempt == 3 {
			return o, again, err
		}
	}
}

func (s *myStore) pay(ctx context.Context, id, user, ref string, now time.Time) (o sale.Order, again bool, err error) {
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		o, again = sale.Order{}, false
		res, err := tx.ExecContext(ctx, myPayOrderSQL, now.UTC(), nullString(ref), id, user, user, now.UTC())
		if err != nil {
			return fmt.Errorf("orderstore: pay %s: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("orderstore: pay %s: %w", id, err)
		}
		if n == 0 {
			cur, err := s.ownedOrder(ctx, tx, id, user)
			if err != nil {
				return err
			}
			o = cur
			switch cur.Status {
			case sale.StatusPaid:
				again = true
				return nil
			case sale.StatusCancelled:
				return fmt.Errorf("orderstore: pay %s: %w", id, sale.ErrOrderExpired)
			case sale.StatusPendingPayment:
				if pastDeadline(cur, now) {
					return fmt.Errorf("orderstore: pay %s: %w", id, sale.ErrOrderExpired)
				}
				// The row committed after the update looked for it.
				return errRaced
			default:
				return fmt.Errorf("orderstore: pay %s: %w", id, sale.ErrOrderFailed)
			}
		}
		if o, err = s.ownedOrder(ctx, tx, id, ""); err != nil {
			return err
		}
		if err := myInsertTransitions(ctx, tx, []transition{{r: orderRes(o), from: sale.StatusPendingPayment, to: sale.StatusPaid, cause: causePaid, at: now}}); err != nil {
			return fmt.Errorf("orderstore: pay %s: %w", id, err)
		}
		return nil
	})
	if err != nil {
		// Like PostgreSQL: the order read that explains a refusal comes back
		// with it; a failed commit returns none.
		if errors.Is(err, errRaced) || errors.Is(err, sale.ErrOrderExpired) || errors.Is(err, sale.ErrOrderFailed) {
			return o, false, err
		}
		return sale.Order{}, false, err
	}
	return o, again, nil
}

// ownedOrder reads order id inside tx; not found (or not user's) wraps
// sale.ErrOrderNotFound.
func (s *myStore) ownedOrder(ctx context.Context, tx *sql.Tx, id, user string) (sale.Order, error) {
	o, found, err := myOptionalOrder(ctx, tx, id)
	if err != nil {
		return sale.Order{}, fmt.Errorf("orderstore: order %s: %w", id, err)
	}
	if !found || (user != "" && o.User != user) {
		return sale.Order{}, fmt.Errorf("orderstore: order %s: %w", id, sale.ErrOrderNotFound)
	}
	return o, nil
}

const myReleaseOrderSQL = `
UPDATE orders SET status = 'cancelled', cancelled_at = ?, cancel_reason = ?, updated_at = CURRENT_TIMESTAMP(6)
WHERE order_id = ? AND (? = '' OR user_id = ?) AND status = 'pending_payment'
  AND (? IS NULL OR expires_at <= ?)`

const myGiveStockSQL = `UPDATE inventory SET stock = stock + ?, updated_at = CURRENT_TIMESTAMP(6) WHERE sku_id = ?`

// Cancel releases order id (pending_payment -> cancelled with cause), with
// the contract of pgStore.Cancel: in one transaction the status changes, the
// database stock comes back (with its stock_audit row), the Redis restore is
// owed (redis_restores) and the transition recorded. A paid order is never
// released, and a release happens once. user, if not empty, must own the
// order. Cancelling a cancelled order returns it with again = true. Errors
// wrap sale.ErrOrderNotFound, sale.ErrOrderPaid or sale.ErrOrderFailed.
func (s *myStore) Cancel(ctx context.Context, id, user, cause string, now time.Time) (o sale.Order, again bool, err error) {
	return s.release(ctx, id, user, cause, now, nil)
}

// Expire releases order id like Cancel with cause payment_timeout, but only
// if its deadline (expires_at) is at or before now: nothing is released
// early. An order not yet due, paid, failed or already released is returned
// with released = false and no error.
func (s *myStore) Expire(ctx context.Context, id string, now time.Time) (o sale.Order, released bool, err error) {
	o, again, err := s.release(ctx, id, "", sale.CancelPaymentTimeout, now, &now)
	switch {
	case errors.Is(err, errNotDue), errors.Is(err, sale.ErrOrderPaid), errors.Is(err, sale.ErrOrderFailed):
		return o, false, nil
	case err != nil:
		return o, false, err
	}
	return o, !again, nil
}

func (s *myStore) release(ctx context.Context, id, user, cause string, now time.Time, due *time.Time) (o sale.Order, again bool, err error) {
	err = s.bounded(ctx, func() error {
		o, again, err = s.releaseLoop(ctx, id, user, cause, now, due)
		return err
	})
	return o, again, err
}

func (s *myStore) releaseLoop(ctx context.Context, id, user, cause string, now time.Time, due *time.Time) (o sale.Order, again bool, err error) {
	for attempt := 0; ; attempt++ {
		o, again, err = s.releaseOnce(ctx, id, user, cause, now, due)
		if !errors.Is(err, errRaced) || attempt == 3 {
			if errors.Is(err, errRaced) {
				if due != nil {
					err = errNotDue // Expire: try again at the next trigger
				} else {
					err = fmt.Errorf("orderstore: release %s: %w: the order kept changing, retry", id, sale.ErrUnavailable)
				}
			}
			return o, again, err
		}
	}
}

func (s *myStore) releaseOnce(ctx context.Context, id, user, cause string, now time.Time, due *time.Time) (o sale.Order, again bool, err error) {
	var dueArg any
	if due != nil {
		dueArg = due.UTC()
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		o, again = sale.Order{}, false
		res, err := tx.ExecContext(ctx, myReleaseOrderSQL, now.UTC(), cause, id, user, user, dueArg, dueArg)
		if err != nil {
			return fmt.Errorf("orderstore: release %s: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("orderstore: release %s: %w", id, err)
		}
		if n == 0 {
			cur, err := s.ownedOrder(ctx, tx, id, user)
			if err != nil {
				return err
			}
			o = cur
			switch cur.Status {
			case sale.StatusCancelled:
				again = true
				return nil
			case sale.StatusPaid:
				return fmt.Errorf("orderstore: release %s: %w", id, sale.ErrOrderPaid)
			case sale.StatusFailed:
				return fmt.Errorf("orderstore: release %s: %w", id, sale.ErrOrderFailed)
			}
			if due == nil || (cur.ExpiresAt != nil && !cur.ExpiresAt.After(*due)) {
				// pending_payment and due (or a user's cancel): the row
				// committed after the update looked for it.
				return errRaced
			}
			return errNotDue
		}
		if o, err = s.ownedOrder(ctx, tx, id, ""); err != nil {
			return err
		}
		a := actorOf(ctx)
		if err := myInsertAudit(ctx, tx, []auditRow{{sku: o.SKU, delta: o.Quantity, reason: AuditRelease + ":" + cause, orderID: o.ID, actor: a.Name, ip: a.SourceIP}}); err != nil {
			return fmt.Errorf("orderstore: release %s: %w", id, err)
		}
		if err := myInsertRestores(ctx, tx, []Restore{{OrderID: o.ID, SKU: o.SKU, User: o.User, Quantity: o.Quantity}}); err != nil {
			return fmt.Errorf("orderstore: release %s: %w", id, err)
		}
		if err := myInsertTransitions(ctx, tx, []transition{{r: orderRes(o), from: sale.StatusPendingPayment, to: sale.StatusCancelled, cause: cause, at: now}}); err != nil {
			return fmt.Errorf("orderstore: release %s: %w", id, err)
		}
		// The sale's inventory row last: every release and apply of the
		// sale takes its lock in turn, so it is held for this statement and
		// the commit only.
		if _, err := tx.ExecContext(ctx, myGiveStockSQL, o.Quantity, o.SKU); err != nil {
			return fmt.Errorf("orderstore: release %s: %w", id, err)
		}
		return nil
	})
	switch {
	case err == nil:
		return o, again, nil
	case errors.Is(err, errRaced), errors.Is(err, errNotDue), errors.Is(err, sale.ErrOrderPaid), errors.Is(err, sale.ErrOrderFailed):
		// Like PostgreSQL: a refusal comes back with the order that explains it.
		return o, false, err
	}
	return sale.Order{}, false, err
}

// Claimed in deadline order through the (status, expires_at) index; SKIP
// LOCKED lets several sweepers (instances) share the work without waiting on
// each other. At READ COMMITTED the WHERE is checked again on the locked
// (latest committed) row, so a row paid meanwhile is not claimed.
const myExpireDueSQL = `
SELECT order_id, sku_id, user_id, quantity FROM orders
WHERE status = 'pending_payment' AND expires_at <= ?
ORDER BY expires_at LIMIT ?
FOR UPDATE SKIP LOCKED`

// ExpireDue releases up to limit orders whose payment deadline passed, in
// one transaction (status, stock with its audit rows, Redis restores owed,
// transitions), and returns them (nil when none). It is the sweeper: the
// safety net of the delayed trigger.
func (s *myStore) ExpireDue(ctx context.Context, now time.Time, limit int) ([]Restore, error) {
	var out []Restore
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		out = nil
		rows, err := tx.QueryContext(ctx, myExpireDueSQL, now.UTC(), limit)
		if err != nil {
			return fmt.Errorf("orderstore: expire due: %w", err)
		}
		for rows.Next() {
			var r Restore
			if err := rows.Scan(&r.OrderID, &r.SKU, &r.User, &r.Quantity); err != nil {
				rows.Close()
				return fmt.Errorf("orderstore: expire due: %w", err)
			}
			out = append(out, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("orderstore: expire due: %w", err)
		}
		if len(out) == 0 {
			return nil
		}
		ids := make([]string, len(out))
		give := map[string]int64{}
		ts := make([]transition, len(out))
		audit := make([]auditRow, len(out))
		for i, r := range out {
			ids[i] = r.OrderID
			give[r.SKU] += r.Quantity
			ts[i] = transition{r: sale.Reservation{OrderID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity},
				from: sale.StatusPendingPayment, to: sale.StatusCancelled, cause: sale.CancelPaymentTimeout, at: now}
			audit[i] = auditRow{sku: r.SKU, delta: r.Quantity, reason: AuditRelease + ":" + sale.CancelPaymentTimeout, orderID: r.OrderID, actor: "system:sweeper"}
		}
		// The rows are locked by us and pending_payment: every one changes.
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'cancelled', cancelled_at = ?, cancel_reason = ?, updated_at = CURRENT_TIMESTAMP(6)
WHERE order_id IN (`+placeholders(len(ids))+`)`, append([]any{now.UTC(), sale.CancelPaymentTimeout}, anys(ids)...)...); err != nil {
			return fmt.Errorf("orderstore: expire due: %w", err)
		}
		if err := myInsertAudit(ctx, tx, audit); err != nil {
			return fmt.Errorf("orderstore: expire due: %w", err)
		}
		// Inventory rows in sorted order, like every other writer of them.
		for _, sku := range slices.Sorted(maps.Keys(give)) {
			if _, err := tx.ExecContext(ctx, myGiveStockSQL, give[sku], sku); err != nil {
				return fmt.Errorf("orderstore: expire due: %w", err)
			}
		}
		if err := myInsertRestores(ctx, tx, out); err != nil {
			return fmt.Errorf("orderstore: expire due: %w", err)
		}
		if err := myInsertTransitions(ctx, tx, ts); err != nil {
			return fmt.Errorf("orderstore: expire due: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RequestCancel records that user cancels order id, still queued (accepted
// by the gate, not yet applied): ApplyBatch records it cancelled when it
// lands. If the order was applied meanwhile, it is cancelled now instead
// (landed = true, with the order). The caller checked that the queued
// reservation is user's. Same contract as pgStore.RequestCancel.
func (s *myStore) RequestCancel(ctx context.Context, id, user string, now time.Time) (o sale.Order, landed bool, err error) {
	// The first request stays (like ON CONFLICT DO NOTHING). Not INSERT
	// IGNORE: it would also turn a too long value into a silent truncation.
	// Both statements may be chosen as deadlock victims by an ApplyBatch
	// of the order holding its keys; both are safe to repeat.
	if err := againOnDeadlock(ctx, func() error {
		_, err := s.db.ExecContext(ctx, `INSERT INTO cancel_requests (order_id, user_id) VALUES (?, ?)
ON DUPLICATE KEY UPDATE order_id = order_id`, id, user)
		return err
	}); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: request cancel %s: %w", id, err)
	}
	// An ApplyBatch of this order may have read cancel_requests before our
	// row existed and not yet committed. Wait for it: see waitForApply.
	if err := againOnDeadlock(ctx, func() error { return s.waitForApply(ctx, id) }); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: request cancel %s: %w", id, err)
	}
	// The apply may have committed just before the request: cancel it now.
	o, _, err = s.Cancel(ctx, id, user, sale.CancelByUser, now)
	if errors.Is(err, sale.ErrOrderNotFound) {
		return sale.Order{}, false, nil
	}
	return o, true, err
}

// waitForApply returns once no uncommitted transaction holds order id's
// process_log key: INSERT IGNORE of that key waits on a row another
// transaction inserted and has not committed, until it commits (then the
// order exists) or rolls back. The probe is always rolled back.
func (s *myStore) waitForApply(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT IGNORE INTO process_log (tx_id, sku_id) VALUES (?, '')`, id)
	return err
}

// PendingRestores returns up to limit Redis restores owed, oldest first,
// leaving out those of the SKUs in skip.
func (s *myStore) PendingRestores(ctx context.Context, limit int, skip ...string) ([]Restore, error) {
	where := ""
	if len(skip) > 0 {
		where = ` WHERE sku_id NOT IN (` + placeholders(len(skip)) + `)`
	}
	rows, err := s.db.QueryContext(ctx, `SELECT order_id, sku_id, user_id, quantity, coalesce(idempotency_key, '') FROM redis_restores`+where+` ORDER BY created_at LIMIT ?`,
		append(anys(skip), limit)...)
	if err != nil {
		return nil, fmt.Errorf("orderstore: pending restores: %w", err)
	}
	defer rows.Close()
	var out []Restore
	for rows.Next() {
		var r Restore
		if err := rows.Scan(&r.OrderID, &r.SKU, &r.User, &r.Quantity, &r.IdempotencyKey); err != nil {
			return nil, fmt.Errorf("orderstore: pending restores: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("orderstore: pending restores: %w", err)
	}
	return out, nil
}

// RestoresDone forgets restores the gate has applied.
func (s *myStore) RestoresDone(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `DELETE FROM redis_restores WHERE order_id IN (`+placeholders(len(ids))+`)`, anys(ids)...)
	return err
}

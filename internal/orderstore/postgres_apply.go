package orderstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ApplyBatch applies reservations exactly once, all in ONE transaction, and
// returns one Outcome per element of rs, in the same order.
//
// For each reservation not yet applied (keyed by OrderID in process_log) it
// writes the process_log row and an order row, and takes the quantity from
// the database stock (pending_payment), or records it as failed, checking in
// this order: unknown_sku when no inventory row exists; limit_reached when the
// user's live units of the SKU (pending_payment and paid orders, including
// those this batch takes) plus the quantity would exceed the SKU's
// per_user_limit as it is now; insufficient_stock when what is left does not
// cover it. A refused reservation takes nothing. Reservations are served in
// input order. A reservation already applied, or repeated within rs, changes
// nothing and is reported Duplicate with the status its order has now. The
// stock update is guarded by stock >= quantity, so no interleaving of callers
// can oversell, and the limit is read under the inventory row lock that every
// writer of a new live order holds, so none can exceed it either.
//
// It is safe to call concurrently with overlapping batches, from any number
// of processes: each order id is applied by exactly one call. An error means
// the transaction rolled back or, if the commit itself failed, that its
// outcome is unknown; either way the caller retries the whole batch and
// idempotency makes that safe (after a lost commit the retry reports the
// reservations as Duplicate, with the same statuses). So whatever the caller
// does for a failed outcome, such as giving the Redis stock back, must be
// idempotent by order id and also be done for a Duplicate failed outcome.
//
// One order per (user, SKU, Idempotency-Key), whatever path made it (a
// unique index is the final arbiter): a new reservation whose key already
// made an order (in the database, or earlier in rs) is recorded failed with
// ReasonDuplicateKey, without the key, takes nothing, and its Outcome names
// the first order (KeyOrderID; also on a Duplicate of it), so that the
// caller gives its units back and answers the key with that order. This
// check comes before the others. A key conflict with a transaction that did
// not hold the SKU's row lock runs the batch again; it never fails it.
//
// A reservation that fails sale.Reservation.Validate rejects the whole batch
// with an error wrapping sale.ErrInvalid, applying nothing: validate first.
//
// The gate enforces the per-user limit too; the database is the final arbiter
// (purchases by BuyDirect while Redis was down, a limit lowered mid-sale).
// The sale window is not checked: the gate admitted the reservation in time.
func (s *pgStore) ApplyBatch(ctx context.Context, rs []sale.Reservation) ([]Outcome, error) {
	if len(rs) == 0 {
		return []Outcome{}, nil
	}
	if err := validateBatch(rs); err != nil {
		return nil, fmt.Errorf("orderstore: apply batch: %w", err)
	}
	uniq, idx := dedupe(rs)
	var (
		got []Outcome
		err error
	)
	for attempt := 1; ; attempt++ {
		got, err = s.applyUnique(ctx, uniq)
		if !pgKeyConflict(err) || attempt == keyConflictAttempts {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("orderstore: apply batch of %d: %w", len(rs), err)
	}
	out := make([]Outcome, len(rs))
	seen := make([]bool, len(uniq))
	for i, j := range idx {
		out[i] = got[j]
		out[i].Duplicate = out[i].Duplicate || seen[j]
		seen[j] = true
	}
	return out, nil
}

// The ids are sorted before the insert, so every transaction takes its
// process_log row locks in the same order: overlapping batches wait for each
// other instead of deadlocking. A conflicting row of an uncommitted
// transaction makes the insert wait for its outcome.
const insertProcessLogSQL = `
INSERT INTO process_log (tx_id, sku_id)
SELECT t.tx_id, t.sku_id FROM unnest($1::text[], $2::text[]) AS t(tx_id, sku_id) ORDER BY t.tx_id
ON CONFLICT (tx_id) DO NOTHING
RETURNING tx_id`

const appliedOrdersSQL = `SELECT order_id, status, fail_reason FROM orders WHERE order_id = ANY($1::text[])`

// Rows are locked in sku_id order: inventory locks, always taken after the
// process_log ones, are ordered too.
const lockStockSQL = `SELECT sku_id, stock, per_user_limit FROM inventory WHERE sku_id = ANY($1::text[]) ORDER BY sku_id FOR UPDATE`

// Run after lockStockSQL: every writer of a new live order (ApplyBatch,
// BuyDirect) holds the inventory row lock, so at READ COMMITTED this
// statement (a new snapshot, taken once the lock is granted) sees every live
// unit there is. $1 and $2 are the (sku,
// user) pairs of the batch. The status test is a FILTER, not a WHERE, so that
// whatever the statistics say (they lag during a sale) the planner looks rows
// up by orders_sku_user_idx, never scans a hot SKU's orders by status.
const liveHeldSQL = `
SELECT o.sku_id, o.user_id, coalesce(sum(o.quantity) FILTER (WHERE o.status IN ('pending_payment', 'paid')), 0)::bigint
FROM orders o
WHERE (o.sku_id, o.user_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
GROUP BY o.sku_id, o.user_id`

// The WHERE is the guard against oversell (re-evaluated on the newest row
// version at READ COMMITTED); CHECK (stock >= 0) is the second line.
const takeStockSQL = `UPDATE inventory SET stock = stock - $2, updated_at = now() WHERE sku_id = $1 AND stock >= $2`

const insertOrdersSQL = `
INSERT INTO orders (order_id, sku_id, user_id, quantity, status, fail_reason, idempotency_key, created_at,
    expires_at, cancel_reason, cancelled_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::timestamptz[],
    $9::timestamptz[], $10::text[], $11::timestamptz[])`

// Run after lockStockSQL, like liveHeldSQL: every writer of a live order
// with a key holds the SKU's row lock, so this sees every order the keys
// made. $1-$3 are the (sku, user, key) triples of the batch.
const keyOwnersSQL = `
SELECT o.sku_id, o.user_id, o.idempotency_key, o.order_id
FROM orders o
WHERE o.idempotency_key IS NOT NULL
  AND (o.sku_id, o.user_id, o.idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))`

// pgKeyConflict reports whether err is the unique index on orders'
// Idempotency-Keys refusing a row (a key committed by a transaction that did
// not hold the SKU's row lock): the apply runs again and sees it.
func pgKeyConflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "orders_idempotency_idx"
}

// Cancellations requested while the order was queued (see RequestCancel).
const cancelRequestsSQL = `SELECT order_id, user_id FROM cancel_requests WHERE order_id = ANY($1::text[])`

const deleteCancelRequestsSQL = `DELETE FROM cancel_requests WHERE order_id = ANY($1::text[])`

// applyUnique runs the transaction of ApplyBatch on reservations with distinct
// order ids: four round trips (begin+log, read+lock+holdings, write, commit).
func (s *pgStore) applyUnique(ctx context.Context, uniq []sale.Reservation) ([]Outcome, error) {
	byID := slices.Clone(uniq)
	slices.SortFunc(byID, func(a, b sale.Reservation) int { return cmp.Compare(a.OrderID, b.OrderID) })
	ids, skus := make([]string, len(byID)), make([]string, len(byID))
	for i, r := range byID {
		ids[i], skus[i] = r.OrderID, r.SKU
	}

	isNew := make(map[string]bool, len(uniq))
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(markAuditedSQL) // this transaction writes its own stock_audit rows
	b.Queue(insertProcessLogSQL, ids, skus).Query(func(rows pgx.Rows) error {
		var id string
		_, err := pgx.ForEachRow(rows, []any{&id}, func() error { isNew[id] = true; return nil })
		return err
	})
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("process_log: %w", err)
	}

	var (
		fresh  []sale.Reservation
		dupIDs []string
	)
	skuSet, pairSet := make(map[string]bool), make(map[holder]bool)
	for _, r := range uniq {
		if isNew[r.OrderID] {
			fresh = append(fresh, r)
			skuSet[r.SKU], pairSet[holder{r.SKU, r.User}] = true, true
		} else {
			dupIDs = append(dupIDs, r.OrderID)
		}
	}

	// Duplicates: their order rows are visible, as each statement at READ
	// COMMITTED sees what committed before it started, including the
	// transaction the insert above waited for.
	prior := make(map[string]Outcome, len(dupIDs))
	locked := make(map[string]lockedSKU, len(skuSet))
	held := make(map[holder]int64)
	cancelBy := make(map[string]string)
	b = &pgx.Batch{}
	if len(dupIDs) > 0 {
		b.Queue(appliedOrdersSQL, dupIDs).Query(func(rows pgx.Rows) error {
			var (
				id, status string
				reason     *string
			)
			_, err := pgx.ForEachRow(rows, []any{&id, &status, &reason}, func() error {
				o := Outcome{OrderID: id, Status: sale.Status(status), Duplicate: true}
				if reason != nil {
					o.Reason = *reason
				}
				prior[id] = o
				return nil
			})
			return err
		})
	}
	if len(fresh) > 0 {
		skuIDs := slices.Sorted(maps.Keys(skuSet))
		b.Queue(lockStockSQL, skuIDs).Query(func(rows pgx.Rows) error {
			var (
				id string
				k  lockedSKU
			)
			_, err := pgx.ForEachRow(rows, []any{&id, &k.Stock, &k.PerUserLimit}, func() error { locked[id] = k; return nil })
			return err
		})
		pairSKUs, pairUsers := make([]string, 0, len(pairSet)), make([]string, 0, len(pairSet))
		for h := range pairSet {
			pairSKUs, pairUsers = append(pairSKUs, h.SKU), append(pairUsers, h.User)
		}
		freshIDs := make([]string, len(fresh))
		for i, r := range fresh {
			freshIDs[i] = r.OrderID
		}
		b.Queue(cancelRequestsSQL, freshIDs).Query(func(rows pgx.Rows) error {
			var id, user string
			_, err := pgx.ForEachRow(rows, []any{&id, &user}, func() error { cancelBy[id] = user; return nil })
			return err
		})
		b.Queue(liveHeldSQL, pairSKUs, pairUsers).Query(func(rows pgx.Rows) error {
			var (
				h holder
				n int64
			)
			_, err := pgx.ForEachRow(rows, []any{&h.SKU, &h.User, &n}, func() error { held[h] = n; return nil })
			return err
		})
	}
	owners := make(map[idemKey]string)
	if keys := keyedOf(uniq); len(keys) > 0 {
		ks, us, vs := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
		for i, k := range keys {
			ks[i], us[i], vs[i] = k.SKU, k.User, k.Key
		}
		b.Queue(keyOwnersSQL, ks, us, vs).Query(func(rows pgx.Rows) error {
			var (
				k  idemKey
				id string
			)
			_, err := pgx.ForEachRow(rows, []any{&k.SKU, &k.User, &k.Key, &id}, func() error { owners[k] = id; return nil })
			return err
		})
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("read orders and lock inventory: %w", err)
	}
	for _, id := range dupIDs {
		if _, ok := prior[id]; !ok {
			// This package writes both rows in one transaction: only a
			// hand-made process_log row can get here.
			return nil, fmt.Errorf("order %s is in process_log but has no order row", id)
		}
	}

	withKeyOwners(prior, uniq, owners)

	// A reservation its owner cancelled while it was queued lands cancelled:
	// it takes no stock, and the gate gives its units back (redis_restores).
	// One whose Idempotency-Key already made an order is refused.
	var cancelledIDs []string
	cancelled := func(r sale.Reservation) bool { u, ok := cancelBy[r.OrderID]; return ok && u == r.User }
	for _, r := range fresh {
		if cancelled(r) {
			cancelledIDs = append(cancelledIDs, r.OrderID)
		}
	}
	decided, toAllocate := decideKeys(fresh, owners, cancelled)
	allocated, take := allocate(toAllocate, locked, held)
	mergeDecided(decided, allocated)
	now := time.Now()
	if len(fresh) > 0 {
		b = &pgx.Batch{}
		for _, sku := range slices.Sorted(maps.Keys(take)) {
			n := take[sku]
			b.Queue(takeStockSQL, sku, n).Exec(func(ct pgconn.CommandTag) error {
				if ct.RowsAffected() != 1 {
					return fmt.Errorf("inventory %s: stock below %d under row lock: refusing to oversell", sku, n)
				}
				return nil
			})
		}
		b.Queue(insertOrdersSQL, s.orderColumns(fresh, decided, now)...)
		ts := make([]transition, len(fresh))
		var restores []Restore
		for i, r := range fresh {
			ts[i] = transition{r: r, to: decided[i].Status, cause: causeApplied, at: now}
			switch decided[i].Status {
			case sale.StatusFailed:
				ts[i].cause = "refused:" + decided[i].Reason
			case sale.StatusCancelled:
				ts[i].cause = sale.CancelByUser
				restores = append(restores, Restore{OrderID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity})
			}
		}
		queueTransitions(b, ts)
		queueRestores(b, restores)
		var audit []auditRow
		for i, r := range fresh {
			if decided[i].Status == sale.StatusPendingPayment {
				audit = append(audit, auditRow{sku: r.SKU, delta: -r.Quantity, reason: AuditApplied, orderID: r.OrderID, actor: "user:" + r.User, ip: r.ClientIP})
			}
		}
		queueAudit(b, audit)
		if len(cancelledIDs) > 0 {
			b.Queue(deleteCancelRequestsSQL, cancelledIDs)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("take stock and insert orders: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}

	out := make([]Outcome, len(uniq))
	nextFresh := 0
	for i, r := range uniq {
		if isNew[r.OrderID] {
			out[i] = decided[nextFresh]
			nextFresh++
			continue
		}
		out[i] = prior[r.OrderID]
	}
	return out, nil
}

// orderColumns returns the arguments of insertOrdersSQL: one array per column.
func (s *pgStore) orderColumns(rs []sale.Reservation, decided []Outcome, now time.Time) []any {
	n := len(rs)
	var (
		ids, skus, users, statuses = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		qty                        = make([]int64, n)
		reasons, keys              = make([]*string, n), make([]*string, n)
		created                    = make([]time.Time, n)
		expires, cancelledAt       = make([]*time.Time, n), make([]*time.Time, n)
		cancelReasons              = make([]*string, n)
	)
	byUser := sale.CancelByUser
	for i, r := range rs {
		switch decided[i].Status {
		case sale.StatusPendingPayment:
			e := s.expiry(r.AcceptedAt)
			expires[i] = &e
		case sale.StatusCancelled:
			cancelledAt[i], cancelReasons[i] = &now, &byUser
		}
		ids[i], skus[i], users[i], qty[i] = r.OrderID, r.SKU, r.User, r.Quantity
		statuses[i] = string(decided[i].Status)
		if decided[i].Reason != "" {
			reasons[i] = &decided[i].Reason
		}
		if ownsKey(r, decided[i]) {
			keys[i] = &rs[i].IdempotencyKey
		}
		created[i] = time.UnixMilli(r.AcceptedAt)
	}
	return []any{ids, skus, users, qty, statuses, reasons, keys, created, expires, cancelReasons, cancelledAt}
}

// The row carries the Idempotency-Key only if no order holds it yet.
const insertDiscardedOrderSQL = `
INSERT INTO orders (order_id, sku_id, user_id, quantity, status, fail_reason, idempotency_key, created_at)
SELECT $1, $2, $3, $4, 'failed', $5,
    CASE WHEN EXISTS (SELECT 1 FROM orders WHERE sku_id = $2 AND user_id = $3 AND idempotency_key = $6::text) THEN NULL ELSE $6::text END, $7`

// Discard records r as failed with reason ReasonDiscarded (a process_log row
// and a failed order row, in one transaction) so that it can never be applied
// later: ApplyBatch then reports it Duplicate, failed, discarded. It is how an
// operator discards a dead-lettered reservation.
//
// It returns already = false and sale.StatusFailed if it recorded r now, or
// already = true and the status of r's order if r was processed before
// (applied, sold by BuyDirect, or discarded): then nothing changes, as an
// applied reservation cannot be discarded. No stock changes either way: the
// units r holds in the gate are given back by the caller, as for any failed
// outcome (idempotent by order id, so also when already is true and the
// status is failed). Calls racing with ApplyBatch on the same order id are
// safe: exactly one of them records it.
//
// An r failing Validate gives an error wrapping sale.ErrInvalid: ApplyBatch
// never applies such a reservation, so there is nothing to record.
func (s *pgStore) Discard(ctx context.Context, r sale.Reservation) (already bool, status sale.Status, err error) {
	if err := r.Validate(); err != nil {
		return false, "", fmt.Errorf("orderstore: discard: %w: %v", sale.ErrInvalid, err)
	}
	var (
		inserted, prior bool
		existing        sale.Order
	)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(insertOneProcessLogSQL, r.OrderID, r.SKU).Exec(func(ct pgconn.CommandTag) error {
		inserted = ct.RowsAffected() == 1
		return nil
	})
	// Sees the order of a transaction the insert above waited for (READ COMMITTED).
	b.Queue(orderSQL, r.OrderID).QueryRow(func(row pgx.Row) error {
		var err error
		existing, prior, err = scanOptionalOrder(row)
		return err
	})
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := br.Close(); err != nil {
		return false, "", fmt.Errorf("orderstore: discard %s: %w", r.OrderID, err)
	}
	switch {
	case !inserted && !prior:
		return false, "", fmt.Errorf("orderstore: discard %s: in process_log but has no order row", r.OrderID)
	case !inserted:
		return true, existing.Status, nil
	}
	if _, err := tx.Exec(ctx, insertDiscardedOrderSQL, r.OrderID, r.SKU, r.User, r.Quantity,
		ReasonDiscarded, nullString(r.IdempotencyKey), time.UnixMilli(r.AcceptedAt)); err != nil {
		return false, "", fmt.Errorf("orderstore: discard %s: insert order: %w", r.OrderID, err)
	}
	tb := &pgx.Batch{}
	queueTransitions(tb, []transition{{r: r, to: sale.StatusFailed, cause: "refused:" + ReasonDiscarded, at: time.Now()}})
	if err := tx.SendBatch(ctx, tb).Close(); err != nil {
		return false, "", fmt.Errorf("orderstore: discard %s: transition: %w", r.OrderID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, "", fmt.Errorf("orderstore: discard %s: commit: %w", r.OrderID, err)
	}
	return false, sale.StatusFailed, nil
}

package orderstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale/internal/sale"
)

// Causes recorded in order_transitions.cause besides the cancel reasons.
const (
	causeApplied = "reservation_applied"
	causeDirect  = "direct_sale"
	causePaid    = "payment"
)

// transition is one row of order_transitions.
type transition struct {
	r     sale.Reservation
	from  sale.Status // "" for a new order
	to    sale.Status
	cause string
	at    time.Time
}

const insertTransitionsSQL = `
INSERT INTO order_transitions (order_id, sku_id, user_id, quantity, from_status, to_status, cause, at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::timestamptz[])`

// queueTransitions adds the insert of ts to b.
func queueTransitions(b *pgx.Batch, ts []transition) {
	if len(ts) == 0 {
		return
	}
	n := len(ts)
	ids, skus, users, tos, causes := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	froms := make([]*string, n)
	qty := make([]int64, n)
	at := make([]time.Time, n)
	for i, t := range ts {
		ids[i], skus[i], users[i], qty[i] = t.r.OrderID, t.r.SKU, t.r.User, t.r.Quantity
		tos[i], causes[i], at[i] = string(t.to), t.cause, t.at
		if t.from != "" {
			f := string(t.from)
			froms[i] = &f
		}
	}
	b.Queue(insertTransitionsSQL, ids, skus, users, qty, froms, tos, causes, at)
}

// Restore is Redis work the database owes the gate, once per OrderID (the
// gate's token): a release gives Quantity units of SKU and the buyer's slot
// back (OrderID = the order's id); a sale made by the database fallback
// (Quantity < 0, OrderID = DebitPrefix + the order's id, so that a later
// release of the same order is a distinct token) takes them; a stock change
// made outside flashsale (OrderID starting with ExternalPrefix, User empty)
// moves units only.
type Restore struct {
	OrderID  string
	SKU      string
	User     string
	Quantity int64
	// IdempotencyKey is, on a direct sale's debit, the key of its order
	// (empty if none): the gate records that the key made the order, so a
	// retry through the gate of any instance is answered with it.
	IdempotencyKey string
}

const insertRestoresSQL = `
INSERT INTO redis_restores (order_id, sku_id, user_id, quantity, idempotency_key)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])
ON CONFLICT (order_id) DO NOTHING`

func queueRestores(b *pgx.Batch, rs []Restore) {
	if len(rs) == 0 {
		return
	}
	n := len(rs)
	ids, skus, users, qty := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
	keys := make([]*string, n)
	for i, r := range rs {
		ids[i], skus[i], users[i], qty[i], keys[i] = r.OrderID, r.SKU, r.User, r.Quantity, nullString(r.IdempotencyKey)
	}
	b.Queue(insertRestoresSQL, ids, skus, users, qty, keys)
}

const payOrderSQL = `
UPDATE orders SET status = 'paid', paid_at = $3, payment_ref = $4, updated_at = now()
WHERE order_id = $1 AND ($2 = '' OR user_id = $2) AND status = 'pending_payment' AND expires_at > $3
RETURNING ` + orderColumnList

// Pay moves order id from pending_payment to paid: one compare-and-set on
// the order row, so a payment racing with the payment timeout or a cancel
// ends in exactly one terminal state. The set also requires expires_at >
// now: a pay at or after the deadline is refused even before the sweeper
// releases the order (which it then does as usual). user, if not empty, must own the order.
// Paying a paid order again returns it with again = true. Errors wrap
// sale.ErrOrderNotFound (absent, or not user's), sale.ErrOrderExpired
// (cancelled by its user or the timeout, or past its deadline: the caller
// refunds) or
// sale.ErrOrderFailed.
func (s *pgStore) Pay(ctx context.Context, id, user, ref string, now time.Time) (o sale.Order, again bool, err error) {
	for attempt := 0; ; attempt++ {
		o, again, err = s.pay(ctx, id, user, ref, now)
		if !errors.Is(err, errRaced) || attempt == 3 {
			return o, again, err
		}
	}
}

// pastDeadline reports whether o's payment deadline has passed at now.
func pastDeadline(o sale.Order, now time.Time) bool {
	return o.ExpiresAt != nil && !o.ExpiresAt.After(now)
}

// errRaced: the order row was created or changed between the compare-and-set
// and the read that explains its failure (an apply committing at that
// moment): try the compare-and-set again.
var errRaced = errors.New("order changed during the update")

func (s *pgStore) pay(ctx context.Context, id, user, ref string, now time.Time) (o sale.Order, again bool, err error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: pay %s: %w", id, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	o, err = scanOrder(tx.QueryRow(ctx, payOrderSQL, id, user, now, nullString(ref)))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, err := s.ownedOrder(ctx, tx, id, user)
		if err != nil {
			return sale.Order{}, false, err
		}
		switch cur.Status {
		case sale.StatusPaid:
			return cur, true, nil
		case sale.StatusCancelled:
			return cur, false, fmt.Errorf("orderstore: pay %s: %w", id, sale.ErrOrderExpired)
		case sale.StatusPendingPayment:
			if pastDeadline(cur, now) {
				return cur, false, fmt.Errorf("orderstore: pay %s: %w", id, sale.ErrOrderExpired)
			}
			return cur, false, errRaced
		default:
			return cur, false, fmt.Errorf("orderstore: pay %s: %w", id, sale.ErrOrderFailed)
		}
	}
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: pay %s: %w", id, err)
	}
	b := &pgx.Batch{}
	queueTransitions(b, []transition{{r: orderRes(o), from: sale.StatusPendingPayment, to: sale.StatusPaid, cause: causePaid, at: now}})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: pay %s: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: pay %s: commit: %w", id, err)
	}
	return o, false, nil
}

func orderRes(o sale.Order) sale.Reservation {
	return sale.Reservation{OrderID: o.ID, SKU: o.SKU, User: o.User, Quantity: o.Quantity}
}

// ownedOrder reads order id inside tx; not found (or not user's) wraps
// sale.ErrOrderNotFound.
func (s *pgStore) ownedOrder(ctx context.Context, tx pgx.Tx, id, user string) (sale.Order, error) {
	o, err := scanOrder(tx.QueryRow(ctx, orderSQL, id))
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && user != "" && o.User != user) {
		return sale.Order{}, fmt.Errorf("orderstore: order %s: %w", id, sale.ErrOrderNotFound)
	}
	if err != nil {
		return sale.Order{}, fmt.Errorf("orderstore: order %s: %w", id, err)
	}
	return o, nil
}

const releaseOrderSQL = `
UPDATE orders SET status = 'cancelled', cancelled_at = $3, cancel_reason = $4, updated_at = now()
WHERE order_id = $1 AND ($2 = '' OR user_id = $2) AND status = 'pending_payment'
  AND ($5::timestamptz IS NULL OR expires_at <= $5)
RETURNING ` + orderColumnList

const giveStockSQL = `UPDATE inventory SET stock = stock + $2, updated_at = now() WHERE sku_id = $1`

// Cancel releases order id: pending_payment -> cancelled with cause, in one
// transaction with the database stock given back and the Redis restore owed
// (redis_restores). The status change is the guard: a paid order is never
// released, and a release happens once. user, if not empty, must own the
// order. Cancelling a cancelled order returns it with again = true. Errors
// wrap sale.ErrOrderNotFound, sale.ErrOrderPaid or sale.ErrOrderFailed.
func (s *pgStore) Cancel(ctx context.Context, id, user, cause string, now time.Time) (o sale.Order, again bool, err error) {
	return s.release(ctx, id, user, cause, now, nil)
}

// Expire releases order id like Cancel with cause payment_timeout, but only
// if its deadline (expires_at) is at or before now: nothing is released
// early. An order not yet due, paid, or already released is returned with
// released = false and no error.
func (s *pgStore) Expire(ctx context.Context, id string, now time.Time) (o sale.Order, released bool, err error) {
	o, again, err := s.release(ctx, id, "", sale.CancelPaymentTimeout, now, &now)
	switch {
	case errors.Is(err, errNotDue), errors.Is(err, sale.ErrOrderPaid), errors.Is(err, sale.ErrOrderFailed):
		return o, false, nil
	case err != nil:
		return o, false, err
	}
	return o, !again, nil
}

var errNotDue = errors.New("not due")

func (s *pgStore) release(ctx context.Context, id, user, cause string, now time.Time, due *time.Time) (o sale.Order, again bool, err error) {
	err = s.bounded(ctx, func() error {
		o, again, err = s.releaseLoop(ctx, id, user, cause, now, due)
		return err
	})
	return o, again, err
}

func (s *pgStore) releaseLoop(ctx context.Context, id, user, cause string, now time.Time, due *time.Time) (o sale.Order, again bool, err error) {
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

func (s *pgStore) releaseOnce(ctx context.Context, id, user, cause string, now time.Time, due *time.Time) (sale.Order, bool, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: release %s: %w", id, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	o, err := scanOrder(tx.QueryRow(ctx, releaseOrderSQL, id, user, now, cause, due))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, err := s.ownedOrder(ctx, tx, id, user)
		if err != nil {
			return sale.Order{}, false, err
		}
		switch cur.Status {
		case sale.StatusCancelled:
			return cur, true, nil
		case sale.StatusPaid:
			return cur, false, fmt.Errorf("orderstore: release %s: %w", id, sale.ErrOrderPaid)
		case sale.StatusFailed:
			return cur, false, fmt.Errorf("orderstore: release %s: %w", id, sale.ErrOrderFailed)
		}
		if due == nil || (cur.ExpiresAt != nil && !cur.ExpiresAt.After(*due)) {
			// pending_payment and due (or a user's cancel): the row landed
			// after the update's snapshot.
			return cur, false, errRaced
		}
		return cur, false, errNotDue
	}
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: release %s: %w", id, err)
	}
	b := &pgx.Batch{}
	a := actorOf(ctx)
	queueAudit(b, []auditRow{{sku: o.SKU, delta: o.Quantity, reason: AuditRelease + ":" + cause, orderID: o.ID, actor: a.Name, ip: a.SourceIP}})
	b.Queue(giveStockSQL, o.SKU, o.Quantity)
	queueRestores(b, []Restore{{OrderID: o.ID, SKU: o.SKU, User: o.User, Quantity: o.Quantity}})
	queueTransitions(b, []transition{{r: orderRes(o), from: sale.StatusPendingPayment, to: sale.StatusCancelled, cause: cause, at: now}})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: release %s: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: release %s: commit: %w", id, err)
	}
	return o, false, nil
}

// Claimed in deadline order; SKIP LOCKED lets several sweepers (instances)
// share the work without waiting on each other.
const expireDueSQL = `
WITH due AS (
    SELECT order_id FROM orders
    WHERE status = 'pending_payment' AND expires_at <= $1
    ORDER BY expires_at LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE orders o SET status = 'cancelled', cancelled_at = $1, cancel_reason = 'payment_timeout', updated_at = now()
FROM due WHERE o.order_id = due.order_id
RETURNING o.order_id, o.sku_id, o.user_id, o.quantity`

// ExpireDue releases up to limit orders whose payment deadline passed, in
// one transaction (status, stock, Redis restores owed, transitions), and
// returns them. It is the sweeper: the safety net of the delayed trigger.
func (s *pgStore) ExpireDue(ctx context.Context, now time.Time, limit int) ([]Restore, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("orderstore: expire due: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, expireDueSQL, now, limit)
	if err != nil {
		return nil, fmt.Errorf("orderstore: expire due: %w", err)
	}
	var out []Restore
	var r Restore
	if _, err := pgx.ForEachRow(rows, []any{&r.OrderID, &r.SKU, &r.User, &r.Quantity}, func() error {
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("orderstore: expire due: %w", err)
	}
	if len(out) == 0 {
		return nil, nil
	}
	give := map[string]int64{}
	ts := make([]transition, len(out))
	for i, r := range out {
		give[r.SKU] += r.Quantity
		ts[i] = transition{r: sale.Reservation{OrderID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity},
			from: sale.StatusPendingPayment, to: sale.StatusCancelled, cause: sale.CancelPaymentTimeout, at: now}
	}
	b := &pgx.Batch{}
	audit := make([]auditRow, len(out))
	for i, r := range out {
		audit[i] = auditRow{sku: r.SKU, delta: r.Quantity, reason: AuditRelease + ":" + sale.CancelPaymentTimeout, orderID: r.OrderID, actor: "system:sweeper"}
	}
	queueAudit(b, audit)
	for _, sku := range slices.Sorted(maps.Keys(give)) {
		b.Queue(giveStockSQL, sku, give[sku])
	}
	queueRestores(b, out)
	queueTransitions(b, ts)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("orderstore: expire due: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("orderstore: expire due: commit: %w", err)
	}
	return out, nil
}

const requestCancelSQL = `INSERT INTO cancel_requests (order_id, user_id) VALUES ($1, $2) ON CONFLICT (order_id) DO NOTHING`

// RequestCancel records that user cancels order id, still queued (accepted
// by the gate, not yet applied): ApplyBatch records it cancelled when it
// lands. If the order was applied meanwhile, it is cancelled now instead
// (landed = true, with the order). The caller checked that the queued
// reservation is user's.
func (s *pgStore) RequestCancel(ctx context.Context, id, user string, now time.Time) (o sale.Order, landed bool, err error) {
	if _, err := s.pool.Exec(ctx, requestCancelSQL, id, user); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: request cancel %s: %w", id, err)
	}
	// An ApplyBatch of this order may have read cancel_requests before our
	// row existed and not yet committed. Wait for it: inserting the order's
	// process_log key blocks on its uncommitted row until it commits (then
	// the order exists and is cancelled below) or rolls back. The probe is
	// always rolled back.
	if err := s.waitForApply(ctx, id); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: request cancel %s: %w", id, err)
	}
	// The apply may have committed just before the request: cancel it now.
	o, _, err = s.Cancel(ctx, id, user, sale.CancelByUser, now)
	if errors.Is(err, sale.ErrOrderNotFound) {
		return sale.Order{}, false, nil
	}
	return o, true, err
}

const pendingRestoresSQL = `SELECT order_id, sku_id, user_id, quantity, coalesce(idempotency_key, '') FROM redis_restores
WHERE NOT (sku_id = ANY($2::text[])) ORDER BY created_at LIMIT $1`

// PendingRestores returns up to limit Redis restores owed, oldest first,
// leaving out those of the SKUs in skip.
func (s *pgStore) PendingRestores(ctx context.Context, limit int, skip ...string) ([]Restore, error) {
	if skip == nil {
		skip = []string{}
	}
	rows, err := s.pool.Query(ctx, pendingRestoresSQL, limit, skip)
	if err != nil {
		return nil, fmt.Errorf("orderstore: pending restores: %w", err)
	}
	var out []Restore
	var r Restore
	if _, err := pgx.ForEachRow(rows, []any{&r.OrderID, &r.SKU, &r.User, &r.Quantity, &r.IdempotencyKey}, func() error {
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("orderstore: pending restores: %w", err)
	}
	return out, nil
}

// RestoresDone forgets restores the gate has applied.
func (s *pgStore) RestoresDone(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := s.pool.Exec(ctx, `DELETE FROM redis_restores WHERE order_id = ANY($1::text[])`, ids)
	return err
}

func (s *pgStore) waitForApply(ctx context.Context, id string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	_, err = tx.Exec(ctx, `INSERT INTO process_log (tx_id, sku_id) VALUES ($1, '') ON CONFLICT (tx_id) DO NOTHING`, id)
	return err
}

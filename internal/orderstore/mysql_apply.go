package orderstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/go-sql-driver/mysql"
)

// ApplyBatch keeps the contract of pgStore.ApplyBatch: reservations applied
// exactly once, in one transaction, one Outcome per element of rs in input
// order, Duplicate for those applied before (or earlier in rs) with their
// order's status now; the batch is rejected whole (sale.ErrInvalid) when a
// reservation fails Validate. An error means the transaction rolled back, or
// that the outcome of its commit is unknown: the caller retries the batch.
func (s *myStore) ApplyBatch(ctx context.Context, rs []sale.Reservation) ([]Outcome, error) {
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
	lockFirst := false
	for attempt := 1; ; attempt++ {
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			var err error
			got, err = s.applyUnique(ctx, tx, uniq, lockFirst)
			return err
		})
		if errors.Is(err, errMovedBeforeLock) && !lockFirst {
			// What the batch was decided from changed before the lock was
			// granted (rolled back): decide again under the lock.
			lockFirst, attempt = true, attempt-1
			continue
		}
		if !myKeyConflict(err) || attempt == keyConflictAttempts {
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

// errMovedBeforeLock is applyUnique's answer, when it did not lock first,
// that the stock, limit or holdings it decided from changed before it held
// the inventory row locks: the transaction rolls back and runs again with
// lockFirst.
var errMovedBeforeLock = errors.New("inventory or holdings changed before the row lock")

// applyUnique is the body of ApplyBatch's transaction for reservations with
// distinct order ids; it keeps no state across calls, so inTx may run it
// again after a deadlock. A batch of new reservations costs nine statements
// besides BEGIN and COMMIT, whatever its size: claim, read stock, read
// cancels and holdings, read key owners, insert orders, transitions, audit,
// then lock, read holdings again, take (a batch with duplicates one more, to
// read their orders; lockFirst: lock, read cancels and holdings, read key
// owners, take, insert orders, transitions, audit).
//
// Lock late. A hot SKU's batches queue for its inventory row lock, held
// until commit, so what runs under it bounds the SKU's rate; the inserts
// are most of a batch's time. Without lockFirst the batch decides from a
// plain read of the inventory rows, the holdings and the key owners, writes
// every row, and only then locks the inventory rows and reads the holdings
// again (its own new rows included, which it adds to what it read before).
// It takes the stock only if the decision stands under the lock; otherwise
// it returns errMovedBeforeLock, and ApplyBatch rolls it back and runs it
// with lockFirst, the order of the rules as they are stated on pgStore:
//
//   - The decisions are a function of the SKUs that exist, their limits and
//     stock, the fresh pairs' live holdings, the key owners and the
//     cancellations (allocate, decideKeys). Every writer of a live order
//     (this one, BuyDirect, the bench strategies) and every release holds
//     the inventory row lock until it commits, and reads the holdings after
//     the lock was granted; so once this transaction holds it, a new
//     statement sees every live unit there is, and none can change until
//     commit. The same SKUs with the same limits and the same holdings give
//     the same limit decisions; the same stock, or (no reservation refused
//     for stock) a stock still covering what is taken, gives the same stock
//     decisions: allocate walks the batch in order, and with at least take
//     units every unit it took is still there. So the commit is exactly
//     what lockFirst would have committed at the moment of the lock, the
//     serialization point either way. A batch that reads holdings under the
//     lock before this one committed did not see this one's rows, and this
//     one, checking after, saw its.
//   - Key owners only grow (no order gives its key up), and a new order row
//     carries its key unless refused for it: a key another transaction
//     committed after the read makes the row's insert fail on
//     orders_idempotency_idx, and one it holds uncommitted makes the insert
//     wait for it, then fail (a key conflict: ApplyBatch runs the batch
//     again) or pass (it rolled back). No one can commit a key this batch
//     inserted until it ends. So the owners read before the lock are those
//     under it, for the keys of the batch.
//   - Cancellations do not depend on the lock: RequestCancel waits for the
//     process_log key the claim holds (see waitForApply).
//   - Locks: process_log rows first (the claim, sorted), then the new rows,
//     then inventory rows in sku_id order. The only other wait, an insert on
//     a key another uncommitted order holds, can deadlock with a batch that
//     holds the inventory lock and waits on a key of this one; InnoDB
//     picks a victim and inTx runs it again.
func (s *myStore) applyUnique(ctx context.Context, tx *sql.Tx, uniq []sale.Reservation, lockFirst bool) ([]Outcome, error) {
	isNew, prior, err := myClaim(ctx, tx, uniq)
	if err != nil {
		return nil, err
	}

	var fresh []sale.Reservation
	skuSet, pairSet := make(map[string]bool), make(map[holder]bool)
	for _, r := range uniq {
		if isNew[r.OrderID] {
			fresh = append(fresh, r)
			skuSet[r.SKU], pairSet[holder{r.SKU, r.User}] = true, true
		}
	}
	if len(fresh) == 0 {
		owners, err := myKeyOwners(ctx, tx, keyedOf(uniq))
		if err != nil {
			return nil, fmt.Errorf("read idempotency keys: %w", err)
		}
		withKeyOwners(prior, uniq, owners)
		out := make([]Outcome, len(uniq))
		for i, r := range uniq {
			out[i] = prior[r.OrderID]
		}
		return out, nil
	}

	skus := slices.Sorted(maps.Keys(skuSet))
	seen, err := myReadStock(ctx, tx, skus, lockFirst)
	if err != nil {
		return nil, fmt.Errorf("read inventory: %w", err)
	}
	freshIDs := make([]string, len(fresh))
	for i, r := range fresh {
		freshIDs[i] = r.OrderID
	}
	cancelBy, held, err := myCancelsAndHoldings(ctx, tx, freshIDs, pairSet)
	if err != nil {
		return nil, fmt.Errorf("read holdings: %w", err)
	}

	// A reservation its owner cancelled while it was queued lands cancelled:
	// it takes no stock, and the gate gives its units back (redis_restores).
	// One whose Idempotency-Key already made an order is refused.
	cancelled := func(r sale.Reservation) bool { u, ok := cancelBy[r.OrderID]; return ok && u == r.User }
	var cancelledIDs []string
	for _, r := range fresh {
		if cancelled(r) {
			cancelledIDs = append(cancelledIDs, r.OrderID)
		}
	}
	owners, err := myKeyOwners(ctx, tx, keyedOf(uniq))
	if err != nil {
		return nil, fmt.Errorf("read idempotency keys: %w", err)
	}
	withKeyOwners(prior, uniq, owners)
	decided, toAllocate := decideKeys(fresh, owners, cancelled)
	allocated, take := allocate(toAllocate, seen, held)
	mergeDecided(decided, allocated)

	now := time.Now().UTC().Truncate(time.Microsecond)
	if lockFirst {
		if err := myTakeStock(ctx, tx, take); err != nil {
			return nil, err
		}
	}
	if err := s.myInsertOrders(ctx, tx, fresh, decided, now); err != nil {
		return nil, fmt.Errorf("insert orders: %w", err)
	}
	ts := make([]transition, len(fresh))
	var (
		restores []Restore
		audit    []auditRow
	)
	for i, r := range fresh {
		ts[i] = transition{r: r, to: decided[i].Status, cause: causeApplied, at: now}
		switch decided[i].Status {
		case sale.StatusFailed:
			ts[i].cause = "refused:" + decided[i].Reason
		case sale.StatusCancelled:
			ts[i].cause = sale.CancelByUser
			restores = append(restores, Restore{OrderID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity})
		case sale.StatusPendingPayment:
			audit = append(audit, auditRow{sku: r.SKU, delta: -r.Quantity, reason: AuditApplied, orderID: r.OrderID, actor: "user:" + r.User, ip: r.ClientIP})
		}
	}
	if err := myInsertTransitions(ctx, tx, ts); err != nil {
		return nil, fmt.Errorf("insert transitions: %w", err)
	}
	if err := myInsertRestores(ctx, tx, restores); err != nil {
		return nil, fmt.Errorf("insert redis restores: %w", err)
	}
	if err := myInsertAudit(ctx, tx, audit); err != nil {
		return nil, fmt.Errorf("insert audit: %w", err)
	}
	if len(cancelledIDs) > 0 {
		if _, err := tx.ExecContext(ctx, `DELETE FROM cancel_requests WHERE order_id IN (`+placeholders(len(cancelledIDs))+`)`,
			anys(cancelledIDs)...); err != nil {
			return nil, fmt.Errorf("delete cancel requests: %w", err)
		}
	}
	if !lockFirst {
		if s.beforeLock != nil {
			s.beforeLock()
		}
		if err := myLockUnmoved(ctx, tx, skus, seen, fresh, decided, held, take); err != nil {
			return nil, err
		}
		if err := myTakeStock(ctx, tx, take); err != nil {
			return nil, err
		}
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

// myLockUnmoved locks the inventory rows of skus (applyUnique without
// lockFirst, after its writes) and returns errMovedBeforeLock unless the
// batch's decisions stand under the lock (see applyUnique): the same SKUs
// with the same per-user limits as seen, the stock of each unchanged or, if
// none of its reservations was refused for stock, still at least take, and
// every fresh pair's live units those of held plus what the batch's new
// orders (fresh, decided) hold.
func myLockUnmoved(ctx context.Context, tx *sql.Tx, skus []string, seen map[string]lockedSKU, fresh []sale.Reservation,
	decided []Outcome, held map[holder]int64, take map[string]int64) error {
	locked, err := myReadStock(ctx, tx, skus, true)
	if err != nil {
		return fmt.Errorf("lock inventory: %w", err)
	}
	short := make(map[string]bool)
	want := maps.Clone(held)
	pairs := make(map[holder]bool, len(fresh))
	for i, r := range fresh {
		h := holder{r.SKU, r.User}
		pairs[h] = true
		switch {
		case decided[i].Status == sale.StatusPendingPayment:
			want[h] += r.Quantity
		case decided[i].Reason == ReasonInsufficientStock:
			short[r.SKU] = true
		}
	}
	if len(locked) != len(seen) {
		return errMovedBeforeLock
	}
	for sku, was := range seen {
		is, ok := locked[sku]
		if !ok || is.PerUserLimit != was.PerUserLimit || is.Stock != was.Stock && (short[sku] || is.Stock < take[sku]) {
			return errMovedBeforeLock
		}
	}
	_, got, err := myCancelsAndHoldings(ctx, tx, nil, pairs)
	if err != nil {
		return fmt.Errorf("read holdings under the lock: %w", err)
	}
	for h := range pairs {
		if got[h] != want[h] {
			return errMovedBeforeLock
		}
	}
	return nil
}

// myKeyOwners reads which orders hold keys: the order id per key.
//
// It asks per SKU for the keyed orders of the users, sku_id = ? AND user_id
// IN (...), and keeps the rows whose key was asked for: InnoDB reads one
// range of orders_idempotency_idx per user, index only. The obvious shape, an
// OR of (sku_id = ? AND user_id = ? AND idempotency_key = ?) terms, costs
// MariaDB's range optimizer about a third of a second for 1,000 keys (more
// than the rest of the batch eight times over); user_id IN (...) AND
// idempotency_key IN (...) would make it |users| x |keys| ranges.
func myKeyOwners(ctx context.Context, tx *sql.Tx, keys []idemKey) (map[idemKey]string, error) {
	owners := make(map[idemKey]string)
	if len(keys) == 0 {
		return owners, nil
	}
	wanted := make(map[idemKey]bool, len(keys))
	asked := make(map[holder]bool, len(keys))
	usersOf := make(map[string][]string)
	for _, k := range keys {
		wanted[k] = true
		if h := (holder{k.SKU, k.User}); !asked[h] {
			asked[h] = true
			usersOf[k.SKU] = append(usersOf[k.SKU], k.User)
		}
	}
	var q strings.Builder
	args := make([]any, 0, len(usersOf)+len(keys))
	q.WriteString(`SELECT sku_id, user_id, idempotency_key, order_id FROM orders WHERE idempotency_key IS NOT NULL AND (`)
	for i, sku := range slices.Sorted(maps.Keys(usersOf)) {
		if i > 0 {
			q.WriteString(" OR ")
		}
		users := usersOf[sku]
		q.WriteString("(sku_id = ? AND user_id IN (" + placeholders(len(users)) + "))")
		args = append(args, sku)
		args = append(args, anys(users)...)
	}
	q.WriteString(")")
	rows, err := tx.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k  idemKey
			id string
		)
		if err := rows.Scan(&k.SKU, &k.User, &k.Key, &id); err != nil {
			return nil, err
		}
		if wanted[k] {
			owners[k] = id
		}
	}
	return owners, rows.Err()
}

// myKeyConflict reports whether err is the unique key on orders'
// Idempotency-Keys refusing a row (see pgKeyConflict).
func myKeyConflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062 && strings.Contains(me.Message, "orders_idempotency_idx")
}

// myClaim inserts the process_log rows of rs (distinct order ids) and
// reports which this transaction inserted (isNew: those it must apply) and,
// for the others, applied by a committed transaction, their order's status
// now as Duplicate outcomes (prior).
//
// The rows go in sorted by id, so every transaction takes its process_log
// row locks in the same order and overlapping batches wait for each other
// instead of deadlocking. INSERT IGNORE on an id another uncommitted
// transaction holds waits for it and, once it committed, skips the row.
// MySQL cannot say which rows it skipped, so when it skipped any the ids come
// from the order rows: this package writes an id's process_log and order
// rows in one transaction, so (READ COMMITTED: a statement sees what
// committed before it started) an id with a visible order row was applied
// before, one without is ours. The count of ours must equal the rows
// inserted; otherwise a process_log row without its order row (or the
// reverse) exists, which only a hand-made row can cause: an error.
func myClaim(ctx context.Context, tx *sql.Tx, rs []sale.Reservation) (isNew map[string]bool, prior map[string]Outcome, err error) {
	byID := slices.Clone(rs)
	slices.SortFunc(byID, func(a, b sale.Reservation) int { return cmp.Compare(a.OrderID, b.OrderID) })
	q := valuesSQL("INSERT IGNORE INTO process_log (tx_id, sku_id) VALUES ", len(byID), 2)
	args := make([]any, 0, 2*len(byID))
	for _, r := range byID {
		args = append(args, r.OrderID, r.SKU)
	}
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("process_log: %w", err)
	}
	inserted, err := res.RowsAffected()
	if err != nil {
		return nil, nil, fmt.Errorf("process_log: %w", err)
	}
	isNew = make(map[string]bool, len(rs))
	for _, r := range rs {
		isNew[r.OrderID] = true
	}
	prior = make(map[string]Outcome)
	if int(inserted) == len(rs) {
		return isNew, prior, nil
	}
	ids := make([]string, len(byID))
	for i, r := range byID {
		ids[i] = r.OrderID
	}
	rows, err := tx.QueryContext(ctx, `SELECT order_id, status, fail_reason FROM orders WHERE order_id IN (`+placeholders(len(ids))+`)`,
		anys(ids)...)
	if err != nil {
		return nil, nil, fmt.Errorf("read applied orders: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, status string
			reason     sql.NullString
		)
		if err := rows.Scan(&id, &status, &reason); err != nil {
			return nil, nil, fmt.Errorf("read applied orders: %w", err)
		}
		prior[id] = Outcome{OrderID: id, Status: sale.Status(status), Reason: reason.String, Duplicate: true}
		delete(isNew, id)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read applied orders: %w", err)
	}
	if len(isNew) != int(inserted) {
		return nil, nil, fmt.Errorf("process_log: inserted %d of %d ids, but %d have no order row: "+
			"a process_log row without its order row, or an order row without its process_log row", inserted, len(rs), len(isNew))
	}
	return isNew, prior, nil
}

// myReadStock reads the inventory rows of skus (sorted), locking them if
// lock; an absent SKU is absent from the map. Rows are locked in sku_id
// order, always after the process_log rows, like every writer of inventory,
// so lockers queue instead of deadlocking.
func myReadStock(ctx context.Context, tx *sql.Tx, skus []string, lock bool) (map[string]lockedSKU, error) {
	q := `SELECT sku_id, stock, per_user_limit FROM inventory WHERE sku_id IN (` + placeholders(len(skus)) + `) ORDER BY sku_id`
	if lock {
		q += ` FOR UPDATE`
	}
	rows, err := tx.QueryContext(ctx, q, anys(skus)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	locked := make(map[string]lockedSKU, len(skus))
	for rows.Next() {
		var (
			id string
			k  lockedSKU
		)
		if err := rows.Scan(&id, &k.Stock, &k.PerUserLimit); err != nil {
			return nil, err
		}
		locked[id] = k
	}
	return locked, rows.Err()
}

// myCancelsAndHoldings reads, in one statement, the cancellations requested
// for the order ids while they were queued (order id -> requesting user, see
// RequestCancel; none asked when ids is empty) and the live units
// (pending_payment and paid) each (sku, user) pair holds. Every writer of a
// new live order holds the inventory row lock until it commits, so at READ
// COMMITTED a read started once the lock is granted sees every live unit
// there is (see applyUnique for a read before it).
//
// The pairs are written per SKU, sku_id = ? AND user_id IN (...), which
// InnoDB looks up in orders_sku_user_idx one range per pair (faster on
// MariaDB than a (sku_id, user_id) IN list of rows); the status test is in
// the SUM, not the WHERE, so no plan scans a hot SKU's orders by status.
func myCancelsAndHoldings(ctx context.Context, tx *sql.Tx, ids []string, pairs map[holder]bool) (map[string]string, map[holder]int64, error) {
	usersOf := make(map[string][]string)
	for h := range pairs {
		usersOf[h.SKU] = append(usersOf[h.SKU], h.User)
	}
	var q strings.Builder
	args := make([]any, 0, len(ids)+len(usersOf)+len(pairs))
	if len(ids) > 0 {
		q.WriteString(`SELECT 'c', order_id, user_id, 0 FROM cancel_requests WHERE order_id IN (` + placeholders(len(ids)) + `)
UNION ALL
`)
	}
	q.WriteString(`SELECT 'h', sku_id, user_id, CAST(SUM(CASE WHEN status IN ('pending_payment', 'paid') THEN quantity ELSE 0 END) AS SIGNED)
FROM orders WHERE `)
	args = append(args, anys(ids)...)
	for i, sku := range slices.Sorted(maps.Keys(usersOf)) {
		if i > 0 {
			q.WriteString(" OR ")
		}
		users := usersOf[sku]
		q.WriteString("(sku_id = ? AND user_id IN (" + placeholders(len(users)) + "))")
		args = append(args, sku)
		args = append(args, anys(users)...)
	}
	q.WriteString(` GROUP BY sku_id, user_id`)
	rows, err := tx.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	cancelBy := make(map[string]string)
	held := make(map[holder]int64, len(pairs))
	for rows.Next() {
		var (
			kind, key, user string
			n               int64
		)
		if err := rows.Scan(&kind, &key, &user, &n); err != nil {
			return nil, nil, err
		}
		if kind == "c" {
			cancelBy[key] = user
		} else {
			held[holder{key, user}] = n
		}
	}
	return cancelBy, held, rows.Err()
}

// myTakeStock takes take[sku] units of each SKU in one statement. The stock
// >= n guard refuses what the rows, locked since myReadStock, do not hold:
// then the transaction fails rather than oversell (CHECK (stock >= 0) is the
// second line).
func myTakeStock(ctx context.Context, tx *sql.Tx, take map[string]int64) error {
	if len(take) == 0 {
		return nil
	}
	skus := slices.Sorted(maps.Keys(take))
	var byCase strings.Builder
	caseArgs := make([]any, 0, 2*len(skus))
	byCase.WriteString("CASE sku_id")
	for _, sku := range skus {
		byCase.WriteString(" WHEN ? THEN ?")
		caseArgs = append(caseArgs, sku, take[sku])
	}
	byCase.WriteString(" END")
	q := `UPDATE inventory SET stock = stock - ` + byCase.String() + `, updated_at = CURRENT_TIMESTAMP(6)
WHERE sku_id IN (` + placeholders(len(skus)) + `) AND stock >= ` + byCase.String()
	args := slices.Concat(caseArgs, anys(skus), caseArgs)
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("take stock: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("take stock: %w", err)
	}
	if int(n) != len(skus) {
		return fmt.Errorf("take stock: %d of %d inventory rows %v held the units under row lock: refusing to oversell", n, len(skus), skus)
	}
	return nil
}

// myInsertOrders inserts the order rows of rs as decided, in one statement.
func (s *myStore) myInsertOrders(ctx context.Context, tx *sql.Tx, rs []sale.Reservation, decided []Outcome, now time.Time) error {
	q := valuesSQL(`INSERT INTO orders (order_id, sku_id, user_id, quantity, status, fail_reason, idempotency_key, created_at,
    expires_at, cancel_reason, cancelled_at) VALUES `, len(rs), 11)
	args := make([]any, 0, 11*len(rs))
	for i, r := range rs {
		var (
			expires, cancelledAt *time.Time
			cancelReason         *string
		)
		switch decided[i].Status {
		case sale.StatusPendingPayment:
			e := s.expiry(r.AcceptedAt).UTC()
			expires = &e
		case sale.StatusCancelled:
			byUser := sale.CancelByUser
			cancelledAt, cancelReason = &now, &byUser
		}
		var key *string
		if ownsKey(r, decided[i]) {
			key = &rs[i].IdempotencyKey
		}
		args = append(args, r.OrderID, r.SKU, r.User, r.Quantity, string(decided[i].Status), nullString(decided[i].Reason),
			key, time.UnixMilli(r.AcceptedAt).UTC(), expires, cancelReason, cancelledAt)
	}
	_, err := tx.ExecContext(ctx, q, args...)
	return err
}

// Discard keeps the contract of pgStore.Discard: it records r as failed
// (ReasonDiscarded) with a process_log row and an order row, so that it can
// never be applied later, and returns already = false, StatusFailed; if r was
// processed before it changes nothing and returns already = true and the
// status of its order. No stock changes. An r failing Validate gives an
// error wrapping sale.ErrInvalid. Safe against racing ApplyBatch calls:
// exactly one of them records the order id.
func (s *myStore) Discard(ctx context.Context, r sale.Reservation) (already bool, status sale.Status, err error) {
	if err := r.Validate(); err != nil {
		return false, "", fmt.Errorf("orderstore: discard: %w: %v", sale.ErrInvalid, err)
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		already, status = false, ""
		res, err := tx.ExecContext(ctx, `INSERT IGNORE INTO process_log (tx_id, sku_id) VALUES (?, ?)`, r.OrderID, r.SKU)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		inserted := n == 1
		// Sees the order of a transaction the insert above waited for (READ COMMITTED).
		existing, prior, err := myOptionalOrder(ctx, tx, r.OrderID)
		if err != nil {
			return err
		}
		switch {
		case !inserted && !prior:
			return fmt.Errorf("in process_log but has no order row")
		case !inserted:
			already, status = true, existing.Status
			return nil
		}
		if _, err := tx.ExecContext(ctx, `
INSERT INTO orders (order_id, sku_id, user_id, quantity, status, fail_reason, idempotency_key, created_at)
SELECT ?, ?, ?, ?, 'failed', ?,
    CASE WHEN EXISTS (SELECT 1 FROM orders WHERE sku_id = ? AND user_id = ? AND idempotency_key = ?) THEN NULL ELSE ? END, ?`,
			r.OrderID, r.SKU, r.User, r.Quantity, ReasonDiscarded, r.SKU, r.User, nullString(r.IdempotencyKey),
			nullString(r.IdempotencyKey), time.UnixMilli(r.AcceptedAt).UTC()); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		if err := myInsertTransitions(ctx, tx, []transition{{r: r, to: sale.StatusFailed, cause: "refused:" + ReasonDiscarded,
			at: time.Now().UTC()}}); err != nil {
			return fmt.Errorf("transition: %w", err)
		}
		status = sale.StatusFailed
		return nil
	})
	if err != nil {
		return false, "", fmt.Errorf("orderstore: discard %s: %w", r.OrderID, err)
	}
	return already, status, nil
}

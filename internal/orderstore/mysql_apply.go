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
// again after a deadlock.
//
// Two round trips besides BEGIN and COMMIT, whatever the batch's size (a
// batch with duplicates one more, to read their orders), each a few
// statements sent at once (multiStatements): under load every round trip
// waits for the scheduler of a busy machine twice, once on each side, and
// that wait, not the statements, was most of a batch's time. The first:
// claim the process_log rows, read the stock, the cancellations and
// holdings, the key owners. The second: insert the orders, transitions,
// restores and audit rows, delete the cancellations served, then lock the
// inventory rows, read the holdings again and take the stock. With
// lockFirst the first locks the rows where it reads them and the second
// takes the stock first.
//
// Lock late. A hot SKU's batches queue for its inventory row lock, held
// until commit, so what runs under it bounds the SKU's rate; the inserts
// are most of a batch's time. Without lockFirst the batch decides from a
// plain read of the inventory rows, the holdings and the key owners, writes
// every row, and only then locks the inventory rows and reads the holdings
// again (its own new rows included, which it adds to what it read before).
// It keeps the stock it took only if the decision stands under the lock;
// otherwise it returns errMovedBeforeLock, and ApplyBatch rolls it back and
// runs it with lockFirst, the order of the rules as they are stated on
// pgStore:
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
	skuSet, pairSet := make(map[string]bool), make(map[holder]bool)
	ids := make([]string, len(uniq))
	for i, r := range uniq {
		skuSet[r.SKU], pairSet[holder{r.SKU, r.User}] = true, true
		ids[i] = r.OrderID
	}
	skus := slices.Sorted(maps.Keys(skuSet))
	keys := keyedOf(uniq)

	// The reads cover every reservation: which are new is known only once the
	// claim ran, and the reads of the others are not used.
	var (
		inserted int64
		seen     map[string]lockedSKU
		cancelBy map[string]string
		held     map[holder]int64
		owners   = make(map[idemKey]string)
	)
	sets := []func(*sql.Rows) error{scanCount(&inserted), scanStock(&seen), scanCancelsAndHoldings(&cancelBy, &held)}
	if len(keys) > 0 {
		sets = append(sets, scanKeyOwners(keys, owners))
	}
	err := myMulti(ctx, tx, sets, myClaimSQL(uniq), stmt{q: "SELECT ROW_COUNT()"}, myStockSQL(skus, lockFirst),
		myCancelsAndHoldingsSQL(ids, pairSet), myKeyOwnersSQL(keys))
	if err != nil {
		return nil, fmt.Errorf("claim and read: %w", err)
	}
	isNew, prior, err := myPrior(ctx, tx, uniq, inserted)
	if err != nil {
		return nil, err
	}
	withKeyOwners(prior, uniq, owners)

	var fresh []sale.Reservation
	freshPairs := make(map[holder]bool)
	freshSKUs := make(map[string]bool)      // the rows the late lock takes
	seenFresh := make(map[string]lockedSKU) // and what was seen of them
	for _, r := range uniq {
		if isNew[r.OrderID] {
			fresh = append(fresh, r)
			freshPairs[holder{r.SKU, r.User}] = true
			freshSKUs[r.SKU] = true
			if k, ok := seen[r.SKU]; ok {
				seenFresh[r.SKU] = k
			}
		}
	}
	if len(fresh) == 0 {
		out := make([]Outcome, len(uniq))
		for i, r := range uniq {
			out[i] = prior[r.OrderID]
		}
		return out, nil
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
	decided, toAllocate := decideKeys(fresh, owners, cancelled)
	allocated, take := allocate(toAllocate, seen, held)
	mergeDecided(decided, allocated)

	now := time.Now().UTC().Truncate(time.Microsecond)
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
	writes := []stmt{s.myOrdersSQL(fresh, decided, now), myTransitionsSQL(ts), myRestoresSQL(restores), myAuditSQL(audit),
		myDeleteCancelsSQL(cancelledIDs)}
	takeStmts := myTakeSQL(take)
	var taken int64
	if s.beforeWrite != nil {
		s.beforeWrite(lockFirst)
	}
	if lockFirst {
		var sets []func(*sql.Rows) error
		if len(take) > 0 {
			sets = append(sets, scanCount(&taken))
		}
		if err := myMulti(ctx, tx, sets, append(takeStmts, writes...)...); err != nil {
			return nil, fmt.Errorf("take stock and write: %w", err)
		}
	} else {
		var (
			locked  map[string]lockedSKU
			heldNow map[holder]int64
		)
		sets := []func(*sql.Rows) error{scanStock(&locked), scanCancelsAndHoldings(nil, &heldNow)}
		if len(take) > 0 {
			sets = append(sets, scanCount(&taken))
		}
		stmts := append(writes, myStockSQL(slices.Sorted(maps.Keys(freshSKUs)), true), myCancelsAndHoldingsSQL(nil, freshPairs))
		if err := myMulti(ctx, tx, sets, append(stmts, takeStmts...)...); err != nil {
			return nil, fmt.Errorf("write, lock and take stock: %w", err)
		}
		// The take ran before this check, so the batch holds the locks for one
		// round trip; a decision that does not stand is rolled back with it.
		if !unmoved(seenFresh, locked, held, heldNow, fresh, decided, take) {
			return nil, errMovedBeforeLock
		}
	}
	if int(taken) != len(take) {
		// Under the row lock the rows held what the batch takes (checked, or
		// read under the lock): only a bug gets here.
		return nil, fmt.Errorf("take stock: %d of %d inventory rows %v held the units under row lock: refusing to oversell",
			taken, len(take), slices.Sorted(maps.Keys(take)))
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

// unmoved reports whether a batch's decisions (fresh, decided, take), made
// from inventory rows seen and holdings held read without the lock, stand
// under it, where the rows are locked and the fresh pairs hold heldNow (the
// batch's new orders included): the same SKUs with the same per-user
// limits, the stock of each unchanged or, if none of its reservations was
// refused for stock, still at least what the batch takes, and every fresh
// pair's live units those of held plus what the batch's new orders hold.
// See applyUnique.
func unmoved(seen, locked map[string]lockedSKU, held, heldNow map[holder]int64, fresh []sale.Reservation,
	decided []Outcome, take map[string]int64) bool {
	if len(locked) != len(seen) {
		return false
	}
	short := make(map[string]bool)
	want := make(map[holder]int64, len(fresh))
	for _, r := range fresh {
		h := holder{r.SKU, r.User}
		want[h] = held[h]
	}
	for i, r := range fresh {
		switch {
		case decided[i].Status == sale.StatusPendingPayment:
			want[holder{r.SKU, r.User}] += r.Quantity
		case decided[i].Reason == ReasonInsufficientStock:
			short[r.SKU] = true
		}
	}
	for sku, was := range seen {
		is, ok := locked[sku]
		if !ok || is.PerUserLimit != was.PerUserLimit || is.Stock != was.Stock && (short[sku] || is.Stock < take[sku]) {
			return false
		}
	}
	for h, n := range want {
		if heldNow[h] != n {
			return false
		}
	}
	return true
}

// myMulti sends the statements of stmts (the zero ones left out) in one
// round trip and hands the result sets, in order, to sets: one per
// statement that returns rows (an INSERT, UPDATE or DELETE returns none).
// The server runs the statements in order and none after one that fails;
// myMulti returns the first error.
func myMulti(ctx context.Context, tx *sql.Tx, sets []func(*sql.Rows) error, stmts ...stmt) error {
	var (
		q    strings.Builder
		args []any
	)
	for _, st := range stmts {
		if st.q == "" {
			continue
		}
		if q.Len() > 0 {
			q.WriteString(";\n")
		}
		q.WriteString(st.q)
		args = append(args, st.args...)
	}
	if q.Len() == 0 {
		return nil
	}
	rows, err := tx.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for i, set := range sets {
		if i > 0 && !rows.NextResultSet() {
			if err := rows.Err(); err != nil {
				return err
			}
			return fmt.Errorf("orderstore: %d result sets, want %d", i, len(sets))
		}
		if err := set(rows); err != nil {
			return err
		}
	}
	for rows.NextResultSet() {
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

// scanCount scans a result set of one number into n.
func scanCount(n *int64) func(*sql.Rows) error {
	return func(rows *sql.Rows) error {
		for rows.Next() {
			if err := rows.Scan(n); err != nil {
				return err
			}
		}
		return rows.Err()
	}
}

// myKeyConflict reports whether err is the unique key on orders'
// Idempotency-Keys refusing a row (see pgKeyConflict).
func myKeyConflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062 && strings.Contains(me.Message, "orders_idempotency_idx")
}

// myClaimSQL inserts the process_log rows of rs (distinct order ids); the
// ROW_COUNT() right after it says how many were new (see myPrior).
//
// The rows go in sorted by id, so every transaction takes its process_log
// row locks in the same order and overlapping batches wait for each other
// instead of deadlocking. INSERT IGNORE on an id another uncommitted
// transaction holds waits for it and, once it committed, skips the row.
func myClaimSQL(rs []sale.Reservation) stmt {
	byID := slices.Clone(rs)
	slices.SortFunc(byID, func(a, b sale.Reservation) int { return cmp.Compare(a.OrderID, b.OrderID) })
	q := valuesSQL("INSERT IGNORE INTO process_log (tx_id, sku_id) VALUES ", len(byID), 2)
	args := make([]any, 0, 2*len(byID))
	for _, r := range byID {
		args = append(args, r.OrderID, r.SKU)
	}
	return stmt{q, args}
}

// myPrior reports, after the claim of rs inserted inserted process_log rows,
// which rows this transaction inserted (isNew: those it must apply) and,
// for the others, applied by a committed transaction, their order's status
// now as Duplicate outcomes (prior).
//
// MySQL cannot say which rows INSERT IGNORE skipped, so when it skipped any
// the ids come from the order rows: this package writes an id's process_log
// and order rows in one transaction, so (READ COMMITTED: a statement sees
// what committed before it started) an id with a visible order row was
// applied before, one without is ours. The count of ours must equal the
// rows inserted; otherwise a process_log row without its order row (or the
// reverse) exists, which only a hand-made row can cause: an error.
func myPrior(ctx context.Context, tx *sql.Tx, rs []sale.Reservation, inserted int64) (isNew map[string]bool, prior map[string]Outcome, err error) {
	isNew = make(map[string]bool, len(rs))
	for _, r := range rs {
		isNew[r.OrderID] = true
	}
	prior = make(map[string]Outcome)
	if int(inserted) == len(rs) {
		return isNew, prior, nil
	}
	ids := make([]string, len(rs))
	for i, r := range rs {
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

// myStockSQL reads the inventory rows of skus (sorted), locking them if lock
// (scanStock reads the result: an absent SKU is absent from the map). Rows
// are locked in sku_id order, always after the process_log rows, like every
// writer of inventory, so lockers queue instead of deadlocking.
func myStockSQL(skus []string, lock bool) stmt {
	q := `SELECT sku_id, stock, per_user_limit FROM inventory WHERE sku_id IN (` + placeholders(len(skus)) + `) ORDER BY sku_id`
	if lock {
		q += ` FOR UPDATE`
	}
	return stmt{q, anys(skus)}
}

func scanStock(into *map[string]lockedSKU) func(*sql.Rows) error {
	return func(rows *sql.Rows) error {
		m := make(map[string]lockedSKU)
		for rows.Next() {
			var (
				id string
				k  lockedSKU
			)
			if err := rows.Scan(&id, &k.Stock, &k.PerUserLimit); err != nil {
				return err
			}
			m[id] = k
		}
		*into = m
		return rows.Err()
	}
}

// myCancelsAndHoldingsSQL reads, in one statement, the cancellations requested
// for the order ids while they were queued (order id -> requesting user, see
// RequestCancel; none asked when ids is empty) and the live units
// (pending_payment and paid) each (sku, user) pair holds
// (scanCancelsAndHoldings reads the result). Every writer of a new live
// order holds the inventory row lock until it commits, so at READ COMMITTED
// a read started once the lock is granted sees every live unit there is
// (see applyUnique for a read before it).
//
// The pairs are written per SKU, sku_id = ? AND user_id IN (...), which
// InnoDB looks up in orders_sku_user_idx one range per pair (faster on
// MariaDB than a (sku_id, user_id) IN list of rows); the status test is in
// the SUM, not the WHERE, so no plan scans a hot SKU's orders by status.
func myCancelsAndHoldingsSQL(ids []string, pairs map[holder]bool) stmt {
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
		args = append(args, anys(ids)...)
	}
	q.WriteString(`SELECT 'h', sku_id, user_id, CAST(SUM(CASE WHEN status IN ('pending_payment', 'paid') THEN quantity ELSE 0 END) AS SIGNED)
FROM orders WHERE `)
	args = skuUsersWhere(&q, args, usersOf)
	q.WriteString(` GROUP BY sku_id, user_id`)
	return stmt{q.String(), args}
}

// skuUsersWhere writes the condition "(sku_id = ? AND user_id IN (...))
// OR ..." for usersOf (users by SKU, SKUs in sorted order) to q and returns
// args with its values appended: InnoDB reads one index range per user.
func skuUsersWhere(q *strings.Builder, args []any, usersOf map[string][]string) []any {
	for i, sku := range slices.Sorted(maps.Keys(usersOf)) {
		if i > 0 {
			q.WriteString(" OR ")
		}
		users := usersOf[sku]
		q.WriteString("(sku_id = ? AND user_id IN (" + placeholders(len(users)) + "))")
		args = append(args, sku)
		args = append(args, anys(users)...)
	}
	return args
}

// scanCancelsAndHoldings reads the result of myCancelsAndHoldingsSQL: the
// requesting user by order id into cancelBy (nil: no cancellations asked),
// the live units by pair into held.
func scanCancelsAndHoldings(cancelBy *map[string]string, held *map[holder]int64) func(*sql.Rows) error {
	return func(rows *sql.Rows) error {
		c, h := make(map[string]string), make(map[holder]int64)
		for rows.Next() {
			var (
				kind, key, user string
				n               int64
			)
			if err := rows.Scan(&kind, &key, &user, &n); err != nil {
				return err
			}
			if kind == "c" {
				c[key] = user
			} else {
				h[holder{key, user}] = n
			}
		}
		if cancelBy != nil {
			*cancelBy = c
		}
		*held = h
		return rows.Err()
	}
}

// myKeyOwnersSQL reads which orders hold keys (none asked for no keys;
// scanKeyOwners reads the result: the order id per key).
//
// It asks per SKU for the keyed orders of the users, sku_id = ? AND user_id
// IN (...), and the scan keeps the rows whose key was asked for: InnoDB
// reads one range of orders_idempotency_idx per user, index only. The
// obvious shape, an OR of (sku_id = ? AND user_id = ? AND idempotency_key =
// ?) terms, costs MariaDB's range optimizer about a third of a second for
// 1,000 keys (more than the rest of the batch eight times over); user_id IN
// (...) AND idempotency_key IN (...) would make it |users| x |keys| ranges.
func myKeyOwnersSQL(keys []idemKey) stmt {
	if len(keys) == 0 {
		return stmt{}
	}
	asked := make(map[holder]bool, len(keys))
	usersOf := make(map[string][]string)
	for _, k := range keys {
		if h := (holder{k.SKU, k.User}); !asked[h] {
			asked[h] = true
			usersOf[k.SKU] = append(usersOf[k.SKU], k.User)
		}
	}
	var q strings.Builder
	args := make([]any, 0, len(usersOf)+len(keys))
	q.WriteString(`SELECT sku_id, user_id, idempotency_key, order_id FROM orders WHERE idempotency_key IS NOT NULL AND (`)
	args = skuUsersWhere(&q, args, usersOf)
	q.WriteString(")")
	return stmt{q.String(), args}
}

func scanKeyOwners(keys []idemKey, owners map[idemKey]string) func(*sql.Rows) error {
	wanted := make(map[idemKey]bool, len(keys))
	for _, k := range keys {
		wanted[k] = true
	}
	return func(rows *sql.Rows) error {
		for rows.Next() {
			var (
				k  idemKey
				id string
			)
			if err := rows.Scan(&k.SKU, &k.User, &k.Key, &id); err != nil {
				return err
			}
			if wanted[k] {
				owners[k] = id
			}
		}
		return rows.Err()
	}
}

// myTakeSQL takes take[sku] units of each SKU in one statement, then counts
// the rows it changed (none for no take). The stock >= n guard refuses what
// the rows do not hold: then the count is short and the transaction fails
// rather than oversell (CHECK (stock >= 0) is the second line).
func myTakeSQL(take map[string]int64) []stmt {
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
	return []stmt{{q, slices.Concat(caseArgs, anys(skus), caseArgs)}, {q: "SELECT ROW_COUNT()"}}
}

// myDeleteCancelsSQL deletes the cancellation requests of ids, served (none
// for no ids).
func myDeleteCancelsSQL(ids []string) stmt {
	if len(ids) == 0 {
		return stmt{}
	}
	return stmt{`DELETE FROM cancel_requests WHERE order_id IN (` + placeholders(len(ids)) + `)`, anys(ids)}
}

// myOrdersSQL inserts the order rows of rs as decided, in one statement.
func (s *myStore) myOrdersSQL(rs []sale.Reservation, decided []Outcome, now time.Time) stmt {
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
	return stmt{q, args}
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

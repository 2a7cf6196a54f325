package orderstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale/internal/sale"
)

// The comparison strategies of flashsale bench (docs/performance.md): ways
// to sell straight from the database that the seeds compare with the
// pipeline. BuyDirect (SELECT ... FOR UPDATE, check in Go, UPDATE) is the
// pessimistic one; this file adds the conditional update, the optimistic
// compare-and-set and the fenced update behind a Redis lock. Each writes
// exactly what BuyDirect writes (process_log row, pending_payment order with
// its expiry, transition row) and decides in the same order (see BuyDirect),
// so the invariant checks read them all the same way.

// ErrStaleFence is returned by BuyFenced when the row was already changed
// under a lock token at least as high as the caller's: the caller's lock was
// given to someone else (it expired). Nothing was written.
var ErrStaleFence = errors.New("orderstore: lock token superseded by a newer one")

const (
	beginReadCommittedSQL = `BEGIN ISOLATION LEVEL READ COMMITTED`
	commitSQL             = `COMMIT`
)

// The statement that takes the stock and the row lock. At READ COMMITTED a
// writer that waited for the lock re-evaluates the WHERE on the newest row
// version, so it cannot oversell; CHECK (stock >= 0) is the second line.
const takeConditionalSQL = `
UPDATE inventory SET stock = stock - $2, updated_at = now()
WHERE sku_id = $1 AND stock >= $2
RETURNING ` + skuColumns

// As takeConditionalSQL, and refused unless $3 is above every token that
// changed the row before.
const takeFencedSQL = `
UPDATE inventory SET stock = stock - $2, fence = $3, updated_at = now()
WHERE sku_id = $1 AND stock >= $2 AND fence < $3
RETURNING ` + skuColumns

// The trigger of migration 00004 bumps version on every update of the row.
const takeIfVersionSQL = `
UPDATE inventory SET stock = stock - $2, updated_at = now()
WHERE sku_id = $1 AND stock >= $2 AND version = $3`

const skuVersionFenceSQL = `SELECT ` + skuColumns + `, version, fence FROM inventory WHERE sku_id = $1`

const fenceSQL = `SELECT fence FROM inventory WHERE sku_id = $1`

// BuyConditional sells r like BuyDirect (same rows, same decisions, same
// errors, same retry contract), in one READ COMMITTED transaction whose only
// statement on the inventory row is the conditional update
// `UPDATE inventory SET stock = stock - n WHERE sku_id = $1 AND stock >= n`:
// no SELECT ... FOR UPDATE before it. The update takes the row lock; the
// window, idempotency key and per-user limit are checked after it, under
// that lock (every writer of a live order holds it until it commits, so the
// user's holdings read then are complete), and a refusal rolls back. The
// process_log row is inserted before the update, the order BuyDirect and
// ApplyBatch take their locks in, so they wait for each other instead of
// deadlocking.
//
// Two round trips: begin + log + take + reads, then order + commit. The row
// lock is held from the update to the commit.
func (s *pgStore) BuyConditional(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
	if err := validateDirect(r); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy (conditional): %w", err)
	}
	o, dup, err := s.buyTaking(ctx, r, now, 0)
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s, conditional): %w", r.SKU, r.OrderID, err)
	}
	return o, dup, nil
}

// BuyFenced is BuyConditional for a caller holding a lock whose fencing
// token is token (redis-lock): the update also requires every earlier change
// of the row to carry a lower token, and records token. A caller whose lock
// expired and was given to another gets an error wrapping ErrStaleFence and
// nothing is written; it may take the lock again and retry with the same r.
// Correctness never depends on the lock: the stock guard and the checks
// under the row lock are those of BuyConditional.
func (s *pgStore) BuyFenced(ctx context.Context, r sale.Reservation, now time.Time, token int64) (sale.Order, bool, error) {
	if err := validateDirect(r); err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy (fenced): %w", err)
	}
	if token < 1 {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy (fenced): %w: token %d", sale.ErrInvalid, token)
	}
	o, dup, err := s.buyTaking(ctx, r, now, token)
	if err != nil {
		return sale.Order{}, false, fmt.Errorf("orderstore: buy %s (order %s, fence %d): %w", r.SKU, r.OrderID, token, err)
	}
	return o, dup, nil
}

// Fence returns the highest lock token that changed sku's row (0: none);
// sale.ErrUnknownSKU if there is no such row.
func (s *pgStore) Fence(ctx context.Context, sku string) (int64, error) {
	var f int64
	err := s.pool.QueryRow(ctx, fenceSQL, sku).Scan(&f)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("orderstore: fence of %s: %w", sku, sale.ErrUnknownSKU)
	}
	if err != nil {
		return 0, fmt.Errorf("orderstore: fence of %s: %w", sku, err)
	}
	return f, nil
}

// BuyOptimistic sells r like BuyDirect with optimistic concurrency: it reads
// the row's version, the user's holdings and the idempotency state without a
// lock, decides, then takes the stock only if the version is unchanged
// (`... WHERE version = v AND stock >= n`) and writes the order in the same
// transaction. A changed version (another purchase, a release, an admin
// change) means the read is stale: it reads and tries again, up to attempts
// times (at least 1) with a short random pause, then gives up with an error
// wrapping sale.ErrBusy; nothing was written then. Every update of the row
// changes its version (trigger of migration 00004), so the holdings read
// beside the version are still complete when the compare-and-set succeeds:
// the per-user limit holds.
//
// Per attempt, on one pooled connection: one round trip to read, two to
// write (begin + log + compare-and-set, then order + commit). Under
// contention on one row most attempts fail; that is what the strategy costs.
func (s *pgStore) BuyOptimistic(ctx context.Context, r sale.Reservation, now time.Time, attempts int) (sale.Order, bool, error) {
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
		o, dup, done, err := s.buyOptimisticOnce(ctx, r, now)
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

func validateDirect(r sale.Reservation) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: %v", sale.ErrInvalid, err)
	}
	if r.IdempotencyKey != "" && !sale.ValidIdempotencyKey(r.IdempotencyKey) {
		return fmt.Errorf("%w: bad idempotency key", sale.ErrInvalid)
	}
	return nil
}

// pipeTx is a READ COMMITTED transaction on one pooled connection, begun and
// committed by statements queued in batches, so that the COMMIT travels with
// the last writes (pgx.Tx would spend a round trip on it, with the row lock
// held). done rolls back whatever is still open and returns the connection.
type pipeTx struct{ conn *pgxpool.Conn }

func (s *pgStore) beginPipe(ctx context.Context) (*pipeTx, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &pipeTx{conn: conn}, nil
}

func (p *pipeTx) send(ctx context.Context, b *pgx.Batch) error {
	return p.conn.SendBatch(ctx, b).Close()
}

// rollback ends an open transaction; the connection is discarded if that
// fails (the pool also discards a connection released inside a transaction).
func (p *pipeTx) rollback(ctx context.Context) {
	if p.conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := p.conn.Exec(rctx, "ROLLBACK"); err != nil {
		_ = p.conn.Conn().Close(rctx)
	}
}

func (p *pipeTx) done(ctx context.Context) {
	p.rollback(ctx)
	p.conn.Release()
}

// queueCommit queues the insert of r's order, its transition and its audit
// row (as BuyDirect writes them) and the COMMIT, storing the order in *order.
// No Redis debit is owed: these strategies sell without the gate.
func (s *pgStore) queueCommit(b *pgx.Batch, r sale.Reservation, now time.Time, order *sale.Order) {
	b.Queue(insertOrderSQL, r.OrderID, r.SKU, r.User, r.Quantity, nullString(r.IdempotencyKey), time.UnixMilli(r.AcceptedAt), s.expiry(r.AcceptedAt)).
		QueryRow(func(row pgx.Row) error {
			var err error
			*order, err = scanOrder(row)
			return err
		})
	queueTransitions(b, []transition{{r: r, to: sale.StatusPendingPayment, cause: causeDirect, at: now}})
	queueAudit(b, []auditRow{{sku: r.SKU, delta: -r.Quantity, reason: AuditDirectSale, orderID: r.OrderID, actor: "user:" + r.User, ip: r.ClientIP}})
	b.Queue(commitSQL).Exec(func(ct pgconn.CommandTag) error {
		if ct.String() != "COMMIT" {
			return fmt.Errorf("commit ended as %q", ct.String())
		}
		return nil
	})
}

// skuRow is an inventory row with the strategy columns.
type skuRow struct {
	sale.SKU
	Version, Fence int64
}

func scanSKURow(row scanner) (k skuRow, found bool, err error) {
	k.SKU, err = scanSKU(extraRow{row, []any{&k.Version, &k.Fence}})
	if noRows(err) {
		return skuRow{}, false, nil
	}
	return k, err == nil, err
}

// extraRow scans the columns scanSKU knows, then extra ones.
type extraRow struct {
	scanner
	extra []any
}

func (e extraRow) Scan(dest ...any) error { return e.scanner.Scan(append(dest, e.extra...)...) }

// buyTaking is BuyConditional (token 0) and BuyFenced.
func (s *pgStore) buyTaking(ctx context.Context, r sale.Reservation, now time.Time, token int64) (sale.Order, bool, error) {
	var (
		inserted, prior, took, byKey bool
		existing, keyed              sale.Order
		after                        sale.SKU
		cur                          skuRow
		known                        bool
		held                         int64
	)
	tx, err := s.beginPipe(ctx)
	if err != nil {
		return sale.Order{}, false, err
	}
	defer tx.done(ctx)

	b := &pgx.Batch{}
	b.Queue(beginReadCommittedSQL)
	b.Queue(markAuditedSQL) // writes its own stock_audit row, like BuyDirect
	b.Queue(insertOneProcessLogSQL, r.OrderID, r.SKU).Exec(func(ct pgconn.CommandTag) error {
		inserted = ct.RowsAffected() == 1
		return nil
	})
	b.Queue(orderSQL, r.OrderID).QueryRow(func(row pgx.Row) error {
		var err error
		existing, prior, err = scanOptionalOrder(row)
		return err
	})
	takeSQL, takeArgs := takeConditionalSQL, []any{r.SKU, r.Quantity}
	if token > 0 {
		takeSQL, takeArgs = takeFencedSQL, append(takeArgs, token)
	}
	b.Queue(takeSQL, takeArgs...).QueryRow(func(row pgx.Row) error {
		var err error
		after, err = scanSKU(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		took = err == nil
		return err
	})
	// From here on the statements run after the update: under the row lock
	// when it took the stock, so they see every live order of the SKU.
	b.Queue(skuVersionFenceSQL, r.SKU).QueryRow(func(row pgx.Row) error {
		var err error
		cur, known, err = scanSKURow(row)
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
	if err := tx.send(ctx, b); err != nil {
		return sale.Order{}, false, fmt.Errorf("log, take and read: %w", err)
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
	case !took && token > 0 && cur.Fence >= token:
		return sale.Order{}, false, fmt.Errorf("%w: token %d, row changed under %d", ErrStaleFence, token, cur.Fence)
	case !took:
		if err := checkDirect(cur.SKU, held, r.Quantity, now); err != nil {
			return sale.Order{}, false, err
		}
		return sale.Order{}, false, fmt.Errorf("%w: fewer than %d left when the update ran", sale.ErrSoldOut, r.Quantity)
	}
	before := after
	before.Stock += r.Quantity
	if err := checkDirect(before, held, r.Quantity, now); err != nil {
		return sale.Order{}, false, err // rolled back by done: the units stay
	}

	var order sale.Order
	b = &pgx.Batch{}
	s.queueCommit(b, r, now, &order)
	if err := tx.send(ctx, b); err != nil {
		return sale.Order{}, false, fmt.Errorf("insert order and commit: %w", err)
	}
	return order, false, nil
}

// buyOptimisticOnce is one attempt of BuyOptimistic; done is false when the
// version had changed (nothing written: try again).
func (s *pgStore) buyOptimisticOnce(ctx context.Context, r sale.Reservation, now time.Time) (order sale.Order, dup, done bool, err error) {
	var (
		prior, known, byKey bool
		existing, keyed     sale.Order
		k                   skuRow
		held                int64
	)
	// One connection for the whole attempt, as one database session would
	// do it: the time between the read and the compare-and-set is a round
	// trip, not a wait for the pool.
	tx, err := s.beginPipe(ctx)
	if err != nil {
		return sale.Order{}, false, false, err
	}
	defer tx.done(ctx)

	// The version is read before (or with) the holdings: any live order
	// committed after the version was read changed the version.
	b := &pgx.Batch{}
	b.Queue(orderSQL, r.OrderID).QueryRow(func(row pgx.Row) error {
		var err error
		existing, prior, err = scanOptionalOrder(row)
		return err
	})
	b.Queue(skuVersionFenceSQL, r.SKU).QueryRow(func(row pgx.Row) error {
		var err error
		k, known, err = scanSKURow(row)
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
	if err := tx.send(ctx, b); err != nil {
		return sale.Order{}, false, false, fmt.Errorf("read: %w", err)
	}
	switch {
	case prior:
		return existing, true, true, nil
	case !known:
		return sale.Order{}, false, true, sale.ErrUnknownSKU
	case byKey:
		return keyed, true, true, nil
	}
	if err := checkDirect(k.SKU, held, r.Quantity, now); err != nil {
		return sale.Order{}, false, true, err
	}

	var inserted, took bool
	b = &pgx.Batch{}
	b.Queue(beginReadCommittedSQL)
	b.Queue(markAuditedSQL) // writes its own stock_audit row, like BuyDirect
	b.Queue(insertOneProcessLogSQL, r.OrderID, r.SKU).Exec(func(ct pgconn.CommandTag) error {
		inserted = ct.RowsAffected() == 1
		return nil
	})
	b.Queue(takeIfVersionSQL, r.SKU, r.Quantity, k.Version).Exec(func(ct pgconn.CommandTag) error {
		took = ct.RowsAffected() == 1
		return nil
	})
	if err := tx.send(ctx, b); err != nil {
		return sale.Order{}, false, false, fmt.Errorf("log and compare-and-set: %w", err)
	}
	if !inserted || !took {
		// !inserted: the same order id was sold meanwhile; the next read finds it.
		return sale.Order{}, false, false, nil
	}
	b = &pgx.Batch{}
	s.queueCommit(b, r, now, &order)
	if err := tx.send(ctx, b); err != nil {
		return sale.Order{}, false, false, fmt.Errorf("insert order and commit: %w", err)
	}
	return order, false, true, nil
}

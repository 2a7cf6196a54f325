package orderstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// myCreateSKUSQL creates the SKU, or takes the row lock of the existing one:
// on a duplicate key it locks the row EXCLUSIVELY (a plain INSERT IGNORE
// would take a shared lock, and two concurrent updaters upgrading their
// shared locks deadlock). The no-op assignment fires the version trigger,
// which is harmless: the update that follows bumps it anyway. Rows affected
// is 1 only when the row was inserted.
const myCreateSKUSQL = `
INSERT INTO inventory (sku_id, stock, total_stock, per_user_limit, starts_at, ends_at, buckets,
    ticket_required, tickets_open_at, waiting_room, admission_rate, tag)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE sku_id = sku_id`

const myLockSKUSQL = `SELECT total_stock, stock FROM inventory WHERE sku_id = ? FOR UPDATE`

const myUpdateSKUSQL = `
UPDATE inventory
SET stock = stock + ?, total_stock = ?, per_user_limit = ?, starts_at = ?, ends_at = ?, buckets = ?,
    ticket_required = ?, tickets_open_at = ?, waiting_room = ?, admission_rate = ?, tag = ?, updated_at = CURRENT_TIMESTAMP(6)
WHERE sku_id = ?`

const mySKUSQL = `SELECT ` + skuColumns + ` FROM inventory WHERE sku_id = ?`

// PutSKU creates the SKU or updates it, in one transaction, with the contract
// of pgStore.PutSKU: creation gives delta = total and created = true; an
// update adds new total - old total to the stock under the row lock and
// refuses (sale.ErrStockConflict, nothing changed) to make the stock
// negative; invalid input wraps sale.ErrInvalid. It writes the stock_audit row
// of a non-zero delta itself (flashsale's sessions are not audited by the
// trigger). It returns the SKU as committed.
func (s *myStore) PutSKU(ctx context.Context, c SKUChange) (sku sale.SKU, delta int64, created bool, err error) {
	if err := c.validate(); err != nil {
		return sale.SKU{}, 0, false, fmt.Errorf("orderstore: put sku: %w", err)
	}
	startsAt, endsAt := myNullTime(c.StartsAt), myNullTime(c.EndsAt)
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		sku, delta, created = sale.SKU{}, 0, false
		// Lock first: the common case (an update of an existing SKU) then
		// never goes through the insert.
		var total, stock int64
		err := tx.QueryRowContext(ctx, myLockSKUSQL, c.ID).Scan(&total, &stock)
		switch {
		case noRows(err):
			res, err := tx.ExecContext(ctx, myCreateSKUSQL, c.ID, c.TotalStock, c.TotalStock, c.PerUserLimit, startsAt, endsAt, c.buckets(),
				c.Crowd.TicketRequired, myNullTime(c.Crowd.TicketsOpenAt), c.Crowd.WaitingRoom, c.Crowd.AdmissionRate, c.Tag)
			if err != nil {
				return fmt.Errorf("orderstore: put sku %s: %w", c.ID, err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return fmt.Errorf("orderstore: put sku %s: %w", c.ID, err)
			} else if n == 1 {
				created, delta = true, c.TotalStock
				break
			}
			// A concurrent creator committed first: its row is now locked
			// by us (and visible, at READ COMMITTED).
			if err := tx.QueryRowContext(ctx, myLockSKUSQL, c.ID).Scan(&total, &stock); err != nil {
				return fmt.Errorf("orderstore: put sku %s: lock: %w", c.ID, err)
			}
		case err != nil:
			return fmt.Errorf("orderstore: put sku %s: lock: %w", c.ID, err)
		}
		if !created {
			delta = c.TotalStock - total
			if stock+delta < 0 {
				return fmt.Errorf("orderstore: put sku %s: total %d -> %d with %d units left: %w",
					c.ID, total, c.TotalStock, stock, sale.ErrStockConflict)
			}
			if _, err := tx.ExecContext(ctx, myUpdateSKUSQL, delta, c.TotalStock, c.PerUserLimit, startsAt, endsAt, c.buckets(),
				c.Crowd.TicketRequired, myNullTime(c.Crowd.TicketsOpenAt), c.Crowd.WaitingRoom, c.Crowd.AdmissionRate, c.Tag, c.ID); err != nil {
				return fmt.Errorf("orderstore: put sku %s: update: %w", c.ID, err)
			}
		}
		if sku, err = scanSKU(tx.QueryRowContext(ctx, mySKUSQL, c.ID)); err != nil {
			return fmt.Errorf("orderstore: put sku %s: read: %w", c.ID, err)
		}
		if delta != 0 {
			a := actorOf(ctx)
			reason := AuditRestock
			switch {
			case created:
				reason = AuditSKUCreated
			case delta < 0:
				reason = AuditReduce
			}
			if err := myInsertAudit(ctx, tx, []auditRow{{sku: c.ID, delta: delta, reason: reason, actor: a.Name, ip: a.SourceIP}}); err != nil {
				return fmt.Errorf("orderstore: put sku %s: audit: %w", c.ID, err)
			}
		}
		return nil
	})
	if err != nil {
		return sale.SKU{}, 0, false, err
	}
	return sku, delta, created, nil
}

// SKU returns the SKU with its current database stock. An absent SKU gives an
// error wrapping sale.ErrUnknownSKU.
func (s *myStore) SKU(ctx context.Context, id string) (sale.SKU, error) {
	sku, err := scanSKU(s.db.QueryRowContext(ctx, mySKUSQL, id))
	if noRows(err) {
		return sale.SKU{}, fmt.Errorf("orderstore: sku %q: %w", id, sale.ErrUnknownSKU)
	}
	if err != nil {
		return sale.SKU{}, fmt.Errorf("orderstore: sku %q: %w", id, err)
	}
	return sku, nil
}

// SKUs returns every SKU, ordered by id (an empty slice when there are none).
func (s *myStore) SKUs(ctx context.Context) ([]sale.SKU, error) {
	rows, err := s.db.QueryContext(ctx, skusSQL)
	if err != nil {
		return nil, fmt.Errorf("orderstore: skus: %w", err)
	}
	defer rows.Close()
	skus := []sale.SKU{}
	for rows.Next() {
		sku, err := scanSKU(rows)
		if err != nil {
			return nil, fmt.Errorf("orderstore: skus: %w", err)
		}
		skus = append(skus, sku)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("orderstore: skus: %w", err)
	}
	return skus, nil
}

// myNullTime maps the zero time to SQL NULL (the driver would write a zero
// time as '0000-00-00'), and any other to UTC.
func myNullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC()
}

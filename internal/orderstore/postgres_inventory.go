package orderstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/jackc/pgx/v5"
)

// skuColumns is the column list scanSKU reads.
const skuColumns = `sku_id, total_stock, stock, per_user_limit, starts_at, ends_at, updated_at, buckets,
	ticket_required, tickets_open_at, waiting_room, admission_rate, tag`

const insertSKUSQL = `
INSERT INTO inventory (sku_id, stock, total_stock, per_user_limit, starts_at, ends_at, buckets,
    ticket_required, tickets_open_at, waiting_room, admission_rate, tag)
VALUES ($1, $2, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (sku_id) DO NOTHING
RETURNING ` + skuColumns

const lockSKUSQL = `SELECT total_stock, stock FROM inventory WHERE sku_id = $1 FOR UPDATE`

const updateSKUSQL = `
UPDATE inventory
SET stock = stock + $2, total_stock = $3, per_user_limit = $4, starts_at = $5, ends_at = $6, buckets = $7,
    ticket_required = $8, tickets_open_at = $9, waiting_room = $10, admission_rate = $11, tag = $12, updated_at = now()
WHERE sku_id = $1
RETURNING ` + skuColumns

// PutSKU creates the SKU or updates it, in one transaction.
//
// Creation: stock = total_stock = c.TotalStock; delta = c.TotalStock, created = true.
//
// Update: c.TotalStock is the new allocation of the sale, not the units left.
// delta = new total - old total is added to the database stock under a row
// lock, so units sold or reserved meanwhile stay counted. If stock + delta
// would be negative (more units are already held than the new allocation),
// nothing changes and the error wraps sale.ErrStockConflict. Limit and
// window are replaced (zero times clear them).
//
// Invalid input wraps sale.ErrInvalid. It returns the SKU as committed.
// Redis is not touched: keeping the gate in step with delta is the caller's job.
func (s *pgStore) PutSKU(ctx context.Context, c SKUChange) (sku sale.SKU, delta int64, created bool, err error) {
	if err := c.validate(); err != nil {
		return sale.SKU{}, 0, false, fmt.Errorf("orderstore: put sku: %w", err)
	}
	startsAt, endsAt := nullTime(c.StartsAt), nullTime(c.EndsAt)

	// Insert first: either it creates the row, or it conflicts (after waiting
	// for a concurrent creator to commit) and the row is there to lock.
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(markAuditedSQL)
	b.Queue(insertSKUSQL, c.ID, c.TotalStock, c.PerUserLimit, startsAt, endsAt, c.buckets(),
		c.Crowd.TicketRequired, nullTime(c.Crowd.TicketsOpenAt), c.Crowd.WaitingRoom, c.Crowd.AdmissionRate, c.Tag).QueryRow(func(row pgx.Row) error {
		inserted, err := scanSKU(row)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return err
		}
		sku, created = inserted, true
		return nil
	})
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := br.Close(); err != nil {
		return sale.SKU{}, 0, false, fmt.Errorf("orderstore: put sku %s: %w", c.ID, err)
	}

	if created {
		delta = c.TotalStock
	} else {
		var total, stock int64
		if err := tx.QueryRow(ctx, lockSKUSQL, c.ID).Scan(&total, &stock); err != nil {
			return sale.SKU{}, 0, false, fmt.Errorf("orderstore: put sku %s: lock: %w", c.ID, err)
		}
		delta = c.TotalStock - total
		if stock+delta < 0 {
			return sale.SKU{}, 0, false, fmt.Errorf("orderstore: put sku %s: total %d -> %d with %d units left: %w",
				c.ID, total, c.TotalStock, stock, sale.ErrStockConflict)
		}
		sku, err = scanSKU(tx.QueryRow(ctx, updateSKUSQL, c.ID, delta, c.TotalStock, c.PerUserLimit, startsAt, endsAt, c.buckets(),
			c.Crowd.TicketRequired, nullTime(c.Crowd.TicketsOpenAt), c.Crowd.WaitingRoom, c.Crowd.AdmissionRate, c.Tag))
		if err != nil {
			return sale.SKU{}, 0, false, fmt.Errorf("orderstore: put sku %s: update: %w", c.ID, err)
		}
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
		ab := &pgx.Batch{}
		queueAudit(ab, []auditRow{{sku: c.ID, delta: delta, reason: reason, actor: a.Name, ip: a.SourceIP}})
		if err := tx.SendBatch(ctx, ab).Close(); err != nil {
			return sale.SKU{}, 0, false, fmt.Errorf("orderstore: put sku %s: audit: %w", c.ID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return sale.SKU{}, 0, false, fmt.Errorf("orderstore: put sku %s: commit: %w", c.ID, err)
	}
	return sku, delta, created, nil
}

const skuSQL = `SELECT ` + skuColumns + ` FROM inventory WHERE sku_id = $1`

// SKU returns the SKU with its current database stock. An absent SKU gives an
// error wrapping sale.ErrUnknownSKU.
func (s *pgStore) SKU(ctx context.Context, id string) (sale.SKU, error) {
	sku, err := scanSKU(s.pool.QueryRow(ctx, skuSQL, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return sale.SKU{}, fmt.Errorf("orderstore: sku %q: %w", id, sale.ErrUnknownSKU)
	}
	if err != nil {
		return sale.SKU{}, fmt.Errorf("orderstore: sku %q: %w", id, err)
	}
	return sku, nil
}

const skusSQL = `SELECT ` + skuColumns + ` FROM inventory ORDER BY sku_id`

// SKUs returns every SKU, ordered by id (an empty slice when there are none).
func (s *pgStore) SKUs(ctx context.Context) ([]sale.SKU, error) {
	rows, err := s.pool.Query(ctx, skusSQL)
	if err != nil {
		return nil, fmt.Errorf("orderstore: skus: %w", err)
	}
	skus, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sale.SKU, error) { return scanSKU(row) })
	if err != nil {
		return nil, fmt.Errorf("orderstore: skus: %w", err)
	}
	return skus, nil
}

// scanSKU scans the columns of skuColumns. Times come back in UTC.
func scanSKU(row scanner) (sale.SKU, error) {
	var (
		s                sale.SKU
		startsAt, endsAt *time.Time
		ticketsOpenAt    *time.Time
	)
	if err := row.Scan(&s.ID, &s.TotalStock, &s.Stock, &s.PerUserLimit, &startsAt, &endsAt, &s.UpdatedAt, &s.Buckets,
		&s.Crowd.TicketRequired, &ticketsOpenAt, &s.Crowd.WaitingRoom, &s.Crowd.AdmissionRate, &s.Tag); err != nil {
		return sale.SKU{}, err
	}
	if ticketsOpenAt != nil {
		s.Crowd.TicketsOpenAt = ticketsOpenAt.UTC()
	}
	if startsAt != nil {
		s.StartsAt = startsAt.UTC()
	}
	if endsAt != nil {
		s.EndsAt = endsAt.UTC()
	}
	s.UpdatedAt = s.UpdatedAt.UTC()
	return s, nil
}

// nullTime maps the zero time to SQL NULL.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

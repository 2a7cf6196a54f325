package orderstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ExternalChange is a change of a SKU's stock made outside flashsale,
// recorded by the audit trigger. ID orders them and is the resume position.
type ExternalChange struct {
	ID    int64
	SKU   string
	Delta int64
}

const externalChangesSQL = `
SELECT id, sku_id, delta FROM stock_audit
WHERE reason = 'external_change' AND store = 'db' AND id > $1
ORDER BY id LIMIT $2`

// ExternalChanges returns up to limit external stock changes with id above after.
func (s *Store) ExternalChanges(ctx context.Context, after int64, limit int) ([]ExternalChange, error) {
	rows, err := s.pool.Query(ctx, externalChangesSQL, after, limit)
	if err != nil {
		return nil, fmt.Errorf("orderstore: external changes: %w", err)
	}
	var out []ExternalChange
	var c ExternalChange
	if _, err := pgx.ForEachRow(rows, []any{&c.ID, &c.SKU, &c.Delta}, func() error {
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("orderstore: external changes: %w", err)
	}
	return out, nil
}

// ListenExternalChanges calls wake whenever the database notifies an
// external stock change, until ctx ends or the connection fails (then it
// returns the error; the caller reconnects, and its poll covers the gap).
func (s *Store) ListenExternalChanges(ctx context.Context, wake func()) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN flashsale_stock_changes"); err != nil {
		return err
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN flashsale_stock_changes")
	}()
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}

const maxExternalSQL = `SELECT coalesce(max(id), 0) FROM stock_audit WHERE sku_id = $1 AND reason = 'external_change'`

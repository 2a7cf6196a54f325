package orderstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Transition is one row of order_transitions: an order event to publish.
type Transition struct {
	ID       int64     `json:"event_id"`
	OrderID  string    `json:"order_id"`
	SKU      string    `json:"sku_id"`
	User     string    `json:"user_id"`
	Quantity int64     `json:"quantity"`
	From     string    `json:"from_status,omitempty"`
	To       string    `json:"status"`
	Cause    string    `json:"cause"`
	At       time.Time `json:"at"`
}

const claimTransitionsSQL = `
SELECT id, order_id, sku_id, user_id, quantity, coalesce(from_status, ''), to_status, cause, at
FROM order_transitions WHERE published_at IS NULL
ORDER BY id LIMIT $1
FOR UPDATE SKIP LOCKED`

const markPublishedSQL = `UPDATE order_transitions SET published_at = now() WHERE id = ANY($1::bigint[])`

// PublishTransitions claims up to limit unpublished transitions (oldest
// first; rows another instance holds are skipped), hands them to publish, and
// marks them published in the same transaction if publish succeeds. publish
// must be idempotent per transition id (a crash after it and before the
// commit hands the same rows over again). It returns how many were published.
func (s *pgStore) PublishTransitions(ctx context.Context, limit int, publish func([]Transition) error) (int, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("orderstore: claim events: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, claimTransitionsSQL, limit)
	if err != nil {
		return 0, fmt.Errorf("orderstore: claim events: %w", err)
	}
	var ts []Transition
	var t Transition
	if _, err := pgx.ForEachRow(rows, []any{&t.ID, &t.OrderID, &t.SKU, &t.User, &t.Quantity, &t.From, &t.To, &t.Cause, &t.At}, func() error {
		t.At = t.At.UTC()
		ts = append(ts, t)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("orderstore: claim events: %w", err)
	}
	if len(ts) == 0 {
		return 0, nil
	}
	if err := publish(ts); err != nil {
		return 0, err
	}
	ids := make([]int64, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	if _, err := tx.Exec(ctx, markPublishedSQL, ids); err != nil {
		return 0, fmt.Errorf("orderstore: mark events published: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("orderstore: mark events published: %w", err)
	}
	return len(ts), nil
}

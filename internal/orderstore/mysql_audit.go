package orderstore

import (
	"context"
	"database/sql"
	"fmt"
)

// AuditRedis records a change of the gate's (Redis) stock: a reconciler
// correction or a re-seed (store "redis", the actor of ctx). It is
// informational: Redis is not the record.
func (s *myStore) AuditRedis(ctx context.Context, sku string, delta int64, reason string) error {
	a := actorOf(ctx)
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		return myInsertAudit(ctx, tx, []auditRow{{sku: sku, store: "redis", delta: delta, reason: reason, actor: a.Name, ip: a.SourceIP}})
	})
	if err != nil {
		return fmt.Errorf("orderstore: audit redis %s: %w", sku, err)
	}
	return nil
}

const myAuditPageSQL = `
SELECT id, sku_id, store, delta, reason, coalesce(order_id, ''), actor, coalesce(source_ip, ''), created_at
FROM stock_audit WHERE sku_id = ? AND id > ? ORDER BY id LIMIT ?`

// Audit returns up to limit audit rows of sku with id above after, oldest
// first (an empty slice when there are none).
func (s *myStore) Audit(ctx context.Context, sku string, after int64, limit int) ([]AuditEntry, error) {
	rows, err := s.db.QueryContext(ctx, myAuditPageSQL, sku, after, limit)
	if err != nil {
		return nil, fmt.Errorf("orderstore: audit %s: %w", sku, err)
	}
	defer rows.Close()
	out := []AuditEntry{}
	for rows.Next() {
		var e AuditEntry
		if err := rows.Scan(&e.ID, &e.SKU, &e.Store, &e.Delta, &e.Reason, &e.OrderID, &e.Actor, &e.SourceIP, &e.CreatedAt); err != nil {
			return nil, fmt.Errorf("orderstore: audit %s: %w", sku, err)
		}
		e.CreatedAt = e.CreatedAt.UTC()
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("orderstore: audit %s: %w", sku, err)
	}
	return out, nil
}

// Claimed oldest first through the (published_at, id) index; SKIP LOCKED
// lets several publishers (instances) share the outbox without waiting.
const myClaimTransitionsSQL = `
SELECT id, order_id, sku_id, user_id, quantity, coalesce(from_status, ''), to_status, cause, at
FROM order_transitions WHERE published_at IS NULL
ORDER BY id LIMIT ?
FOR UPDATE SKIP LOCKED`

// PublishTransitions claims up to limit unpublished transitions (oldest
// first; rows another instance holds are skipped), hands them to publish, and
// marks them published in the same transaction if publish succeeds (its
// error is returned as is). publish must be idempotent per transition id: a
// crash after it and before the commit, or a deadlock retry of the
// transaction, hands the same rows over again. It returns how many were
// published.
func (s *myStore) PublishTransitions(ctx context.Context, limit int, publish func([]Transition) error) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		n = 0
		ts, err := myClaimTransitions(ctx, tx, limit)
		if err != nil {
			return fmt.Errorf("orderstore: claim events: %w", err)
		}
		if len(ts) == 0 {
			return nil
		}
		if err := publish(ts); err != nil {
			return err
		}
		ids := make([]int64, len(ts))
		for i, t := range ts {
			ids[i] = t.ID
		}
		if _, err := tx.ExecContext(ctx, `UPDATE order_transitions SET published_at = CURRENT_TIMESTAMP(6) WHERE id IN (`+placeholders(len(ids))+`)`, anys(ids)...); err != nil {
			return fmt.Errorf("orderstore: mark events published: %w", err)
		}
		n = len(ts)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// myClaimTransitions reads and locks up to limit unpublished transitions.
func myClaimTransitions(ctx context.Context, tx *sql.Tx, limit int) ([]Transition, error) {
	rows, err := tx.QueryContext(ctx, myClaimTransitionsSQL, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ts []Transition
	for rows.Next() {
		var t Transition
		if err := rows.Scan(&t.ID, &t.OrderID, &t.SKU, &t.User, &t.Quantity, &t.From, &t.To, &t.Cause, &t.At); err != nil {
			return nil, err
		}
		t.At = t.At.UTC()
		ts = append(ts, t)
	}
	return ts, rows.Err()
}

package orderstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Audit reasons written by flashsale (stock_audit.reason). Changes made
// outside flashsale are recorded as "external_change" by a trigger.
const (
	AuditSKUCreated  = "sku_created"
	AuditRestock     = "restock"
	AuditReduce      = "reduce"
	AuditApplied     = "reservation_applied"
	AuditDirectSale  = "fallback_sale"
	AuditRelease     = "release"
	AuditRedisFix    = "reconcile_correction"
	AuditRedisReseed = "reseed"
)

// ActorKey is the context key WithActor stores the Actor under. A context
// may answer it itself with an Actor: the HTTP API's request context does,
// so that a request no store call is made for composes none.
type ActorKey struct{}

// Actor identifies who causes a change: an admin, a user, or the system.
type Actor struct {
	Name     string // e.g. "admin", "user:alice", "system:timer"
	SourceIP string
}

// WithActor returns ctx carrying who is acting, for the audit rows of the
// store calls made with it. Without one the actor is "system".
func WithActor(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, ActorKey{}, a)
}

func actorOf(ctx context.Context) Actor {
	if a, ok := ctx.Value(ActorKey{}).(Actor); ok && a.Name != "" {
		return a
	}
	return Actor{Name: "system"}
}

// auditRow is one row of stock_audit.
type auditRow struct {
	sku, store, reason, orderID, actor, ip string
	delta                                  int64
}

const markAuditedSQL = `SELECT set_config('flashsale.audited', 'on', true)`

const insertAuditSQL = `
INSERT INTO stock_audit (sku_id, store, delta, reason, order_id, actor, source_ip)
SELECT t.sku, t.store, t.delta, t.reason, nullif(t.order_id, ''), t.actor, nullif(t.ip, '')
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[])
    AS t(sku, store, delta, reason, order_id, actor, ip)`

// queueAudit adds to b: the mark that this transaction audits its own stock
// changes, and the audit rows.
func queueAudit(b *pgx.Batch, rows []auditRow) {
	b.Queue(markAuditedSQL)
	if len(rows) == 0 {
		return
	}
	n := len(rows)
	skus, stores, reasons, orders, actors, ips := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	deltas := make([]int64, n)
	for i, r := range rows {
		skus[i], stores[i], reasons[i], orders[i], actors[i], ips[i], deltas[i] = r.sku, r.store, r.reason, r.orderID, r.actor, r.ip, r.delta
		if stores[i] == "" {
			stores[i] = "db"
		}
	}
	b.Queue(insertAuditSQL, skus, stores, deltas, reasons, orders, actors, ips)
}

// AuditRedis records a change of the gate's (Redis) stock: a reconciler
// correction or a re-seed. It is informational: Redis is not the record.
func (s *pgStore) AuditRedis(ctx context.Context, sku string, delta int64, reason string) error {
	a := actorOf(ctx)
	b := &pgx.Batch{}
	queueAudit(b, []auditRow{{sku: sku, store: "redis", delta: delta, reason: reason, actor: a.Name, ip: a.SourceIP}})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("orderstore: audit redis %s: %w", sku, err)
	}
	return nil
}

// AuditEntry is one row of stock_audit.
type AuditEntry struct {
	ID        int64     `json:"id"`
	SKU       string    `json:"sku_id"`
	Store     string    `json:"store"`
	Delta     int64     `json:"delta"`
	Reason    string    `json:"reason"`
	OrderID   string    `json:"order_id,omitempty"`
	Actor     string    `json:"actor"`
	SourceIP  string    `json:"source_ip,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

const auditPageSQL = `
SELECT id, sku_id, store, delta, reason, coalesce(order_id, ''), actor, coalesce(source_ip, ''), created_at
FROM stock_audit WHERE sku_id = $1 AND id > $2 ORDER BY id LIMIT $3`

// Audit returns up to limit audit rows of sku with id above after, oldest first.
func (s *pgStore) Audit(ctx context.Context, sku string, after int64, limit int) ([]AuditEntry, error) {
	rows, err := s.pool.Query(ctx, auditPageSQL, sku, after, limit)
	if err != nil {
		return nil, fmt.Errorf("orderstore: audit %s: %w", sku, err)
	}
	out := []AuditEntry{}
	var e AuditEntry
	if _, err := pgx.ForEachRow(rows, []any{&e.ID, &e.SKU, &e.Store, &e.Delta, &e.Reason, &e.OrderID, &e.Actor, &e.SourceIP, &e.CreatedAt}, func() error {
		e.CreatedAt = e.CreatedAt.UTC()
		out = append(out, e)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("orderstore: audit %s: %w", sku, err)
	}
	return out, nil
}

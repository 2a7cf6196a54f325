package orderstore

import (
	"context"
	"database/sql"
	"strings"

	"github.com/flashsale/flashsale/internal/sale"
)

// The MySQL writes every dialect-neutral rule shares. Each takes the open
// transaction; multi-row VALUES lists stay far below max_allowed_packet for
// the batch sizes the consumer uses (a row is < 1 KB).

// valuesSQL returns head followed by n row tuples of cols placeholders each:
// "head (?, ?), (?, ?)" for a multi-row INSERT.
func valuesSQL(head string, n, cols int) string {
	row := "(" + placeholders(cols) + ")"
	var q strings.Builder
	q.Grow(len(head) + n*(len(row)+2))
	q.WriteString(head)
	for i := range n {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString(row)
	}
	return q.String()
}

// myInsertTransitions inserts ts into order_transitions (the event outbox).
func myInsertTransitions(ctx context.Context, tx *sql.Tx, ts []transition) error {
	return myExec(ctx, tx, myTransitionsSQL(ts))
}

// myInsertRestores records Redis work owed (a row per order id; a second
// insert of the same order id changes nothing).
func myInsertRestores(ctx context.Context, tx *sql.Tx, rs []Restore) error {
	return myExec(ctx, tx, myRestoresSQL(rs))
}

// myInsertAudit writes stock_audit rows (store "" means "db"). flashsale's
// MySQL sessions carry @flashsale_audited = 1, so the audit trigger leaves
// their stock changes to these rows.
func myInsertAudit(ctx context.Context, tx *sql.Tx, rows []auditRow) error {
	return myExec(ctx, tx, myAuditSQL(rows))
}

// stmt is one SQL statement with its arguments; the zero stmt is none.
type stmt struct {
	q    string
	args []any
}

// myExec runs st, if any.
func myExec(ctx context.Context, tx *sql.Tx, st stmt) error {
	if st.q == "" {
		return nil
	}
	_, err := tx.ExecContext(ctx, st.q, st.args...)
	return err
}

// myTransitionsSQL is the INSERT of ts into order_transitions (none for no ts).
func myTransitionsSQL(ts []transition) stmt {
	if len(ts) == 0 {
		return stmt{}
	}
	q := valuesSQL("INSERT INTO order_transitions (order_id, sku_id, user_id, quantity, from_status, to_status, cause, at) VALUES ", len(ts), 8)
	args := make([]any, 0, 8*len(ts))
	for _, t := range ts {
		var from *string
		if t.from != "" {
			f := string(t.from)
			from = &f
		}
		args = append(args, t.r.OrderID, t.r.SKU, t.r.User, t.r.Quantity, from, string(t.to), t.cause, t.at.UTC())
	}
	return stmt{q, args}
}

// myRestoresSQL is the INSERT IGNORE of rs into redis_restores (none for no rs).
func myRestoresSQL(rs []Restore) stmt {
	if len(rs) == 0 {
		return stmt{}
	}
	q := valuesSQL("INSERT IGNORE INTO redis_restores (order_id, sku_id, user_id, quantity, idempotency_key) VALUES ", len(rs), 5)
	args := make([]any, 0, 5*len(rs))
	for _, r := range rs {
		args = append(args, r.OrderID, r.SKU, r.User, r.Quantity, nullString(r.IdempotencyKey))
	}
	return stmt{q, args}
}

// myAuditSQL is the INSERT of rows into stock_audit (none for no rows).
func myAuditSQL(rows []auditRow) stmt {
	if len(rows) == 0 {
		return stmt{}
	}
	q := valuesSQL("INSERT INTO stock_audit (sku_id, store, delta, reason, order_id, actor, source_ip) VALUES ", len(rows), 7)
	args := make([]any, 0, 7*len(rows))
	for _, r := range rows {
		store := r.store
		if store == "" {
			store = "db"
		}
		args = append(args, r.sku, store, r.delta, r.reason, nullString(r.orderID), r.actor, nullString(r.ip))
	}
	return stmt{q, args}
}

// myOrderSQL reads one order (orderColumnList) by id.
const myOrderSQL = `SELECT ` + orderColumnList + ` FROM orders WHERE order_id = ?`

// myOptionalOrder reads order id through q (a transaction, a connection or
// the pool); found = false when absent.
func myOptionalOrder(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, id string) (sale.Order, bool, error) {
	o, err := scanOrder(q.QueryRowContext(ctx, myOrderSQL, id))
	if noRows(err) {
		return sale.Order{}, false, nil
	}
	return o, err == nil, err
}

package orderstore

import (
	"context"
	"errors"
)

// Change data capture (stock changes made outside flashsale): the audit
// trigger of inventory records each in stock_audit (reason external_change)
// and owes it to Redis as a redis_restores row (order_id "ext-<audit id>-<uuid>",
// user_id ""), in the transaction that made the change. PendingRestores
// returns them with the releases; the restorer applies each to the gate once.

// ErrNoNotify is returned by ListenRestores on a database without
// notifications (MySQL): the caller polls instead.
var ErrNoNotify = errors.New("orderstore: this database sends no change notifications; poll")

// ExternalPrefix starts the order id of a redis_restores row that carries a
// stock change made outside flashsale: "ext-<stock_audit id>-<uuid>" (the
// uuid keeps the token unique even if the audit table is truncated and its
// ids start again).
const ExternalPrefix = "ext-"

// DebitPrefix starts the order id of a redis_restores row that takes in
// Redis the units of a sale the database fallback made ("sale-<order id>").
const DebitPrefix = "sale-"

// ListenRestores calls wake whenever the database notifies a stock change
// made outside flashsale, until ctx ends or the connection fails (then it
// returns the error; the caller reconnects, and its poll covers the gap).
func (s *pgStore) ListenRestores(ctx context.Context, wake func()) error {
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

// ListenRestores on MySQL: no notifications (see ErrNoNotify).
func (s *myStore) ListenRestores(ctx context.Context, wake func()) error { return ErrNoNotify }

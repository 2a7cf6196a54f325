package release

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
)

// Notifier tells of stock changes made outside flashsale as the database
// makes them (orderstore.Store.ListenRestores: PostgreSQL's NOTIFY).
type Notifier interface {
	// ListenRestores calls wake on every notification until ctx ends or
	// the connection fails; orderstore.ErrNoNotify: the database sends none.
	ListenRestores(ctx context.Context, wake func()) error
}

// listenRetry is how long ListenRestores waits before listening again
// after a failure.
const listenRetry = time.Second

// ListenRestores calls kick (the restorer's Kick) on every notification
// of src until ctx ends, so the restorer applies a stock change made
// outside flashsale at once instead of at its next poll. After a failure
// it logs, calls kick once (for whatever was notified while the listener
// was down) and listens again a second later. On a database without
// notifications (MySQL) it returns at once: the restorer's poll finds the
// changes.
func ListenRestores(ctx context.Context, src Notifier, kick func(), log *slog.Logger) {
	for ctx.Err() == nil {
		err := src.ListenRestores(ctx, kick)
		if errors.Is(err, orderstore.ErrNoNotify) || ctx.Err() != nil {
			return
		}
		log.Warn("listening for stock changes made outside flashsale; polling meanwhile", "err", err)
		kick()
		select {
		case <-ctx.Done():
		case <-time.After(listenRetry):
		}
	}
}

// Package release is the order lifecycle after the purchase: payment,
// cancellation and the payment timeout.
//
// The truth is one compare-and-set on the order row in the database
// (pending_payment -> paid, or -> cancelled with the stock given back in the
// same transaction): a paid order is never released and a release happens
// once, whatever races. Triggers are never the truth: the database sweeper
// (the payment timeout, SweepOnce) and users just ask for the change. The Redis half of a release (units and buyer slot back in the
// gate) is owed in the database (redis_restores) and done by the Restorer,
// retried until done, once per order.
package release

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// Store is the database side of the lifecycle.
type Store interface {
	Pay(ctx context.Context, id, user, ref string, now time.Time) (sale.Order, bool, error)
	Cancel(ctx context.Context, id, user, cause string, now time.Time) (sale.Order, bool, error)
	RequestCancel(ctx context.Context, id, user string, now time.Time) (sale.Order, bool, error)
	Expire(ctx context.Context, id string, now time.Time) (sale.Order, bool, error)
	ExpireDue(ctx context.Context, now time.Time, limit int) ([]orderstore.Restore, error)
	PendingRestores(ctx context.Context, limit int, skip ...string) ([]orderstore.Restore, error)
	RestoresDone(ctx context.Context, ids []string) error
}

// Gate gives released units back in Redis.
type Gate interface {
	Restore(ctx context.Context, sku string, rs []stockgate.Release) (int64, error)
}

// Orders finds an order its user may see, queued ones included.
type Orders interface {
	Order(ctx context.Context, user, id string) (sale.Order, error)
}

// Service answers payment and cancellation requests and runs the restorer.
type Service struct {
	store  Store
	gate   Gate
	orders Orders
	log    *slog.Logger
	active func(sku string) bool
	kick   chan struct{}
	now    func() time.Time
}

// New returns a Service. active reports whether a SKU's sale is still
// going (restores owed to a sale that is over and unloaded are dropped).
func New(store Store, gate Gate, orders Orders, active func(string) bool, log *slog.Logger) *Service {
	return &Service{store: store, gate: gate, orders: orders, active: active, log: log, kick: make(chan struct{}, 1), now: time.Now}
}

// Pay records the payment of order id by its owner user (ref: the payment
// provider's reference). Paying twice returns the same order. Errors:
// sale.ErrOrderNotFound, sale.ErrOrderExpired (cancelled or timed out: the
// caller refunds; an order past its deadline that the sweeper has not yet
// released is released here, before the answer), sale.ErrOrderFailed,
// sale.ErrOrderQueued (not yet in the database: retry shortly).
func (s *Service) Pay(ctx context.Context, user, id, ref string) (sale.Order, error) {
	if !sale.ValidOrderID(id) {
		return sale.Order{}, sale.ErrOrderNotFound
	}
	o, _, err := s.store.Pay(ctx, id, user, ref, s.now())
	if errors.Is(err, sale.ErrOrderNotFound) {
		q, qerr := s.orders.Order(ctx, user, id)
		switch {
		case qerr != nil:
		case q.Status == sale.StatusQueued:
			return q, sale.ErrOrderQueued
		default:
			// It landed between the two reads: pay it now.
			o, _, err = s.store.Pay(ctx, id, user, ref, s.now())
		}
	}
	if errors.Is(err, sale.ErrOrderExpired) && o.Status == sale.StatusPendingPayment {
		// Past its deadline but not yet released by the sweeper: release
		// it now, so that the order is cancelled when the payer hears
		// order_expired (the same compare-and-set as the sweeper's:
		// a release happens once, whoever asks).
		if eo, released, eerr := s.store.Expire(ctx, id, s.now()); eerr == nil {
			o = eo
			if released {
				s.Kick()
			}
		} else {
			s.log.Warn("expire after a late pay", "order_id", id, "err", eerr)
		}
	}
	return o, err
}

// Cancel cancels order id for its owner user and releases its stock. An
// order still queued is cancelled when it lands (returned with status
// queued and ok). Errors: sale.ErrOrderNotFound, sale.ErrOrderPaid,
// sale.ErrOrderFailed.
func (s *Service) Cancel(ctx context.Context, user, id string) (sale.Order, error) {
	if !sale.ValidOrderID(id) {
		return sale.Order{}, sale.ErrOrderNotFound
	}
	o, again, err := s.store.Cancel(ctx, id, user, sale.CancelByUser, s.now())
	if errors.Is(err, sale.ErrOrderNotFound) {
		q, qerr := s.orders.Order(ctx, user, id)
		if qerr != nil {
			return sale.Order{}, qerr
		}
		if q.Status != sale.StatusQueued {
			// Landed between the two reads: cancel it now.
			o, again, err = s.store.Cancel(ctx, id, user, sale.CancelByUser, s.now())
		} else {
			landed, ok, rerr := s.store.RequestCancel(ctx, id, user, s.now())
			if rerr != nil {
				return sale.Order{}, rerr
			}
			if !ok {
				return q, nil
			}
			o, again, err = landed, false, nil
		}
	}
	if err == nil && !again {
		s.Kick()
	}
	return o, err
}

// Kick asks the restorer to run now.
func (s *Service) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// restorePage is how many owed restores RestoreOnce reads at a time.
const restorePage = 500

// RestoreOnce gives back in Redis the units of releases the database owes
// it, and returns how many releases it completed. Each is applied once by
// the gate however often this runs (a crash between the database change and
// this is repaired by the next run). Restores of a SKU Redis does not hold
// now (being rebuilt) wait; the next page is read past that SKU, so however
// many of them are owed they never hold up the other SKUs'.
func (s *Service) RestoreOnce(ctx context.Context) (int, error) {
	var skip []string
	total := 0
	for {
		rs, err := s.store.PendingRestores(ctx, restorePage, skip...)
		if err != nil || len(rs) == 0 {
			return total, err
		}
		n, waiting, err := s.restore(ctx, rs)
		total += n
		skip = append(skip, waiting...)
		// A full page whose SKUs all completed: the caller comes back for
		// the next one (RunRestorer does at once).
		if err != nil || len(rs) < restorePage || len(waiting) == 0 {
			return total, err
		}
	}
}

// restore applies one page of owed restores and returns how many it
// completed and the SKUs whose restores must wait.
func (s *Service) restore(ctx context.Context, rs []orderstore.Restore) (int, []string, error) {
	failpoint.Inject(failpoint.ReleaseAfterStatusBeforeRestock)
	bySKU := map[string][]orderstore.Restore{}
	for _, r := range rs {
		bySKU[r.SKU] = append(bySKU[r.SKU], r)
	}
	var done, waiting []string
	var errs []error
	for sku, list := range bySKU {
		rel := make([]stockgate.Release, len(list))
		for i, r := range list {
			rel[i] = stockgate.Release{OrderID: r.OrderID, User: r.User, Quantity: r.Quantity}
			if r.IdempotencyKey != "" && strings.HasPrefix(r.OrderID, orderstore.DebitPrefix) {
				// A direct sale: the gate learns that the key made this order.
				rel[i].IdempotencyKey, rel[i].KeyOrderID = r.IdempotencyKey, strings.TrimPrefix(r.OrderID, orderstore.DebitPrefix)
			}
		}
		_, err := s.gate.Restore(ctx, sku, rel)
		switch {
		case err == nil:
		case errors.Is(err, sale.ErrNotWarmed) && !s.active(sku):
			// The sale is over and unloaded: nothing to give back to.
		case errors.Is(err, sale.ErrNotWarmed):
			// Redis lost the sale: the rebuild counts these from the
			// database and marks them; they complete on a later run.
			waiting = append(waiting, sku)
			continue
		default:
			errs = append(errs, fmt.Errorf("%s: %w", sku, err))
			continue
		}
		for _, r := range list {
			done = append(done, r.OrderID)
		}
	}
	if len(done) > 0 {
		failpoint.Inject(failpoint.RestoreAfterRedisBeforeDone)
	}
	if err := s.store.RestoresDone(ctx, done); err != nil {
		errs = append(errs, err)
	}
	return len(done), waiting, errors.Join(errs...)
}

// RunRestorer restores every period, and at once when kicked, until ctx ends.
func (s *Service) RunRestorer(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		for {
			n, err := s.RestoreOnce(ctx)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("release: restoring units in redis", "err", err)
			}
			if n < restorePage || err != nil {
				break
			}
		}
	}
}

// SweepOnce releases every order whose payment deadline passed before now
// (the payment timeout: claimed in batches with FOR UPDATE SKIP LOCKED, so
// several instances share the work) and returns how many.
func (s *Service) SweepOnce(ctx context.Context, now time.Time) (int, error) {
	total := 0
	for {
		rs, err := s.store.ExpireDue(ctx, now, 500)
		total += len(rs)
		if len(rs) > 0 {
			s.Kick()
		}
		if err != nil || len(rs) < 500 {
			return total, err
		}
	}
}

// RunSweeper sweeps every period until ctx ends.
func (s *Service) RunSweeper(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n, err := s.SweepOnce(ctx, now); err != nil && ctx.Err() == nil {
				s.log.Warn("release: sweeper", "err", err)
			} else if n > 0 {
				s.log.Info("release: sweeper released unpaid orders", "orders", n)
			}
		}
	}
}

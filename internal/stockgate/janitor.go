package stockgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// Sales lists the sales an instance knows (purchase.Catalog).
type Sales interface {
	All() []sale.SKU
}

// TransferAge is how old a transfer between stock buckets must be before
// the TransferSweeper finishes it: a younger one is its caller's to finish.
const TransferAge = 2 * time.Second

// TransferPass is what one TransferSweeper pass did.
type TransferPass struct {
	Transfers int   // transfers finished (credited, or refunded)
	Settled   int64 // units moved to buckets that owed them
}

// TransferSweeper finishes the transfers between stock buckets whose
// caller did not (it died between the halves: SweepTransfers) and pays the
// debts of split sales from their other buckets (SettleDebt), so units in
// transfer sell again. Only split sales have transfers or debts between
// buckets: the sales list names them, so sales in one bucket cost no Redis
// call. Several instances may sweep at once: each transfer completes once.
type TransferSweeper struct {
	gate  *Gate
	sales Sales
	log   *slog.Logger
}

// NewTransferSweeper returns a sweeper of the split sales sales lists.
func NewTransferSweeper(g *Gate, sales Sales, log *slog.Logger) *TransferSweeper {
	return &TransferSweeper{gate: g, sales: sales, log: log}
}

// RunOnce finishes, in every bucket of every split sale, the transfers
// begun TransferAge or longer before now, then settles each sale's debts.
// A failure is logged and the pass goes on with the next bucket or sale;
// the failures are returned together, with what the pass did.
func (s *TransferSweeper) RunOnce(ctx context.Context, now time.Time) (TransferPass, error) {
	var p TransferPass
	var errs []error
	for _, sk := range s.sales.All() {
		k := sk.BucketCount()
		if k <= 1 {
			continue
		}
		for _, n := range BucketNames(sk.ID, k) {
			done, err := s.gate.SweepTransfers(ctx, n, now.Add(-TransferAge))
			p.Transfers += done
			if err != nil {
				s.log.Warn("stock bucket transfers", "bucket", n, "err", err)
				errs = append(errs, fmt.Errorf("bucket %s: %w", n, err))
			}
		}
		moved, err := s.gate.SettleDebt(ctx, sk.ID)
		p.Settled += moved
		if err != nil {
			s.log.Warn("stock bucket debts", "sku_id", sk.ID, "err", err)
			errs = append(errs, fmt.Errorf("sku %s: %w", sk.ID, err))
		}
	}
	return p, errors.Join(errs...)
}

// Run sweeps every period until ctx ends (RunOnce logs its failures).
func (s *TransferSweeper) Run(ctx context.Context, period time.Duration) {
	every(ctx, period, func(now time.Time) { _, _ = s.RunOnce(ctx, now) })
}

// Janitor drops the Redis keys of sales that ended more than a retention
// ago, bucket by bucket, never while work of theirs is in flight (Expire).
// Several instances may run one at once.
type Janitor struct {
	gate      *Gate
	retention time.Duration
	log       *slog.Logger
}

// NewJanitor returns a janitor that keeps an ended sale's keys for
// retention.
func NewJanitor(g *Gate, retention time.Duration, log *slog.Logger) *Janitor {
	return &Janitor{gate: g, retention: retention, log: log}
}

// RunOnce drops the keys of every loaded sale (every bucket in the
// registry, SKUs) that ended more than the retention before now, and
// returns the names it dropped. The failure of one is logged and the pass
// goes on; the failures are returned together. A registry that cannot be
// read ends the pass with its error, not logged (the next pass tries
// again).
func (j *Janitor) RunOnce(ctx context.Context, now time.Time) ([]string, error) {
	names, err := j.gate.SKUs(ctx)
	if err != nil {
		return nil, fmt.Errorf("stockgate: janitor: %w", err)
	}
	var dropped []string
	var errs []error
	for _, n := range names {
		ok, err := j.gate.Expire(ctx, n, now, j.retention)
		switch {
		case err != nil:
			j.log.Warn("expire sale keys", "sku_id", n, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
		case ok:
			j.log.Info("ended sale's redis keys dropped", "sku_id", n)
			dropped = append(dropped, n)
		}
	}
	return dropped, errors.Join(errs...)
}

// Run runs a pass every period until ctx ends (RunOnce logs its failures).
func (j *Janitor) Run(ctx context.Context, period time.Duration) {
	every(ctx, period, func(now time.Time) { _, _ = j.RunOnce(ctx, now) })
}

// every calls pass with the tick's time every period until ctx ends.
func every(ctx context.Context, period time.Duration, pass func(now time.Time)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			pass(now)
		}
	}
}

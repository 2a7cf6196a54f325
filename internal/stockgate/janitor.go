package stockgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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
//
// Its Redis work is bounded by what there is to do: a sale that ended
// more than SweepEndedAfter ago is not looked at (nothing sells; a change
// of its end makes it swept again), and a sale is looked at with one
// pipelined read of its buckets (one script call each); one whose read
// showed nothing to do (no transfer, no debt) is looked at again after a
// wait that doubles from a second up to SweepIdleMax. Purchases finish a
// stale transfer themselves when only transfers hold the units they want
// (refill), and refusals and restores settle debts as they land, so the
// sweeper is the backstop, not the path.
type TransferSweeper struct {
	gate  *Gate
	sales Sales
	log   *slog.Logger

	mu   sync.Mutex
	idle map[string]idleSale // by SKU id
}

// idleSale is when a quiet split sale is looked at next.
type idleSale struct {
	next time.Time
	wait time.Duration
}

// Bounds of the TransferSweeper's work on quiet sales.
const (
	// SweepEndedAfter is how long after its end a split sale is still
	// swept (a transfer left half done at the end is finished).
	SweepEndedAfter = time.Minute
	// SweepIdleMax is the longest wait between two looks at a split sale
	// whose last looks found nothing to do.
	SweepIdleMax = 30 * time.Second
)

// NewTransferSweeper returns a sweeper of the split sales sales lists.
func NewTransferSweeper(g *Gate, sales Sales, log *slog.Logger) *TransferSweeper {
	return &TransferSweeper{gate: g, sales: sales, log: log, idle: map[string]idleSale{}}
}

// RunOnce finishes, in every bucket of every split sale due for a look
// (see TransferSweeper), the transfers begun TransferAge or longer before
// now, then settles each sale's debts. A failure is logged and the pass
// goes on with the next bucket or sale; the failures are returned
// together, with what the pass did.
func (s *TransferSweeper) RunOnce(ctx context.Context, now time.Time) (TransferPass, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p TransferPass
	var errs []error
	listed := map[string]bool{}
	for _, sk := range s.sales.All() {
		k := sk.BucketCount()
		if k <= 1 {
			continue
		}
		listed[sk.ID] = true
		if !sk.EndsAt.IsZero() && now.Sub(sk.EndsAt) > SweepEndedAfter {
			delete(s.idle, sk.ID)
			continue
		}
		if st, ok := s.idle[sk.ID]; ok && now.Before(st.next) {
			continue
		}
		busy, err := s.sweep(ctx, sk.ID, k, now, &p)
		if err != nil {
			errs = append(errs, err)
		}
		if busy || err != nil {
			delete(s.idle, sk.ID)
			continue
		}
		st := s.idle[sk.ID]
		st.wait = min(max(2*st.wait, time.Second), SweepIdleMax)
		st.next = now.Add(st.wait)
		s.idle[sk.ID] = st
	}
	for id := range s.idle {
		if !listed[id] { // gone from the catalog, or no longer split
			delete(s.idle, id)
		}
	}
	return p, errors.Join(errs...)
}

// sweep is one look at split sale id: it reports whether the sale had
// anything in transfer or in debt.
func (s *TransferSweeper) sweep(ctx context.Context, id string, k int, now time.Time, p *TransferPass) (bool, error) {
	names := BucketNames(id, k)
	bs, err := s.gate.ReadBuckets(ctx, names, false)
	if err != nil {
		s.log.Warn("stock bucket transfers", "sku_id", id, "err", err)
		return false, fmt.Errorf("sku %s: %w", id, err)
	}
	var errs []error
	busy, debt := false, false
	for _, b := range bs {
		debt = debt || b.Debt > 0
		if b.Transit == 0 {
			continue
		}
		busy = true
		done, err := s.gate.SweepTransfers(ctx, b.Name, now.Add(-TransferAge))
		p.Transfers += done
		if err != nil {
			s.log.Warn("stock bucket transfers", "bucket", b.Name, "err", err)
			errs = append(errs, fmt.Errorf("bucket %s: %w", b.Name, err))
		}
	}
	if debt {
		busy = true
		moved, err := s.gate.SettleDebt(ctx, id)
		p.Settled += moved
		if err != nil {
			s.log.Warn("stock bucket debts", "sku_id", id, "err", err)
			errs = append(errs, fmt.Errorf("sku %s: %w", id, err))
		}
	}
	return busy, errors.Join(errs...)
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

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/invariant"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// Checker verifies a run from the database (PostgreSQL or MySQL) and Redis
// directly, never from the service's own counters.
type Checker struct {
	DB invariant.DB
	// Gate is the Redis gate of the service, or nil when the strategy sells
	// straight from the database (its Redis state is then not the sale's:
	// I3 is skipped).
	Gate *stockgate.Gate
	// DrainTimeout bounds the wait for the queue to empty (default 60s).
	DrainTimeout time.Duration
}

// Verdict is what the checks found.
type Verdict struct {
	// Drained is true once nothing was in flight and every accepted order
	// was in the database; DrainTime is how long that took after the run.
	Drained   bool
	DrainTime time.Duration
	Sold      int64 // live units (pending_payment, paid) in the database
	Oversold  int64 // live units above the allocation, plus negative stock
	Lost      int64 // accepted (202) order ids without an order row
	// Doubled counts purchases applied twice: a second live order for the
	// same user and Idempotency-Key, or process_log rows not matching orders.
	Doubled int64
	// I7Units is what fresh buyers could buy after the run (see CheckI7).
	I7Units    int64
	Reports    []invariant.Report
	Violations []string
}

// OK reports whether every check passed.
func (v *Verdict) OK() bool {
	return v.Drained && v.Oversold == 0 && v.Lost == 0 && v.Doubled == 0 && len(v.Violations) == 0
}

func (v *Verdict) failf(format string, args ...any) {
	v.Violations = append(v.Violations, fmt.Sprintf(format, args...))
}

// doubledSQL counts live orders beyond the first per user and Idempotency-Key.
const doubledSQL = `
SELECT coalesce(sum(n - 1), 0) FROM (
    SELECT count(*) AS n FROM orders
    WHERE sku_id = ? AND idempotency_key IS NOT NULL AND status IN ('pending_payment', 'paid')
    GROUP BY user_id, idempotency_key HAVING count(*) > 1) d`

// Drain waits until the sale is idle: nothing in flight or in the outbox in
// Redis (a reservation leaves the in-flight set only once the database
// decided it), no release still owing the gate its units, and every
// accepted order id has its order row. It returns
// how long that took, or false after DrainTimeout.
func (c Checker) Drain(ctx context.Context, accepted map[string][]string) (time.Duration, bool, error) {
	timeout := c.DrainTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	start := time.Now()
	for {
		// The sale was idle when the check that found it so began.
		at := time.Since(start)
		idle, err := c.idle(ctx, accepted)
		if err != nil {
			return time.Since(start), false, err
		}
		if idle {
			return at, true, nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), false, nil
		}
		select {
		case <-ctx.Done():
			return time.Since(start), false, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Releases (cancellations, payment timeouts) owe the gate their units
// until the restorer has given them back: the sale is not idle before.
const pendingRestoresSQL = `SELECT count(*) FROM redis_restores WHERE sku_id IN (`

func (c Checker) idle(ctx context.Context, accepted map[string][]string) (bool, error) {
	if c.Gate != nil {
		if len(accepted) > 0 {
			skus := make([]any, 0, len(accepted))
			for sku := range accepted {
				skus = append(skus, sku)
			}
			q := pendingRestoresSQL + strings.TrimSuffix(strings.Repeat("?,", len(skus)), ",") + ")"
			var owed int64
			if err := c.DB.DB().QueryRowContext(ctx, c.DB.Rebind(q), skus...).Scan(&owed); err != nil {
				return false, fmt.Errorf("loadgen: pending restores: %w", err)
			}
			if owed > 0 {
				return false, nil
			}
		}
		for sku := range accepted {
			f, err := c.Gate.ReadInFlight(ctx, sku)
			if err != nil {
				return false, err
			}
			n, err := c.Gate.OutboxLen(ctx, sku)
			if err != nil {
				return false, err
			}
			if len(f.Reservations) > 0 || n > 0 {
				return false, nil
			}
		}
	}
	var all []string
	for _, ids := range accepted {
		all = append(all, ids...)
	}
	missing, err := invariant.Missing(ctx, c.DB, all)
	if err != nil {
		return false, fmt.Errorf("loadgen: accepted orders: %w", err)
	}
	return missing == 0, nil
}

// Check drains, then checks I1-I6 for every SKU of accepted (see
// invariant.Check) and counts what was sold, oversold, lost and doubled.
func (c Checker) Check(ctx context.Context, accepted map[string][]string) (*Verdict, error) {
	v := &Verdict{}
	var err error
	v.DrainTime, v.Drained, err = c.Drain(ctx, accepted)
	if err != nil {
		return nil, err
	}
	if !v.Drained {
		v.failf("I3/I4: not drained %v after the run: reservations still in flight or accepted orders missing", v.DrainTime.Round(time.Millisecond))
	}
	if err := c.checkInvariants(ctx, accepted, v); err != nil {
		return nil, err
	}
	return v, nil
}

func (c Checker) checkInvariants(ctx context.Context, accepted map[string][]string, v *Verdict) error {
	skus := make([]string, 0, len(accepted))
	for sku := range accepted {
		skus = append(skus, sku)
	}
	slices.Sort(skus)
	for _, sku := range skus {
		rep, err := invariant.Check(ctx, c.DB, c.Gate, sku, accepted[sku], true)
		if err != nil {
			return err
		}
		v.Reports = append(v.Reports, rep)
		for _, x := range rep.Violations {
			v.failf("%s: %s", sku, x)
		}
		v.Sold += rep.LiveUnits
		v.Oversold += max(rep.LiveUnits-rep.TotalStock, 0) + max(-rep.DBStock, 0)
		missing, err := invariant.Missing(ctx, c.DB, accepted[sku])
		if err != nil {
			return fmt.Errorf("loadgen: lost orders: %w", err)
		}
		var doubled int64
		if err := c.DB.DB().QueryRowContext(ctx, c.DB.Rebind(doubledSQL), sku).Scan(&doubled); err != nil {
			return fmt.Errorf("loadgen: doubled orders: %w", err)
		}
		v.Lost += missing
		v.Doubled += doubled + max(rep.ProcessLog-rep.Orders, rep.Orders-rep.ProcessLog, 0)
	}
	return nil
}

// I7 buyers: how many at once, and how often one retries an answer that
// decided nothing (503, no answer) with the same Idempotency-Key.
const (
	i7Buyers  = 8
	i7Retries = 50
)

// CheckI7 checks that no stock is stranded once the sales are idle (I7):
// for every SKU, fresh buyers can buy exactly the units the database says
// remain, then get sold_out. When more than capUnits remain, the admin API
// first takes the surplus off the sale (itself a check: the service must
// agree those units are unsold), so the check stays short. Afterwards it
// drains again and re-checks I1-I6 with the new orders; v collects the
// violations and I7Units the units bought.
func (c Checker) CheckI7(ctx context.Context, cl *Client, sc *Scenario, capUnits int64, v *Verdict) error {
	return c.CheckI7Sales(ctx, cl, sc.Accepted(), "i7-"+sc.cfg.RunID, capUnits, v)
}

// CheckI7Sales is CheckI7 for sales whose accepted orders are accepted
// (by SKU), the fresh buyers' names starting with prefix.
func (c Checker) CheckI7Sales(ctx context.Context, cl *Client, accepted map[string][]string, prefix string, capUnits int64, v *Verdict) error {
	for _, rep := range v.Reports {
		sku := rep.SKU
		remain := rep.DBStock
		if remain > capUnits {
			total := rep.TotalStock - (remain - capUnits)
			if err := cl.PutSKU(ctx, sku, total, rep.PerUserLimit); err != nil {
				v.failf("%s: I7: taking %d unsold units off the sale was refused: %v", sku, remain-capUnits, err)
				continue
			}
			remain = capUnits
		}
		ids, units, err := buyOut(ctx, cl, sku, prefix+"-"+sku)
		if err != nil {
			v.failf("%s: I7: %v", sku, err)
		}
		v.I7Units += units
		if units != remain {
			v.failf("%s: I7: the database said %d units remain, fresh buyers bought %d", sku, remain, units)
		}
		accepted[sku] = append(accepted[sku], ids...)
	}
	drained, ok, err := c.Drain(ctx, accepted)
	if err != nil {
		return err
	}
	if !ok {
		v.failf("I7: the fresh buyers' orders did not drain within %v", drained.Round(time.Millisecond))
	}
	after := &Verdict{}
	if err := c.checkInvariants(ctx, accepted, after); err != nil {
		return err
	}
	for _, x := range after.Violations {
		v.failf("after I7: %s", x)
	}
	v.Oversold = max(v.Oversold, after.Oversold)
	v.Lost = max(v.Lost, after.Lost)
	v.Doubled = max(v.Doubled, after.Doubled)
	return nil
}

// buyOut buys one unit at a time as fresh users until sku answers sold_out,
// then checks that one more buyer is refused too.
func buyOut(ctx context.Context, cl *Client, sku, prefix string) (ids []string, units int64, err error) {
	var (
		next atomic.Int64
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for w := 0; w < i7Buyers; w++ {
		wg.Go(func() {
			for ctx.Err() == nil {
				user := prefix + "-" + strconv.FormatInt(next.Add(1), 10)
				r := buyDecided(ctx, cl, user, sku)
				mu.Lock()
				switch {
				case r.Status == 202:
					ids = append(ids, r.OrderID)
					units++
				case r.Code == "sold_out":
					mu.Unlock()
					return
				default:
					errs = append(errs, fmt.Errorf("fresh buyer %s: HTTP %d %s %v", user, r.Status, r.Code, r.Err))
					mu.Unlock()
					return
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) == 0 {
		if r := buyDecided(ctx, cl, prefix+"-last", sku); r.Code != "sold_out" {
			errs = append(errs, fmt.Errorf("after selling out, a fresh buyer got HTTP %d %s", r.Status, r.Code))
			if r.Status == 202 {
				ids, units = append(ids, r.OrderID), units+1
			}
		}
	}
	return ids, units, errors.Join(append(errs, ctx.Err())...)
}

// buyDecided buys until the answer decides the purchase (no 503, no
// transport error), with the same Idempotency-Key each time.
func buyDecided(ctx context.Context, cl *Client, user, sku string) Reply {
	var r Reply
	for try := 0; try < i7Retries && ctx.Err() == nil; try++ {
		r = cl.Buy(ctx, user, sku, 1, "i7")
		if r.Status != 0 && r.Status < 500 {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r
}

// BacklogPoint is the pipeline's backlog at a moment of a run.
type BacklogPoint struct {
	At time.Duration // since the sampling started
	// InFlight is the reservations accepted by the gate and not yet decided
	// by the database (queued, in the stream, or being applied).
	InFlight int64
}

// SampleBacklog records the gate's in-flight reservations of skus (HLEN of
// their res hashes, read through c) every period until the returned
// function is called, which returns the samples. It is how a run shows that
// the consumer keeps up: a backlog that stays bounded.
func SampleBacklog(ctx context.Context, c rueidis.Client, gate *stockgate.Gate, skus []string, period time.Duration) (stop func() []BacklogPoint) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan []BacklogPoint, 1)
	go func() {
		var out []BacklogPoint
		start := time.Now()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			var n int64
			for _, sku := range skus {
				k, err := c.Do(ctx, c.B().Hlen().Key(gate.KeysOf(sku).Res).Build()).AsInt64()
				if err != nil {
					break
				}
				n += k
			}
			if ctx.Err() == nil {
				out = append(out, BacklogPoint{At: time.Since(start), InFlight: n})
			}
			select {
			case <-ctx.Done():
				done <- out
				return
			case <-t.C:
			}
		}
	}()
	return func() []BacklogPoint {
		cancel()
		return <-done
	}
}

// targetSKUSQL finds a SKU's inventory row.
const targetSKUSQL = `SELECT count(*) FROM inventory WHERE sku_id = ?`

// CheckStores returns an error unless the checker reads the stores of the
// server that created skus: their inventory rows are in c.DB and, for the
// pipeline, their gate keys in Redis (within a few seconds). Against a
// running server (-target) given the wrong database or Redis prefix, every
// check would fail as lost orders; this says what is wrong instead.
func (c Checker) CheckStores(ctx context.Context, rc rueidis.Client, skus []string) error {
	for _, sku := range skus {
		var n int
		if err := c.DB.DB().QueryRowContext(ctx, c.DB.Rebind(targetSKUSQL), sku).Scan(&n); err != nil {
			return fmt.Errorf("loadgen: reading the sale %s from the database: %w", sku, err)
		}
		if n == 0 {
			return fmt.Errorf("loadgen: the server created the sale %s, but the database given has no row of it: give the server's own database URL", sku)
		}
		if c.Gate == nil {
			continue
		}
		for start := time.Now(); ; {
			n, err := rc.Do(ctx, rc.B().Exists().Key(c.Gate.KeysOf(sku).Meta).Build()).AsInt64()
			if err != nil {
				return fmt.Errorf("loadgen: reading the sale %s from Redis: %w", sku, err)
			}
			if n > 0 {
				break
			}
			if time.Since(start) > 5*time.Second {
				return fmt.Errorf("loadgen: the server created the sale %s, but Redis has no %s: give the server's own Redis URL and prefix", sku, c.Gate.KeysOf(sku).Meta)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

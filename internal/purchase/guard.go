package purchase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// DirectBuyer sells straight from the database (the fallback while the
// circuit breaker around Redis is open).
type DirectBuyer interface {
	BuyDirect(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error)
}

// BreakerConfig tunes the circuit breaker around the Redis gate and the
// database fallback behind it. Zero values take the defaults.
type BreakerConfig struct {
	// Window is the rolling window the error ratio is measured over (default 10s).
	Window time.Duration
	// FailureRatio opens the breaker (default 0.5) ...
	FailureRatio float64
	// MinRequests ... once the window holds at least this many answered or
	// failed calls (default 20). This many failures in a row open it too,
	// whatever the window holds before them.
	MinRequests uint32
	// CallTimeout bounds one gate call, all its attempts together (default
	// 1s). The call runs to its answer or this deadline even when the buyer
	// gives up first, so a hung Redis is counted, not hidden by cancellations.
	CallTimeout time.Duration
	// OpenFor is how long it stays open before a half-open probe (default 5s).
	OpenFor time.Duration
	// FallbackConcurrency caps database fallback purchases in flight per
	// instance (default 8); beyond it purchases get ErrBusy.
	FallbackConcurrency int
	// SettleFor is how long after the breaker closes a keyed purchase the
	// gate refuses (sold out, limit reached) also asks the
	// database for the order its Idempotency-Key made (default 30s; while
	// the breaker is open or half-open it always does). The fallback's
	// sales reach Redis through the restorer's debit (every 500 ms) or a
	// rebuild, so for a while the gate may not know a key with an order:
	// one whose answer its buyer lost, such as a commit that succeeded past
	// the request's deadline (answered 503).
	SettleFor time.Duration
	// Disabled turns the breaker off: Redis errors are returned as they are.
	Disabled bool
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Window == 0 {
		c.Window = 10 * time.Second
	}
	if c.FailureRatio == 0 {
		c.FailureRatio = 0.5
	}
	if c.MinRequests == 0 {
		c.MinRequests = 20
	}
	if c.OpenFor == 0 {
		c.OpenFor = 5 * time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = time.Second
	}
	if c.FallbackConcurrency == 0 {
		c.FallbackConcurrency = 8
	}
	if c.SettleFor == 0 {
		c.SettleFor = 30 * time.Second
	}
	return c
}

// BreakerObserver is told of breaker state changes and fallback purchases; nil is fine.
type BreakerObserver interface {
	BreakerState(state string)
}

// guard is the circuit breaker around the gate. While it is open purchases
// go to the database; before the gate serves again, every active sale is
// rebuilt in Redis from the database (the half-open probe does it), because
// the database sold units Redis does not know about.
type guard struct {
	cb         *gobreaker.CircuitBreaker[stockgate.ReserveResult]
	direct     DirectBuyer
	sem        chan struct{}
	rebuildAll func(ctx context.Context) error
	ping       func(ctx context.Context) error // checks Redis answers before the probe's rebuild; nil: none
	needSync   atomic.Bool
	// unsettledUntil (Unix ns): until then keyed refusals ask the database
	// too (see BreakerConfig.SettleFor); MaxInt64 while not closed.
	unsettledUntil atomic.Int64
	settleFor      time.Duration
	reads          chan struct{} // caps fallbackOrder's database reads in flight
	disabled       bool
	timeout        time.Duration
	log            *slog.Logger

	// The probe's rebuild (syncBeforeClosing), under mu.
	mu       sync.Mutex
	syncing  bool   // a rebuild runs
	syncErr  error  // the last rebuild's failure, for the next probe
	openings uint64 // breaker openings: a rebuild begun before one is stale
}

var errBreakerOpen = errors.New("redis circuit breaker open")

// errRebuilding answers purchases while the half-open probe's rebuild of
// Redis runs: 503 busy (excluded from the breaker's counts, so it stays
// half-open and no purchase goes to the database meanwhile).
var errRebuilding = fmt.Errorf("%w: redis is being rebuilt from the database, retry shortly", sale.ErrBusy)

// rebuildTimeout bounds the rebuild of every active sale before the breaker closes.
const rebuildTimeout = 30 * time.Second

// syncBeforeClosing is the half-open probe's first step: Redis is rebuilt
// from the database before the gate serves again. The buyer whose purchase
// is the probe waits for it only within the call's own deadline (ctx): a
// rebuild of a large catalog, or one against a Redis that is still
// unreachable, runs on in the background while purchases are answered busy
// (errRebuilding), and the next purchase after it ends either closes the
// breaker (it succeeded) or opens it again (its error is that purchase's).
// Redis is pinged first: still unreachable, the probe fails within the call
// timeout and the breaker opens again at once, so the database fallback goes
// on selling instead of a rebuild holding every purchase busy until its own
// deadline.
func (g *guard) syncBeforeClosing(ctx context.Context) error {
	g.mu.Lock()
	switch {
	case g.syncErr != nil:
		err := g.syncErr
		g.syncErr = nil
		g.mu.Unlock()
		return err
	case !g.needSync.Load():
		g.mu.Unlock()
		return nil
	case g.syncing:
		g.mu.Unlock()
		return errRebuilding
	}
	g.syncing = true
	openings := g.openings
	g.mu.Unlock()
	if g.ping != nil {
		if err := g.ping(ctx); err != nil {
			g.mu.Lock()
			g.syncing = false
			g.mu.Unlock()
			return fmt.Errorf("redis before the rebuild: %w", err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		rctx, cancel := context.WithTimeout(context.Background(), rebuildTimeout)
		err := g.rebuildAll(rctx)
		cancel()
		g.mu.Lock()
		defer g.mu.Unlock()
		g.syncing = false
		switch {
		case err != nil:
			g.syncErr = fmt.Errorf("rebuilding redis before closing the breaker: %w", err)
		case g.openings == openings:
			// No opening since it started: no database sale it missed.
			g.needSync.Store(false)
			g.log.Info("redis rebuilt from the database; gate serving again")
		}
	}()
	select {
	case <-done:
		g.mu.Lock()
		defer g.mu.Unlock()
		if err := g.syncErr; err != nil {
			g.syncErr = nil
			return err
		}
		if g.needSync.Load() {
			return errRebuilding
		}
		return nil
	case <-ctx.Done():
		return errRebuilding
	}
}

func newGuard(cfg BreakerConfig, direct DirectBuyer, rebuildAll func(ctx context.Context) error, log *slog.Logger, obs BreakerObserver) *guard {
	cfg = cfg.withDefaults()
	g := &guard{direct: direct, sem: make(chan struct{}, cfg.FallbackConcurrency), rebuildAll: rebuildAll, disabled: cfg.Disabled || direct == nil, timeout: cfg.CallTimeout, log: log,
		settleFor: cfg.SettleFor, reads: make(chan struct{}, fallbackReads)}
	bucket := cfg.Window / 10
	g.cb = gobreaker.NewCircuitBreaker[stockgate.ReserveResult](gobreaker.Settings{
		Name:         "redis-gate",
		MaxRequests:  1,
		Interval:     cfg.Window,
		BucketPeriod: bucket,
		Timeout:      cfg.OpenFor,
		// Requests counts calls still outstanding and excluded ones: the
		// ratio is over calls that ended. A window full of successes would
		// hold a dead Redis for half the window: enough failures in a row
		// (no answer in between) open it at once.
		ReadyToTrip: func(c gobreaker.Counts) bool {
			ended := c.TotalSuccesses + c.TotalFailures
			return c.ConsecutiveFailures >= cfg.MinRequests ||
				ended >= cfg.MinRequests && float64(c.TotalFailures) >= cfg.FailureRatio*float64(ended)
		},
		// Redis answered: sold out, limit reached and the like are business
		// outcomes, successes of the gate. A timeout is a failure. A call is
		// not cancelled by its buyer (see reserve), so a cancellation is
		// this process stopping: it says nothing.
		IsSuccessful: func(err error) bool { return err == nil || isBusiness(err) },
		// A sale being (re)loaded is answered by a healthy Redis: it must not
		// push purchases to the database while the rebuild runs.
		// Neither is a split sale whose buckets moved under the call, or
		// one split anew since the catalog was read, or one a newer
		// release seeded in its layout, or a Redis Cluster slot being
		// moved past the gate's retries (TRYAGAIN).
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, sale.ErrNotWarmed) ||
				errors.Is(err, sale.ErrBusy) || errors.Is(err, stockgate.ErrBucketsChanged) ||
				errors.Is(err, stockgate.ErrLayoutNewer) || stockgate.IsTryAgain(err)
		},
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if to == gobreaker.StateClosed {
				g.unsettledUntil.Store(time.Now().Add(g.settleFor).UnixNano())
			} else {
				g.unsettledUntil.Store(math.MaxInt64)
			}
			if to == gobreaker.StateOpen {
				g.mu.Lock()
				g.openings++
				g.needSync.Store(true)
				g.mu.Unlock()
			}
			log.Warn("redis circuit breaker", "from", from.String(), "to", to.String())
			if obs != nil {
				obs.BreakerState(to.String())
			}
		},
	})
	if obs != nil {
		obs.BreakerState(gobreaker.StateClosed.String())
	}
	return g
}

// State returns "closed", "half-open" or "open".
func (g *guard) State() string { return g.cb.State().String() }

// fallbackReads caps the database reads of keyed refusals in the unsettled
// window (fallbackOrder) per instance: a sold-out sale's keyed requests
// must not take the database the fallback and the rebuild need.
const fallbackReads = 16

// unsettled reports whether the database fallback may have sold orders the
// gate does not know yet: the breaker is not closed, or closed less than
// SettleFor ago (by the wall clock, as the breaker's own transitions).
func (g *guard) unsettled() bool {
	u := g.unsettledUntil.Load()
	return u != 0 && time.Now().UnixNano() < u
}

// reserve runs the gate through the breaker under the call timeout.
// errBreakerOpen means: use the database path.
//
// The call is detached from the caller's cancellation: a buyer who gives up
// after a second must not turn a Redis that never answered into an
// excluded call. It ends at its answer or its own deadline, soon after.
//
// The call's context is the clock's first wait (clock.go).
func (g *guard) reserve(ctx context.Context, c *waitClock, f func(ctx context.Context) (stockgate.ReserveResult, error)) (stockgate.ReserveResult, error) {
	if g.disabled {
		return f(ctx)
	}
	p := c.start(ctx, g.timeout)
	defer c.stop(p)
	ctx = p
	res, err := g.cb.Execute(func() (stockgate.ReserveResult, error) {
		if g.needSync.Load() {
			// The probe after an opening: Redis must learn what the
			// database sold before it gates again.
			if err := g.syncBeforeClosing(ctx); err != nil {
				return stockgate.ReserveResult{}, err
			}
		}
		return f(ctx)
	})
	switch {
	case errors.Is(err, gobreaker.ErrOpenState):
		return res, errBreakerOpen
	case errors.Is(err, gobreaker.ErrTooManyRequests):
		// Half-open: the probe is rebuilding Redis from the database. No
		// more direct sales meanwhile (each is also owed to Redis, but fewer
		// moving parts while the gate comes back): try again in a moment.
		return res, sale.ErrBusy
	}
	return res, err
}

// buyDirect sells r from the database within the concurrency cap.
func (g *guard) buyDirect(ctx context.Context, r sale.Reservation, now time.Time) (Result, error) {
	select {
	case g.sem <- struct{}{}:
		defer func() { <-g.sem }()
	default:
		return Result{}, sale.ErrBusy
	}
	o, dup, err := g.direct.BuyDirect(ctx, r, now)
	if err != nil {
		if isBusiness(err) || errors.Is(err, sale.ErrUnknownSKU) {
			return Result{}, err
		}
		return Result{}, fmt.Errorf("%w: database fallback: %v", sale.ErrUnavailable, err)
	}
	res := Result{OrderID: o.ID, Duplicate: dup, Status: o.Status}
	if dup {
		res.Order = &o
	}
	return res, nil
}

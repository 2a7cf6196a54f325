package purchase

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis/mock"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// states records the breaker's state changes.
type states struct {
	mu  sync.Mutex
	got []string
}

func (s *states) BreakerState(st string) {
	s.mu.Lock()
	s.got = append(s.got, st)
	s.mu.Unlock()
}

func (s *states) opened() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.got {
		if st == "open" {
			return true
		}
	}
	return false
}

// hung is a gate call to a Redis that never answers.
func hung(ctx context.Context) (stockgate.ReserveResult, error) {
	<-ctx.Done()
	return stockgate.ReserveResult{}, ctx.Err()
}

func rebuildNothing(context.Context) error { return nil }

// TestGuardCountsHungCallsWhoseBuyersGaveUp: every buyer gives up after
// 20 ms on a Redis that never answers. The gate calls still end at their own
// deadline as failures, so the breaker opens: cancellations do not hide
// the hang.
func TestGuardCountsHungCallsWhoseBuyersGaveUp(t *testing.T) {
	obs := &states{}
	g := newGuard(BreakerConfig{CallTimeout: 100 * time.Millisecond}, directNone{}, rebuildNothing, slog.New(slog.NewTextHandler(io.Discard, nil)), obs)
	var wg sync.WaitGroup
	for range 25 {
		wg.Go(func() {
			// The buyer disconnects (a cancellation, not a deadline).
			ctx, cancel := context.WithCancel(context.Background())
			defer time.AfterFunc(20*time.Millisecond, cancel).Stop()
			_, _ = g.reserve(ctx, newWaitClock(), hung)
		})
	}
	wg.Wait()
	if !obs.opened() {
		t.Fatalf("breaker %s after 25 hung calls, want open", g.State())
	}
	if _, err := g.reserve(context.Background(), newWaitClock(), hung); !errors.Is(err, errBreakerOpen) {
		t.Fatalf("call while open: %v, want errBreakerOpen", err)
	}
}

// TestGuardOpensDespiteAFullWindow: a window full of successes does not
// hold the breaker closed once Redis fails every call: MinRequests
// failures in a row open it. Business outcomes are successes, never trips.
func TestGuardOpensDespiteAFullWindow(t *testing.T) {
	obs := &states{}
	g := newGuard(BreakerConfig{}, directNone{}, rebuildNothing, slog.New(slog.NewTextHandler(io.Discard, nil)), obs)
	ok := func(context.Context) (stockgate.ReserveResult, error) { return stockgate.ReserveResult{}, nil }
	soldOut := func(context.Context) (stockgate.ReserveResult, error) {
		return stockgate.ReserveResult{}, sale.ErrSoldOut
	}
	down := func(context.Context) (stockgate.ReserveResult, error) {
		return stockgate.ReserveResult{}, errors.New("dial tcp: connection refused")
	}
	for range 1000 {
		_, _ = g.reserve(context.Background(), newWaitClock(), ok)
		_, _ = g.reserve(context.Background(), newWaitClock(), soldOut)
	}
	for i := range 19 {
		if _, _ = g.reserve(context.Background(), newWaitClock(), down); obs.opened() {
			t.Fatalf("opened after %d failures, want 20", i+1)
		}
	}
	_, _ = g.reserve(context.Background(), newWaitClock(), down)
	if !obs.opened() {
		t.Fatalf("breaker %s after 20 failures in a row", g.State())
	}
}

// TestGuardSlotMoveIsNotAFailure: a Redis Cluster slot being moved answers
// TRYAGAIN past the gate's retries; a healthy Redis answered, so however
// many purchases meet it the breaker stays closed (no sale goes to the
// database for a reshard), and each is an error the buyer retries.
func TestGuardSlotMoveIsNotAFailure(t *testing.T) {
	obs := &states{}
	g := newGuard(BreakerConfig{MinRequests: 3}, directNone{}, rebuildNothing, slog.New(slog.NewTextHandler(io.Discard, nil)), obs)
	tryAgainErr := mock.Result(mock.RedisError("TRYAGAIN Multiple keys request during rehashing of slot")).Error()
	moving := func(context.Context) (stockgate.ReserveResult, error) {
		return stockgate.ReserveResult{}, fmt.Errorf("stockgate: reserve: %w", tryAgainErr)
	}
	for range 50 {
		if _, err := g.reserve(context.Background(), newWaitClock(), moving); !stockgate.IsTryAgain(err) {
			t.Fatalf("a purchase during a slot move: %v, want the TRYAGAIN", err)
		}
	}
	if obs.opened() {
		t.Fatalf("breaker opened on TRYAGAIN answers: %v", obs.got)
	}
}

type directNone struct{}

func (directNone) BuyDirect(context.Context, sale.Reservation, time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, errors.New("not used")
}

// openGuard returns a guard whose breaker just opened (MinRequests failures
// in a row) and turns half-open after openFor.
func openGuard(t *testing.T, obs *states, openFor time.Duration, rebuild func(context.Context) error) *guard {
	t.Helper()
	g := newGuard(BreakerConfig{CallTimeout: 100 * time.Millisecond, OpenFor: openFor, MinRequests: 3}, directNone{}, rebuild,
		slog.New(slog.NewTextHandler(io.Discard, nil)), obs)
	down := func(context.Context) (stockgate.ReserveResult, error) {
		return stockgate.ReserveResult{}, errors.New("dial tcp: connection refused")
	}
	for range 3 {
		_, _ = g.reserve(context.Background(), newWaitClock(), down)
	}
	if !obs.opened() {
		t.Fatalf("breaker %s after 3 failures", g.State())
	}
	return g
}

func okCall(context.Context) (stockgate.ReserveResult, error) {
	return stockgate.ReserveResult{OrderID: "o"}, nil
}

// reserveWithin runs one purchase's gate call and fails the test if the
// buyer is held longer than d.
func reserveWithin(t *testing.T, g *guard, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := g.reserve(context.Background(), newWaitClock(), okCall)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("the half-open probe held its buyer over %v (still waiting after %v)", d, time.Since(start))
		return nil
	}
}

// TestGuardProbeRebuildDoesNotHoldTheBuyer: the probe after an opening
// rebuilds Redis from the database before the gate serves again. When Redis
// is still unreachable that rebuild hangs until its own deadline (30 s): the
// buyer whose purchase happened to be the probe must not wait for it (a
// cluster test saw one purchase on an instance cut off from Redis get no
// answer within the client's 30 s). The buyer gets 503 busy within the call
// timeout; the rebuild goes on without them; its failure opens the breaker
// again and its success lets the next purchase close it.
func TestGuardProbeRebuildDoesNotHoldTheBuyer(t *testing.T) {
	release := make(chan error)
	rebuild := func(ctx context.Context) error {
		select {
		case err := <-release:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	obs := &states{}
	g := openGuard(t, obs, 50*time.Millisecond, rebuild)
	time.Sleep(80 * time.Millisecond) // half-open
	if err := reserveWithin(t, g, time.Second); !errors.Is(err, sale.ErrBusy) {
		t.Fatalf("probe while the rebuild runs: %v, want busy", err)
	}
	// Others meanwhile: busy too, at once, and the breaker stays half-open
	// (no purchase goes to the database while Redis is being rebuilt).
	if err := reserveWithin(t, g, time.Second); !errors.Is(err, sale.ErrBusy) || g.State() != "half-open" {
		t.Fatalf("purchase during the rebuild: %v, breaker %s; want busy, half-open", err, g.State())
	}
	// The rebuild fails: the next purchase learns it and the breaker opens.
	release <- errors.New("redis: i/o timeout")
	time.Sleep(20 * time.Millisecond)
	if err := reserveWithin(t, g, time.Second); err == nil || errors.Is(err, sale.ErrBusy) {
		t.Fatalf("purchase after the rebuild failed: %v, want the failure", err)
	}
	if err := reserveWithin(t, g, time.Second); !errors.Is(err, errBreakerOpen) {
		t.Fatalf("after a failed rebuild: %v, want the breaker open", err)
	}
	// Half-open again; this time the rebuild succeeds while its probe
	// waits (within the call timeout): that purchase runs and closes it.
	time.Sleep(80 * time.Millisecond)
	go func() { release <- nil }()
	if err := reserveWithin(t, g, time.Second); err != nil {
		t.Fatalf("probe whose rebuild succeeded: %v", err)
	}
	if g.State() != "closed" {
		t.Fatalf("breaker %s after a successful rebuild and probe, want closed", g.State())
	}
}

// TestGuardProbeChecksRedisFirst: with Redis still unreachable the probe's
// ping fails within the call timeout and the breaker opens again at once,
// so the database fallback goes on selling instead of answering busy.
func TestGuardProbeChecksRedisFirst(t *testing.T) {
	rebuilt := 0
	obs := &states{}
	g := openGuard(t, obs, 50*time.Millisecond, func(context.Context) error { rebuilt++; return nil })
	g.ping = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	time.Sleep(80 * time.Millisecond)
	if err := reserveWithin(t, g, time.Second); err == nil || errors.Is(err, sale.ErrBusy) {
		t.Fatalf("probe with Redis unreachable: %v, want its failure", err)
	}
	if err := reserveWithin(t, g, time.Second); !errors.Is(err, errBreakerOpen) {
		t.Fatalf("after the failed probe: %v, want the breaker open (fallback)", err)
	}
	if rebuilt != 0 {
		t.Fatalf("rebuilt %d times with Redis unreachable", rebuilt)
	}
}

package purchase

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

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

type directNone struct{}

func (directNone) BuyDirect(context.Context, sale.Reservation, time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, errors.New("not used")
}

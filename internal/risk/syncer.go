package risk

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Source is where a Syncer reads the lists: the database of record
// (*orderstore.Store).
type Source interface {
	// RiskVersion returns a counter every change of the lists steps, in
	// commit order.
	RiskVersion(ctx context.Context) (int64, error)
	// RiskEntries returns the entries live at now, of kind ("" for all).
	RiskEntries(ctx context.Context, kind string, now time.Time) ([]Entry, error)
}

// DefaultPeriod is how often a Syncer checks the database for changes
// when no notice comes: changes reach every instance within it even when a
// notice is lost.
const DefaultPeriod = time.Second

// callTimeout bounds each database call of a pass (the pool has no
// acquire timeout).
const callTimeout = 5 * time.Second

// Syncer keeps a List in step with a Source. Each pass (RunOnce) reads the
// change counter, one row, and reloads the entries only when it moved since
// the last load, or when an entry of the loaded lists has since expired
// (expired entries never block anyway; the reload drops them from memory).
// Run makes a pass every Period and at once after Notify (a change notice
// from any instance). Until its first load the List is empty: an instance
// that cannot read the database blocks nobody (fails open) and, once it has
// loaded, keeps the last lists it read.
type Syncer struct {
	list   *List
	src    Source
	log    *slog.Logger
	period time.Duration
	wake   chan struct{}

	mu      sync.Mutex // one pass at a time; guards the fields below
	loaded  bool
	version int64
	expiry  time.Time // the earliest expiry in the loaded lists; zero: none
	failing bool
}

// NewSyncer returns a Syncer loading src into list, checking every period
// (DefaultPeriod if 0 or less).
func NewSyncer(list *List, src Source, log *slog.Logger, period time.Duration) *Syncer {
	if period <= 0 {
		period = DefaultPeriod
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Syncer{list: list, src: src, log: log, period: period, wake: make(chan struct{}, 1)}
}

// List returns the List the Syncer keeps.
func (s *Syncer) List() *List { return s.list }

// Notify asks Run for a pass now (a change notice arrived). It never blocks.
func (s *Syncer) Notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// RunOnce makes one pass at now: it reloads the lists if the change counter
// moved since the last load (or nothing is loaded yet, or a loaded entry
// expired by now), and reports whether it did. On an error the List keeps
// what it held.
func (s *Syncer) RunOnce(ctx context.Context, now time.Time) (reloaded bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	v, err := s.src.RiskVersion(cctx)
	if err != nil {
		return false, err
	}
	if s.loaded && v == s.version && (s.expiry.IsZero() || now.Before(s.expiry)) {
		return false, nil
	}
	return true, s.load(ctx, v, now)
}

// Refresh reloads the lists at now whatever the change counter says.
func (s *Syncer) Refresh(ctx context.Context, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	v, err := s.src.RiskVersion(cctx)
	if err != nil {
		return err
	}
	return s.load(ctx, v, now)
}

// load reads the entries live at now and swaps them in as version v. The
// counter is read before the entries: a change committed in between makes
// the next pass reload again, never leaves it unseen.
func (s *Syncer) load(ctx context.Context, v int64, now time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	es, err := s.src.RiskEntries(ctx, "", now)
	if err != nil {
		return err
	}
	var expiry time.Time
	for _, e := range es {
		if !e.ExpiresAt.IsZero() && (expiry.IsZero() || e.ExpiresAt.Before(expiry)) {
			expiry = e.ExpiresAt
		}
	}
	s.list.Replace(es)
	s.loaded, s.version, s.expiry = true, v, expiry
	return nil
}

// Run makes a pass every period and after each Notify until ctx ends. A
// failing pass is logged once when the failures start and once when they
// end; the List keeps its last lists meanwhile.
func (s *Syncer) Run(ctx context.Context) {
	t := time.NewTicker(s.period)
	defer t.Stop()
	for {
		_, err := s.RunOnce(ctx, time.Now())
		switch {
		case err != nil && ctx.Err() == nil && !s.failing:
			s.failing = true
			s.log.WarnContext(ctx, "risk: lists not reloaded (keeping the last ones; retrying every period)", "period", s.period, "err", err)
		case err == nil && s.failing:
			s.failing = false
			s.log.InfoContext(ctx, "risk: lists reloaded again")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
		}
	}
}

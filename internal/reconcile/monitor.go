package reconcile

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"time"
)

// RunIDSource reads the Redis server's run id and keeps the monitor's
// record beside it (stockgate.Gate): the run id the sales were loaded for,
// a rebuild pending until one succeeds, and the lease of the instance
// doing it.
type RunIDSource interface {
	RunID(ctx context.Context) (string, error)
	// MarkRunID records id if another run id is recorded and then marks a
	// rebuild pending for it, leased to token; marked is true for exactly
	// one of several callers.
	MarkRunID(ctx context.Context, id, token string, lease time.Duration) (prev string, marked bool, err error)
	// ClaimRebuild returns the pending rebuild's run id ("" if none) and
	// whether token holds its lease (taken if free, renewed if token's).
	ClaimRebuild(ctx context.Context, token string, lease time.Duration) (pending string, held bool, err error)
	// EndRebuild frees token's lease, and on success clears the pending
	// mark if it still names id.
	EndRebuild(ctx context.Context, id, token string, succeeded bool) error
}

// DefaultRebuildLease is how long a rebuilder's lease lasts unless renewed
// (it is renewed every third of it while the rebuild runs): how long the
// other instances wait before they finish the rebuild of one that crashed.
const DefaultRebuildLease = 10 * time.Second

// Monitor notices a Redis that restarted (its run id changed), which may
// have come back empty or with old counters, or on a Redis Cluster a
// primary replaced by a replica that may miss its last writes (see
// stockgate Gate.RunID), and rebuilds every active sale from the database
// before the gate sells against it again. An emptied Redis
// is also refused by the gate itself (no epoch): the monitor makes the
// recovery prompt, and catches restarts that kept stale data.
//
// The instance that notices a change records the new run id and, in the
// same step, marks a rebuild pending; the mark stays until a rebuild
// succeeds. A rebuild that fails, is cancelled (SIGTERM, a start-up
// deadline) or whose instance crashes is therefore finished by the next
// pass of any instance: one at a time, by a lease that ends by itself.
type Monitor struct {
	src     RunIDSource
	rebuild func(ctx context.Context) error
	log     *slog.Logger
	token   string
	// Lease is the rebuild lease (DefaultRebuildLease if zero). Set it
	// before the first RunOnce.
	Lease time.Duration
}

// NewMonitor returns a monitor that calls rebuild (every active sale) when
// the run id changes.
func NewMonitor(src RunIDSource, rebuild func(ctx context.Context) error, log *slog.Logger) *Monitor {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Monitor{src: src, rebuild: rebuild, log: log, token: hex.EncodeToString(b[:])}
}

func (m *Monitor) lease() time.Duration {
	if m.Lease > 0 {
		return m.Lease
	}
	return DefaultRebuildLease
}

// RunOnce checks the run id once and rebuilds if this instance is the one
// that noticed the change, or if a rebuild is pending and no instance is
// doing it. It reports whether it rebuilt.
func (m *Monitor) RunOnce(ctx context.Context) (bool, error) {
	id, err := m.src.RunID(ctx)
	if err != nil {
		return false, err
	}
	// Compared with the record every pass, not with what this instance saw
	// last: an instance of the previous release puts the old run id back
	// when its rebuild fails, and may crash before it tries again.
	var pending string
	held := false
	prev, marked, err := m.src.MarkRunID(ctx, id, m.token, m.lease())
	if err != nil {
		return false, err
	}
	if marked {
		if prev == "" {
			// No run id recorded under this prefix: a deployment's first
			// start (or a Redis that lost every key, which the gate's epoch
			// check refuses to sell against anyway); either way the load
			// below is the usual one, not an alarm.
			m.log.Info("first start on this prefix (no Redis run id recorded): loading every active sale from the database", "run_id", id)
		} else {
			m.log.Warn("redis restarted, failed over or is new: rebuilding every active sale from the database", "run_id", id, "previous", prev)
		}
		pending, held = id, true
	}
	if !held {
		if pending, held, err = m.src.ClaimRebuild(ctx, m.token, m.lease()); err != nil || pending == "" || !held {
			return false, err
		}
		m.log.Warn("redis rebuild pending (the instance that began it failed, stopped or crashed): rebuilding every active sale from the database", "run_id", pending)
	}
	err = m.leased(ctx, func(ctx context.Context) error { return m.rebuild(ctx) })
	// The mark and the lease are ended even when ctx has: a lease freed
	// now lets another instance finish at once instead of after it runs out.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if eerr := m.src.EndRebuild(ectx, pending, m.token, err == nil); eerr != nil {
		m.log.Warn("redis monitor: ending the rebuild's lease (another instance rebuilds again once it runs out)", "run_id", pending, "err", eerr)
	}
	if err != nil {
		// Let the next check try again (right after a failover the
		// cluster's view may still be moving).
		m.log.Warn("redis rebuild failed: the next check of any instance tries again", "run_id", pending, "err", err)
		return false, err
	}
	return true, nil
}

// leased runs f while renewing this instance's rebuild lease every third
// of it. A renewal that finds the lease lost (it ran out, or a newer
// restart was marked) does not stop f: a second rebuild is harmless, only
// wasted work.
func (m *Monitor) leased(ctx context.Context, f func(context.Context) error) error {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(m.lease() / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if _, _, err := m.src.ClaimRebuild(ctx, m.token, m.lease()); err != nil && ctx.Err() == nil {
					m.log.Debug("redis monitor: renewing the rebuild lease", "err", err)
				}
			}
		}
	}()
	err := f(ctx)
	close(done)
	<-stopped
	return err
}

// Run checks every period until ctx is done.
func (m *Monitor) Run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := m.RunOnce(ctx); err != nil && ctx.Err() == nil {
				m.log.Debug("redis monitor", "err", err)
			}
		}
	}
}

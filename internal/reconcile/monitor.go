package reconcile

import (
	"context"
	"log/slog"
	"time"
)

// RunIDSource reads and records the Redis server's run id.
type RunIDSource interface {
	RunID(ctx context.Context) (string, error)
	SwapRunID(ctx context.Context, id string) (string, error)
}

// Monitor notices a Redis that restarted (its run id changed), which may
// have come back empty or with old counters, or on a Redis Cluster a
// primary replaced by a replica that may miss its last writes (see
// stockgate Gate.RunID), and rebuilds every active sale from the database
// before the gate sells against it again. An emptied Redis
// is also refused by the gate itself (no epoch): the monitor makes the
// recovery prompt, and catches restarts that kept stale data.
type Monitor struct {
	src     RunIDSource
	rebuild func(ctx context.Context) error
	log     *slog.Logger
	last    string
}

// NewMonitor returns a monitor that calls rebuild (every active sale) when
// the run id changes.
func NewMonitor(src RunIDSource, rebuild func(ctx context.Context) error, log *slog.Logger) *Monitor {
	return &Monitor{src: src, rebuild: rebuild, log: log}
}

// RunOnce checks the run id once and rebuilds if this instance is the one
// that noticed the change. It reports whether it rebuilt.
func (m *Monitor) RunOnce(ctx context.Context) (bool, error) {
	id, err := m.src.RunID(ctx)
	if err != nil {
		return false, err
	}
	if id == m.last {
		return false, nil
	}
	prev, err := m.src.SwapRunID(ctx, id)
	if err != nil {
		return false, err
	}
	if prev == id {
		m.last = id // another instance handled it, or nothing changed
		return false, nil
	}
	if prev == "" {
		// No run id recorded under this prefix: a deployment's first start
		// (or a Redis that lost every key, which the gate's epoch check
		// refuses to sell against anyway); either way the load below is
		// the usual one, not an alarm.
		m.log.Info("first start on this prefix (no Redis run id recorded): loading every active sale from the database", "run_id", id)
	} else {
		m.log.Warn("redis restarted, failed over or is new: rebuilding every active sale from the database", "run_id", id, "previous", prev)
	}
	if err := m.rebuild(ctx); err != nil {
		// Let the next check try again (right after a failover the
		// cluster's view may still be moving).
		m.log.Warn("redis rebuild failed: the next check tries again", "run_id", id, "err", err)
		_, _ = m.src.SwapRunID(ctx, prev)
		return false, err
	}
	m.last = id
	return true, nil
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

package reconcile_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/reconcile"
)

// runIDs is a RunIDSource whose server run id is now and whose recorded
// one is stored (pending: the run id a rebuild is pending for; no lease).
type runIDs struct {
	mu                   sync.Mutex
	now, stored, pending string
}

func (r *runIDs) RunID(context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.now, nil
}

func (r *runIDs) MarkRunID(_ context.Context, id, _ string, _ time.Duration) (string, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.stored
	if prev == id {
		return prev, false, nil
	}
	r.stored, r.pending = id, id
	return prev, true, nil
}

func (r *runIDs) ClaimRebuild(context.Context, string, time.Duration) (string, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending, r.pending != "", nil
}

func (r *runIDs) EndRebuild(_ context.Context, id, _ string, ok bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok && r.pending == id {
		r.pending = ""
	}
	return nil
}

// TestMonitorRetriesFailedRebuild: a rebuild that fails is logged as a
// warning and leaves the rebuild pending, so the next check rebuilds
// again; once one succeeds, checks stop rebuilding.
func TestMonitorRetriesFailedRebuild(t *testing.T) {
	ctx := context.Background()
	src := &runIDs{now: "a", stored: "a"}
	var calls int
	fail := errors.New("CLUSTERDOWN")
	var logs bytes.Buffer
	mon := reconcile.NewMonitor(src, func(context.Context) error {
		calls++
		if calls == 1 {
			return fail
		}
		return nil
	}, slog.New(slog.NewTextHandler(&logs, nil)))

	if rebuilt, err := mon.RunOnce(ctx); err != nil || rebuilt || calls != 0 {
		t.Fatalf("unchanged run id: rebuilt %v, %v, %d rebuilds", rebuilt, err, calls)
	}
	src.mu.Lock()
	src.now = "b" // a failover
	src.mu.Unlock()
	if rebuilt, err := mon.RunOnce(ctx); !errors.Is(err, fail) || rebuilt {
		t.Fatalf("failing rebuild: rebuilt %v, err %v", rebuilt, err)
	}
	if src.pending != "b" {
		t.Fatalf("after a failed rebuild the pending rebuild is %q, want b's", src.pending)
	}
	if !strings.Contains(logs.String(), "level=WARN msg=\"redis rebuild failed") || !strings.Contains(logs.String(), "CLUSTERDOWN") {
		t.Fatalf("the failed rebuild is not a warning with its error:\n%s", logs.String())
	}
	if rebuilt, err := mon.RunOnce(ctx); err != nil || !rebuilt || calls != 2 {
		t.Fatalf("next check: rebuilt %v, %v, %d rebuilds; want the retry", rebuilt, err, calls)
	}
	for range 3 {
		if rebuilt, err := mon.RunOnce(ctx); err != nil || rebuilt || calls != 2 {
			t.Fatalf("after the rebuild: rebuilt %v, %v, %d rebuilds", rebuilt, err, calls)
		}
	}
}

// TestMonitorFirstStart: the first check on a prefix with no recorded run
// id is a first start, logged at INFO as such (not a warning that Redis
// restarted); a later change of run id is the warning.
func TestMonitorFirstStart(t *testing.T) {
	ctx := context.Background()
	src := &runIDs{now: "a"}
	var logs bytes.Buffer
	mon := reconcile.NewMonitor(src, func(context.Context) error { return nil }, slog.New(slog.NewTextHandler(&logs, nil)))
	if rebuilt, err := mon.RunOnce(ctx); err != nil || !rebuilt {
		t.Fatalf("first start: rebuilt %v, %v; want the load", rebuilt, err)
	}
	if got := logs.String(); !strings.Contains(got, `level=INFO msg="first start on this prefix`) || strings.Contains(got, "WARN") {
		t.Errorf("first start logged:\n%s", got)
	}
	logs.Reset()
	src.mu.Lock()
	src.now = "b"
	src.mu.Unlock()
	if rebuilt, err := mon.RunOnce(ctx); err != nil || !rebuilt {
		t.Fatalf("restart: rebuilt %v, %v", rebuilt, err)
	}
	if got := logs.String(); !strings.Contains(got, `level=WARN msg="redis restarted`) {
		t.Errorf("restart logged:\n%s", got)
	}
}

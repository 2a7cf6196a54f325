package reconcile_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/flashsale/flashsale/internal/reconcile"
)

// runIDs is a RunIDSource whose server run id is now and whose recorded
// one is stored.
type runIDs struct {
	mu          sync.Mutex
	now, stored string
}

func (r *runIDs) RunID(context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.now, nil
}

func (r *runIDs) SwapRunID(_ context.Context, id string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.stored
	r.stored = id
	return prev, nil
}

// TestMonitorRetriesFailedRebuild: a rebuild that fails is logged as a
// warning and leaves the recorded run id as it was, so the next check
// rebuilds again; once one succeeds, checks stop rebuilding.
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
	if src.stored != "a" {
		t.Fatalf("after a failed rebuild the recorded run id is %q, want the previous one", src.stored)
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

package reconcile_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// restartedGate makes the gate's Redis look restarted: the server's run id
// is id from now on.
type restartedGate struct {
	*stockgate.Gate
	id atomic.Pointer[string]
}

func (g *restartedGate) RunID(ctx context.Context) (string, error) {
	if p := g.id.Load(); p != nil {
		return *p, nil
	}
	return g.Gate.RunID(ctx)
}

func (g *restartedGate) restart(id string) { g.id.Store(&id) }

// TestMonitorRebuildCancelled: the instance that noticed a restart is
// stopped (SIGTERM, the start-up deadline) in the middle of its rebuild:
// its context ends. Some later pass, of this instance's successor or of
// another instance, must still rebuild.
func TestMonitorRebuildCancelled(t *testing.T) {
	url, prefix := testenv.Redis(t)
	g := &restartedGate{Gate: stockgate.New(testenv.RedisClient(t, url), prefix)}
	log := slog.New(slog.DiscardHandler)
	ctx := t.Context()
	g.restart("run-a")
	first := reconcile.NewMonitor(g, func(context.Context) error { return nil }, log)
	if rebuilt, err := first.RunOnce(ctx); err != nil || !rebuilt {
		t.Fatalf("first check: rebuilt %v, %v", rebuilt, err)
	}

	g.restart("run-b")
	stopping, stop := context.WithCancel(ctx)
	a := reconcile.NewMonitor(g, func(ctx context.Context) error {
		stop() // SIGTERM arrives mid-rebuild
		<-ctx.Done()
		return ctx.Err()
	}, log)
	if rebuilt, err := a.RunOnce(stopping); rebuilt || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled rebuild: rebuilt %v, %v", rebuilt, err)
	}

	var rebuilds int
	count := func(context.Context) error { rebuilds++; return nil }
	b := reconcile.NewMonitor(g, count, log)    // another instance
	next := reconcile.NewMonitor(g, count, log) // the stopped one, restarted
	for range 3 {
		for _, m := range []*reconcile.Monitor{b, next} {
			if _, err := m.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rebuilds != 1 {
		t.Fatalf("after a rebuild cancelled mid-way: %d rebuilds by later passes, want 1", rebuilds)
	}
}

// crashingGate is the gate as a process sees it that crashes: once dead,
// nothing it asks reaches Redis any more.
type crashingGate struct {
	*restartedGate
	dead atomic.Bool
}

var errCrashed = errors.New("crashed")

func (g *crashingGate) RunID(ctx context.Context) (string, error) {
	if g.dead.Load() {
		return "", errCrashed
	}
	return g.restartedGate.RunID(ctx)
}

func (g *crashingGate) MarkRunID(ctx context.Context, id, token string, lease time.Duration) (string, bool, error) {
	if g.dead.Load() {
		return "", false, errCrashed
	}
	return g.restartedGate.MarkRunID(ctx, id, token, lease)
}

func (g *crashingGate) ClaimRebuild(ctx context.Context, token string, lease time.Duration) (string, bool, error) {
	if g.dead.Load() {
		return "", false, errCrashed
	}
	return g.restartedGate.ClaimRebuild(ctx, token, lease)
}

func (g *crashingGate) EndRebuild(ctx context.Context, id, token string, ok bool) error {
	if g.dead.Load() {
		return errCrashed
	}
	return g.restartedGate.EndRebuild(ctx, id, token, ok)
}

// TestMonitorRebuildCrashed: the instance that noticed a restart crashes
// in the middle of its rebuild. Another instance must still rebuild.
func TestMonitorRebuildCrashed(t *testing.T) {
	url, prefix := testenv.Redis(t)
	rg := &restartedGate{Gate: stockgate.New(testenv.RedisClient(t, url), prefix)}
	log := slog.New(slog.DiscardHandler)
	ctx := t.Context()
	rg.restart("run-a")
	if rebuilt, err := reconcile.NewMonitor(rg, func(context.Context) error { return nil }, log).RunOnce(ctx); err != nil || !rebuilt {
		t.Fatalf("first check: rebuilt %v, %v", rebuilt, err)
	}

	rg.restart("run-b")
	dying := &crashingGate{restartedGate: rg}
	crashed := make(chan struct{})
	a := reconcile.NewMonitor(dying, func(context.Context) error {
		dying.dead.Store(true) // the process is gone: its goroutine never returns
		close(crashed)
		<-t.Context().Done()
		return nil
	}, log)
	a.Lease = leaseForTest
	go func() { _, _ = a.RunOnce(ctx) }()
	<-crashed

	var rebuilds atomic.Int32
	b := reconcile.NewMonitor(rg, func(context.Context) error { rebuilds.Add(1); return nil }, log)
	b.Lease = leaseForTest
	waitFor(t, 5*leaseForTest+2*time.Second, func() bool {
		if _, err := b.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return rebuilds.Load() > 0
	})
	for range 3 {
		if _, err := b.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := rebuilds.Load(); n != 1 {
		t.Fatalf("after a crash mid-rebuild: %d rebuilds by another instance, want 1", n)
	}
}

// leaseForTest is the rebuild lease of the crash test: how long a crashed
// rebuilder holds the others off.
const leaseForTest = 300 * time.Millisecond

// waitFor checks cond every 20 ms until it holds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(within); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", within)
		}
	}
}

// TestMonitorBesideThePreviousRelease: an instance of the previous release
// noticed a restart first (its SET GET swapped the run id), and this
// release's monitors do not rebuild it again; when its rebuild fails it
// puts the old run id back (and may crash before it tries again): then a
// monitor of this release rebuilds, once.
func TestMonitorBesideThePreviousRelease(t *testing.T) {
	url, prefix := testenv.Redis(t)
	g := &restartedGate{Gate: stockgate.New(testenv.RedisClient(t, url), prefix)}
	log := slog.New(slog.DiscardHandler)
	ctx := t.Context()
	var rebuilds int
	m := reconcile.NewMonitor(g, func(context.Context) error { rebuilds++; return nil }, log)
	g.restart("run-a")
	if rebuilt, err := m.RunOnce(ctx); err != nil || !rebuilt {
		t.Fatalf("first check: rebuilt %v, %v", rebuilt, err)
	}
	rebuilds = 0

	g.restart("run-b")
	if prev, err := g.SwapRunID(ctx, "run-b"); err != nil || prev != "run-a" { // the previous release noticed first
		t.Fatalf("previous release's swap: %q %v", prev, err)
	}
	for range 3 {
		if _, err := m.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if rebuilds != 0 {
		t.Fatalf("a restart the previous release rebuilds: %d rebuilds by this release, want 0", rebuilds)
	}
	if _, err := g.SwapRunID(ctx, "run-a"); err != nil { // its rebuild failed: the old id back
		t.Fatal(err)
	}
	for range 3 {
		if _, err := m.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if rebuilds != 1 {
		t.Fatalf("after the previous release put the old run id back: %d rebuilds, want 1", rebuilds)
	}
}

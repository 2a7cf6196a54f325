package release_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/release"
	"github.com/flashsale/flashsale/internal/testenv"
)

// syncBuffer is a bytes.Buffer safe for a logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// notifyCounter is the store's notifications, counted.
type notifyCounter struct {
	st *orderstore.Store
	n  atomic.Int64
}

func (c *notifyCounter) ListenRestores(ctx context.Context, wake func()) error {
	return c.st.ListenRestores(ctx, func() { c.n.Add(1); wake() })
}

// TestListenRestores, on the dialect under test. PostgreSQL: a
// notification on flashsale_stock_changes kicks the restorer; a listening
// connection that dies is logged, kicks once (what it may have missed) and
// is replaced, whose notifications kick again; the end of ctx ends it.
// MySQL, which sends no notifications: it returns at once, kicking nothing.
func TestListenRestores(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	src := &notifyCounter{st: st}
	var kicks atomic.Int64
	var logged syncBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		release.ListenRestores(ctx, src, func() { kicks.Add(1) }, slog.New(slog.NewTextHandler(&logged, nil)))
	}()
	const hang = 30 * time.Second // only a hang fails this, never a slow machine
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(hang); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after %v (kicks %d, notifications %d)", what, hang, kicks.Load(), src.n.Load())
			}
		}
	}

	if st.Dialect() != orderstore.Postgres {
		waitFor("returned on a database without notifications", func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		})
		if n := kicks.Load(); n != 0 {
			t.Fatalf("%d kicks, want none", n)
		}
		return
	}

	// notifyUntilKicked notifies until one kicks: the listener may not be
	// listening yet when the first is sent.
	notifyUntilKicked := func(what string) {
		t.Helper()
		before := kicks.Load()
		waitFor(what, func() bool {
			if _, err := st.DB().ExecContext(ctx, `NOTIFY flashsale_stock_changes, 'sku:1'`); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			return kicks.Load() > before
		})
	}
	notifyUntilKicked("a notification kicks")

	// Kill the listening connection (its last statement was the LISTEN).
	var killed int
	if err := st.DB().QueryRowContext(ctx, `SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query = 'LISTEN flashsale_stock_changes'`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listening connections, want 1", killed)
	}
	waitFor("a kick of its own after the listening connection died", func() bool { return kicks.Load() > src.n.Load() })
	if got := kicks.Load() - src.n.Load(); got != 1 {
		t.Fatalf("%d kicks beside the notifications, want the 1 after the failure", got)
	}
	if !strings.Contains(logged.String(), "listening for stock changes made outside flashsale; polling meanwhile") {
		t.Fatalf("the failure is not logged: %q", logged.String())
	}
	notifyUntilKicked("a notification kicks after the new connection listens")

	cancel()
	waitFor("returned when its context ended", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
}

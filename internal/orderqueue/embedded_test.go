package orderqueue_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderqueue"
)

// TestEmbeddedKeepsItsStore: the embedded server stores under dir, so a
// restarted one has the stream and its messages back.
func TestEmbeddedKeepsItsStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := func() (*orderqueue.Embedded, *orderqueue.Queue) {
		t.Helper()
		e, err := orderqueue.StartEmbedded(dir, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := e.Connect("test")
		if err != nil {
			e.Shutdown()
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		q, err := orderqueue.Open(context.Background(), nc, orderqueue.Config{})
		if err != nil {
			e.Shutdown()
			t.Fatal(err)
		}
		return e, q
	}
	e, q := open()
	publishAll(t, q, message(resv("k", 1)), message(resv("k", 2)))
	e.Shutdown()

	e, q = open()
	defer e.Shutdown()
	statsUntil(t, q, "after a restart: want the 2 messages, undelivered", func(st orderqueue.Stats) bool { return st.Messages == 2 && st.Pending == 2 })
}

// TestEmbeddedRefusesASharedDataDir: a second embedded server on the data
// directory one already uses (another flashsale serve with the same
// -data-dir) is refused with ErrDataDirInUse, naming the directory and the
// two ways out; once the first shuts down, the directory is free again.
func TestEmbeddedRefusesASharedDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := orderqueue.StartEmbedded(dir, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := orderqueue.StartEmbedded(dir, false, nil)
	if err == nil {
		second.Shutdown()
		first.Shutdown()
		t.Fatal("second embedded server on the same data directory started, want ErrDataDirInUse")
	}
	if !errors.Is(err, orderqueue.ErrDataDirInUse) {
		t.Errorf("second start: %v, want ErrDataDirInUse", err)
	}
	for _, want := range []string{dir, "-data-dir", "FLASHSALE_DATA_DIR", "-nats-url"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("second start: %q lacks %q", err, want)
		}
	}
	first.Shutdown()
	again, err := orderqueue.StartEmbedded(dir, false, nil)
	if err != nil {
		t.Fatalf("start after the first shut down: %v", err)
	}
	again.Shutdown()
}

// TestEmbeddedRestartsOnlyForWriteErrors: the watcher restarts the server
// for a stream's store write error, the failure it exists for, and for
// nothing else the server's health check reports. A stream whose directory
// is on disk but not (yet) open reads as "could not be recovered": that is
// what the check sees while a stream is being created, a window that a
// loaded machine widens; a restart then would fail the creation it
// interrupts (the instance's start, "event stream: context deadline
// exceeded"). Here the directory stays, so the watcher sees it every tick.
func TestEmbeddedRestartsOnlyForWriteErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	e, q := startEmbeddedQueue(t, dir)
	streams, err := filepath.Glob(filepath.Join(dir, "nats", "jetstream", "*", "streams"))
	if err != nil || len(streams) != 1 {
		t.Fatalf("the store's streams directory: %v %v", streams, err)
	}
	if err := os.MkdirAll(filepath.Join(streams[0], "HALF_CREATED"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Several of the watcher's ticks.
	time.Sleep(6 * orderqueue.HealthEvery)
	if n := e.Restarts(); n != 0 {
		t.Errorf("the watcher restarted the server %d times for a stream that is not open", n)
	}
	if err := e.Health(); err != nil {
		t.Errorf("health %v, want nil: every open stream can store", err)
	}
	publishAll(t, q, message(resv("k", 1)))
}

// startEmbeddedQueue starts an embedded server on dir and opens the queue
// on it; both are closed on Cleanup.
func startEmbeddedQueue(t *testing.T, dir string) (*orderqueue.Embedded, *orderqueue.Queue) {
	t.Helper()
	e, err := orderqueue.StartEmbedded(dir, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	nc, err := e.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := orderqueue.Open(context.Background(), nc, orderqueue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return e, q
}

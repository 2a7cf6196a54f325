package orderqueue_test

import (
	"context"
	"errors"
	"strings"
	"testing"

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

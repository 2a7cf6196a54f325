package orderqueue_test

import (
	"context"
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

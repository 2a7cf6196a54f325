package orderqueue_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestEmbeddedDiskFull: the embedded server's store fills its disk, so
// publishes fail; once the disk has room again the stream accepts messages
// by itself, and every message it acknowledged before the fault is still in
// it. nats-server keeps a store write error on the stream until the stream
// is reopened: before the embedded server restarted itself on it, the
// stream refused every publish after the first failed write, for good.
func TestEmbeddedDiskFull(t *testing.T) {
	dir := testenv.SmallDisk(t, 8<<20)
	e, q := startEmbeddedQueue(t, dir)
	data := make([]byte, 8<<10)
	n := 0
	publish := func() error {
		n++
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return q.Publish(ctx, []orderqueue.Message{{ID: fmt.Sprintf("m-%d", n), SKU: "k", Data: data}})[0]
	}
	acked := 0
	for range 4 {
		if err := publish(); err != nil {
			t.Fatalf("publish before the disk filled: %v", err)
		}
		acked++
	}
	filler := testenv.Fill(t, dir, 256<<10)
	var failed error
	for range 200 {
		if failed = publish(); failed != nil {
			break
		}
		acked++
	}
	if failed == nil {
		t.Fatal("the stream took 200 messages of 8 KiB on a full disk: the test proves nothing")
	}
	t.Logf("disk full after %d messages: %v", acked, failed)
	if err := e.Health(); err == nil {
		t.Error("Health: nil while the store cannot write")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	for {
		err := publish()
		if err == nil {
			acked++
			break
		}
		if time.Since(freed) > 20*time.Second {
			t.Fatalf("the stream still refuses publishes 20s after the disk was freed: %v", err)
		}
	}
	t.Logf("publishing again %v after the disk was freed", time.Since(freed).Round(10*time.Millisecond))
	for deadline := time.Now().Add(5 * time.Second); e.Health() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Health 5s after the recovery: %v", e.Health())
		}
	}
	if e.Restarts() == 0 {
		t.Error("the stream accepts again without a restart: the test proves nothing")
	}
	statsUntil(t, q, fmt.Sprintf("after the recovery: every acknowledged message (%d) in the stream", acked),
		func(st orderqueue.Stats) bool { return st.Messages >= uint64(acked) })
}

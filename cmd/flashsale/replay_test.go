package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/orderqueue"
)

// TestDuplicatesAndReplayApplyOnce: every message published a second time
// under a new message id (so the broker cannot de-duplicate it), and then the
// whole stream replayed from the start through the consumer, change nothing.
func TestDuplicatesAndReplayApplyOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("r", 30, 2)
	var accepted []string
	for i := 0; i < 40; i++ {
		if r := h.buy(fmt.Sprintf("u%d", i), "r", 1+i%2, ""); r.Status == http.StatusAccepted {
			accepted = append(accepted, r.str("order_id"))
		}
	}
	settle(t, h.a, "r", accepted, 20*time.Second)
	before := snapshot(t, h, "r")
	ctx := context.Background()
	js := h.a.queue.JetStream()

	// Read the whole stream with an ordered consumer.
	var msgs []jetstream.Msg
	oc, err := js.OrderedConsumer(ctx, orderqueue.StreamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := oc.Fetch(len(accepted), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != len(accepted) {
		t.Fatalf("stream holds %d messages, %d accepted", len(msgs), len(accepted))
	}

	// 1. Publish each again under a new id: the broker stores it, the consumer
	// gets it, the idempotency log refuses it.
	for i, m := range msgs {
		if _, err := js.Publish(ctx, m.Subject(), m.Data(), jetstream.WithMsgID(fmt.Sprintf("dup-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := h.a.queue.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 && st.AckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("duplicates not consumed: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// 2. Replay the original messages straight through the consumer's batch handler.
	c := apply.New(h.a.store, h.a.gate, h.a.queue, slog.New(slog.DiscardHandler), nil, apply.Config{})
	c.Handle(ctx, msgs)

	settle(t, h.a, "r", accepted, 10*time.Second)
	after := snapshot(t, h, "r")
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("duplicates or replay changed state (-before +after):\n%s", diff)
	}
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/orderqueue"
)

// TestRefusedCompensatedOnce: Redis admits more than the database holds (its
// counter was raised behind the service's back). The database refuses the
// excess: those orders end failed, and their units and buyer slots go back
// to Redis exactly once, even when every message is delivered again.
func TestRefusedCompensatedOnce(t *testing.T) {
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("c", 10, 1)
	ctx := context.Background()
	c := h.a.redis
	if err := c.Do(ctx, c.B().Hincrby().Key(h.a.gate.KeysOf("c").Meta).Field("avail").Increment(3).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var accepted []string
	for i := 0; i < 20; i++ {
		if r := h.buy(fmt.Sprintf("u%d", i), "c", 1, ""); r.Status == http.StatusAccepted {
			accepted = append(accepted, r.str("order_id"))
		}
	}
	if len(accepted) != 13 {
		t.Fatalf("%d accepted, want 13 (10 real + 3 phantom units)", len(accepted))
	}
	check := func(when string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			rep := (&checker{t: t, a: h.a}).check("c", accepted, false)
			if rep.InFlight == 0 && rep.Orders == 13 {
				if rep.LiveOrders != 10 || rep.FailedOrders != 3 || rep.DBStock != 0 || rep.RedisAvailable != 3 || !rep.OK() {
					t.Fatalf("%s: %+v", when, rep)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not settled: %+v", when, rep)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// Refused buyers got their slot back: each may buy again (and finds the 3 units).
		var failedUsers []string
		rows, _ := h.a.store.Pool().Query(ctx, `SELECT user_id FROM orders WHERE sku_id='c' AND status='failed'`)
		for rows.Next() {
			var u string
			_ = rows.Scan(&u)
			failedUsers = append(failedUsers, u)
		}
		rows.Close()
		for _, u := range failedUsers {
			if held, _ := h.a.gate.Held(ctx, "c", u); held != 0 {
				t.Fatalf("%s: refused buyer %s still holds %d in redis", when, u, held)
			}
		}
	}
	check("after the first delivery")

	// Deliver every message again through the consumer: nothing moves.
	oc, err := h.a.queue.JetStream().OrderedConsumer(ctx, orderqueue.StreamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := oc.Fetch(100, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	apply.New(h.a.store, h.a.gate, h.a.queue, slog.New(slog.DiscardHandler), nil, apply.Config{}).Handle(ctx, msgs)
	check("after every message was delivered again")
}

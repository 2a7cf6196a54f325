package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
)

// TestRefusedCompensatedOnce: Redis admits more than the database holds (its
// counter was raised behind the service's back). The database refuses the
// excess: those orders end failed, and their units and buyer slots go back
// to Redis exactly once, even when every message is delivered again.
func TestRefusedCompensatedOnce(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("c", 10, 1)
	ctx := context.Background()
	c := h.a.redis
	if err := c.Do(ctx, c.B().Hincrby().Key(h.a.gate.KeysOf("c").Meta).Field("avail").Increment(3).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// 13 buyers take the 10 real and 3 phantom units. (More buyers could
	// take the phantom units again once given back: the count would depend
	// on timing.)
	var accepted []string
	for i := 0; i < 13; i++ {
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
		rows, _ := h.a.store.DB().QueryContext(ctx, `SELECT user_id FROM orders WHERE sku_id='c' AND status='failed'`)
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

// TestDirectSaleReachesRedis: a sale made by the database fallback (here
// straight through the store, as another instance with an open breaker
// would) is owed to Redis and taken there once: Redis and the database agree.
func TestDirectSaleReachesRedis(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("ds", 10, 2)
	ctx := context.Background()
	r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: "ds", User: "dora", Quantity: 2, AcceptedAt: time.Now().UnixMilli()}
	if _, _, err := h.a.store.BuyDirect(ctx, r, time.Now()); err != nil {
		t.Fatal(err)
	}
	rep := settle(t, h.a, "ds", []string{r.OrderID}, 10*time.Second)
	if rep.RedisAvailable != 8 || rep.DBStock != 8 {
		t.Fatalf("after a direct sale: %+v", rep)
	}
	if held, _ := h.a.gate.Held(ctx, "ds", "dora"); held != 2 {
		t.Fatalf("redis says dora holds %d, want 2", held)
	}
	if b := h.buy("dora", "ds", 1, ""); b.code() != "limit_reached" {
		t.Fatalf("dora buys past her limit: %d %s", b.Status, b.Raw)
	}
	// A reduction while the sale is not loaded is refused, never guessed.
	if err := h.a.gate.Fence(ctx, "ds"); err != nil {
		t.Fatal(err)
	}
	if p := h.putSKU("ds", `{"stock":5,"per_user_limit":2}`); p.Status != http.StatusServiceUnavailable {
		t.Fatalf("reduction while unloaded: %d %s", p.Status, p.Raw)
	}
}

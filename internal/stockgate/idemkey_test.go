package stockgate_test

import (
	"context"
	"testing"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

func keyed(sku, user, key string) sale.Reservation {
	r := res(sku, user, 1)
	r.IdempotencyKey = key
	return r
}

// keyNames returns the order the gate answers a retry of user's key with ("" if none).
func keyNames(t *testing.T, g *stockgate.Gate, sku, user, key string) string {
	t.Helper()
	id, _, err := g.Duplicate(context.Background(), sku, user, key)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestKeyRetryIsNotRateLimited: a retry of an Idempotency-Key that made an
// order gets that order back even while the user's rate limit refuses
// new purchases.
func TestKeyRetryIsNotRateLimited(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 100, 100)
	l := stockgate.Limits{User: stockgate.Rate{PerSecond: 1, Burst: 1}}
	first := keyed("s", "u", "click")
	if _, err := g.ReserveLimited(ctx, first, l); err != nil {
		t.Fatal(err)
	}
	if _, err := g.ReserveLimited(ctx, res("s", "u", 1), l); err == nil {
		t.Fatal("the second purchase within the limit's interval was admitted")
	}
	got, err := g.ReserveLimited(ctx, keyed("s", "u", "click"), l)
	if err != nil || !got.Duplicate || got.OrderID != first.OrderID {
		t.Fatalf("retry of the key: %+v, %v; want a duplicate of %s", got, err, first.OrderID)
	}
}

// TestKeyFollowsTheDatabase: the gate's record of an Idempotency-Key ends
// naming the order the database kept: a reservation refused because its key
// had made another order (duplicate_key) points the key at that order as its
// units go back; a direct sale's debit records its key; a reseed records
// the keys of reservations in flight.
func TestKeyFollowsTheDatabase(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 5)

	queued := keyed("s", "u1", "click")
	if _, err := g.Reserve(ctx, queued); err != nil {
		t.Fatal(err)
	}
	const direct = "0190a1b2-0000-7000-8000-00000000d1ec"
	units, err := g.Finalize(ctx, "s", []stockgate.Outcome{{OrderID: queued.OrderID, Refused: true, KeyOrderID: direct}})
	if err != nil || units != 1 {
		t.Fatalf("finalize: %d units back, %v; want 1", units, err)
	}
	if id := keyNames(t, g, "s", "u1", "click"); id != direct {
		t.Errorf("after the refusal the key names %q, want the kept order %s", id, direct)
	}

	// A direct sale of u2 with a key: its debit records the key.
	sold := "0190a1b2-0000-7000-8000-00000000d1ed"
	if _, err := g.Restore(ctx, "s", []stockgate.Release{{OrderID: "sale-" + sold, User: "u2", Quantity: -1,
		IdempotencyKey: "k2", KeyOrderID: sold}}); err != nil {
		t.Fatal(err)
	}
	if id := keyNames(t, g, "s", "u2", "k2"); id != sold {
		t.Errorf("after the debit the key names %q, want %s", id, sold)
	}
	if r, err := g.Reserve(ctx, keyed("s", "u2", "k2")); err != nil || !r.Duplicate || r.OrderID != sold {
		t.Errorf("a retry through the gate: %+v, %v; want the direct sale %s", r, err, sold)
	}

	// Redis lost the sale: the reseed from the database and the in-flight
	// reservations restores their keys (the database's order wins).
	inflight := keyed("s", "u3", "k3")
	other := keyed("s", "u4", "k4")
	if _, err := g.Reserve(ctx, inflight); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reserve(ctx, other); err != nil {
		t.Fatal(err)
	}
	f, err := g.ReadInFlight(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	g2, c2 := newGate(t) // an empty prefix: the data is gone
	_ = c2
	dbKeys := map[string]string{"u4\x00k4": "0190a1b2-0000-7000-8000-0000000000db"}
	if ok, err := g2.Seed(ctx, "s", stockgate.Config{PerUserLimit: 5}, 5, nil, f.Reservations, nil, dbKeys, "e2"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if id := keyNames(t, g2, "s", "u3", "k3"); id != inflight.OrderID {
		t.Errorf("after the reseed u3's key names %q, want the reservation in flight %s", id, inflight.OrderID)
	}
	if id := keyNames(t, g2, "s", "u4", "k4"); id != dbKeys["u4\x00k4"] {
		t.Errorf("after the reseed u4's key names %q, want the database's order", id)
	}
}

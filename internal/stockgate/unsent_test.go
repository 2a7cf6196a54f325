package stockgate_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// TestUnsent: a reservation is unsent (its payload and bucket returned)
// from its acceptance until the stream acknowledged it (the relay's
// Unqueue), and for a split sale it is found in the buyer's home bucket,
// whichever bucket that is.
func TestUnsent(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "one", 10, 5)
	seedSplit(t, g, "split", 4, 40, 5)
	for _, tc := range []struct {
		sku string
		k   int
	}{{"one", 1}, {"split", 4}} {
		for _, user := range []string{"u1", "u2", "u3", "u4", "u5"} {
			r := keyed(tc.sku, user, "k")
			got, err := g.ReserveIn(ctx, r, stockgate.Limits{}, tc.k)
			if err != nil || got.Duplicate {
				t.Fatalf("%s %s: reserve %+v %v", tc.sku, user, got, err)
			}
			home := stockgate.HomeName(tc.sku, user, tc.k)
			p, bucket, err := g.Unsent(ctx, tc.sku, user, r.OrderID)
			var back sale.Reservation
			if err != nil || bucket != home || json.Unmarshal(p, &back) != nil || back.OrderID != r.OrderID {
				t.Fatalf("%s %s: unsent %q %q %v, want its payload in %s", tc.sku, user, p, bucket, err, home)
			}
			if err := g.Unqueue(ctx, home, r.OrderID); err != nil {
				t.Fatal(err)
			}
			if p, _, err := g.Unsent(ctx, tc.sku, user, r.OrderID); err != nil || p != nil {
				t.Fatalf("%s %s: unsent after the stream's ack: %q %v, want none", tc.sku, user, p, err)
			}
		}
	}
	if p, _, err := g.Unsent(ctx, "never-loaded", "u1", "no-such-order"); err != nil || p != nil {
		t.Fatalf("unknown sale: %q %v", p, err)
	}
}

package reconcile_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// streamHolds is the queue as a rebuild reads it: the reservations the
// stream holds unacknowledged.
type streamHolds []sale.Reservation

func (q streamHolds) Unapplied(context.Context, string) ([]sale.Reservation, error) { return q, nil }

func newGate(t *testing.T) *stockgate.Gate {
	t.Helper()
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	return stockgate.New(c, prefix)
}

// TestRebuildRestoresKeysInFlight: Redis lost its data while reservations
// with an Idempotency-Key were in flight (in the stream, not yet applied).
// The rebuild re-records them and their keys, so a retry of each key is
// answered with its reservation instead of making a second one; a key whose
// order the database holds names that order.
func TestRebuildRestoresKeysInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	store, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := store.PutSKU(ctx, orderstore.SKUChange{ID: "rb", TotalStock: 10, PerUserLimit: 2}); err != nil {
		t.Fatal(err)
	}
	keyed := func(user, key string) sale.Reservation {
		return sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: "rb", User: user, Quantity: 1,
			AcceptedAt: time.Now().UnixMilli(), IdempotencyKey: key}
	}
	applied, flying := keyed("ann", "a1"), keyed("bob", "b1")
	if _, err := store.ApplyBatch(ctx, []sale.Reservation{applied}); err != nil {
		t.Fatal(err)
	}

	gate := newGate(t) // a Redis that lost everything
	s := reconcile.NewSyncer(store, gate, streamHolds{applied, flying}, slog.New(slog.DiscardHandler))
	if _, err := s.Rebuild(ctx, "rb"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, key, want string
	}{{"ann", "a1", applied.OrderID}, {"bob", "b1", flying.OrderID}} {
		got, err := gate.Reserve(ctx, keyed(c.user, c.key))
		if err != nil || !got.Duplicate || got.OrderID != c.want {
			t.Errorf("%s retrying %s after the rebuild: %+v, %v; want a duplicate of %s", c.user, c.key, got, err, c.want)
		}
	}
	if n, ok, err := gate.Available(ctx, "rb"); err != nil || !ok || n != 8 {
		t.Errorf("available after the rebuild and the retries: %d (loaded %v, %v), want 8", n, ok, err)
	}
}

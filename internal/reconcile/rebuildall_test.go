package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// manySKUs creates n SKUs of 10 units in the database only (Redis knows
// nothing of them: as after a Redis that came back empty), and publishes a
// reservation of 2 units to the order stream for every tenth, not applied.
// It returns the ids and the units in flight per SKU.
func manySKUs(t testing.TB, e *env, q *orderqueue.Queue, n int) ([]string, map[string]int64) {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("M%05d", i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan string)
	for range 8 {
		wg.Go(func() {
			for id := range next {
				if _, _, _, err := e.store.PutSKU(ctx, orderstore.SKUChange{ID: id, TotalStock: 10, PerUserLimit: 5}); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	inflight := map[string]int64{}
	var msgs []orderqueue.Message
	for i := 0; i < n; i += 10 {
		r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: ids[i], User: "u", Quantity: 2, AcceptedAt: time.Now().UnixMilli()}
		data, _ := json.Marshal(r)
		msgs = append(msgs, orderqueue.Message{ID: r.OrderID, SKU: r.SKU, Data: data})
		inflight[r.SKU] = 2
	}
	for _, err := range q.Publish(ctx, msgs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids, inflight
}

func openTestQueue(t testing.TB) (*orderqueue.Queue, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := orderqueue.Open(context.Background(), nc, orderqueue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return q, js
}

// TestRebuildAllManySKUs: a rebuild of 3,000 SKUs reads the stream's
// in-flight reservations once (no consumer per SKU is left on the broker)
// and is exact: every SKU has its database stock less the units the stream
// holds unapplied for it, and those reservations are in flight in Redis.
func TestRebuildAllManySKUs(t *testing.T) {
	if testing.Short() {
		t.Skip("3,000 SKUs")
	}
	e := newEnv(t)
	q, js := openTestQueue(t)
	ids, inflight := manySKUs(t, e, q, 3000)
	s := reconcile.NewSyncer(e.store, e.gate, q, e.log)
	start := time.Now()
	res, err := s.RebuildAll(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rebuilt %d SKUs in %v", len(res), time.Since(start))
	if len(res) != len(ids) {
		t.Fatalf("%d results for %d SKUs", len(res), len(ids))
	}
	for _, id := range ids {
		f, err := e.gate.ReadInFlight(t.Context(), id)
		if err != nil || !f.Loaded {
			t.Fatalf("%s: %+v %v", id, f, err)
		}
		if want := 10 - inflight[id]; f.Available != want || f.Units() != inflight[id] {
			t.Fatalf("%s: %d available, %d in flight; want %d and %d", id, f.Available, f.Units(), want, inflight[id])
		}
	}
	st, err := js.Stream(t.Context(), orderqueue.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers > 2 {
		t.Fatalf("%d consumers on the order stream after the rebuild, want only the 2 durables", info.State.Consumers)
	}
}

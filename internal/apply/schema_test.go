package apply_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// countingStore applies everything and counts the applies of each order.
type countingStore struct {
	mu      sync.Mutex
	applied map[string]int
}

func (s *countingStore) ApplyBatch(_ context.Context, rs []sale.Reservation) ([]orderstore.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]orderstore.Outcome, len(rs))
	for i, r := range rs {
		s.applied[r.OrderID]++
		out[i] = orderstore.Outcome{OrderID: r.OrderID, Status: sale.StatusPendingPayment}
	}
	return out, nil
}
func (s *countingStore) Ping(context.Context) error { return nil }

func (s *countingStore) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied[id]
}

// TestUnknownSchemaVersionWaits: on a real JetStream, a message of schema
// version 99 (a newer release's) is never acked, dead-lettered or applied by
// a consumer that knows only version 1, however often it is delivered, and
// each delivery is counted in flashsale_messages_unknown_version_total;
// messages of version 1, with the header or without it (the previous
// release's), are applied meanwhile. A consumer that knows version 99 then
// applies it exactly once.
func TestUnknownSchemaVersionWaits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	q, err := orderqueue.Open(ctx, nc, orderqueue.Config{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	res := func(n byte) sale.Reservation {
		return sale.Reservation{OrderID: "01890000-0000-7000-8000-00000000000" + string('0'+n), SKU: "s", User: "u", Quantity: 1, AcceptedAt: 1}
	}
	v1, bare, v99 := res(1), res(2), res(3)
	data := func(r sale.Reservation) []byte { b, _ := json.Marshal(r); return b }
	if errs := q.Publish(ctx, []orderqueue.Message{{ID: v1.OrderID, SKU: v1.SKU, Data: data(v1)}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	js := q.JetStream()
	// The previous release publishes no header.
	if _, err := js.Publish(ctx, orderqueue.SubjectPrefix+"s", data(bare), jetstream.WithMsgID(bare.OrderID)); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(orderqueue.SubjectPrefix + "s")
	m.Data = data(v99)
	m.Header.Set(orderqueue.SchemaHeader, "99")
	if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(v99.OrderID)); err != nil {
		t.Fatal(err)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := &countingStore{applied: map[string]int{}}
	met := metrics.New()
	dl := &dead{}
	cfg := apply.Config{UnknownDelay: 100 * time.Millisecond, MaxDeliver: 1, Backoff: []time.Duration{10 * time.Millisecond}}
	run := func(cfg apply.Config) (stop func()) {
		c := apply.New(st, gate{}, dl, log, met, cfg)
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Run(rctx, q.Consumer())
		}()
		return func() { rcancel(); <-done }
	}

	stop := run(cfg)
	unknown := func() float64 { return counterValue(t, met, "flashsale_messages_unknown_version_total") }
	until(t, "version 1 applied and version 99 delivered 4 times", func() bool {
		return st.count(v1.OrderID) == 1 && st.count(bare.OrderID) == 1 && unknown() >= 4
	})
	stop()
	if n := st.count(v99.OrderID); n != 0 {
		t.Errorf("version 99 applied %d times by a consumer that does not know it", n)
	}
	if dl.n != 0 {
		t.Errorf("%d dead letters, want none", dl.n)
	}
	ci, err := q.Consumer().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if waiting := ci.NumPending + uint64(ci.NumAckPending); waiting != 1 {
		t.Errorf("messages not acked = %d, want 1 (the version 99)", waiting)
	}
	if ci.AckFloor.Stream != 2 {
		t.Errorf("ack floor %d, want 2 (both version 1 messages acked, the version 99 not)", ci.AckFloor.Stream)
	}

	// An instance that knows version 99 (here: decoded as version 1) applies it.
	before := unknown()
	schemas := apply.DefaultSchemas()
	schemas[99] = apply.DecodeV1
	cfg.Schemas = schemas
	stop = run(cfg)
	defer stop()
	until(t, "version 99 applied and acked", func() bool {
		ci, err := q.Consumer().Info(ctx)
		return err == nil && st.count(v99.OrderID) == 1 && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	if n := st.count(v99.OrderID); n != 1 {
		t.Errorf("version 99 applied %d times, want 1", n)
	}
	if d := unknown() - before; d != 0 {
		t.Errorf("unknown-version deliveries grew by %v under a consumer that knows it", d)
	}
}

// counterValue reads the counter name from m's registry.
func counterValue(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

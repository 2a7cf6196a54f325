package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
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
	q := openQueue(ctx, t, time.Second)
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
		return running(ctx, apply.New(st, gate{}, dl, log, met, cfg), q)
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

// poisonStore is countingStore that fails, deterministically, every batch
// holding the order poison.
type poisonStore struct {
	countingStore
	poison string
}

func (s *poisonStore) ApplyBatch(ctx context.Context, rs []sale.Reservation) ([]orderstore.Outcome, error) {
	for _, r := range rs {
		if r.OrderID == s.poison {
			return nil, errors.New("poison")
		}
	}
	return s.countingStore.ApplyBatch(ctx, rs)
}

// TestSchema2MessageDecidedPerReservation: on a real JetStream, a schema 2
// message carrying five reservations, one of which does not validate and
// one of which the database always refuses, has its three others applied,
// each bad one dead-lettered alone (as a version 1 dead letter holding its
// own payload, so that a replay or discard reads it as every release
// does: the poisoned one at its MaxDeliver-th failure, the invalid one at
// once), and is then acked: nothing waits on the stream.
func TestSchema2MessageDecidedPerReservation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := openQueue(ctx, t, time.Second)
	q.SetPublishSchema(orderqueue.SchemaBatch)
	res := func(n int) sale.Reservation {
		return sale.Reservation{OrderID: fmt.Sprintf("01890000-0000-7000-8000-%012d", n), SKU: "s", User: fmt.Sprintf("u%d", n), Quantity: 1, AcceptedAt: 1}
	}
	good := []sale.Reservation{res(1), res(2), res(4)}
	poison := res(3)
	var msgs []orderqueue.Message
	for _, r := range []sale.Reservation{good[0], good[1], poison, good[2]} {
		b, _ := json.Marshal(r)
		msgs = append(msgs, orderqueue.Message{ID: r.OrderID, SKU: r.SKU, Data: b})
	}
	invalid := []byte(`{"order_id":"01890000-0000-7000-8000-000000000009","sku_id":"s"}`) // no user, no quantity
	msgs = append(msgs, orderqueue.Message{ID: "invalid", SKU: "s", Data: invalid})
	// Two without an order id: two dead letters, not one taken for the other's copy.
	noID1, noID2 := []byte(`{"sku_id":"s","user_id":"a"}`), []byte(`{"sku_id":"s","user_id":"b"}`)
	msgs = append(msgs, orderqueue.Message{ID: "no-id-1", SKU: "s", Data: noID1}, orderqueue.Message{ID: "no-id-2", SKU: "s", Data: noID2})
	for i, err := range q.Publish(ctx, msgs) {
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if si, err := q.JetStream().Stream(ctx, orderqueue.StreamName); err != nil || si.CachedInfo().State.Msgs != 1 {
		t.Fatalf("stream: %v, want one message", err)
	}

	st := &poisonStore{countingStore: countingStore{applied: map[string]int{}}, poison: poison.OrderID}
	met := metrics.New()
	dl := &countingDead{DeadLetters: q}
	c := apply.New(st, gate{}, dl, slog.New(slog.NewTextHandler(io.Discard, nil)), met,
		apply.Config{MaxDeliver: 2, Backoff: []time.Duration{10 * time.Millisecond}, AckWait: time.Second})
	defer running(ctx, c, q)()

	until(t, "the message acked", func() bool {
		ci, err := q.Consumer().Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream == 1
	})
	for _, r := range good {
		if n := st.count(r.OrderID); n < 1 {
			t.Errorf("%s applied %d times, want at least once (a redelivery is a duplicate in the database)", r.OrderID, n)
		}
	}
	if n := st.count(poison.OrderID); n != 0 {
		t.Errorf("the poisoned order applied %d times", n)
	}
	dls, err := q.DeadLetters(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 4 {
		t.Fatalf("%d dead letters, want 4: %+v", len(dls), dls)
	}
	// The poisoned one fails twice: the message is delivered again after
	// the first, and the invalid ones, dead-lettered on the first
	// delivery, are not dead-lettered again.
	if n := dl.count(); n != 4 {
		t.Errorf("%d dead letters written, want 4 (one each)", n)
	}
	byID := map[string]orderqueue.DeadLetter{}
	var noIDs []string
	for _, d := range dls {
		byID[d.OrderID] = d
		if d.OrderID == "" {
			noIDs = append(noIDs, string(d.Data))
		}
		if d.Schema != "1" || d.SKU != "s" || d.StreamSeq != 1 {
			t.Errorf("dead letter %s: schema %q, sku %q, stream seq %d; want 1, s, 1", d.OrderID, d.Schema, d.SKU, d.StreamSeq)
		}
	}
	if !slices.Equal(noIDs, []string{string(noID1), string(noID2)}) {
		t.Errorf("dead letters without an order id hold %q, want %q and %q", noIDs, noID1, noID2)
	}
	if d, ok := byID["01890000-0000-7000-8000-000000000009"]; !ok || string(d.Data) != string(invalid) || !strings.HasPrefix(d.Reason, "malformed") {
		t.Errorf("the invalid reservation's dead letter = %+v", d)
	}
	d, ok := byID[poison.OrderID]
	if !ok || !strings.HasPrefix(d.Reason, "apply failed 2 times") {
		t.Fatalf("the poisoned reservation's dead letter = %+v", d)
	}
	if r, err := d.Reservation(); err != nil || r != poison {
		t.Errorf("the poisoned dead letter reads as %+v, %v; want %+v", r, err, poison)
	}
}

// countingDead counts the dead letters a consumer writes.
type countingDead struct {
	apply.DeadLetters
	mu sync.Mutex
	n  int
}

func (d *countingDead) DeadLetterPart(ctx context.Context, m jetstream.Msg, part int, data []byte, schema, orderID, sku, reason string) error {
	d.mu.Lock()
	d.n++
	d.mu.Unlock()
	return d.DeadLetters.DeadLetterPart(ctx, m, part, data, schema, orderID, sku, reason)
}

func (d *countingDead) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// TestHeaderlessSchema2Applied: a version 2 payload on the stream without
// the schema header (a release before the header replayed the dead letter
// it made of one) is applied as what it carries.
func TestHeaderlessSchema2Applied(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := openQueue(ctx, t, time.Second)
	a := sale.Reservation{OrderID: "01890000-0000-7000-8000-000000000001", SKU: "s", User: "a", Quantity: 1, AcceptedAt: 1}
	b := sale.Reservation{OrderID: "01890000-0000-7000-8000-000000000002", SKU: "s", User: "b", Quantity: 2, AcceptedAt: 1}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if _, err := q.JetStream().Publish(ctx, orderqueue.SubjectPrefix+"_malformed", []byte(string(ja)+"\n"+string(jb))); err != nil {
		t.Fatal(err)
	}
	st := &countingStore{applied: map[string]int{}}
	dl := &dead{}
	c := apply.New(st, gate{}, dl, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, apply.Config{AckWait: time.Second})
	defer running(ctx, c, q)()
	until(t, "the message acked", func() bool {
		ci, err := q.Consumer().Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream == 1
	})
	if st.count(a.OrderID) != 1 || st.count(b.OrderID) != 1 || dl.n != 0 {
		t.Errorf("applied %d and %d times, %d dead letters; want 1, 1, 0", st.count(a.OrderID), st.count(b.OrderID), dl.n)
	}
}

// openQueue opens the order stream and its consumer (ack wait ackWait) on
// an in-process NATS of the test's own.
func openQueue(ctx context.Context, t *testing.T, ackWait time.Duration) *orderqueue.Queue {
	t.Helper()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := orderqueue.Open(ctx, nc, orderqueue.Config{AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// running runs c on q's consumer until stop is called (stop returns once
// it has stopped).
func running(ctx context.Context, c *apply.Consumer, q *orderqueue.Queue) (stop func()) {
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(rctx, q.Consumer())
	}()
	return func() { rcancel(); <-done }
}

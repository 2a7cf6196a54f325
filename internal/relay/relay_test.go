package relay_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/relay"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

type env struct {
	gate  *stockgate.Gate
	queue *orderqueue.Queue
	relay *relay.Relay
	rep   *relay.Republisher
}

const after = 10 * time.Second

func newEnv(t *testing.T) *env {
	t.Helper()
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := orderqueue.Open(context.Background(), nc, orderqueue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	g := stockgate.New(c, prefix)
	log := slog.New(slog.DiscardHandler)
	return &env{gate: g, queue: q, relay: relay.New(g, q, log, relay.Config{}),
		rep: relay.NewRepublisher(g, q, q, log, relay.RepublishConfig{After: after})}
}

func (e *env) load(t *testing.T, sku string, inflight ...sale.Reservation) {
	t.Helper()
	ok, err := e.gate.Seed(context.Background(), sku, stockgate.Config{PerUserLimit: 5}, 100, nil, inflight, nil, nil, "e1")
	if err != nil || !ok {
		t.Fatalf("seed: %v %v", ok, err)
	}
}

func reservation(sku string, at time.Time) sale.Reservation {
	return sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: "u-" + uuid.NewString()[:8], Quantity: 1, AcceptedAt: at.UnixMilli()}
}

// reserve admits n reservations accepted at at and relays them to the
// stream (acknowledged: out of the outbox, into the accepted index).
func (e *env) reserve(t *testing.T, sku string, n int, at time.Time) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		r := reservation(sku, at)
		if _, err := e.gate.Reserve(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.OrderID)
	}
	if got, err := e.relay.SweepOnce(context.Background(), time.Now().Add(time.Minute)); err != nil || got != n {
		t.Fatalf("relay sweep: %d published, %v; want %d", got, err, n)
	}
	return ids
}

// loseStream deletes the order stream, as a broker restarted on an empty
// store does, and lets the queue re-create it empty.
func (e *env) loseStream(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := e.queue.JetStream().DeleteStream(ctx, orderqueue.StreamName); err != nil {
		t.Fatal(err)
	}
	if err := e.queue.Ready(ctx); err == nil {
		t.Fatal("Ready: nil with the order stream gone")
	}
	if did, err := e.queue.Ensure(ctx); err != nil || !did {
		t.Fatalf("ensure: %v %v", did, err)
	}
	if err := e.queue.Ready(ctx); err != nil {
		t.Fatalf("Ready after re-creation: %v", err)
	}
}

func (e *env) streamMsgs(t *testing.T) uint64 {
	t.Helper()
	st, err := e.queue.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

func (e *env) pass(t *testing.T, now time.Time) relay.RepublishResult {
	t.Helper()
	res, err := e.rep.RunOnce(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestRepublisherRecoversWhatTheStreamLost(t *testing.T) {
	e := newEnv(t)
	e.load(t, "r")
	now := time.Now()
	e.reserve(t, "r", 3, now.Add(-time.Minute))
	e.reserve(t, "r", 2, now.Add(after/2)) // young: inside the bound

	// The stream holds all of them: nothing is published again.
	if got := e.pass(t, now); got.Republished != 0 || got.Held != 3 {
		t.Fatalf("stream intact: %+v, want 0 republished, 3 held", got)
	}
	e.loseStream(t)
	// Looked at within the bound already: no second look yet.
	if got := e.pass(t, now.Add(time.Second)); got.Republished != 0 || got.Held != 0 {
		t.Fatalf("within the bound: %+v, want nothing", got)
	}
	if got := e.pass(t, now.Add(after)); got.Republished != 3 {
		t.Fatalf("after the bound: %+v, want 3 republished", got)
	}
	if n := e.streamMsgs(t); n != 3 {
		t.Fatalf("stream holds %d, want 3", n)
	}
	// No storm: once per bound, and then the stream holds them again.
	if got := e.pass(t, now.Add(after+time.Second)); got.Republished != 0 {
		t.Fatalf("second pass: %+v, want 0 republished", got)
	}
	// The next bound: the stream holds the three again; the young ones,
	// lost with the stream, have passed the bound now.
	if got := e.pass(t, now.Add(2*after+time.Second)); got.Republished != 2 || got.Held != 3 {
		t.Fatalf("next bound: %+v, want 2 republished, 3 held", got)
	}
	e.loseStream(t)
	if got := e.pass(t, now.Add(4*after)); got.Republished != 5 {
		t.Fatalf("after a second loss: %+v, want 5 republished", got)
	}
}

func TestRepublisherSkipsClosedAndDeadLettered(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.load(t, "d")
	now := time.Now()
	ids := e.reserve(t, "d", 3, now.Add(-time.Minute))

	// One is decided by the database and closed; one is dead-lettered.
	if _, err := e.gate.Finalize(ctx, "d", []stockgate.Outcome{{OrderID: ids[0]}}); err != nil {
		t.Fatal(err)
	}
	cons, err := e.queue.JetStream().Consumer(ctx, orderqueue.StreamName, orderqueue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	dead := 0
	for m := range batch.Messages() {
		if string(m.Headers().Get("Nats-Msg-Id")) == ids[1] {
			if err := e.queue.DeadLetter(ctx, m, ids[1], "d", "test"); err != nil {
				t.Fatal(err)
			}
			_ = m.Term()
			dead++
		} else {
			_ = m.Nak()
		}
	}
	if dead != 1 {
		t.Fatalf("dead-lettered %d, want 1", dead)
	}
	e.loseStream(t)
	got := e.pass(t, now)
	if got.Republished != 1 || got.Held != 1 {
		t.Fatalf("%+v, want 1 republished (the live one), 1 held (the dead letter)", got)
	}
	// The dead letter is still there for the operator, and only one copy of
	// the live one is in the stream.
	if n, err := e.queue.DeadLetterCount(ctx); err != nil || n != 1 {
		t.Fatalf("dead letters: %d %v", n, err)
	}
	if n := e.streamMsgs(t); n != 1 {
		t.Fatalf("stream holds %d, want 1", n)
	}
}

func TestRepublisherIndexesRebuiltEntries(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	// A rebuild records in-flight reservations straight in res: neither in
	// the outbox nor in the accepted index.
	old := reservation("b", now.Add(-time.Minute))
	e.load(t, "b", old, reservation("b", now))
	oldest, ok, err := e.gate.OldestInFlight(context.Background(), "b")
	if err != nil || ok {
		t.Fatalf("oldest before indexing: %v %v %v", oldest, ok, err)
	}
	got := e.pass(t, now)
	if got.Indexed != 2 || got.Republished != 1 {
		t.Fatalf("%+v, want 2 indexed, 1 republished", got)
	}
	oldest, ok, err = e.gate.OldestInFlight(context.Background(), "b")
	if err != nil || !ok || oldest.UnixMilli() != old.AcceptedAt {
		t.Fatalf("oldest: %v %v %v, want %d", oldest, ok, err, old.AcceptedAt)
	}
}

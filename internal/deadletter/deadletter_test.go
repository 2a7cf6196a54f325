package deadletter_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/deadletter"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// env is the real queue, gate and store a Service works on.
type env struct {
	q     *orderqueue.Queue
	store *orderstore.Store
	gate  *stockgate.Gate
	svc   *deadletter.Service
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := t.Context()
	st, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	url, prefix := testenv.Redis(t)
	g := stockgate.New(testenv.RedisClient(t, url), prefix)
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := orderqueue.Open(ctx, nc, orderqueue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{q: q, store: st, gate: g, svc: deadletter.New(q, st, g)}
}

// sale puts sku in the database with dbStock units and loads gateStock
// units of it in the gate (more than the database when a test wants the
// database to refuse).
func (e *env) sale(t *testing.T, sku string, dbStock, gateStock int64) {
	t.Helper()
	ctx := t.Context()
	if _, _, _, err := e.store.PutSKU(ctx, orderstore.SKUChange{ID: sku, TotalStock: dbStock, PerUserLimit: 5}); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.gate.Seed(ctx, sku, stockgate.Config{PerUserLimit: 5}, gateStock, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatalf("seed %s: %v %v", sku, ok, err)
	}
}

// reserve admits a reservation in the gate and publishes it, as a purchase
// and the relay do.
func (e *env) reserve(t *testing.T, sku, user string, qty int64) sale.Reservation {
	t.Helper()
	r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: user, Quantity: qty, AcceptedAt: time.Now().UnixMilli()}
	res, err := e.gate.Reserve(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, orderqueue.Message{ID: r.OrderID, SKU: sku, Data: res.Payload})
	return r
}

func (e *env) publish(t *testing.T, m orderqueue.Message) {
	t.Helper()
	if err := e.q.Publish(t.Context(), []orderqueue.Message{m})[0]; err != nil {
		t.Fatal(err)
	}
}

// next takes the apply consumer's next message, which must be msgID's.
func (e *env) next(t *testing.T, msgID string) jetstream.Msg {
	t.Helper()
	b, err := e.q.Consumer().Fetch(1, jetstream.FetchMaxWait(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := <-b.Messages()
	if !ok {
		t.Fatalf("nothing delivered, want %s", msgID)
	}
	if id := m.Headers().Get(jetstream.MsgIDHeader); msgID != "" && id != msgID {
		t.Fatalf("delivered %s, want %s", id, msgID)
	}
	return m
}

// deadLetter gives up on the consumer's next message, as the apply
// consumer does, and returns the dead letter's sequence number.
func (e *env) deadLetter(t *testing.T, msgID, orderID, sku string) uint64 {
	t.Helper()
	ctx := t.Context()
	m := e.next(t, msgID)
	if err := e.q.DeadLetter(ctx, m, orderID, sku, "poison order"); err != nil {
		t.Fatal(err)
	}
	if err := m.Term(); err != nil {
		t.Fatal(err)
	}
	ds, err := e.q.DeadLetters(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.OrderID == orderID {
			return d.Seq
		}
	}
	t.Fatalf("no dead letter of %s in %+v", orderID, ds)
	return 0
}

func (e *env) available(t *testing.T, sku string) int64 {
	t.Helper()
	n, ok, err := e.gate.Available(t.Context(), sku)
	if err != nil || !ok {
		t.Fatalf("available %s: %d %v %v", sku, n, ok, err)
	}
	return n
}

func (e *env) inFlight(t *testing.T, sku, orderID string) bool {
	t.Helper()
	f, err := e.gate.ReadInFlight(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Reservations {
		if r.OrderID == orderID {
			return true
		}
	}
	return false
}

func (e *env) apply(t *testing.T, r sale.Reservation) orderstore.Outcome {
	t.Helper()
	out, err := e.store.ApplyBatch(t.Context(), []sale.Reservation{r})
	if err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// TestDiscard: what a discard does depends on what the database and the
// gate already did with the reservation: one the database never saw is
// recorded failed ("discarded") and its units and the buyer's slot go back
// once; one the database refused gets its units back once too; one it
// applied keeps its order and its units sold (already_applied); a discard
// interrupted half way, repeated, gives nothing back twice; a payload that
// is not a reservation is dropped. The dead letter goes in every case.
func TestDiscard(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	e.sale(t, "d", 100, 100)
	e.sale(t, "short", 1, 10) // the database refuses what the gate admits past its 1 unit

	type want struct {
		action     string
		units      int64
		held       int64 // the buyer's units in the gate afterwards
		status     sale.Status
		failReason string
	}
	for _, tt := range []struct {
		name   string
		sku    string
		qty    int64
		before func(t *testing.T, r sale.Reservation)
		want   want
	}{
		{"never applied", "d", 2, nil,
			want{action: "discarded", units: 2, status: sale.StatusFailed, failReason: orderstore.ReasonDiscarded}},
		{"recorded failed, units not yet back", "d", 1, func(t *testing.T, r sale.Reservation) {
			if _, _, err := e.store.Discard(ctx, r); err != nil {
				t.Fatal(err)
			}
		}, want{action: "discarded", units: 1, status: sale.StatusFailed, failReason: orderstore.ReasonDiscarded}},
		{"recorded failed, units back, dead letter left", "d", 3, func(t *testing.T, r sale.Reservation) {
			if _, _, err := e.store.Discard(ctx, r); err != nil {
				t.Fatal(err)
			}
			if n, err := e.gate.Finalize(ctx, r.SKU, []stockgate.Outcome{{OrderID: r.OrderID, Refused: true}}); err != nil || n != 3 {
				t.Fatalf("finalize: %d %v", n, err)
			}
		}, want{action: "discarded", units: 0, status: sale.StatusFailed, failReason: orderstore.ReasonDiscarded}},
		{"refused by the database", "short", 2, func(t *testing.T, r sale.Reservation) {
			if o := e.apply(t, r); o.Status != sale.StatusFailed {
				t.Fatalf("apply: %+v, want refused", o)
			}
		}, want{action: "discarded", units: 2, status: sale.StatusFailed, failReason: orderstore.ReasonInsufficientStock}},
		{"applied", "d", 2, func(t *testing.T, r sale.Reservation) {
			if o := e.apply(t, r); o.Status != sale.StatusPendingPayment {
				t.Fatalf("apply: %+v", o)
			}
		}, want{action: "already_applied", units: 0, held: 2, status: sale.StatusPendingPayment}},
		{"applied and paid", "d", 1, func(t *testing.T, r sale.Reservation) {
			e.apply(t, r)
			if _, _, err := e.store.Pay(ctx, r.OrderID, r.User, "ref", time.Now()); err != nil {
				t.Fatal(err)
			}
		}, want{action: "already_applied", units: 0, held: 1, status: sale.StatusPaid}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := e.reserve(t, tt.sku, "u-"+uuid.NewString()[:8], tt.qty)
			seq := e.deadLetter(t, r.OrderID, r.OrderID, r.SKU)
			if tt.before != nil {
				tt.before(t, r)
			}
			avail := e.available(t, tt.sku)

			a, err := e.svc.Discard(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(deadletter.Action{Seq: seq, OrderID: r.OrderID, Action: tt.want.action, UnitsReturned: tt.want.units}, a); diff != "" {
				t.Errorf("Discard (-want +got):\n%s", diff)
			}
			if got := e.available(t, tt.sku); got != avail+tt.want.units {
				t.Errorf("available %d after the discard, want %d + %d", got, avail, tt.want.units)
			}
			if held, err := e.gate.Held(ctx, tt.sku, r.User); err != nil || held != tt.want.held {
				t.Errorf("buyer holds %d (%v), want %d", held, err, tt.want.held)
			}
			if e.inFlight(t, tt.sku, r.OrderID) {
				t.Error("the reservation is still in flight in the gate")
			}
			o, err := e.store.Order(ctx, r.OrderID)
			if err != nil || o.Status != tt.want.status || o.FailReason != tt.want.failReason {
				t.Errorf("order %+v, %v; want %s (%q)", o, err, tt.want.status, tt.want.failReason)
			}
			if _, err := e.q.GetDeadLetter(ctx, seq); !deadletter.IsNotFound(err) {
				t.Errorf("dead letter after the discard: %v, want gone", err)
			}
			// Repeated: nothing more to do, nothing given back again.
			if _, err := e.svc.Discard(ctx, seq); !deadletter.IsNotFound(err) {
				t.Errorf("second Discard: %v, want not found", err)
			}
			if got := e.available(t, tt.sku); got != avail+tt.want.units {
				t.Errorf("available %d after a second discard, want %d", got, avail+tt.want.units)
			}
			// A discarded reservation can never be applied afterwards.
			if tt.want.action == "discarded" {
				if out := e.apply(t, r); !out.Duplicate || out.Status != sale.StatusFailed {
					t.Errorf("ApplyBatch after the discard = %+v, want the failed order, duplicate", out)
				}
			}
		})
	}

	t.Run("applied and cancelled", func(t *testing.T) {
		// The cancel owes the units back through the restore queue: the
		// discard must not give them too.
		r := e.reserve(t, "d", "u-cancel", 2)
		seq := e.deadLetter(t, r.OrderID, r.OrderID, r.SKU)
		e.apply(t, r)
		if _, _, err := e.store.Cancel(ctx, r.OrderID, r.User, sale.CancelByUser, time.Now()); err != nil {
			t.Fatal(err)
		}
		avail := e.available(t, "d")
		a, err := e.svc.Discard(ctx, seq)
		if err != nil || a.UnitsReturned != 0 {
			t.Fatalf("Discard = %+v, %v; want no units returned", a, err)
		}
		if got := e.available(t, "d"); got != avail {
			t.Errorf("available %d after the discard, want %d (the restore gives them back)", got, avail)
		}
		if e.inFlight(t, "d", r.OrderID) {
			t.Error("the reservation is still in flight in the gate")
		}
		if o, err := e.store.Order(ctx, r.OrderID); err != nil || o.Status != sale.StatusCancelled {
			t.Errorf("order %+v, %v; want cancelled", o, err)
		}
	})

	t.Run("malformed", func(t *testing.T) {
		for _, data := range []string{`not json`, `{"order_id":"x","sku_id":"d","quantity":0}`} {
			id := "junk-" + uuid.NewString()[:8]
			e.publish(t, orderqueue.Message{ID: id, SKU: "d", Data: []byte(data)})
			seq := e.deadLetter(t, id, id, "d")
			a, err := e.svc.Discard(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(deadletter.Action{Seq: seq, OrderID: id, Action: "dropped_malformed"}, a); diff != "" {
				t.Errorf("Discard of %s (-want +got):\n%s", data, diff)
			}
			if _, err := e.q.GetDeadLetter(ctx, seq); !deadletter.IsNotFound(err) {
				t.Errorf("dead letter after the discard: %v, want gone", err)
			}
		}
	})

	if _, err := e.svc.Discard(ctx, 9999); !deadletter.IsNotFound(err) {
		t.Errorf("Discard of no dead letter: %v, want not found", err)
	}
}

// TestDiscardConcurrently: operators discarding the same dead letter at
// once give its units back once; each either does it or finds it gone.
func TestDiscardConcurrently(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	e.sale(t, "c", 10, 10)
	r := e.reserve(t, "c", "u1", 3)
	seq := e.deadLetter(t, r.OrderID, r.OrderID, r.SKU)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		units int64
	)
	for range 4 {
		wg.Go(func() {
			a, err := e.svc.Discard(ctx, seq)
			switch {
			case deadletter.IsNotFound(err):
			case err != nil:
				t.Errorf("Discard: %v", err)
			default:
				mu.Lock()
				units += a.UnitsReturned
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if units != 3 || e.available(t, "c") != 10 {
		t.Errorf("%d units returned, %d available; want 3 returned once, all 10 available", units, e.available(t, "c"))
	}
}

// TestReplay: a replayed dead letter is back on the order stream and gone
// from the dead letters; applying it twice (replayed again after a second
// failure) makes one order; a payload that is not a reservation cannot be
// replayed and stays for a discard.
func TestReplay(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	e.sale(t, "r", 10, 10)
	r := e.reserve(t, "r", "u1", 1)
	seq := e.deadLetter(t, r.OrderID, r.OrderID, r.SKU)

	a, err := e.svc.Replay(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(deadletter.Action{Seq: seq, OrderID: r.OrderID, Action: "replayed"}, a); diff != "" {
		t.Errorf("Replay (-want +got):\n%s", diff)
	}
	if _, err := e.q.GetDeadLetter(ctx, seq); !deadletter.IsNotFound(err) {
		t.Errorf("dead letter after the replay: %v, want gone", err)
	}
	if _, err := e.svc.Replay(ctx, seq); !deadletter.IsNotFound(err) {
		t.Errorf("second Replay: %v, want not found", err)
	}
	if !e.inFlight(t, "r", r.OrderID) {
		t.Error("the replayed reservation left the gate's in-flight records; its stock must stay reserved")
	}

	// The consumer is delivered it; it fails once more, is dead-lettered
	// and replayed again, and is applied both times: one order.
	m := e.next(t, "")
	var got sale.Reservation
	if err := json.Unmarshal(m.Data(), &got); err != nil || got != r {
		t.Fatalf("replayed payload %s (%v), want %+v", m.Data(), err, r)
	}
	if o := e.apply(t, got); o.Duplicate || o.Status != sale.StatusPendingPayment {
		t.Fatalf("first apply of the replay: %+v", o)
	}
	if err := e.q.DeadLetter(ctx, m, r.OrderID, r.SKU, "timeout"); err != nil {
		t.Fatal(err)
	}
	if err := m.Term(); err != nil {
		t.Fatal(err)
	}
	ds, _, err := e.svc.List(ctx, seq, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("dead letters after the second failure: %+v, %v", ds, err)
	}
	if _, err := e.svc.Replay(ctx, ds[0].Seq); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(e.next(t, "").Data(), &got); err != nil {
		t.Fatal(err)
	}
	if o := e.apply(t, got); !o.Duplicate || o.Status != sale.StatusPendingPayment {
		t.Errorf("second apply of the replay: %+v, want the same order, duplicate", o)
	}

	// Malformed: refused, kept.
	e.publish(t, orderqueue.Message{ID: "junk", SKU: "r", Data: []byte(`not json`)})
	bad := e.deadLetter(t, "junk", "junk", "r")
	if _, err := e.svc.Replay(ctx, bad); !errors.Is(err, sale.ErrInvalid) {
		t.Errorf("Replay of a malformed dead letter: %v, want sale.ErrInvalid", err)
	}
	if _, err := e.q.GetDeadLetter(ctx, bad); err != nil {
		t.Errorf("malformed dead letter after the refused replay: %v, want kept", err)
	}
	if st, _ := e.q.Stats(ctx); st.Pending != 0 {
		t.Errorf("%d messages pending after the refused replay, want none published", st.Pending)
	}
}

// TestList: a page of dead letters from after+1 and the count of all.
func TestList(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	e.sale(t, "l", 10, 10)
	var seqs []uint64
	for _, u := range []string{"a", "b", "c"} {
		r := e.reserve(t, "l", u, 1)
		seqs = append(seqs, e.deadLetter(t, r.OrderID, r.OrderID, r.SKU))
	}
	for _, p := range []struct {
		after uint64
		limit int
		want  []uint64
	}{
		{0, 2, seqs[:2]},
		{seqs[0], 10, seqs[1:]},
		{seqs[2], 10, nil},
	} {
		ds, n, err := e.svc.List(ctx, p.after, p.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, d := range ds {
			got = append(got, d.Seq)
		}
		if diff := cmp.Diff(p.want, got); diff != "" || n != 3 {
			t.Errorf("List(%d, %d): count %d, want 3; seqs (-want +got):\n%s", p.after, p.limit, n, diff)
		}
	}
}

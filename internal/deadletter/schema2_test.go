package deadletter_test

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/deadletter"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
)

// TestWholeSchema2DeadLetter: a release before the schema header reads a
// version 2 message (several reservations) as one malformed reservation
// and dead-letters it whole, without a header, under _malformed. Nothing
// in it is lost: the rebuild's read of the dead letters counts its
// reservations as in flight, a replay publishes each as a version 1
// message of its own (what every release reads), and a discard records
// each failed and gives each one's units back.
func TestWholeSchema2DeadLetter(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	e.sale(t, "w", 100, 100)

	// admit reserves n reservations in the gate (not published) and
	// returns them with their payloads.
	admit := func(n int) ([]sale.Reservation, [][]byte) {
		var rs []sale.Reservation
		var ps [][]byte
		for i := range n {
			r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: "w", User: "u-" + uuid.NewString()[:8], Quantity: int64(1 + i), AcceptedAt: time.Now().UnixMilli()}
			res, err := e.gate.Reserve(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			rs, ps = append(rs, r), append(ps, res.Payload)
		}
		return rs, ps
	}
	// deadLetterWhole writes the dead letter the older release writes.
	deadLetterWhole := func(ps [][]byte) uint64 {
		m := nats.NewMsg(orderqueue.DeadLetterPrefix + "_malformed")
		m.Data = bytes.Join(ps, []byte("\n"))
		m.Header.Set("Flashsale-Reason", "malformed: bad user_id")
		m.Header.Set("Flashsale-Order-Id", "")
		ack, err := e.q.JetStream().PublishMsg(ctx, m, jetstream.WithExpectStream(orderqueue.DeadLetterStream))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}

	replayed, rps := admit(3)
	seq := deadLetterWhole(rps)
	want := []string{replayed[0].OrderID, replayed[1].OrderID, replayed[2].OrderID}
	held, err := e.q.UnappliedAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range held["w"] {
		ids = append(ids, r.OrderID)
	}
	if !slices.Equal(ids, want) {
		t.Errorf("the rebuild's read of every SKU's dead letters holds %v under w, want %v (all: %v)", ids, want, held)
	}
	one, err := e.q.Unapplied(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	ids = ids[:0]
	for _, r := range one {
		ids = append(ids, r.OrderID)
	}
	if !slices.Equal(ids, want) {
		t.Errorf("the rebuild's read of w holds %v, want %v", ids, want)
	}
	if other, err := e.q.Unapplied(ctx, "x"); err != nil || len(other) != 0 {
		t.Errorf("the rebuild's read of x holds %v, %v; want nothing", other, err)
	}

	a, err := e.svc.Replay(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if a.Action != "replayed" || a.OrderID != replayed[0].OrderID || len(a.OrderIDs) != 3 || a.OrderIDs[2] != replayed[2].OrderID {
		t.Errorf("replay = %+v", a)
	}
	for i := range replayed {
		m := e.next(t, "")
		if s := m.Headers().Get(orderqueue.SchemaHeader); s != "1" || !bytes.Equal(m.Data(), rps[i]) || m.Subject() != orderqueue.SubjectPrefix+"w" {
			t.Errorf("replayed message %d: schema %q, subject %s, data %s; want 1, w, %s", i, s, m.Subject(), m.Data(), rps[i])
		}
	}

	discarded, dps := admit(2)
	before := e.available(t, "w")
	seq = deadLetterWhole(append(dps, []byte(`{"sku_id":"w"}`)))
	a, err = e.svc.Discard(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if a.Action != "discarded" || a.UnitsReturned != 3 || len(a.OrderIDs) != 2 || a.Malformed != 1 {
		t.Errorf("discard = %+v, want discarded, 3 units back, 2 orders, 1 malformed", a)
	}
	// Interrupted after the database and the gate, before the dead
	// letter's removal, and done again: nothing is given back twice.
	seq = deadLetterWhole(dps)
	if a, err := e.svc.Discard(ctx, seq); err != nil || a.UnitsReturned != 0 || a.Action != "discarded" {
		t.Errorf("discard again = %+v, %v; want discarded, 0 units back", a, err)
	}
	if got := e.available(t, "w"); got != before+3 {
		t.Errorf("available %d after the discard, want %d", got, before+3)
	}
	for _, r := range discarded {
		o, err := e.store.Order(ctx, r.OrderID)
		if err != nil || o.Status != sale.StatusFailed {
			t.Errorf("order %s after the discard: %+v, %v; want failed", r.OrderID, o, err)
		}
	}
	if n, err := e.q.DeadLetterCount(ctx); err != nil || n != 0 {
		t.Errorf("%d dead letters left, %v", n, err)
	}

	// A dead letter of a version this release does not read (a newer
	// release's) is left as it is.
	m := nats.NewMsg(orderqueue.DeadLetterPrefix + "w")
	m.Data = rps[0]
	m.Header.Set(orderqueue.SchemaHeader, "3")
	ack, err := e.q.JetStream().PublishMsg(ctx, m, jetstream.WithExpectStream(orderqueue.DeadLetterStream))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Replay(ctx, ack.Sequence); !errors.Is(err, deadletter.ErrUnknownSchema) {
		t.Errorf("replay of a version 3 dead letter: %v, want ErrUnknownSchema", err)
	}
	if _, err := e.svc.Discard(ctx, ack.Sequence); !errors.Is(err, deadletter.ErrUnknownSchema) {
		t.Errorf("discard of a version 3 dead letter: %v, want ErrUnknownSchema", err)
	}
	if n, err := e.q.DeadLetterCount(ctx); err != nil || n != 1 {
		t.Errorf("%d dead letters left, %v; want the version 3 one", n, err)
	}
}

package orderqueue_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
)

// TestPublishSchema2Groups: while the queue publishes schema version 2, one
// Publish sends each SKU's reservations (a bucket's with its SKU's) as
// messages of at most MaxBatch, in order; a reservation alone on its SKU,
// and a payload that is not JSON, go out as version 1 messages of their
// own. Every reservation reads back exactly once (the consumer's decoding
// and Unapplied's, which a rebuild counts reserved units with), and the
// same Publish sent again is dropped by the broker's de-duplication.
func TestPublishSchema2Groups(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	ctx := context.Background()
	if v := q.PublishSchema(); v != 1 {
		t.Fatalf("a new queue publishes schema %d, want 1", v)
	}
	q.SetPublishSchema(orderqueue.SchemaBatch)

	var msgs []orderqueue.Message
	want := map[string]sale.Reservation{}
	for i := range 140 {
		r := resv("k", i)
		if i%10 == 3 {
			r.Bucket = "k~2"
		}
		msgs = append(msgs, message(r))
		want[r.OrderID] = r
		if i == 70 {
			msgs = append(msgs, orderqueue.Message{ID: "not-json", SKU: "k", Data: []byte(`{"order_id":`)})
		}
	}
	lone := resv("j", 1000)
	msgs = append(msgs, message(lone))
	want[lone.OrderID] = lone
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	msgs[5].Trace = map[string]string{"traceparent": tp}
	publishAll(t, q, msgs...)

	// k: 64 + 64, the broken payload alone, k's last 12, j alone: 5 messages.
	if st := stats(t, q); st.Messages != 5 {
		t.Fatalf("stream holds %d messages, want 5", st.Messages)
	}
	ms := fetch(t, q, 5)
	got := map[string]sale.Reservation{}
	var schemas, counts []string
	for _, m := range ms {
		schemas = append(schemas, m.Headers().Get(orderqueue.SchemaHeader))
		counts = append(counts, m.Headers().Get(orderqueue.HeaderCount))
		v, ok := orderqueue.SchemaOf(m.Headers())
		if !ok {
			t.Fatalf("message %s: no schema", m.Subject())
		}
		parts, err := orderqueue.Decode(v, m.Data())
		if err != nil {
			t.Fatalf("message %s: %v", m.Subject(), err)
		}
		for _, p := range parts {
			if p.Err != nil {
				if string(p.Data) != `{"order_id":` {
					t.Errorf("part %s: %v", p.Data, p.Err)
				}
				continue
			}
			if _, dup := got[p.Reservation.OrderID]; dup {
				t.Errorf("%s carried twice", p.Reservation.OrderID)
			}
			got[p.Reservation.OrderID] = p.Reservation
			if p.Reservation.OrderID == msgs[5].ID && p.Trace.Get("traceparent") != tp {
				t.Errorf("trace of %s = %v, want %s", p.Reservation.OrderID, p.Trace, tp)
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("read back %d reservations, want %d", len(got), len(want))
	}
	for id, r := range want {
		if g, ok := got[id]; !ok || g != r {
			t.Errorf("reservation %s read back as %+v, want %+v", id, g, r)
		}
	}
	if w := []string{"2", "2", "1", "2", "1"}; !slices.Equal(schemas, w) {
		t.Errorf("schemas %v, want %v", schemas, w)
	}
	if w := []string{strconv.Itoa(orderqueue.MaxBatch), strconv.Itoa(orderqueue.MaxBatch), "", "12", ""}; !slices.Equal(counts, w) {
		t.Errorf("counts %v, want %v", counts, w)
	}

	// Unapplied (nothing acknowledged yet) reads every valid reservation.
	all, err := q.UnappliedAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for sku, rs := range all {
		for _, r := range rs {
			n++
			if want[r.OrderID] != r || sale.SKUOfBucket(sku) != r.SKU {
				t.Errorf("Unapplied: %s under %s", r.OrderID, sku)
			}
		}
	}
	if n != len(want) {
		t.Errorf("Unapplied read %d reservations, want %d", n, len(want))
	}

	// The relay sends the same round again (an ack it did not hear): dropped.
	publishAll(t, q, msgs...)
	if st := stats(t, q); st.Messages != 5 {
		t.Errorf("after the same publish again the stream holds %d messages, want 5", st.Messages)
	}
}

// TestPublishSchema1Unchanged: a queue left at schema 1 (the default)
// publishes one message per reservation, as every release reads.
func TestPublishSchema1Unchanged(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	publishAll(t, q, message(resv("k", 1)), message(resv("k", 2)), message(resv("k", 3)))
	if st := stats(t, q); st.Messages != 3 {
		t.Fatalf("stream holds %d messages, want 3", st.Messages)
	}
	for _, m := range fetch(t, q, 3) {
		if s := m.Headers().Get(orderqueue.SchemaHeader); s != "1" {
			t.Errorf("schema %q, want 1", s)
		}
	}
}

// TestDecodeBatch: the version 2 payload's reading, with what a damaged
// one gives.
func TestDecodeBatch(t *testing.T) {
	a, b := resv("k", 1), resv("k", 2)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	good := `{"reservations":[` + string(ja) + `,{"order_id":"x"},` + string(jb) + `],"traces":[null,null,{"traceparent":"t"}]}`
	parts, err := orderqueue.DecodeBatch([]byte(good))
	if err != nil || len(parts) != 3 {
		t.Fatalf("DecodeBatch = %d parts, %v", len(parts), err)
	}
	if parts[0].Err != nil || parts[0].Reservation != a || string(parts[0].Data) != string(ja) || parts[0].Trace != nil {
		t.Errorf("part 0 = %+v", parts[0])
	}
	if parts[1].Err == nil {
		t.Errorf("part 1 (no sku, user, quantity) decoded without error")
	}
	if parts[2].Err != nil || parts[2].Reservation != b || parts[2].Trace.Get("traceparent") != "t" {
		t.Errorf("part 2 = %+v", parts[2])
	}
	for _, bad := range []string{``, `[]`, `{"reservations":[]}`, `{"reservations":[` + string(ja) + `],"traces":[]}`, string(ja)} {
		if _, err := orderqueue.DecodeBatch([]byte(bad)); err == nil {
			t.Errorf("DecodeBatch(%q) = nil error", bad)
		}
	}
	if _, err := orderqueue.Decode(3, ja); err != orderqueue.ErrUnknownSchema {
		t.Errorf("Decode(3) = %v, want ErrUnknownSchema", err)
	}
}

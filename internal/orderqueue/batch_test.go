package orderqueue_test

import (
	"bytes"
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
		switch i {
		case 70: // not one line: alone, as version 1
			msgs = append(msgs, orderqueue.Message{ID: "lines", SKU: "k", Data: []byte("{\"order_id\":\"x\",\n\"sku_id\":\"k\"}")})
		case 100: // one line, not JSON: rides along, and fails alone when read
			msgs = append(msgs, orderqueue.Message{ID: "not-json", SKU: "k", Data: []byte(`{"order_id":`)})
		}
	}
	lone := resv("j", 1000)
	msgs = append(msgs, message(lone))
	want[lone.OrderID] = lone
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	msgs[5].Trace = map[string]string{"traceparent": tp}
	publishAll(t, q, msgs...)

	// k: 64 + 64 (the line that is not JSON in the second), the payload of
	// two lines alone, k's last 13, j alone: 5 messages.
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
		parts, err := orderqueue.Decode(v, m.Data(), m.Headers().Get(orderqueue.HeaderTraces))
		if err != nil {
			t.Fatalf("message %s: %v", m.Subject(), err)
		}
		for _, p := range parts {
			if p.Err != nil {
				if d := string(p.Data); d != `{"order_id":` && d != "{\"order_id\":\"x\",\n\"sku_id\":\"k\"}" {
					t.Errorf("part %q: %v", p.Data, p.Err)
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
	if w := []string{strconv.Itoa(orderqueue.MaxBatch), strconv.Itoa(orderqueue.MaxBatch), "", "13", ""}; !slices.Equal(counts, w) {
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
// one gives: a damaged line spoils only its own reservation, traces that do
// not match the lines are ignored.
func TestDecodeBatch(t *testing.T) {
	a, b := resv("k", 1), resv("k", 2)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	data := []byte(string(ja) + "\n" + `{"order_id":"x"}` + "\n" + string(jb) + "\n" + `{"order_`)
	parts, err := orderqueue.DecodeBatch(data, `[null,null,{"traceparent":"t"},null]`)
	if err != nil || len(parts) != 4 {
		t.Fatalf("DecodeBatch = %d parts, %v", len(parts), err)
	}
	if parts[0].Err != nil || parts[0].Reservation != a || string(parts[0].Data) != string(ja) || parts[0].Trace != nil || !parts[0].Batched || parts[0].Index != 0 {
		t.Errorf("part 0 = %+v", parts[0])
	}
	if parts[1].Err == nil || parts[3].Err == nil {
		t.Errorf("parts 1 (no sku, user, quantity) and 3 (cut short) decoded without error: %+v, %+v", parts[1], parts[3])
	}
	if parts[2].Err != nil || parts[2].Reservation != b || parts[2].Trace.Get("traceparent") != "t" || parts[2].Index != 2 {
		t.Errorf("part 2 = %+v", parts[2])
	}
	if parts, err := orderqueue.DecodeBatch(data, `[{"traceparent":"t"}]`); err != nil || parts[0].Trace != nil {
		t.Errorf("traces of the wrong length: %v, trace %v; want ignored", err, parts[0].Trace)
	}
	if parts, err := orderqueue.DecodeBatch([]byte(string(ja)+"\n\n"+string(jb)), ""); err != nil || len(parts) != 3 || parts[1].Err == nil {
		t.Errorf("an empty line: %v, %+v; want 3 parts, the middle one failing", err, parts)
	}
	if _, err := orderqueue.DecodeBatch(nil, ""); err == nil {
		t.Errorf("DecodeBatch of nothing = nil error")
	}
	if _, err := orderqueue.Decode(3, ja, ""); err != orderqueue.ErrUnknownSchema {
		t.Errorf("Decode(3) = %v, want ErrUnknownSchema", err)
	}
	// Version 1 (or no header): a payload of several lines is read as a
	// version 2 one only when a line is a reservation.
	if got := orderqueue.DecodeV1OrBatch([]byte(string(ja) + "\n" + string(jb))); len(got) != 2 || got[1].Reservation != b {
		t.Errorf("DecodeV1OrBatch of two lines = %+v", got)
	}
	for _, one := range [][]byte{ja, []byte("{\"order_id\":\"x\",\n\"sku_id\":\"k\"}")} {
		if got := orderqueue.DecodeV1OrBatch(one); len(got) != 1 || got[0].Batched || string(got[0].Data) != string(one) {
			t.Errorf("DecodeV1OrBatch(%q) = %+v, want it as one version 1 payload", one, got)
		}
	}
}

// BenchmarkDecode reads 16 reservations: as one version 2 message (lines)
// and as 16 version 1 messages. The version 2 reading should cost about
// what the 16 cost (each line is decoded once).
func BenchmarkDecode(b *testing.B) {
	var msgs []orderqueue.Message
	var lines [][]byte
	for i := range 16 {
		m := message(resv("sku-1", i))
		msgs, lines = append(msgs, m), append(lines, m.Data)
	}
	data := bytes.Join(lines, []byte("\n"))
	b.Run("v2-one-message", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := orderqueue.DecodeBatch(data, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("v1-16-messages", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, m := range msgs {
				if p := orderqueue.DecodeV1(m.Data); p.Err != nil {
					b.Fatal(p.Err)
				}
			}
		}
	})
}

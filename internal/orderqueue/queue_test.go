package orderqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
)

// resv returns a valid reservation of sku numbered n (a deterministic order id).
func resv(sku string, n int) sale.Reservation {
	return sale.Reservation{OrderID: fmt.Sprintf("01900000-0000-7000-8000-%012x", n), SKU: sku,
		User: fmt.Sprintf("u%d", n), Quantity: 1, AcceptedAt: 1_700_000_000_000 + int64(n)}
}

// message is r as the relay publishes it.
func message(r sale.Reservation) orderqueue.Message {
	data, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	sku := r.SKU
	if r.Bucket != "" {
		sku = r.Bucket
	}
	return orderqueue.Message{ID: r.OrderID, SKU: sku, Data: data}
}

func publishAll(t *testing.T, q *orderqueue.Queue, msgs ...orderqueue.Message) {
	t.Helper()
	for i, err := range q.Publish(context.Background(), msgs) {
		if err != nil {
			t.Fatalf("publish %s: %v", msgs[i].ID, err)
		}
	}
}

// fetch takes the next n messages from the apply consumer, unacknowledged.
func fetch(t *testing.T, q *orderqueue.Queue, n int) []jetstream.Msg {
	t.Helper()
	var out []jetstream.Msg
	deadline := time.Now().Add(5 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		b, err := q.Consumer().Fetch(n-len(out), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			out = append(out, m)
		}
	}
	if len(out) != n {
		t.Fatalf("fetched %d messages, want %d", len(out), n)
	}
	return out
}

func stats(t *testing.T, q *orderqueue.Queue) orderqueue.Stats {
	t.Helper()
	st, err := q.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// delivered is what the apply consumer sees of a message.
type delivered struct {
	Subject, MsgID, Data, Traceparent string
}

func deliveredOf(ms []jetstream.Msg) []delivered {
	var out []delivered
	for _, m := range ms {
		out = append(out, delivered{Subject: m.Subject(), MsgID: m.Headers().Get(jetstream.MsgIDHeader),
			Data: string(m.Data()), Traceparent: m.Headers().Get("traceparent")})
	}
	return out
}

// TestPublishDedupesByOrderID: the order id is the broker's message id, so
// a re-publish (in the same batch or a later one) is acknowledged without
// being stored again; the apply consumer receives each reservation once, on
// its SKU's subject (a bucket's too), with the purchase's trace context.
func TestPublishDedupesByOrderID(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	a, b, c := message(resv("k", 1)), message(resv("k", 2)), message(resv("j", 3))
	b.SKU = "k~7" // a stock bucket of k
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	b.Trace = map[string]string{"traceparent": tp}

	if errs := q.Publish(context.Background(), []orderqueue.Message{a, b, a, c}); len(errs) != 4 {
		t.Fatalf("Publish of 4 returned %d errors, want one per message", len(errs))
	} else {
		for i, err := range errs {
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	}
	publishAll(t, q, a, b) // a retry of the relay

	statsBecome(t, q, "after publishing 3 distinct ids (5 copies)", orderqueue.Stats{Messages: 3, Pending: 3})
	want := []delivered{
		{Subject: orderqueue.SubjectPrefix + "k", MsgID: a.ID, Data: string(a.Data)},
		{Subject: orderqueue.SubjectPrefix + "k", MsgID: b.ID, Data: string(b.Data), Traceparent: tp},
		{Subject: orderqueue.SubjectPrefix + "j", MsgID: c.ID, Data: string(c.Data)},
	}
	if diff := cmp.Diff(want, deliveredOf(fetch(t, q, 3))); diff != "" {
		t.Errorf("delivered (-want +got):\n%s", diff)
	}
}

// TestPublishErrorPerMessage: a message the stream does not take fails
// alone, at its own index.
func TestPublishErrorPerMessage(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	good1, good2 := message(resv("k", 1)), message(resv("k", 2))
	stray := orderqueue.Message{ID: "stray", SKU: "not.a.sku", Data: []byte(`{}`)} // no stream holds its subject
	errs := q.Publish(context.Background(), []orderqueue.Message{good1, stray, good2})
	if len(errs) != 3 || errs[0] != nil || errs[1] == nil || errs[2] != nil {
		t.Fatalf("Publish = %v, want [nil, an error, nil]", errs)
	}
	if got := stats(t, q).Messages; got != 2 {
		t.Fatalf("stream holds %d, want the 2 good ones", got)
	}
}

// TestStats: Messages counts what the stream stores, Pending what the
// consumer has not been delivered yet, AckPending what it was delivered and
// has not acknowledged.
func TestStats(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	if got := stats(t, q); got != (orderqueue.Stats{}) {
		t.Fatalf("empty queue: %+v", got)
	}
	publishAll(t, q, message(resv("k", 1)), message(resv("k", 2)), message(resv("k", 3)))
	statsBecome(t, q, "published 3", orderqueue.Stats{Messages: 3, Pending: 3})
	ms := fetch(t, q, 2)
	statsBecome(t, q, "2 delivered", orderqueue.Stats{Messages: 3, Pending: 1, AckPending: 2})
	if err := ms[0].DoubleAck(context.Background()); err != nil {
		t.Fatal(err)
	}
	statsBecome(t, q, "1 acknowledged", orderqueue.Stats{Messages: 3, Pending: 1, AckPending: 1})
	if err := q.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// statsBecome waits until q's stats are want: the broker updates a
// consumer's counts shortly after the stream stored or delivered a message
// (seen: Pending 1 right after three acknowledged publishes), so Stats is a
// reading that catches up, not a snapshot of the last call.
func statsBecome(t *testing.T, q *orderqueue.Queue, what string, want orderqueue.Stats) {
	t.Helper()
	statsUntil(t, q, fmt.Sprintf("%s: want %+v", what, want), func(got orderqueue.Stats) bool { return got == want })
}

// statsUntil waits, as statsBecome, until q's stats satisfy ok.
func statsUntil(t *testing.T, q *orderqueue.Queue, what string, ok func(orderqueue.Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := stats(t, q)
		if ok(got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: stats %+v", what, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConfigDefaults: zero values take the documented defaults, others are
// applied to the stream and the consumer; the order stream never has a
// MaxAge (Retain removes acknowledged messages instead).
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	type applied struct {
		OrderMaxAge, DLQMaxAge, Duplicates, DLQDuplicates, AckWait time.Duration
		MaxAckPending                                              int
		AckPolicy                                                  jetstream.AckPolicy
		Subjects, DLQSubjects                                      []string
	}
	for _, tt := range []struct {
		name string
		cfg  orderqueue.Config
		want applied
	}{
		{"defaults", orderqueue.Config{}, applied{Duplicates: 2 * time.Minute, DLQDuplicates: 2 * time.Minute,
			AckWait: 3 * time.Second, MaxAckPending: 20000}},
		{"configured", orderqueue.Config{MaxAge: time.Hour, DuplicateWindow: 10 * time.Second, AckWait: 30 * time.Second, MaxAckPending: 7},
			applied{Duplicates: 10 * time.Second, DLQDuplicates: 10 * time.Second, AckWait: 30 * time.Second, MaxAckPending: 7}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := openQueue(t, tt.cfg)
			ctx := context.Background()
			js := q.JetStream()
			order, err := js.Stream(ctx, orderqueue.StreamName)
			if err != nil {
				t.Fatal(err)
			}
			dlq, err := js.Stream(ctx, orderqueue.DeadLetterStream)
			if err != nil {
				t.Fatal(err)
			}
			ci, err := q.Consumer().Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			oc, dc := order.CachedInfo().Config, dlq.CachedInfo().Config
			got := applied{OrderMaxAge: oc.MaxAge, DLQMaxAge: dc.MaxAge, Duplicates: oc.Duplicates, DLQDuplicates: dc.Duplicates,
				AckWait: ci.Config.AckWait, MaxAckPending: ci.Config.MaxAckPending, AckPolicy: ci.Config.AckPolicy,
				Subjects: oc.Subjects, DLQSubjects: dc.Subjects}
			want := tt.want
			want.AckPolicy = jetstream.AckExplicitPolicy
			want.Subjects = []string{orderqueue.SubjectPrefix + "*"}
			want.DLQSubjects = []string{orderqueue.DeadLetterPrefix + "*"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("configuration (-want +got):\n%s", diff)
			}
			if ci.Name != orderqueue.ConsumerName || ci.Config.Durable != orderqueue.ConsumerName {
				t.Errorf("consumer %q (durable %q), want the durable %q", ci.Name, ci.Config.Durable, orderqueue.ConsumerName)
			}
		})
	}
}

package orderqueue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/testenv"
)

func openQueue(t *testing.T, cfg orderqueue.Config) *orderqueue.Queue { return openQueueCfg(t, cfg) }

func openQueueB(b *testing.B) *orderqueue.Queue { return openQueueCfg(b, orderqueue.Config{}) }

func openQueueCfg(t testing.TB, cfg orderqueue.Config) *orderqueue.Queue {
	t.Helper()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := orderqueue.Open(context.Background(), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func publish(t *testing.T, q *orderqueue.Queue, from, n int) {
	t.Helper()
	var msgs []orderqueue.Message
	for i := from; i < from+n; i++ {
		msgs = append(msgs, orderqueue.Message{ID: fmt.Sprintf("o%d", i), SKU: "k", Data: []byte(`{}`)})
	}
	for _, err := range q.Publish(context.Background(), msgs) {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// ack acknowledges the first n messages on the durable consumer.
func ack(t *testing.T, q *orderqueue.Queue, n int) {
	t.Helper()
	for _, c := range []jetstream.Consumer{q.Consumer()} {
		b, err := c.Fetch(n, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range b.Messages() {
			if err := m.DoubleAck(context.Background()); err != nil {
				t.Fatal(err)
			}
			got++
		}
		if got != n {
			t.Fatalf("fetched %d, want %d", got, n)
		}
	}
}

// TestRetentionKeepsUnacknowledged: with a retention of one second, a
// reservation no consumer acknowledged stays in the stream however old; an
// acknowledged one older than the retention goes.
func TestRetentionKeepsUnacknowledged(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{MaxAge: time.Second, DuplicateWindow: 500 * time.Millisecond})
	ctx := context.Background()
	publish(t, q, 0, 5)
	ack(t, q, 2)
	time.Sleep(2500 * time.Millisecond) // past the retention, nothing else acknowledged
	n, err := q.Retain(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || st.Messages != 3 || st.Pending+uint64(st.AckPending) != 3 {
		t.Fatalf("purged %d, stream holds %d (%d pending, %d ack pending); want 2 purged, 3 held and deliverable", n, st.Messages, st.Pending, st.AckPending)
	}
	// A young acknowledged message is kept for replay and audit.
	publish(t, q, 5, 1)
	ack(t, q, 4)
	if n, err := q.Retain(ctx, time.Now()); err != nil || n != 3 {
		t.Fatalf("second pass purged %d, %v; want the 3 old ones only", n, err)
	}
	if st, _ := q.Stats(ctx); st.Messages != 1 {
		t.Fatalf("stream holds %d, want the young one", st.Messages)
	}
}

// TestOpenRemovesMaxAge: a stream created with a MaxAge (older versions)
// loses it when the queue opens.
func TestOpenRemovesMaxAge(t *testing.T) {
	t.Parallel()
	url := testenv.NATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: orderqueue.StreamName, Subjects: []string{orderqueue.SubjectPrefix + "*"},
		Storage: jetstream.FileStorage, MaxAge: 72 * time.Hour, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := orderqueue.Open(ctx, nc, orderqueue.Config{}); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, orderqueue.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if age := st.CachedInfo().Config.MaxAge; age != 0 {
		t.Fatalf("MaxAge %v after Open, want none", age)
	}
}

// TestEnsureRecreates: streams and consumers deleted while running are
// reported missing and re-created.
func TestEnsureRecreates(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	ctx := context.Background()
	if err := q.EnsureEventStream(ctx, orderqueue.Config{}); err != nil {
		t.Fatal(err)
	}
	if did, err := q.Ensure(ctx); did || err != nil {
		t.Fatalf("ensure with everything there: %v %v", did, err)
	}
	js := q.JetStream()
	if err := js.DeleteConsumer(ctx, orderqueue.StreamName, orderqueue.ConsumerName); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, orderqueue.EventStream); err != nil {
		t.Fatal(err)
	}
	err := q.Ready(ctx)
	if !errors.Is(err, orderqueue.ErrMissing) {
		t.Fatalf("Ready: %v, want ErrMissing", err)
	}
	t.Logf("Ready: %v", err)
	if did, err := q.Ensure(ctx); !did || err != nil {
		t.Fatalf("ensure: %v %v", did, err)
	}
	if err := q.Ready(ctx); err != nil {
		t.Fatalf("Ready after ensure: %v", err)
	}
	publish(t, q, 0, 1)
	ack(t, q, 1) // the re-created consumers deliver
}

// retiredConsumer adds the payment-timer consumer of older versions to the
// order stream, as such a version (or one still running in a rolling
// upgrade) left it: a durable consumer that acknowledges nothing for the
// payment timeout.
func retiredConsumer(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if _, err := js.CreateOrUpdateConsumer(context.Background(), orderqueue.StreamName, jetstream.ConsumerConfig{
		Durable: orderqueue.ExpiryConsumerName, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: orderqueue.SubjectPrefix + "*",
	}); err != nil {
		t.Fatal(err)
	}
}

// TestRetiredExpiryConsumerDeleted: the payment-timer consumer an older
// version left on the stream is deleted when the queue opens, and again by
// the retention pass if an older instance re-creates it; retention then
// proceeds below the apply consumer's ack floor alone.
func TestRetiredExpiryConsumerDeleted(t *testing.T) {
	t.Parallel()
	url := testenv.NATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	cfg := orderqueue.Config{MaxAge: time.Second, DuplicateWindow: 500 * time.Millisecond}
	old, err := orderqueue.Open(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	js := old.JetStream()
	retiredConsumer(t, js)
	publish(t, old, 0, 3) // held by the retired consumer, never acknowledged by it

	q, err := orderqueue.Open(ctx, nc, cfg) // an instance of this version starts
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Consumer(ctx, orderqueue.StreamName, orderqueue.ExpiryConsumerName); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("retired consumer after Open: %v, want it deleted", err)
	}
	if err := q.Missing(ctx); err != nil {
		t.Fatalf("Missing: %v (the retired consumer is not required)", err)
	}
	// An instance of the older version re-creates it meanwhile.
	retiredConsumer(t, js)
	ack(t, q, 3)
	time.Sleep(2500 * time.Millisecond) // past the retention
	n, err := q.Retain(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("retention purged %d, want the 3 acknowledged by the apply consumer", n)
	}
	if _, err := js.Consumer(ctx, orderqueue.StreamName, orderqueue.ExpiryConsumerName); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("retired consumer after Retain: %v, want it deleted", err)
	}
}

package orderqueue_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestMissingAndEnsure: each stream or consumer deleted on the broker is
// named by Missing (wrapping ErrMissing) and by Ready, and re-created by
// Ensure with its configuration; the queue's handles work on what was
// re-created.
func TestMissingAndEnsure(t *testing.T) {
	t.Parallel()
	cfg := orderqueue.Config{DuplicateWindow: 7 * time.Second, AckWait: 3 * time.Second}
	for _, tt := range []struct {
		name   string
		delete func(ctx context.Context, js jetstream.JetStream) error
		gone   string
	}{
		{"consumer", func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteConsumer(ctx, orderqueue.StreamName, orderqueue.ConsumerName)
		}, "consumer " + orderqueue.ConsumerName},
		{"order stream", func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteStream(ctx, orderqueue.StreamName)
		}, "stream " + orderqueue.StreamName},
		{"dead-letter stream", func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteStream(ctx, orderqueue.DeadLetterStream)
		}, "stream " + orderqueue.DeadLetterStream},
		{"event stream", func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteStream(ctx, orderqueue.EventStream)
		}, "stream " + orderqueue.EventStream},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := openQueue(t, cfg)
			ctx := context.Background()
			if err := q.EnsureEventStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			if err := q.Missing(ctx); err != nil {
				t.Fatalf("Missing with everything there: %v", err)
			}
			if err := tt.delete(ctx, q.JetStream()); err != nil {
				t.Fatal(err)
			}
			err := q.Missing(ctx)
			if !errors.Is(err, orderqueue.ErrMissing) || !strings.Contains(err.Error(), tt.gone) {
				t.Fatalf("Missing = %v, want ErrMissing naming %q", err, tt.gone)
			}
			if err := q.Ready(ctx); !errors.Is(err, orderqueue.ErrMissing) {
				t.Fatalf("Ready = %v, want ErrMissing", err)
			}
			if did, err := q.Ensure(ctx); !did || err != nil {
				t.Fatalf("Ensure = %v, %v; want re-created", did, err)
			}
			if did, err := q.Ensure(ctx); did || err != nil {
				t.Fatalf("second Ensure = %v, %v; want nothing to do", did, err)
			}
			if err := q.Ready(ctx); err != nil {
				t.Fatalf("Ready after Ensure: %v", err)
			}
			if n := q.Recreated(); n != 1 {
				t.Errorf("Recreated = %d, want 1", n)
			}

			// Re-created with the configuration, not the defaults.
			js := q.JetStream()
			for _, name := range []string{orderqueue.StreamName, orderqueue.DeadLetterStream, orderqueue.EventStream} {
				st, err := js.Stream(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if d := st.CachedInfo().Config.Duplicates; d != cfg.DuplicateWindow {
					t.Errorf("%s: duplicate window %v, want %v", name, d, cfg.DuplicateWindow)
				}
			}
			ci, err := q.Consumer().Info(ctx)
			if err != nil || ci.Config.AckWait != cfg.AckWait {
				t.Fatalf("consumer after Ensure: %+v, %v; want ack wait %v", ci, err, cfg.AckWait)
			}
			// And the queue works on it: publish, consume, dead-letter, events.
			r := resv("k", 1)
			publishAll(t, q, message(r))
			deadLetter(t, q, fetch(t, q, 1)[0], r.OrderID, r.SKU, "poison")
			ds, err := q.DeadLetters(ctx, 0, 10)
			if err != nil || len(ds) != 1 || ds[0].OrderID != r.OrderID {
				t.Fatalf("DeadLetters after Ensure = %+v, %v", ds, err)
			}
			if err := q.PublishEvents(ctx, []orderqueue.Event{{ID: 1, Type: "created", Body: map[string]any{}}}); err != nil {
				t.Fatalf("PublishEvents after Ensure: %v", err)
			}
		})
	}
}

// TestMissingWithoutEvents: the event stream is required only once the
// queue ensured it.
func TestMissingWithoutEvents(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	if err := q.Missing(context.Background()); err != nil {
		t.Fatalf("Missing on a queue that never ensured the event stream: %v", err)
	}
}

// TestOpenAndEnsureConcurrently: several instances may open the queue at
// once, and re-create what is missing at once.
func TestOpenAndEnsureConcurrently(t *testing.T) {
	t.Parallel()
	// A broker of its own process: concurrent stream updates and consumer
	// creates race inside nats-server, which the race detector would
	// report against this test if the server ran in its binary.
	url := testenv.NATSProcess(t)
	const n = 4
	qs := make([]*orderqueue.Queue, n)
	var wg sync.WaitGroup
	for i := range qs {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		wg.Go(func() {
			q, err := orderqueue.Open(context.Background(), nc, orderqueue.Config{})
			if err != nil {
				t.Errorf("Open %d: %v", i, err)
			}
			qs[i] = q
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ctx := context.Background()
	js := qs[0].JetStream()
	if err := js.DeleteStream(ctx, orderqueue.StreamName); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, orderqueue.DeadLetterStream); err != nil {
		t.Fatal(err)
	}
	dids := make([]bool, n)
	for i, q := range qs {
		wg.Go(func() {
			did, err := q.Ensure(ctx)
			if err != nil {
				t.Errorf("Ensure %d: %v", i, err)
			}
			dids[i] = did
		})
	}
	wg.Wait()
	for i, q := range qs {
		if err := q.Missing(ctx); err != nil {
			t.Errorf("queue %d: Missing after concurrent Ensure: %v", i, err)
		}
	}
	if !slices.Contains(dids, true) {
		t.Errorf("no Ensure reported a re-creation: %v", dids)
	}
	r := resv("k", 1)
	publishAll(t, qs[1], message(r))
	if got := deliveredOf(fetch(t, qs[2], 1))[0]; got.MsgID != r.OrderID {
		t.Errorf("delivered %+v after re-creation, want %s", got, r.OrderID)
	}
}

// TestBrokerUnreachable: a broker that cannot be asked is an error of
// Missing, Ensure and Ping that is not ErrMissing, and Ready does not report
// it (purchases wait in the Redis outbox); once it is back, nothing is
// missing (the streams are on its store) and the queue publishes again.
func TestBrokerUnreachable(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t, "")
	nc, err := nats.Connect(ns.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := orderqueue.Open(context.Background(), nc, orderqueue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	publishAll(t, q, message(resv("k", 1)))
	ns.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := q.Missing(ctx); err == nil || errors.Is(err, orderqueue.ErrMissing) {
		t.Errorf("Missing with the broker down = %v, want an error other than ErrMissing", err)
	}
	if did, err := q.Ensure(ctx); did || err == nil || errors.Is(err, orderqueue.ErrMissing) {
		t.Errorf("Ensure with the broker down = %v, %v; want false and an error other than ErrMissing", did, err)
	}
	if err := q.Ready(ctx); err != nil {
		t.Errorf("Ready with the broker down = %v, want nil (not its concern)", err)
	}
	if err := q.Ping(ctx); err == nil {
		t.Error("Ping with the broker down = nil")
	}

	ns.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for !nc.IsConnected() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ctx = context.Background()
	if err := q.Missing(ctx); err != nil {
		t.Fatalf("Missing after the broker came back: %v", err)
	}
	if did, err := q.Ensure(ctx); did || err != nil {
		t.Fatalf("Ensure after the broker came back = %v, %v; want nothing to do", did, err)
	}
	publishAll(t, q, message(resv("k", 2)))
	if st := stats(t, q); st.Messages != 2 {
		t.Fatalf("stream holds %d after the restart, want 2", st.Messages)
	}
}

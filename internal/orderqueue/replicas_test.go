package orderqueue_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/testenv"
)

// replicasOf reads the replica counts of every stream and durable consumer
// of flashsale.
func replicasOf(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	ctx := context.Background()
	got := map[string]int{}
	for _, name := range []string{orderqueue.StreamName, orderqueue.DeadLetterStream, orderqueue.EventStream} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got[name] = info.Config.Replicas
	}
	for _, name := range []string{orderqueue.ConsumerName} {
		c, err := js.Consumer(ctx, orderqueue.StreamName, name)
		if err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// 0 means "as the stream"; the cluster's peer count is what is real.
		n := info.Config.Replicas
		if n == 0 && info.Cluster != nil {
			n = len(info.Cluster.Replicas) + 1
		}
		got[name] = n
	}
	return got
}

func openOn(t *testing.T, url string, cfg orderqueue.Config) (*orderqueue.Queue, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := orderqueue.Open(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureEventStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return q, js
}

// TestReplicas runs on a 3-node JetStream cluster: streams at R1 are raised
// to R3 in place (their messages kept), a start configured with 1 replica
// does not lower them back, and with one node down the queue keeps
// publishing and consuming.
func TestReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node JetStream cluster")
	}
	t.Parallel()
	nc := testenv.StartNATSCluster(t, 3)
	all := func(n int) map[string]int {
		return map[string]int{orderqueue.StreamName: n, orderqueue.DeadLetterStream: n, orderqueue.EventStream: n,
			orderqueue.ConsumerName: n}
	}
	eq := func(a, b map[string]int) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

	q, js := openOn(t, nc.URL, orderqueue.Config{Replicas: 1})
	if got := replicasOf(t, js); !eq(got, all(1)) {
		t.Fatalf("replicas 1: %v", got)
	}
	publish(t, q, 0, 10)

	_, js = openOn(t, nc.URL, orderqueue.Config{Replicas: 3})
	if got := replicasOf(t, js); !eq(got, all(3)) {
		t.Fatalf("raised to 3 in place: %v", got)
	}
	info, err := q.Stats(context.Background())
	if err != nil || info.Messages != 10 {
		t.Fatalf("after raising the replicas: %+v %v, want the 10 messages kept", info, err)
	}

	var logs bytes.Buffer
	q, js = openOn(t, nc.URL, orderqueue.Config{Replicas: 1, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if got := replicasOf(t, js); !eq(got, all(3)) {
		t.Fatalf("a start with replicas 1 lowered an R3 deployment: %v", got)
	}
	if !strings.Contains(logs.String(), "never lowers") {
		t.Errorf("no notice that the higher count was kept; log:\n%s", logs.String())
	}

	// Every replica caught up (a stream just raised to R3 copies its
	// messages to the new peers first), then one node down: the stream and
	// its consumer have a quorum left.
	nc.WaitCurrent(orderqueue.StreamName)
	nc.Servers[2].Shutdown()
	deadline := time.Now().Add(60 * time.Second)
	for {
		msgs := []orderqueue.Message{{ID: "after", SKU: "k", Data: []byte(`{}`)}}
		err := q.Publish(context.Background(), msgs)[0]
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish with one of three nodes down: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	got := 0
	for got < 11 && time.Now().Before(deadline) {
		batch, err := q.Consumer().Fetch(100, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Logf("fetch: %v", err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for m := range batch.Messages() {
			got++
			_ = m.Ack()
		}
		if err := batch.Error(); err != nil {
			t.Logf("fetch: %v", err)
		}
	}
	if got < 11 {
		t.Fatalf("consumed %d of 11 messages with one node down", got)
	}
}

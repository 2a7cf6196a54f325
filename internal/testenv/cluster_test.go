package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestStartRedisCluster: three primaries with a replica each, a cluster
// client that writes to every slot range, and a forced failover that makes
// the replica a primary.
func TestStartRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six redis-servers")
	}
	rc := testenv.StartRedisCluster(t)
	prim := rc.Primaries()
	if len(prim) != 3 {
		t.Fatalf("primaries %v, want 3", prim)
	}
	c := rc.Client()
	ctx := context.Background()
	for _, k := range []string{"{a}", "{b}", "{c}", "{d}", "{e}"} {
		if err := c.Do(ctx, c.B().Set().Key(k).Value("1").Build()).Error(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	rep := rc.ReplicaOf(prim[0])
	rc.Failover(rep, "FORCE")
	got := rc.Primaries()
	found := false
	for _, p := range got {
		found = found || p == rep
	}
	if !found {
		t.Fatalf("after failover primaries %v, want %s among them", got, rep)
	}
}

// TestStartNATSCluster: an R3 stream on three nodes keeps taking messages
// when one node is shut down.
func TestStartNATSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nats-servers")
	}
	nc := testenv.StartNATSCluster(t, 3)
	conn, err := nats.Connect(nc.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	// Shut a node down once every replica is current.
	nc.WaitCurrent("T")
	nc.Servers[0].Shutdown()
	deadline := time.Now().Add(45 * time.Second)
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.Publish(pctx, "t.1", []byte("y"))
		pcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish with one node down: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

package reconcile_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestMonitorClusterFailover runs the data-loss monitor on a real Redis
// Cluster (3 primaries + 3 replicas): an idle cluster never rebuilds; a
// forced failover (the replica's data may lag: asynchronous replication) is
// noticed although no server restarted and the set of nodes is the same; a
// primary killed after writes its replica never received is noticed, and
// the rebuild replaces the stale stock the promoted replica serves with the
// database's.
func TestMonitorClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	ctx := t.Context()
	st, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rc := testenv.StartRedisCluster(t)
	gate := stockgate.New(rc.Client(), "fs")
	log := slog.New(slog.DiscardHandler)
	s := reconcile.NewSyncer(st, gate, nil, log)
	const sku = "HOT"
	if _, _, err := s.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 10, PerUserLimit: 5}); err != nil {
		t.Fatal(err)
	}
	rebuilds := 0
	mon := reconcile.NewMonitor(gate, func(ctx context.Context) error {
		rebuilds++
		_, err := s.Rebuild(ctx, sku)
		return err
	}, log)
	// runUntil runs the monitor every 100 ms for d or until it rebuilt.
	runUntil := func(d time.Duration, stopOnRebuild bool) {
		t.Helper()
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			rebuilt, err := mon.RunOnce(ctx)
			if err != nil {
				t.Logf("monitor: %v", err)
			}
			if rebuilt && stopOnRebuild {
				return
			}
		}
	}
	if rebuilt, err := mon.RunOnce(ctx); err != nil || !rebuilt {
		t.Fatalf("first check: rebuilt %v, %v; want a rebuild (nothing recorded yet)", rebuilt, err)
	}

	rebuilds = 0
	runUntil(2*time.Second, false)
	if rebuilds != 0 {
		t.Fatalf("idle cluster: %d rebuilds in 20 checks, want 0", rebuilds)
	}

	primaryOf := func() string {
		t.Helper()
		key := gate.KeysOf(sku).Meta
		for _, addr := range rc.Primaries() {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
			if err != nil {
				t.Fatal(err)
			}
			n, err := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64()
			c.Close()
			if err == nil && n == 1 {
				return addr
			}
		}
		t.Fatalf("no primary holds %s", key)
		return ""
	}

	// A coordinated-or-not failover keeps every node and every run id:
	// only the promoted replica's replication id tells.
	p := primaryOf()
	rc.Failover(rc.ReplicaOf(p), "FORCE")
	runUntil(10*time.Second, true)
	if rebuilds != 1 {
		t.Fatalf("forced failover of %s: %d rebuilds, want 1", p, rebuilds)
	}
	rebuilds = 0
	runUntil(time.Second, false)
	if rebuilds != 0 {
		t.Fatalf("after the failover: %d more rebuilds, want 0", rebuilds)
	}

	// A primary dies after a write its replica never got. Freezing the
	// replica does not lose it (the kernel buffers the replication stream),
	// so the replica's copy is made stale by hand once it is promoted: the
	// stock was cut from 10 to 4 (database and old primary) and the new
	// primary still says 10.
	p = primaryOf()
	rep := rc.Node(rc.ReplicaOf(p))
	if _, _, err := s.Put(ctx, orderstore.SKUChange{ID: sku, TotalStock: 4, PerUserLimit: 5}); err != nil {
		t.Fatal(err)
	}
	rc.Node(p).Kill()
	rc.WaitOK()
	if !slices.Contains(rc.Primaries(), rep.Addr) {
		t.Fatalf("replica %s not promoted: primaries %v", rep.Addr, rc.Primaries())
	}
	c := rc.Client()
	if err := c.Do(ctx, c.B().Hset().Key(gate.KeysOf(sku).Meta).FieldValue().FieldValue("avail", "10").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if f, err := gate.ReadInFlight(ctx, sku); err != nil || f.Available != 10 {
		t.Fatalf("stale copy: %+v %v", f, err)
	}
	runUntil(15*time.Second, true)
	if rebuilds != 1 {
		t.Fatalf("primary %s killed, replica %s promoted: %d rebuilds, want 1", p, rep.Addr, rebuilds)
	}
	f, err := gate.ReadInFlight(ctx, sku)
	if err != nil || !f.Loaded {
		t.Fatalf("after the rebuild: %+v %v", f, err)
	}
	if f.Available != 4 {
		t.Fatalf("after the rebuild: %d units sellable, want the database's 4", f.Available)
	}
}

package stockgate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestTransferFailoverCluster: a split sale on a real 3 + 3 Redis
// Cluster, one bucket per primary. The donor's replica lags (paused)
// while a transfer debits the donor; the donor's primary then dies and
// its replica takes over without the debit (nor what it wrote since the
// replica stopped reading). The receiver was never
// credited (the debit was not acknowledged by a replica), so the promoted
// cluster holds exactly the sale's units: before, the receiver kept a
// credit whose debit the failover had lost.
func TestTransferFailoverCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	rc := testenv.StartRedisCluster(t)
	c := rc.Client()
	g := stockgate.New(c, "fc")
	ctx := context.Background()
	const sku, k, stock = "hot", 3, 30
	seedSplit(t, g, sku, k, stock, 5)
	names := stockgate.BucketNames(sku, k)
	donor := primaryOf(t, rc, g.KeysOf(names[1]).Meta)
	if donor == primaryOf(t, rc, g.KeysOf(names[0]).Meta) {
		t.Fatalf("buckets 0 and 1 on one primary %s", donor)
	}
	bs, err := g.ReadBuckets(ctx, names, false)
	if err != nil {
		t.Fatal(err)
	}
	// The donor's replica holds the seed before it starts to lag: a
	// replica that never had the bucket would lose it in the failover
	// whatever the transfer does (a CI run: the bucket gone, 20 of 30).
	dc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{donor}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	waitReplicating(t, dc, "fc:{"+names[1]+"}:replicating")
	dc.Close()
	replica := rc.ReplicaOf(donor)
	rc.Node(replica).Pause()
	// Fill the replication link (the kernel's socket buffers) so that
	// what the donor writes next stays in its own output buffer, which
	// dies with it: a replica that lags.
	junk := strings.Repeat("x", 8<<20)
	for i := range 5 {
		key := fmt.Sprintf("fc:{%s}:junk%d", names[1], i)
		if err := c.Do(ctx, c.B().Set().Key(key).Value(junk).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	err = g.Transfer(ctx, names[1], names[0], bs[0].Epoch, 4, k)
	if !errors.Is(err, sale.ErrBusy) {
		t.Errorf("transfer with the donor's replica paused: %v, want busy", err)
	}
	rc.Node(donor).Kill()
	rc.Node(replica).Resume()
	rc.Failover(replica, "TAKEOVER")

	var sum int64
	deadline := time.Now().Add(20 * time.Second)
	for {
		bs, err = g.ReadBuckets(ctx, names, false)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reading the buckets after the failover: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, b := range bs {
		sum += b.Avail - b.Debt + b.Transit
	}
	if sum != stock {
		t.Fatalf("after the failover the buckets hold %d units (%+v), want %d", sum, bs, stock)
	}
}

// primaryOf returns the address of the primary that holds key.
func primaryOf(t *testing.T, rc *testenv.RedisCluster, key string) string {
	t.Helper()
	for _, addr := range rc.Primaries() {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.Do(context.Background(), c.B().Exists().Key(key).Build()).AsInt64()
		c.Close()
		if err == nil && n == 1 {
			return addr
		}
	}
	t.Fatalf("no primary holds %s", key)
	return ""
}

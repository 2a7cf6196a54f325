package stockgate_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

var evalCalls = regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`)

// scriptCalls returns the script calls (EVALSHA and EVAL) a node has run.
func scriptCalls(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, m := range evalCalls.FindAllStringSubmatch(info, -1) {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		n += v
	}
	return n
}

// clusterClient starts a 3-primary cluster and returns a client of it.
func clusterClient(t *testing.T) rueidis.Client {
	t.Helper()
	var addrs []string
	for _, s := range startCluster(t) {
		addrs = append(addrs, s.Addr)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// One hot SKU split in 3 buckets on a real 3-primary Redis Cluster: its
// gate calls land on all three primaries in roughly equal shares (each
// primary's script calls within 2x of every other's: a distribution check,
// not a timing), and after a concurrent sale that sells out the totals are
// exact: every unit sold once, none left in any bucket or in transfer, no
// buyer over the limit.
func TestBucketsSpreadOverClusterPrimaries(t *testing.T) {
	c := clusterClient(t)
	g := stockgate.New(c, "fs")
	runBucketScripts(t, g, "scripts") // every bucket script on the cluster: none is CROSSSLOT
	for _, k := range []int{3, 6} {
		t.Run(fmt.Sprintf("buckets=%d", k), func(t *testing.T) { clusterSale(t, c, g, fmt.Sprintf("hot%d", k), k) })
	}
}

func clusterSale(t *testing.T, c rueidis.Client, g *stockgate.Gate, sku string, k int) {
	ctx := context.Background()
	const stock, limit, users, buys = 3000, 10, 600, 4000
	if ok, err := g.SeedSplit(ctx, sku, stockgate.Config{PerUserLimit: limit}, k, stock, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatalf("seed split: %v %v", ok, err)
	}
	nodes := c.Nodes()
	if len(nodes) != 3 {
		t.Fatalf("%d nodes", len(nodes))
	}
	names := map[string]bool{}
	for _, n := range stockgate.BucketNames(sku, k) {
		names[n] = true
	}
	if len(names) != k {
		t.Fatalf("bucket names %v", stockgate.BucketNames(sku, k))
	}
	for _, n := range nodes {
		if err := n.Do(ctx, n.B().ConfigResetstat().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	var sold, soldOut atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				_, err := g.ReserveIn(ctx, res(sku, fmt.Sprintf("buyer-%d", i%users), 1), stockgate.Limits{}, k)
				switch {
				case err == nil:
					sold.Add(1)
				case errorsIs(err, sale.ErrSoldOut):
					soldOut.Add(1)
				case errorsIs(err, sale.ErrLimitReached):
				default:
					t.Errorf("purchase: %v", err)
				}
			}
		}()
	}
	for i := range buys {
		work <- i
	}
	close(work)
	wg.Wait()
	if sold.Load() != stock {
		t.Fatalf("%d sold of %d", sold.Load(), stock)
	}
	calls := map[string]int64{}
	lo, hi := int64(-1), int64(0)
	for addr, n := range nodes {
		v := scriptCalls(t, n)
		calls[addr] = v
		if lo < 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	t.Logf("script calls per primary: %v (sold %d, sold out %d)", calls, sold.Load(), soldOut.Load())
	if lo == 0 || hi > 2*lo {
		t.Fatalf("script calls per primary not within 2x of each other: %v", calls)
	}
	bs, err := g.ReadBuckets(ctx, stockgate.BucketNames(sku, k), true)
	if err != nil {
		t.Fatal(err)
	}
	var inflight int
	for _, b := range bs {
		if b.Avail != 0 || b.Debt != 0 || b.Transit != 0 {
			t.Fatalf("bucket %s after the sale: %+v", b.Name, b)
		}
		inflight += len(b.Reservations)
		for _, r := range b.Reservations {
			if r.Bucket != b.Name || stockgate.HomeName(sku, r.User, k) != b.Name {
				t.Fatalf("reservation of %s in bucket %s names %q", r.User, b.Name, r.Bucket)
			}
		}
	}
	if inflight != stock {
		t.Fatalf("%d reservations recorded, %d sold", inflight, stock)
	}
	for i := range users {
		if h, err := g.Held(ctx, sku, fmt.Sprintf("buyer-%d", i)); err != nil || h > limit {
			t.Fatalf("buyer-%d holds %d (%v)", i, h, err)
		}
	}
}

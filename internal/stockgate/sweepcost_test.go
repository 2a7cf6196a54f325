package stockgate_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// callCounter is a client that counts the commands it sends that name a
// key of one of the watched sales (prefix:{sku or sku~n}), by sale.
type callCounter struct {
	rueidis.Client
	prefix string
	mu     sync.Mutex
	n      map[string]int
}

func (c *callCounter) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.note(cmd.Commands())
	return c.Client.Do(ctx, cmd)
}

func (c *callCounter) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	for _, cmd := range cmds {
		c.note(cmd.Commands())
	}
	return c.Client.DoMulti(ctx, cmds...)
}

func (c *callCounter) note(args []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range args {
		if rest, ok := strings.CutPrefix(a, c.prefix+":{"); ok {
			if tag, _, ok := strings.Cut(rest, "}"); ok {
				c.n[sale.SKUOfBucket(tag)]++
				return
			}
		}
	}
}

func (c *callCounter) calls(sku string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[sku]
}

func newCountingGate(t *testing.T) (*stockgate.Gate, *callCounter) {
	t.Helper()
	url, prefix := testenv.Redis(t)
	cc := &callCounter{Client: testenv.RedisClient(t, url), prefix: prefix, n: map[string]int{}}
	return stockgate.New(cc, prefix), cc
}

// TestSweeperQuietSalesCost: two minutes of a pass a second over three
// split sales of 4 buckets: one that ended before, one live with nothing
// in transfer or in debt, one live with a transfer left half done. The
// ended sale costs no Redis call at all; the idle one a look (one script
// call per bucket) at waits doubling up to SweepIdleMax, not 2K+1 calls a
// second; the busy one has its transfer finished in time.
func TestSweeperQuietSalesCost(t *testing.T) {
	g, cc := newCountingGate(t)
	ctx := context.Background()
	const k = 4
	now := time.Now()
	for _, sku := range []string{"ended", "idle", "busy"} {
		seedSplit(t, g, sku, k, 40, 5)
	}
	names := stockgate.BucketNames("busy", k)
	bs, err := g.ReadBuckets(ctx, names, false)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := g.TransferOut(ctx, names[1], names[0], bs[0].Epoch, 3, k, now); err != nil || n != 3 {
		t.Fatalf("transfer out: %d %v", n, err)
	}
	sales := salesList{
		{ID: "ended", Buckets: k, EndsAt: now.Add(-2 * time.Minute)},
		{ID: "idle", Buckets: k, EndsAt: now.Add(time.Hour)},
		{ID: "busy", Buckets: k},
	}
	sw := stockgate.NewTransferSweeper(g, sales, slog.New(slog.DiscardHandler))
	before := map[string]int{}
	for _, s := range sales {
		before[s.ID] = cc.calls(s.ID)
	}
	var done int
	for sec := range 120 {
		p, err := sw.RunOnce(ctx, now.Add(time.Duration(sec)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		done += p.Transfers
	}
	if done != 1 {
		t.Errorf("%d transfers finished, want 1", done)
	}
	if _, transit := bucketAvail(t, g, "busy", k); transit != 0 {
		t.Errorf("busy sale: %d units still in transfer", transit)
	}
	// Looks at 0, 1, 3, 7, 15, 31, 61, 91 s: 8 of them.
	for _, tc := range []struct {
		sku  string
		most int
	}{
		{"ended", 0},
		{"idle", 8 * k},
	} {
		if got := cc.calls(tc.sku) - before[tc.sku]; got > tc.most {
			t.Errorf("%s sale: %d redis calls in 120 passes, want at most %d", tc.sku, got, tc.most)
		}
	}
}

// TestRefillBacksOff: when only a transfer in progress holds the units a
// purchase needs, the purchase does not re-read every bucket in a tight
// loop: a young transfer (its caller still at work) makes it wait with
// backoff and give up busy after a bounded number of reads; a stale one
// (its caller died, TransferAge old) is finished by the purchase itself,
// which then succeeds.
func TestRefillBacksOff(t *testing.T) {
	g, cc := newCountingGate(t)
	ctx := context.Background()
	const k = 2
	for _, tc := range []struct {
		sku     string
		age     time.Duration
		wantErr error
	}{
		{"young", 0, sale.ErrBusy},
		{"stale", stockgate.TransferAge + time.Second, nil},
	} {
		seedSplit(t, g, tc.sku, k, 4, 5) // 2 + 2
		names := stockgate.BucketNames(tc.sku, k)
		bs, err := g.ReadBuckets(ctx, names, false)
		if err != nil {
			t.Fatal(err)
		}
		user := userIn(0, k, 0)
		// Bucket 0's units leave for bucket 1, which never gets them
		// (a caller between the halves); bucket 1 sells its own.
		if n, err := g.TransferOut(ctx, names[0], names[1], bs[1].Epoch, 2, k, time.Now().Add(-tc.age)); err != nil || n != 2 {
			t.Fatalf("%s: transfer out: %d %v", tc.sku, n, err)
		}
		for i := range 2 {
			if _, err := g.ReserveIn(ctx, res(tc.sku, userIn(1, k, i), 1), stockgate.Limits{}, k); err != nil {
				t.Fatalf("%s: bucket 1's own units: %v", tc.sku, err)
			}
		}
		start, calls := time.Now(), cc.calls(tc.sku)
		_, err = g.ReserveIn(ctx, res(tc.sku, user, 1), stockgate.Limits{}, k)
		took, calls := time.Since(start), cc.calls(tc.sku)-calls
		if !errors.Is(err, tc.wantErr) {
			t.Fatalf("%s: purchase: %v, want %v", tc.sku, err, tc.wantErr)
		}
		if most := 70 * k; calls > most {
			t.Errorf("%s: the purchase made %d redis calls in %v, want at most %d", tc.sku, calls, took, most)
		}
		t.Logf("%s: %v after %d redis calls in %v", tc.sku, err, calls, took)
	}
}

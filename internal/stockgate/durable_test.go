package stockgate_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// primaryWithReplica starts a private primary and a replica of it, and
// waits until the replica's link is up.
func primaryWithReplica(t *testing.T) (primary, replica *testenv.RedisServer) {
	t.Helper()
	primary = testenv.StartRedis(t, "--repl-diskless-sync-delay", "0") // a replica's first sync at once, not after 5 s
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica = testenv.StartRedis(t, "--replicaof", host, port)
	waitReplicating(t, testenv.RedisClient(t, primary.URL), "fo:replicating")
	return primary, replica
}

// waitReplicating waits until a write on the primary reaches a replica and
// is acknowledged (WAIT), the condition a transfer's halves wait on. The
// replica's own "master_link_status:up" comes first: the primary lists a
// replica (ROLE, which the gate reads to decide whether a transfer waits)
// only once its server cron has seen the sync end, and after a diskless
// sync it streams writes only from the replica's first REPLCONF ACK, sent
// once a second; a replica paused and resumed catches up from a backlog.
// The write is an INCR of key (on a cluster node, a key of the node's
// slots); the replication stream is ordered, so once it is acknowledged
// everything the primary wrote before it has reached the replica too.
func waitReplicating(t *testing.T, c rueidis.Client, key string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rs := c.DoMulti(ctx, c.B().Incr().Key(key).Build(), c.B().Wait().Numreplicas(1).Timeout(1000).Build())
		n, err := rs[1].AsInt64()
		if err == nil && n >= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replica acknowledged a write within 20 s (WAIT: %d %v)", n, err)
		}
	}
}

// TestTransferHalfLostInFailover: a transfer between two stock buckets on
// a primary with a replica that does not acknowledge one of the halves (it
// lags; here it is paused), then a failover that loses that half, as the
// promoted replica would (the half's writes undone). The sum over the
// buckets + units in transfer stays the sale's stock: a debit no replica
// acknowledged is not credited (else the lost debit duplicates the
// units), and a credit no replica acknowledged leaves the transfer's
// entry open, so the sweeper credits it again once it is lost (else the
// units are lost).
func TestTransferHalfLostInFailover(t *testing.T) {
	primary, replica := primaryWithReplica(t)
	c := testenv.RedisClient(t, primary.URL)
	g := stockgate.New(c, "fo")
	// Long enough for a replica that keeps up to acknowledge on a busy
	// machine; a paused one makes a transfer wait this long.
	g.SetTransferWait(time.Second)
	ctx := context.Background()
	const k, stock = 2, 10
	for _, tc := range []struct {
		name string
		// The replica is paused before the transfer (the debit is not
		// acknowledged) or between its halves (the credit is not), or
		// not at all (both are: the transfer completes at once).
		before, between bool
	}{
		{"debit lost", true, false},
		{"credit lost", false, true},
		{"replica keeps up", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sku := strings.ReplaceAll(tc.name, " ", "-")
			// The replica caught up after the last case's pause.
			waitReplicating(t, c, "fo:replicating")
			seedSplit(t, g, sku, k, stock, 5) // 5 + 5
			names := stockgate.BucketNames(sku, k)
			bs, err := g.ReadBuckets(ctx, names, false)
			if err != nil {
				t.Fatal(err)
			}
			if tc.before {
				replica.Pause()
			}
			if tc.between {
				stockgate.AfterTransferOut(t, replica.Pause)
			}
			// A debit no replica acknowledged stops the transfer, busy.
			if err := g.Transfer(ctx, names[1], names[0], bs[0].Epoch, 3, k); err != nil && !(tc.before && errors.Is(err, sale.ErrBusy)) {
				t.Fatal(err)
			}
			replica.Resume()
			stockgate.AfterTransferOut(t, nil)
			if !tc.before && !tc.between {
				if avail, transit := bucketAvail(t, g, sku, k); avail[0] != 8 || avail[1] != 2 || transit != 0 {
					t.Fatalf("replica keeping up: buckets %v, %d in transfer; want [8 2], 0", avail, transit)
				}
				return
			}
			// The failover: the half the replica never had is gone.
			lose(t, c, g, tc.before, names)
			sw := stockgate.NewTransferSweeper(g, salesList{{ID: sku, Buckets: k}}, slog.New(slog.DiscardHandler))
			if _, err := sw.RunOnce(ctx, time.Now().Add(stockgate.TransferAge+time.Second)); err != nil {
				t.Fatal(err)
			}
			avail, transit := bucketAvail(t, g, sku, k)
			if sum := avail[0] + avail[1] + transit; sum != stock {
				t.Fatalf("after the failover and a sweep: buckets %v + %d in transfer = %d, want %d", avail, transit, sum, stock)
			}
			if transit != 0 {
				t.Fatalf("%d units still in transfer after a sweep", transit)
			}
		})
	}
}

// lose undoes, on the primary, what the promoted replica would not have:
// the donor's debit and journal entry (debit), or the receiver's credit
// and its transfer id (credit). Both buckets live on one primary here; on
// a cluster they live on two, which fail over apart, so either half can
// be lost alone.
func lose(t *testing.T, c rueidis.Client, g *stockgate.Gate, debit bool, names []string) {
	t.Helper()
	ctx := context.Background()
	donor, recv := g.KeysOf(names[1]).Meta, g.KeysOf(names[0]).Meta
	xfer := strings.TrimSuffix(donor, "meta") + "xfer"
	xin := strings.TrimSuffix(recv, "meta") + "xin"
	if debit { // the sale's only transfer: its entry goes with the debit
		must(t, c.Do(ctx, c.B().Del().Key(xfer).Build()).Error())
		must(t, c.Do(ctx, c.B().Hincrby().Key(donor).Field("avail").Increment(3).Build()).Error())
		return
	}
	ids, err := c.Do(ctx, c.B().Smembers().Key(xin).Build()).AsStrSlice()
	if err != nil || len(ids) != 1 {
		t.Fatalf("receiver's credited ids %v %v, want the one transfer", ids, err)
	}
	must(t, c.Do(ctx, c.B().Srem().Key(xin).Member(ids[0]).Build()).Error())
	must(t, c.Do(ctx, c.B().Hincrby().Key(recv).Field("avail").Increment(-3).Build()).Error())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

package stockgate_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// salesList is a fixed list of sales (the catalog).
type salesList []sale.SKU

func (l salesList) All() []sale.SKU { return l }

// TestTransferSweeper: a split sale whose transfer was left half done (the
// units debited from one bucket, never credited to the other) gets its
// units back in the receiver after one pass once the transfer is
// TransferAge old, not before (its caller may still finish it); the debt
// of a bucket is paid from another; a sale in one bucket is left alone.
func TestTransferSweeper(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const k = 2
	seedSplit(t, g, "tw", k, 10, 5) // 5 + 5
	names := stockgate.BucketNames("tw", k)
	bs, err := g.ReadBuckets(ctx, names, false)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if n, err := g.TransferOut(ctx, names[1], names[0], bs[0].Epoch, 3, k, now); err != nil || n != 3 {
		t.Fatalf("transfer out: %d %v", n, err)
	}
	// A sale in debt: bucket 0 owes 2, bucket 1 has 4.
	debtNames := stockgate.BucketNames("td", k)
	if err := g.SetBuckets(ctx, debtNames, k); err != nil {
		t.Fatal(err)
	}
	for b, avail := range []int64{-2, 4} {
		if ok, err := g.Seed(ctx, debtNames[b], stockgate.Config{PerUserLimit: 5}, avail, nil, nil, nil, nil, fmt.Sprintf("e1-%d", b)); err != nil || !ok {
			t.Fatalf("seed bucket %d: %v %v", b, ok, err)
		}
	}
	seed(t, g, "one", 7, 1)
	sw := stockgate.NewTransferSweeper(g, salesList{{ID: "tw", Buckets: k}, {ID: "td", Buckets: k}, {ID: "one"}}, slog.New(slog.DiscardHandler))

	for _, tc := range []struct {
		name    string
		now     time.Time
		want    stockgate.TransferPass
		avail   []int64 // tw's buckets
		transit int64
	}{
		{"young transfer", now.Add(stockgate.TransferAge - time.Millisecond), stockgate.TransferPass{Settled: 2}, []int64{5, 2}, 3},
		{"old transfer", now.Add(stockgate.TransferAge), stockgate.TransferPass{Transfers: 1}, []int64{8, 2}, 0},
		{"nothing left", now.Add(time.Hour), stockgate.TransferPass{}, []int64{8, 2}, 0},
	} {
		got, err := sw.RunOnce(ctx, tc.now)
		if err != nil || got != tc.want {
			t.Fatalf("%s: RunOnce = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
		if avail, transit := bucketAvail(t, g, "tw", k); !slices.Equal(avail, tc.avail) || transit != tc.transit {
			t.Fatalf("%s: buckets %v, in transfer %d; want %v, %d", tc.name, avail, transit, tc.avail, tc.transit)
		}
	}
	if avail, transit := bucketAvail(t, g, "td", k); !slices.Equal(avail, []int64{0, 2}) || transit != 0 {
		t.Fatalf("sale in debt after the passes: %v, in transfer %d; want [0 2]", avail, transit)
	}
	if n, _, err := g.Available(ctx, "one"); err != nil || n != 7 {
		t.Fatalf("sale in one bucket: %d %v, want its 7", n, err)
	}
}

// TestJanitor: a sale that ended more than the retention ago has its keys
// dropped (and leaves the registry); a live one, one that ended within the
// retention, and one ended long ago with a reservation in flight are kept.
func TestJanitor(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	now := time.Now()
	busy := res("busy", "u", 1)
	for _, s := range []struct {
		id       string
		endsAt   time.Time
		inflight []sale.Reservation
	}{
		{"old", now.Add(-2 * time.Hour), nil},
		{"busy", now.Add(-2 * time.Hour), []sale.Reservation{busy}},
		{"recent", now.Add(-time.Minute), nil},
		{"live", time.Time{}, nil},
	} {
		if ok, err := g.Seed(ctx, s.id, stockgate.Config{PerUserLimit: 5, EndsAt: s.endsAt}, 10, nil, s.inflight, nil, nil, "e1"); err != nil || !ok {
			t.Fatalf("seed %s: %v %v", s.id, ok, err)
		}
	}
	j := stockgate.NewJanitor(g, time.Hour, slog.New(slog.DiscardHandler))

	dropped, err := j.RunOnce(ctx, now)
	if err != nil || !slices.Equal(dropped, []string{"old"}) {
		t.Fatalf("RunOnce = %v, %v; want [old]", dropped, err)
	}
	reg, err := g.SKUs(ctx)
	slices.Sort(reg)
	if err != nil || !slices.Equal(reg, []string{"busy", "live", "recent"}) {
		t.Fatalf("registry %v %v; want busy, live, recent", reg, err)
	}
	for id, want := range map[string]int64{"old": 0, "busy": 1, "recent": 1, "live": 1} {
		if got, err := c.Do(ctx, c.B().Exists().Key(g.KeysOf(id).Meta).Build()).AsInt64(); err != nil || got != want {
			t.Errorf("%s's meta exists %d (%v), want %d", id, got, err, want)
		}
	}
	if dropped, err := j.RunOnce(ctx, now); err != nil || len(dropped) != 0 {
		t.Fatalf("second pass: %v %v; want nothing", dropped, err)
	}
}

package orderstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/google/go-cmp/cmp"
)

func pending(id string) orderstore.Outcome {
	return orderstore.Outcome{OrderID: id, Status: sale.StatusPendingPayment}
}

func failed(id, reason string) orderstore.Outcome {
	return orderstore.Outcome{OrderID: id, Status: sale.StatusFailed, Reason: reason}
}

func reversed[T any](s []T) []T {
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}

func dup(o orderstore.Outcome) orderstore.Outcome { o.Duplicate = true; return o }

// cancelBehindStore cancels order id and gives its units back to the stock
// as a release would, in one transaction of the outside client. The outside
// client's stock change counts as an external one on both dialects: it is
// audited, and the trigger makes total_stock follow it, so a second update
// puts total_stock back (a release leaves the allocation alone).
func cancelBehindStore(t testing.TB, s *orderstore.Store, id string) {
	t.Helper()
	ctx := testContext(t)
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, st := range []struct {
		q    string
		args []any
	}{
		{`UPDATE inventory SET stock = stock + (SELECT quantity FROM orders WHERE order_id = ?)
WHERE sku_id = (SELECT sku_id FROM orders WHERE order_id = ?)`, []any{id, id}},
		{`UPDATE inventory SET total_stock = total_stock - (SELECT quantity FROM orders WHERE order_id = ?)
WHERE sku_id = (SELECT sku_id FROM orders WHERE order_id = ?)`, []any{id, id}},
		{`UPDATE orders SET status = 'cancelled' WHERE order_id = ?`, []any{id}},
	} {
		res, err := tx.ExecContext(ctx, s.Rebind(st.q), st.args...)
		if err != nil {
			t.Fatalf("cancel %s: %v", id, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("cancel %s: %d rows changed, want 1", id, n)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestApplyBatch(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)

	type step struct {
		batch     []sale.Reservation
		want      []orderstore.Outcome
		wantStock map[string]int64
	}
	tests := []struct {
		name  string
		stock map[string]int64 // SKUs created first (TotalStock)
		steps func(c int) []step
	}{
		{
			name:  "applies, then the same batch again changes nothing",
			stock: map[string]int64{"APPLY": 10},
			steps: func(c int) []step {
				b := []sale.Reservation{
					resv(oid(c, 1), "APPLY", "u1", 1),
					resv(oid(c, 2), "APPLY", "u2", 2),
					resv(oid(c, 3), "APPLY", "u3", 3),
				}
				first := []orderstore.Outcome{pending(oid(c, 1)), pending(oid(c, 2)), pending(oid(c, 3))}
				again := []orderstore.Outcome{dup(first[0]), dup(first[1]), dup(first[2])}
				return []step{
					{batch: b, want: first, wantStock: map[string]int64{"APPLY": 4}},
					{batch: b, want: again, wantStock: map[string]int64{"APPLY": 4}},
					{batch: reversed(b), want: reversed(again), wantStock: map[string]int64{"APPLY": 4}},
				}
			},
		},
		{
			name:  "more demand than stock: exactly the stock is taken",
			stock: map[string]int64{"SHORT": 5},
			steps: func(c int) []step {
				var b []sale.Reservation
				var want []orderstore.Outcome
				for i := range 8 {
					b = append(b, resv(oid(c, i), "SHORT", fmt.Sprintf("u%d", i), 1))
					if i < 5 {
						want = append(want, pending(oid(c, i)))
					} else {
						want = append(want, failed(oid(c, i), orderstore.ReasonInsufficientStock))
					}
				}
				again := make([]orderstore.Outcome, len(want))
				for i, o := range want {
					again[i] = dup(o)
				}
				return []step{
					{batch: b, want: want, wantStock: map[string]int64{"SHORT": 0}},
					{batch: b, want: again, wantStock: map[string]int64{"SHORT": 0}},
					{
						batch:     []sale.Reservation{resv(oid(c, 100), "SHORT", "late", 1)},
						want:      []orderstore.Outcome{failed(oid(c, 100), orderstore.ReasonInsufficientStock)},
						wantStock: map[string]int64{"SHORT": 0},
					},
				}
			},
		},
		{
			name:  "mixed quantities are served in input order",
			stock: map[string]int64{"MIXED": 5},
			steps: func(c int) []step {
				return []step{{
					batch: []sale.Reservation{
						resv(oid(c, 1), "MIXED", "u1", 3),
						resv(oid(c, 2), "MIXED", "u2", 3),
						resv(oid(c, 3), "MIXED", "u3", 2),
						resv(oid(c, 4), "MIXED", "u4", 1),
					},
					want: []orderstore.Outcome{
						pending(oid(c, 1)),
						failed(oid(c, 2), orderstore.ReasonInsufficientStock),
						pending(oid(c, 3)),
						failed(oid(c, 4), orderstore.ReasonInsufficientStock),
					},
					wantStock: map[string]int64{"MIXED": 0},
				}}
			},
		},
		{
			name:  "unknown sku fails, the rest of the batch applies",
			stock: map[string]int64{"KNOWN": 1},
			steps: func(c int) []step {
				return []step{{
					batch: []sale.Reservation{
						resv(oid(c, 1), "GHOST", "u1", 1),
						resv(oid(c, 2), "KNOWN", "u1", 1),
					},
					want: []orderstore.Outcome{
						failed(oid(c, 1), orderstore.ReasonUnknownSKU),
						pending(oid(c, 2)),
					},
					wantStock: map[string]int64{"KNOWN": 0, "GHOST": 0},
				}}
			},
		},
		{
			name:  "duplicate ids within a batch apply once",
			stock: map[string]int64{"INTRA": 2},
			steps: func(c int) []step {
				a := resv(oid(c, 1), "INTRA", "u1", 2)
				b := resv(oid(c, 2), "INTRA", "u2", 1)
				aBigger := a
				aBigger.Quantity = 5 // a redelivery is the same reservation; the first copy wins
				return []step{{
					batch: []sale.Reservation{a, b, aBigger, b},
					want: []orderstore.Outcome{
						pending(a.OrderID),
						failed(b.OrderID, orderstore.ReasonInsufficientStock),
						dup(pending(a.OrderID)),
						dup(failed(b.OrderID, orderstore.ReasonInsufficientStock)),
					},
					wantStock: map[string]int64{"INTRA": 0},
				}}
			},
		},
		{
			name:  "batch mixing applied and new reservations over two skus",
			stock: map[string]int64{"P": 3, "Q": 1},
			steps: func(c int) []step {
				p1 := resv(oid(c, 1), "P", "u1", 1)
				q1 := resv(oid(c, 2), "Q", "u1", 1)
				p2 := resv(oid(c, 3), "P", "u2", 2)
				q2 := resv(oid(c, 4), "Q", "u2", 1)
				p3 := resv(oid(c, 5), "P", "u3", 1)
				return []step{
					{
						batch:     []sale.Reservation{p1, q1},
						want:      []orderstore.Outcome{pending(p1.OrderID), pending(q1.OrderID)},
						wantStock: map[string]int64{"P": 2, "Q": 0},
					},
					{
						batch: []sale.Reservation{q2, p1, p2, q1, p3},
						want: []orderstore.Outcome{
							failed(q2.OrderID, orderstore.ReasonInsufficientStock),
							dup(pending(p1.OrderID)),
							pending(p2.OrderID),
							dup(pending(q1.OrderID)),
							failed(p3.OrderID, orderstore.ReasonInsufficientStock),
						},
						wantStock: map[string]int64{"P": 0, "Q": 0},
					},
				}
			},
		},
	}

	// Every order row ever reported, to compare with what Order returns.
	wantOrders := make(map[string]sale.Order)
	for c, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for sku, n := range tt.stock {
				putSKU(t, s, sku, n)
			}
			for i, st := range tt.steps(c) {
				got, err := s.ApplyBatch(ctx, st.batch)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if diff := cmp.Diff(st.want, got); diff != "" {
					t.Errorf("step %d: outcomes (-want +got):\n%s", i, diff)
				}
				for j, o := range got {
					if o.Duplicate {
						continue
					}
					r := st.batch[j]
					wantOrders[r.OrderID] = sale.Order{
						ID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity,
						Status: o.Status, FailReason: o.Reason, CreatedAt: acceptedAt,
					}
				}
				for sku, want := range st.wantStock {
					l := checkInvariants(t, s, sku)
					if l.Stock != want {
						t.Errorf("step %d: %s stock = %d, want %d", i, sku, l.Stock, want)
					}
				}
			}
		})
	}

	for id, want := range wantOrders {
		got, err := s.Order(ctx, id)
		if err != nil {
			t.Errorf("Order(%s): %v", id, err)
			continue
		}
		if got.UpdatedAt == nil || got.UpdatedAt.IsZero() {
			t.Errorf("Order(%s).UpdatedAt = %v, want set", id, got.UpdatedAt)
		}
		got.UpdatedAt = nil
		switch {
		case got.Status == sale.StatusPendingPayment && (got.ExpiresAt == nil || !got.ExpiresAt.Equal(got.CreatedAt.Add(15*time.Minute))):
			t.Errorf("Order(%s).ExpiresAt = %v, want created_at + the 15 minute payment timeout", id, got.ExpiresAt)
		case got.Status == sale.StatusFailed && got.ExpiresAt != nil:
			t.Errorf("failed Order(%s).ExpiresAt = %v, want none", id, got.ExpiresAt)
		}
		got.ExpiresAt = nil
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Order(%s) (-want +got):\n%s", id, diff)
		}
	}
	if _, err := s.Order(ctx, oid(999, 1)); !errors.Is(err, sale.ErrOrderNotFound) {
		t.Errorf("Order(absent) err = %v, want %v", err, sale.ErrOrderNotFound)
	}
}

func TestApplyBatchReportsCurrentStatusOfDuplicates(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "PAY", 5)
	r := resv(oid(1, 1), "PAY", "u1", 1)
	if _, err := s.ApplyBatch(ctx, []sale.Reservation{r}); err != nil {
		t.Fatal(err)
	}
	execSQL(t, s, `UPDATE orders SET status = 'paid' WHERE order_id = ?`, r.OrderID)
	got, err := s.ApplyBatch(ctx, []sale.Reservation{r})
	if err != nil {
		t.Fatal(err)
	}
	want := []orderstore.Outcome{{OrderID: r.OrderID, Status: sale.StatusPaid, Duplicate: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
}

func TestApplyBatchIdempotencyKey(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "IDEM", 5)
	with := resv(oid(1, 1), "IDEM", "u1", 1)
	with.IdempotencyKey = "key-1"
	without := resv(oid(1, 2), "IDEM", "u2", 1)
	if _, err := s.ApplyBatch(ctx, []sale.Reservation{with, without}); err != nil {
		t.Fatal(err)
	}
	rows, err := s.DB().QueryContext(ctx, `SELECT order_id, idempotency_key FROM orders ORDER BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*string{}
	for rows.Next() {
		var id string
		var key *string
		if err := rows.Scan(&id, &key); err != nil {
			t.Fatal(err)
		}
		got[id] = key
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if k := got[with.OrderID]; k == nil || *k != "key-1" {
		t.Errorf("idempotency_key of %s = %v, want key-1", with.OrderID, k)
	}
	if k, ok := got[without.OrderID]; !ok || k != nil {
		t.Errorf("idempotency_key of %s = %v (present %v), want NULL", without.OrderID, k, ok)
	}
}

func TestApplyBatchRejectsInvalid(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "V", 5)
	good := resv(oid(1, 1), "V", "u1", 1)
	tests := []struct {
		name string
		bad  sale.Reservation
	}{
		{"zero quantity", resv(oid(1, 2), "V", "u1", 0)},
		{"negative quantity", resv(oid(1, 2), "V", "u1", -3)},
		{"quantity above MaxQuantity", resv(oid(1, 2), "V", "u1", sale.MaxQuantity+1)},
		{"bad order id", resv("not-a-uuid", "V", "u1", 1)},
		{"bad sku", resv(oid(1, 2), "V V", "u1", 1)},
		{"no acceptance time", sale.Reservation{OrderID: oid(1, 2), SKU: "V", User: "u1", Quantity: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.ApplyBatch(ctx, []sale.Reservation{good, tt.bad})
			if !errors.Is(err, sale.ErrInvalid) {
				t.Errorf("err = %v, want %v", err, sale.ErrInvalid)
			}
			if l := checkInvariants(t, s, "V"); l.Stock != 5 || l.Logged != 0 {
				t.Errorf("a rejected batch changed the database: %+v", l)
			}
		})
	}
	got, err := s.ApplyBatch(ctx, nil)
	if err != nil || len(got) != 0 {
		t.Errorf("ApplyBatch(nil) = %v, %v; want no outcomes, no error", got, err)
	}
}

// TestApplyBatchConcurrent: 8 appliers race over overlapping, shuffled,
// duplicated slices of the same 500 reservations on a SKU with 300 units.
// Each order id must be applied by exactly one call, and the ledger must hold.
func TestApplyBatchConcurrent(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const (
		sku     = "HOT"
		stock   = 300
		n       = 500
		workers = 8
	)
	putSKU(t, s, sku, stock)
	all := make([]sale.Reservation, n)
	for i := range all {
		all[i] = newResv(sku, fmt.Sprintf("user%03d", i%211), 1)
	}

	results := make([][]orderstore.Outcome, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			// Every worker covers all ids, in its own order, with repeats.
			seq := rng.Perm(n)
			for range n / 10 {
				seq = append(seq, rng.IntN(n))
			}
			rng.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
			for len(seq) > 0 {
				size := min(1+rng.IntN(64), len(seq))
				batch := make([]sale.Reservation, size)
				for i, k := range seq[:size] {
					batch[i] = all[k]
				}
				seq = seq[size:]
				out, err := s.ApplyBatch(ctx, batch)
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				results[w] = append(results[w], out...)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	applied := make(map[string]orderstore.Outcome)
	for _, outs := range results {
		for _, o := range outs {
			if o.Duplicate {
				continue
			}
			if prev, ok := applied[o.OrderID]; ok {
				t.Errorf("order %s applied twice: %+v and %+v", o.OrderID, prev, o)
			}
			applied[o.OrderID] = o
		}
	}
	var taken int
	for _, r := range all {
		o, ok := applied[r.OrderID]
		if !ok {
			t.Errorf("order %s never applied", r.OrderID)
			continue
		}
		if o.Status == sale.StatusPendingPayment {
			taken++
		}
	}
	if taken != stock {
		t.Errorf("%d reservations reported taken, want %d", taken, stock)
	}
	for _, outs := range results {
		for _, o := range outs {
			if first := applied[o.OrderID]; o.Duplicate && (o.Status != first.Status || o.Reason != first.Reason) {
				t.Errorf("duplicate of %s reported %s/%s, applied as %s/%s", o.OrderID, o.Status, o.Reason, first.Status, first.Reason)
			}
		}
	}

	l := checkInvariants(t, s, sku)
	want := ledger{Stock: 0, Total: stock, Live: stock, Orders: n, Logged: n}
	if diff := cmp.Diff(want, l); diff != "" {
		t.Errorf("ledger (-want +got):\n%s", diff)
	}
	dupLogs := queryInt(t, s, `SELECT count(*) - count(DISTINCT tx_id) FROM process_log`)
	dupOrders := queryInt(t, s, `SELECT count(*) - count(DISTINCT order_id) FROM orders`)
	if dupLogs != 0 || dupOrders != 0 {
		t.Errorf("repeated ids: %d in process_log, %d in orders", dupLogs, dupOrders)
	}
}

func TestSnapshotAndLiveHoldings(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "SNAP", 6)
	putSKU(t, s, "OTHER", 6)
	rs := []sale.Reservation{
		resv(oid(1, 1), "SNAP", "alice", 2),
		resv(oid(1, 2), "SNAP", "bob", 1),
		resv(oid(1, 3), "SNAP", "alice", 1),
		resv(oid(1, 4), "SNAP", "carol", 5), // short: 2 left
		resv(oid(1, 5), "SNAP", "dave", 1),
		resv(oid(1, 6), "OTHER", "alice", 3),
	}
	if _, err := s.ApplyBatch(ctx, rs); err != nil {
		t.Fatal(err)
	}
	// dave pays, bob's order is cancelled (stock given back as release would).
	execSQL(t, s, `UPDATE orders SET status = 'paid' WHERE order_id = ?`, oid(1, 5))
	cancelBehindStore(t, s, oid(1, 2))

	unapplied := oid(1, 99)
	snap, err := s.Snapshot(ctx, "SNAP", []string{oid(1, 1), oid(1, 2), oid(1, 4), oid(1, 5), unapplied})
	stock, processed := snap.Stock, snap.Processed
	if err != nil {
		t.Fatal(err)
	}
	if stock != 2 {
		t.Errorf("Snapshot stock = %d, want 2", stock)
	}
	wantProcessed := map[string]sale.Status{
		oid(1, 1): sale.StatusPendingPayment,
		oid(1, 2): sale.StatusCancelled,
		oid(1, 4): sale.StatusFailed,
		oid(1, 5): sale.StatusPaid,
	}
	if diff := cmp.Diff(wantProcessed, processed); diff != "" {
		t.Errorf("Snapshot processed (-want +got):\n%s", diff)
	}
	if snap, err := s.Snapshot(ctx, "SNAP", nil); err != nil || len(snap.Processed) != 0 {
		t.Errorf("Snapshot without ids = %v, %v; want empty map, no error", processed, err)
	}
	if _, err := s.Snapshot(ctx, "GHOST", []string{oid(1, 1)}); !errors.Is(err, sale.ErrUnknownSKU) {
		t.Errorf("Snapshot(GHOST) err = %v, want %v", err, sale.ErrUnknownSKU)
	}

	held, err := s.LiveHoldings(ctx, "SNAP")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int64{"alice": 3, "dave": 1}, held); diff != "" {
		t.Errorf("LiveHoldings (-want +got):\n%s", diff)
	}
	held, err = s.LiveHoldings(ctx, "GHOST")
	if err != nil || len(held) != 0 {
		t.Errorf("LiveHoldings(GHOST) = %v, %v; want empty", held, err)
	}
	checkInvariants(t, s, "SNAP")
	checkInvariants(t, s, "OTHER")
}

// BenchmarkApplyBatch measures one applier, one SKU with stock that never
// runs out: throughput per batch size (one transaction, one fsync per batch),
// with every reservation a new user's, without an Idempotency-Key (key=false)
// or with one (key=true, as the bench's buyers send: the batch then reads
// the keys' owners too).
func BenchmarkApplyBatch(b *testing.B) {
	s := newStore(b)
	ctx := testContext(b)
	putSKU(b, s, "BENCH", sale.MaxStock)
	for _, n := range []int{1, 10, 100, 500, 1000} {
		for _, keyed := range []bool{false, true} {
			b.Run(fmt.Sprintf("batch=%d/key=%t", n, keyed), func(b *testing.B) {
				batch := make([]sale.Reservation, n)
				start := time.Now()
				iters := 0
				for b.Loop() {
					for i := range batch {
						// A new user each time: the per-user limit must not refuse.
						batch[i] = newResv("BENCH", fmt.Sprintf("u%d-%t-%d-%d", n, keyed, iters, i), 1)
						if keyed {
							batch[i].IdempotencyKey = "k1"
						}
					}
					out, err := s.ApplyBatch(ctx, batch)
					if err != nil {
						b.Fatal(err)
					}
					for _, o := range out {
						if o.Status != sale.StatusPendingPayment {
							b.Fatalf("outcome %+v, want pending_payment", o)
						}
					}
					iters++
				}
				elapsed := time.Since(start)
				b.ReportMetric(float64(iters*n)/elapsed.Seconds(), "orders/s")
			})
		}
	}
}

// A dead context or a missing schema is an error, never a panic or a partial write.
func TestErrorsLeaveNothingBehind(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "ERR", 5)
	r := resv(oid(1, 1), "ERR", "u1", 1)

	dead, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.ApplyBatch(dead, []sale.Reservation{r}); err == nil {
		t.Error("ApplyBatch with a cancelled context succeeded")
	}
	if _, _, _, err := s.PutSKU(dead, orderstore.SKUChange{ID: "ERR", TotalStock: 9, PerUserLimit: 1}); err == nil {
		t.Error("PutSKU with a cancelled context succeeded")
	}
	if _, err := s.Snapshot(dead, "ERR", []string{r.OrderID}); err == nil {
		t.Error("Snapshot with a cancelled context succeeded")
	}
	if l := checkInvariants(t, s, "ERR"); l.Stock != 5 || l.Total != 5 || l.Logged != 0 {
		t.Errorf("failed calls changed the database: %+v", l)
	}

	// Unmigrated database.
	bare, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if _, err := bare.ApplyBatch(ctx, []sale.Reservation{r}); err == nil {
		t.Error("ApplyBatch without a schema succeeded")
	}
	if _, err := bare.Snapshot(ctx, "ERR", nil); err == nil {
		t.Error("Snapshot without a schema succeeded")
	}
}

// TestApplyBatchPerUserLimit: the database refuses what would take a user past
// inventory.per_user_limit, counting live orders (pending_payment, paid) and
// the batch itself, under the limit as it is at apply time.
func TestApplyBatchPerUserLimit(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKUChange(t, s, orderstore.SKUChange{ID: "LIM", TotalStock: 20, PerUserLimit: 2})
	putSKUChange(t, s, orderstore.SKUChange{ID: "LIM0", TotalStock: 0, PerUserLimit: 1})
	limited := func(id string) orderstore.Outcome { return failed(id, orderstore.ReasonLimitReached) }
	steps := []struct {
		name      string
		before    func()
		batch     []sale.Reservation
		want      []orderstore.Outcome
		wantStock int64 // of LIM
	}{
		{
			name:      "up to the limit",
			batch:     []sale.Reservation{resv(oid(1, 1), "LIM", "alice", 2)},
			want:      []orderstore.Outcome{pending(oid(1, 1))},
			wantStock: 18,
		},
		{
			name:      "an existing live order counts",
			batch:     []sale.Reservation{resv(oid(1, 2), "LIM", "alice", 1), resv(oid(1, 3), "LIM", "bob", 1)},
			want:      []orderstore.Outcome{limited(oid(1, 2)), pending(oid(1, 3))},
			wantStock: 17,
		},
		{
			name: "two of one user in one batch: the second is refused, the rest still served",
			batch: []sale.Reservation{
				resv(oid(1, 4), "LIM", "carol", 1),
				resv(oid(1, 5), "LIM", "carol", 2),
				resv(oid(1, 6), "LIM", "carol", 1),
				resv(oid(1, 7), "LIM", "carol", 1),
			},
			want:      []orderstore.Outcome{pending(oid(1, 4)), limited(oid(1, 5)), pending(oid(1, 6)), limited(oid(1, 7))},
			wantStock: 15,
		},
		{
			name: "a paid order counts, a cancelled one does not",
			before: func() {
				execSQL(t, s, `UPDATE orders SET status = 'paid' WHERE order_id = ?`, oid(1, 3)) // bob
				cancelBehindStore(t, s, oid(1, 1))                                               // alice
			},
			batch: []sale.Reservation{
				resv(oid(1, 8), "LIM", "bob", 2),
				resv(oid(1, 9), "LIM", "alice", 2),
				resv(oid(1, 10), "LIM", "bob", 1),
			},
			want:      []orderstore.Outcome{limited(oid(1, 8)), pending(oid(1, 9)), pending(oid(1, 10))},
			wantStock: 14, // alice's 2 back, then 2 + 1 taken
		},
		{
			name: "a limit lowered mid-sale refuses users already above it",
			before: func() {
				putSKUChange(t, s, orderstore.SKUChange{ID: "LIM", TotalStock: 20, PerUserLimit: 1})
			},
			batch:     []sale.Reservation{resv(oid(1, 11), "LIM", "bob", 1), resv(oid(1, 12), "LIM", "dave", 1), resv(oid(1, 13), "LIM", "dave", 1)},
			want:      []orderstore.Outcome{limited(oid(1, 11)), pending(oid(1, 12)), limited(oid(1, 13))},
			wantStock: 13,
		},
		{
			name:      "limit before stock, per sku",
			batch:     []sale.Reservation{resv(oid(1, 14), "LIM0", "dave", 2), resv(oid(1, 15), "LIM0", "dave", 1)},
			want:      []orderstore.Outcome{limited(oid(1, 14)), failed(oid(1, 15), orderstore.ReasonInsufficientStock)},
			wantStock: 13,
		},
	}
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		got, err := s.ApplyBatch(ctx, st.batch)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Errorf("%s: outcomes (-want +got):\n%s", st.name, diff)
		}
		if l := checkInvariants(t, s, "LIM"); l.Stock != st.wantStock {
			t.Errorf("%s: stock = %d, want %d", st.name, l.Stock, st.wantStock)
		}
		// A redelivery reports the same decisions.
		again, err := s.ApplyBatch(ctx, st.batch)
		if err != nil {
			t.Fatalf("%s: again: %v", st.name, err)
		}
		for i := range again {
			if want := dup(st.want[i]); again[i] != want {
				t.Errorf("%s: again[%d] = %+v, want %+v", st.name, i, again[i], want)
			}
		}
	}
	held, err := s.LiveHoldings(ctx, "LIM")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int64{"alice": 2, "bob": 2, "carol": 2, "dave": 1}, held); diff != "" {
		t.Errorf("LiveHoldings (-want +got):\n%s", diff)
	}
	checkInvariants(t, s, "LIM0")
}

// TestApplyBatchConcurrentPerUserLimit: appliers racing on batches of the
// same few users never let one hold more than the limit.
func TestApplyBatchConcurrentPerUserLimit(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const (
		sku     = "HOTLIM"
		limit   = 3
		users   = 7
		workers = 8
		each    = 40
	)
	putSKUChange(t, s, orderstore.SKUChange{ID: sku, TotalStock: 1000, PerUserLimit: limit})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range each / 8 {
				batch := make([]sale.Reservation, 8)
				for i := range batch {
					batch[i] = newResv(sku, fmt.Sprintf("user%d", rng.IntN(users)), 1+rng.Int64N(2))
				}
				if _, err := s.ApplyBatch(ctx, batch); err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	held, err := s.LiveHoldings(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	for u, n := range held {
		if n > limit {
			t.Errorf("%s holds %d units, limit %d", u, n, limit)
		}
	}
	if len(held) != users {
		t.Errorf("%d users hold units, want %d: %v", len(held), users, held)
	}
	checkInvariants(t, s, sku)
}

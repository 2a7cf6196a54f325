package orderstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// saleStart and saleEnd bound the window of the SKUs BuyDirect tests create.
var (
	saleStart  = time.Date(2030, 5, 6, 7, 0, 0, 0, time.UTC)
	saleEnd    = saleStart.Add(time.Hour)
	duringSale = saleStart.Add(time.Minute)
)

var ignoreUpdatedAt = cmpopts.IgnoreFields(sale.Order{}, "UpdatedAt", "ExpiresAt")

func wantPending(r sale.Reservation) sale.Order {
	return sale.Order{
		ID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity,
		Status: sale.StatusPendingPayment, CreatedAt: time.UnixMilli(r.AcceptedAt).UTC(),
	}
}

func TestBuyDirect(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKUChange(t, s, orderstore.SKUChange{ID: "DIRECT", TotalStock: 5, PerUserLimit: 3, StartsAt: saleStart, EndsAt: saleEnd})
	putSKUChange(t, s, orderstore.SKUChange{ID: "OPEN", TotalStock: 1, PerUserLimit: 1})

	keyed := func(r sale.Reservation, key string) sale.Reservation { r.IdempotencyKey = key; return r }
	first := keyed(resv(oid(1, 1), "DIRECT", "alice", 2), "k1")
	steps := []struct {
		name      string
		r         sale.Reservation
		now       time.Time
		want      sale.Order // zero when an error is wanted
		wantDup   bool
		wantErr   error
		wantStock int64 // of DIRECT afterwards
	}{
		{name: "before the window", r: resv(oid(1, 9), "DIRECT", "alice", 1), now: saleStart.Add(-time.Millisecond), wantErr: sale.ErrSaleNotOpen, wantStock: 5},
		{name: "at the end of the window", r: resv(oid(1, 9), "DIRECT", "alice", 1), now: saleEnd, wantErr: sale.ErrSaleEnded, wantStock: 5},
		{name: "unknown sku", r: resv(oid(1, 9), "GHOST", "alice", 1), now: duringSale, wantErr: sale.ErrUnknownSKU, wantStock: 5},
		{name: "invalid", r: resv(oid(1, 9), "DIRECT", "alice", 0), now: duringSale, wantErr: sale.ErrInvalid, wantStock: 5},
		{name: "bad idempotency key", r: keyed(resv(oid(1, 9), "DIRECT", "alice", 1), "has space"), now: duringSale, wantErr: sale.ErrInvalid, wantStock: 5},
		{name: "sells", r: first, now: duringSale, want: wantPending(first), wantStock: 3},
		{name: "same order id again", r: first, now: duringSale, want: wantPending(first), wantDup: true, wantStock: 3},
		{name: "same order id after the window", r: first, now: saleEnd, want: wantPending(first), wantDup: true, wantStock: 3},
		{
			name: "same idempotency key, new order id", r: keyed(resv(oid(1, 2), "DIRECT", "alice", 2), "k1"), now: duringSale,
			want: wantPending(first), wantDup: true, wantStock: 3,
		},
		{
			name: "same idempotency key after the window", r: keyed(resv(oid(1, 2), "DIRECT", "alice", 2), "k1"), now: saleEnd,
			want: wantPending(first), wantDup: true, wantStock: 3,
		},
		{name: "over the limit", r: keyed(resv(oid(1, 3), "DIRECT", "alice", 2), "k2"), now: duringSale, wantErr: sale.ErrLimitReached, wantStock: 3},
		{
			name: "same key, another user", r: keyed(resv(oid(1, 4), "DIRECT", "bob", 3), "k1"), now: duringSale,
			want: wantPending(keyed(resv(oid(1, 4), "DIRECT", "bob", 3), "k1")), wantStock: 0,
		},
		{name: "sold out", r: resv(oid(1, 5), "DIRECT", "carol", 1), now: duringSale, wantErr: sale.ErrSoldOut, wantStock: 0},
		{name: "limit before stock", r: resv(oid(1, 6), "DIRECT", "bob", 1), now: duringSale, wantErr: sale.ErrLimitReached, wantStock: 0},
		{name: "last second of the window", r: resv(oid(1, 7), "OPEN", "alice", 1), now: saleEnd.Add(-time.Nanosecond), want: wantPending(resv(oid(1, 7), "OPEN", "alice", 1)), wantStock: 0},
	}
	for _, st := range steps {
		got, dup, err := s.BuyDirect(ctx, st.r, st.now)
		if st.wantErr != nil {
			if !errors.Is(err, st.wantErr) {
				t.Errorf("%s: err = %v, want %v", st.name, err, st.wantErr)
			}
		} else if err != nil {
			t.Errorf("%s: %v", st.name, err)
		} else {
			if diff := cmp.Diff(st.want, got, ignoreUpdatedAt); diff != "" {
				t.Errorf("%s: order (-want +got):\n%s", st.name, diff)
			}
			if got.UpdatedAt == nil || got.UpdatedAt.IsZero() {
				t.Errorf("%s: UpdatedAt not set", st.name)
			}
			if dup != st.wantDup {
				t.Errorf("%s: duplicate = %v, want %v", st.name, dup, st.wantDup)
			}
			read, err := s.Order(ctx, got.ID)
			if err != nil {
				t.Errorf("%s: Order: %v", st.name, err)
			} else if diff := cmp.Diff(got, read); diff != "" {
				t.Errorf("%s: Order() differs from what BuyDirect returned (-buy +read):\n%s", st.name, diff)
			}
		}
		if l := checkInvariants(t, s, "DIRECT"); l.Stock != st.wantStock {
			t.Errorf("%s: stock = %d, want %d", st.name, l.Stock, st.wantStock)
		}
	}
	// Refusals wrote nothing: only the two sales are there.
	if l := checkInvariants(t, s, "DIRECT"); l.Orders != 2 || l.Logged != 2 {
		t.Errorf("DIRECT: %d orders, %d process_log rows; want 2, 2", l.Orders, l.Logged)
	}
	if _, err := s.Order(ctx, oid(1, 9)); !errors.Is(err, sale.ErrOrderNotFound) {
		t.Errorf("a refused purchase left an order: %v", err)
	}
	checkInvariants(t, s, "OPEN")

	// The queue delivering the same reservations later applies nothing, and
	// direct sales count against the limit there.
	got, err := s.ApplyBatch(ctx, []sale.Reservation{first, resv(oid(1, 4), "DIRECT", "bob", 3), resv(oid(1, 8), "DIRECT", "alice", 2)})
	if err != nil {
		t.Fatal(err)
	}
	want := []orderstore.Outcome{dup(pending(first.OrderID)), dup(pending(oid(1, 4))), failed(oid(1, 8), orderstore.ReasonLimitReached)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ApplyBatch after BuyDirect (-want +got):\n%s", diff)
	}
	if l := checkInvariants(t, s, "DIRECT"); l.Stock != 0 || l.Live != 5 {
		t.Errorf("after ApplyBatch: %+v", l)
	}
}

// An order id applied by ApplyBatch first is returned by BuyDirect as it is,
// failed ones too.
func TestBuyDirectAfterApplyBatch(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "AB", 1)
	ok, short := resv(oid(1, 1), "AB", "u1", 1), resv(oid(1, 2), "AB", "u2", 1)
	if _, err := s.ApplyBatch(ctx, []sale.Reservation{ok, short}); err != nil {
		t.Fatal(err)
	}
	putSKU(t, s, "AB", 2) // restock: BuyDirect would now sell
	for _, tt := range []struct {
		r    sale.Reservation
		want sale.Order
	}{
		{ok, wantPending(ok)},
		{short, sale.Order{ID: short.OrderID, SKU: "AB", User: "u2", Quantity: 1, Status: sale.StatusFailed,
			FailReason: orderstore.ReasonInsufficientStock, CreatedAt: acceptedAt}},
	} {
		got, dup, err := s.BuyDirect(ctx, tt.r, duringSale)
		if err != nil || !dup {
			t.Errorf("BuyDirect(%s) = dup %v, err %v; want dup, no error", tt.r.OrderID, dup, err)
		}
		if diff := cmp.Diff(tt.want, got, ignoreUpdatedAt); diff != "" {
			t.Errorf("BuyDirect(%s) (-want +got):\n%s", tt.r.OrderID, diff)
		}
	}
	if l := checkInvariants(t, s, "AB"); l.Stock != 1 {
		t.Errorf("stock = %d, want 1", l.Stock)
	}
}

// TestBuyDirectConcurrentStock: 50 buyers race for 20 units: exactly 20 sell.
func TestBuyDirectConcurrentStock(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const stock, buyers = 20, 50
	putSKUChange(t, s, orderstore.SKUChange{ID: "RUSH", TotalStock: stock, PerUserLimit: 1})
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex
		sold, refuse int
	)
	for i := range buyers {
		wg.Go(func() {
			_, dup, err := s.BuyDirect(ctx, newResv("RUSH", fmt.Sprintf("u%02d", i), 1), duringSale)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && !dup:
				sold++
			case errors.Is(err, sale.ErrSoldOut):
				refuse++
			default:
				t.Errorf("buyer %d: dup %v, err %v", i, dup, err)
			}
		})
	}
	wg.Wait()
	if sold != stock || refuse != buyers-stock {
		t.Errorf("sold %d, sold out %d; want %d, %d", sold, refuse, stock, buyers-stock)
	}
	want := ledger{Stock: 0, Total: stock, Live: stock, Orders: stock, Logged: stock}
	if diff := cmp.Diff(want, checkInvariants(t, s, "RUSH")); diff != "" {
		t.Errorf("ledger (-want +got):\n%s", diff)
	}
}

// TestBuyDirectConcurrentLimit: one user, 20 concurrent purchases of one unit
// each, limit 2: exactly 2 units.
func TestBuyDirectConcurrentLimit(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const limit, tries = 2, 20
	putSKUChange(t, s, orderstore.SKUChange{ID: "GREEDY", TotalStock: 100, PerUserLimit: limit})
	var (
		wg             sync.WaitGroup
		mu             sync.Mutex
		sold, refusals int
	)
	for i := range tries {
		wg.Go(func() {
			_, dup, err := s.BuyDirect(ctx, newResv("GREEDY", "hoarder", 1), duringSale)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && !dup:
				sold++
			case errors.Is(err, sale.ErrLimitReached):
				refusals++
			default:
				t.Errorf("try %d: dup %v, err %v", i, dup, err)
			}
		})
	}
	wg.Wait()
	if sold != limit || refusals != tries-limit {
		t.Errorf("sold %d, limit reached %d; want %d, %d", sold, refusals, limit, tries-limit)
	}
	held, err := s.LiveHoldings(ctx, "GREEDY")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int64{"hoarder": limit}, held); diff != "" {
		t.Errorf("LiveHoldings (-want +got):\n%s", diff)
	}
	checkInvariants(t, s, "GREEDY")
}

// Concurrent retries with one idempotency key and different order ids end as one order.
func TestBuyDirectConcurrentIdempotencyKey(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "KEYED", 100)
	const tries = 10
	orders := make([]sale.Order, tries)
	dups := make([]bool, tries)
	var wg sync.WaitGroup
	for i := range tries {
		wg.Go(func() {
			r := newResv("KEYED", "u1", 1)
			r.IdempotencyKey = "same-click"
			var err error
			if orders[i], dups[i], err = s.BuyDirect(ctx, r, duringSale); err != nil {
				t.Errorf("try %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	fresh := 0
	for i := range tries {
		if !dups[i] {
			fresh++
		}
		if orders[i].ID != orders[0].ID {
			t.Errorf("try %d got order %s, try 0 got %s", i, orders[i].ID, orders[0].ID)
		}
	}
	if fresh != 1 {
		t.Errorf("%d tries created an order, want 1", fresh)
	}
	if l := checkInvariants(t, s, "KEYED"); l.Orders != 1 || l.Stock != 99 {
		t.Errorf("ledger = %+v, want 1 order, stock 99", l)
	}
}

// TestBuyDirectRacesApplyBatch: the same reservations go through BuyDirect
// and ApplyBatch at once (a gate timeout followed by the database fallback).
// Each order id is applied by exactly one of them, and neither deadlocks.
func TestBuyDirectRacesApplyBatch(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const n = 60
	putSKUChange(t, s, orderstore.SKUChange{ID: "BOTH", TotalStock: n, PerUserLimit: 1})
	rs := make([]sale.Reservation, n)
	for i := range rs {
		rs[i] = newResv("BOTH", fmt.Sprintf("u%02d", i), 1)
	}
	var (
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		direct, viaBatches int
	)
	for i := range rs {
		wg.Go(func() {
			_, dup, err := s.BuyDirect(ctx, rs[i], duringSale)
			if err != nil {
				t.Errorf("BuyDirect %d: %v", i, err)
				return
			}
			if !dup {
				mu.Lock()
				direct++
				mu.Unlock()
			}
		})
	}
	for start := 0; start < n; start += 6 {
		wg.Go(func() {
			// Overlapping batches, in reverse so lock orders cross as much as they can.
			batch := reversed(rs[start:min(start+9, n)])
			out, err := s.ApplyBatch(ctx, batch)
			if err != nil {
				t.Errorf("ApplyBatch from %d: %v", start, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, o := range out {
				if o.Status != sale.StatusPendingPayment {
					t.Errorf("ApplyBatch: %+v", o)
				}
				if !o.Duplicate {
					viaBatches++
				}
			}
		})
	}
	wg.Wait()
	if direct+viaBatches != n {
		t.Errorf("%d sold directly + %d applied from batches = %d, want %d", direct, viaBatches, direct+viaBatches, n)
	}
	want := ledger{Stock: 0, Total: n, Live: n, Orders: n, Logged: n}
	if diff := cmp.Diff(want, checkInvariants(t, s, "BOTH")); diff != "" {
		t.Errorf("ledger (-want +got):\n%s", diff)
	}
}

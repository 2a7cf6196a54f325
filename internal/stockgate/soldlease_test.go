package stockgate

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/redis/rueidis"
)

// The sold-out lease's rules, against the scripts on a real Redis
// (docs/architecture.md, "Answering keyed sold-out from memory"): granted
// only to a loaded, unsplit, sold-out sale, with its key holders; no
// reservation while it is live, though units came back, but a key that made
// an order still gets it; its renewals stop when units come back or a key
// writer waits; the writers of keys outside reserve.lua (the restore of a
// database-fallback sale's key, a load) write only after it ended, and no
// lease is taken before they did.

// leaseTTL is the tests' lease: long enough that a loaded machine's stall
// between two calls does not end it.
const leaseTTL = time.Second

func keyedRes(sku, user, key string) sale.Reservation {
	return sale.Reservation{OrderID: NewOrderID(sku), SKU: sku, User: user, Quantity: 1, AcceptedAt: time.Now().UnixMilli(), IdempotencyKey: key}
}

// redisMs is Redis' clock, ms.
func redisMs(t *testing.T, g *Gate) int64 {
	t.Helper()
	tm, err := g.c.Do(context.Background(), g.c.B().Time().Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	s, _ := strconv.ParseInt(tm[0], 10, 64)
	us, _ := strconv.ParseInt(tm[1], 10, 64)
	return s*1000 + us/1000
}

// metaInt reads one field of sku's meta hash (0 when absent).
func metaInt(t *testing.T, g *Gate, sku, field string) int64 {
	t.Helper()
	v, err := g.c.Do(context.Background(), g.c.B().Hget().Key(g.KeysOf(sku).Meta).Field(field).Build()).AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	return v
}

// soldOutSale seeds sku with n units, limit 1, and sells them to buyers
// b0..b(n-1) with keys k0..; it returns their order ids.
func soldOutSale(t *testing.T, g *Gate, sku string, n int) []string {
	t.Helper()
	ctx := context.Background()
	if ok, err := g.Seed(ctx, sku, Config{PerUserLimit: 1}, int64(n), nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	var ids []string
	for i := range n {
		r, err := g.Reserve(ctx, keyedRes(sku, "b"+strconv.Itoa(i), "k"+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.OrderID)
	}
	return ids
}

func TestSoldLeaseGrantedOnlyWhenSoldOut(t *testing.T) {
	g := newInternalGate(t)
	ctx := context.Background()
	if l, err := g.TakeSoldLease(ctx, "none", time.Second, 100); err != nil || l.Granted || l.Reason != "unloaded" {
		t.Fatalf("lease of a sale not loaded: %+v, %v", l, err)
	}
	if ok, err := g.Seed(ctx, "s", Config{PerUserLimit: 1}, 3, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	first, err := g.Reserve(ctx, keyedRes("s", "b0", "k0"))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := g.TakeSoldLease(ctx, "s", time.Second, 100); err != nil || l.Granted || l.Reason != "units" {
		t.Fatalf("lease of a sale with units: %+v, %v", l, err)
	}
	if _, err := g.Reserve(ctx, keyedRes("s", "b1", "k1")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reserve(ctx, sale.Reservation{OrderID: NewOrderID("s"), SKU: "s", User: "b2", Quantity: 1, AcceptedAt: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	// A closed order leaves a '#' marker in idem: not a key holder.
	if _, err := g.Finalize(ctx, "s", []Outcome{{OrderID: first.OrderID}}); err != nil {
		t.Fatal(err)
	}
	if l, err := g.TakeSoldLease(ctx, "s", time.Second, 1); err != nil || l.Granted || l.Reason != "large" {
		t.Fatalf("lease past the cap: %+v, %v", l, err)
	}
	before := time.Now()
	l, err := g.TakeSoldLease(ctx, "s", time.Second, 100)
	if err != nil || !l.Granted {
		t.Fatalf("lease of a sold-out sale: %+v, %v", l, err)
	}
	slices.Sort(l.Keys)
	if want := []string{"b0\x00k0", "b1\x00k1"}; !slices.Equal(l.Keys, want) {
		t.Fatalf("key holders %q, want %q", l.Keys, want)
	}
	if l.Epoch != "e1" || l.Until.Before(before.Add(time.Second-SoldLeaseMargin)) || l.Until.After(before.Add(time.Second-SoldLeaseMargin+time.Since(before))) {
		t.Fatalf("lease %+v: epoch or until wrong", l)
	}
	if u := metaInt(t, g, "s", "solu"); u <= redisMs(t, g) {
		t.Fatalf("solu %d is not in the future", u)
	}

	// A split sale is not leased.
	if ok, err := g.SeedSplit(ctx, "p", Config{PerUserLimit: 1}, 2, 0, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if l, err := g.TakeSoldLease(ctx, "p", time.Second, 100); err != nil || l.Granted || l.Reason != "split" {
		t.Fatalf("lease of a split sale: %+v, %v", l, err)
	}
}

// TestSoldLeaseHoldsReservations: units that come back under a live lease
// are not sold before it ends, a retry of a key that made an order still
// gets it, and the renewal is refused once units are back.
func TestSoldLeaseHoldsReservations(t *testing.T) {
	g := newInternalGate(t)
	ctx := context.Background()
	ids := soldOutSale(t, g, "s", 2)
	// A lease long enough that the checks below run under it on a loaded
	// machine.
	const leaseTTL = 3 * time.Second
	l, err := g.TakeSoldLease(ctx, "s", leaseTTL, 100)
	if err != nil || !l.Granted {
		t.Fatalf("take: %+v, %v", l, err)
	}
	renewed, err := g.RenewSoldLease(ctx, "s", leaseTTL, l)
	if err != nil || !renewed.Granted || renewed.Version != l.Version || len(renewed.Keys) != 0 {
		t.Fatalf("renewal of an unchanged sale: %+v, %v", renewed, err)
	}
	if r, err := g.RenewSoldLease(ctx, "s", leaseTTL, SoldLease{Version: l.Version, Epoch: "other"}); err != nil || r.Granted {
		t.Fatalf("renewal naming another epoch: %+v, %v", r, err)
	}
	// b0 cancels: one unit back.
	if n, err := g.Restore(ctx, "s", []Release{{OrderID: ids[0], User: "b0", Quantity: 1}}); err != nil || n != 1 {
		t.Fatalf("restore: %d, %v", n, err)
	}
	if r, err := g.RenewSoldLease(ctx, "s", leaseTTL, l); err != nil || r.Granted || r.Reason != "units" {
		t.Fatalf("renewal with a unit back: %+v, %v", r, err)
	}
	late := keyedRes("s", "new", "kn")
	checked := 0
	for metaInt(t, g, "s", "solu") > redisMs(t, g)+5 {
		checked++
		_, err := g.Reserve(ctx, late)
		var so *SoldOutError
		if !errors.As(err, &so) || so.Available != 1 {
			if metaInt(t, g, "s", "solu") <= redisMs(t, g) {
				break // it ended between the two reads
			}
			t.Fatalf("reserve under a live lease with a unit back: %v, want sold out with 1 available", err)
		}
		if got, err := g.Reserve(ctx, keyedRes("s", "b1", "k1")); err != nil || !got.Duplicate || got.OrderID != ids[1] {
			t.Fatalf("retry of a key that made an order, under the lease: %+v, %v", got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if checked == 0 {
		t.Fatal("the lease ended before a reservation was tried under it")
	}
	for metaInt(t, g, "s", "solu") >= redisMs(t, g) {
		time.Sleep(5 * time.Millisecond)
	}
	if got, err := g.Reserve(ctx, late); err != nil || got.Duplicate {
		t.Fatalf("reserve after the lease ended: %+v, %v", got, err)
	}
	if l, err := g.TakeSoldLease(ctx, "s", time.Second, 100); err != nil || !l.Granted || !slices.Contains(l.Keys, "new\x00kn") {
		t.Fatalf("take after the unit sold again: %+v, %v", l, err)
	}
}

// TestSoldLeaseKeyWritersWait: the restore of a database-fallback sale's
// key and a load of the sale write no key while a lease is live: each stops
// its renewals, waits for it to end, and no lease is taken before it wrote.
func TestSoldLeaseKeyWritersWait(t *testing.T) {
	g := newInternalGate(t)
	ctx := context.Background()
	soldOutSale(t, g, "s", 2)
	l, err := g.TakeSoldLease(ctx, "s", leaseTTL, 100)
	if err != nil || !l.Granted {
		t.Fatalf("take: %+v, %v", l, err)
	}
	solu := metaInt(t, g, "s", "solu")
	done := make(chan error, 1)
	direct := NewOrderID("s")
	go func() {
		_, err := g.Restore(ctx, "s", []Release{{OrderID: direct, User: "d", Quantity: -1, IdempotencyKey: "kd", KeyOrderID: direct}})
		done <- err
	}()
	// The restore is waiting: its key is not there, and the lease can be
	// neither renewed nor taken again.
	for metaInt(t, g, "s", "solb") == 0 {
		if redisMs(t, g) >= solu {
			t.Fatal("the lease ended before the restore reached Redis (a machine this slow cannot run this test)")
		}
		time.Sleep(2 * time.Millisecond)
	}
	if id, found, err := g.Duplicate(ctx, "s", "d", "kd"); err != nil || found {
		t.Fatalf("the key was written under the lease: %q %v %v", id, found, err)
	}
	if r, err := g.RenewSoldLease(ctx, "s", leaseTTL, l); err != nil || r.Granted {
		t.Fatalf("renewal while a writer waits: %+v, %v", r, err)
	}
	if r, err := g.TakeSoldLease(ctx, "s", leaseTTL, 100); err != nil || r.Granted || r.Reason != "blocked" {
		t.Fatalf("take while a writer waits: %+v, %v", r, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if now := redisMs(t, g); now < solu {
		t.Fatalf("restore returned at %d, before the lease ended at %d", now, solu)
	}
	if id, found, err := g.Duplicate(ctx, "s", "d", "kd"); err != nil || !found || id != direct {
		t.Fatalf("the direct sale's key after the restore: %q %v %v", id, found, err)
	}

	// A load: fenced (a rebuild) under a new lease, it seeds only after
	// the lease ended.
	for metaInt(t, g, "s", "solb") > redisMs(t, g) {
		time.Sleep(20 * time.Millisecond)
	}
	if l, err = g.TakeSoldLease(ctx, "s", leaseTTL, 100); err != nil || !l.Granted {
		t.Fatalf("take after the writer's turn: %+v, %v", l, err)
	}
	solu = metaInt(t, g, "s", "solu")
	if err := g.Fence(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if ok, err := g.Seed(ctx, "s", Config{PerUserLimit: 1}, 0, nil, nil, nil, map[string]string{"x\x00kx": "ox"}, "e2"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if now := redisMs(t, g); now < solu {
		t.Fatalf("seed returned at %d, before the lease ended at %d", now, solu)
	}
}

// TestSeedStartsWithALease: with SetSeedLease, a load of a sale that sold
// makes no reservation for the lease's length (a snapshot read before Redis
// lost the sale ends first); without it, or for a new sale, at once.
func TestSeedStartsWithALease(t *testing.T) {
	g := newInternalGate(t)
	ctx := context.Background()
	if ok, err := g.Seed(ctx, "a", Config{PerUserLimit: 1}, 5, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := g.Reserve(ctx, keyedRes("a", "u", "k")); err != nil {
		t.Fatalf("reserve after a load without a seed lease: %v", err)
	}
	g.SetSeedLease(300 * time.Millisecond)
	// A new sale (nothing sold) cannot have been leased: no lease.
	if ok, err := g.Seed(ctx, "new", Config{PerUserLimit: 1}, 5, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if u := metaInt(t, g, "new", "solu"); u != 0 {
		t.Fatalf("a new sale loaded with a lease (%d)", u)
	}
	// A sale that sold (a buyer holds a unit): reloaded with one.
	if ok, err := g.Seed(ctx, "b", Config{PerUserLimit: 1}, 5, map[string]int64{"x": 1}, nil, nil, map[string]string{"x\x00kx": "ox"}, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	r := keyedRes("b", "u", "k")
	_, err := g.Reserve(ctx, r)
	var so *SoldOutError
	solu := metaInt(t, g, "b", "solu")
	if solu == 0 {
		t.Fatal("a load with a seed lease wrote no lease")
	}
	if !errors.As(err, &so) && redisMs(t, g) < solu {
		t.Fatalf("reserve within the seed's lease: %v, want sold out", err)
	}
	// A split sale starts without one (it is never leased).
	if ok, err := g.SeedSplit(ctx, "p", Config{PerUserLimit: 1}, 2, 10, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	for _, n := range BucketNames("p", 2) {
		if u := metaInt(t, g, n, "solu"); u != 0 {
			t.Fatalf("bucket %s of a split sale loaded with a lease (%d)", n, u)
		}
	}
	if _, err := g.ReserveIn(ctx, keyedRes("p", "u", "k"), Limits{}, 2); err != nil {
		t.Fatalf("reserve in a split sale just loaded: %v", err)
	}
	for metaInt(t, g, "b", "solu") >= redisMs(t, g) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := g.Reserve(ctx, r); err != nil {
		t.Fatalf("reserve after the seed's lease: %v", err)
	}
}

// TestSoldLeaseStaleHolderNotRenewed: a holder that stalled past its lease
// cannot renew its snapshot once the lease lapsed, a key was added, and
// another instance took the next lease (same epoch, a live lease, no
// writer's bump in between: the new take's version is what refuses it).
func TestSoldLeaseStaleHolderNotRenewed(t *testing.T) {
	g := newInternalGate(t)
	ctx := context.Background()
	ids := soldOutSale(t, g, "s", 1)
	const ttl = 300 * time.Millisecond
	stale, err := g.TakeSoldLease(ctx, "s", ttl, 100)
	if err != nil || !stale.Granted {
		t.Fatalf("take: %+v, %v", stale, err)
	}
	for metaInt(t, g, "s", "solu") >= redisMs(t, g) {
		time.Sleep(5 * time.Millisecond)
	}
	// The lease lapsed: a unit comes back and sells to a new key.
	if _, err := g.Restore(ctx, "s", []Release{{OrderID: ids[0], User: "b0", Quantity: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reserve(ctx, keyedRes("s", "late", "kl")); err != nil {
		t.Fatalf("reserve after the lapse: %v", err)
	}
	next, err := g.TakeSoldLease(ctx, "s", leaseTTL, 100)
	if err != nil || !next.Granted || !slices.Contains(next.Keys, "late\x00kl") {
		t.Fatalf("the next take: %+v, %v", next, err)
	}
	if next.Version == stale.Version {
		t.Fatalf("a take after a lapse kept version %s", next.Version)
	}
	if r, err := g.RenewSoldLease(ctx, "s", leaseTTL, stale); err != nil || r.Granted {
		t.Fatalf("the stale holder's renewal: %+v, %v; want refused", r, err)
	}
	if r, err := g.RenewSoldLease(ctx, "s", leaseTTL, next); err != nil || !r.Granted {
		t.Fatalf("the new holder's renewal: %+v, %v", r, err)
	}
}

package stockgate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

func newGate(t testing.TB) (*stockgate.Gate, rueidis.Client) {
	t.Helper()
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	return stockgate.New(c, prefix), c
}

func res(sku, user string, qty int64) sale.Reservation {
	return sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: user, Quantity: qty, AcceptedAt: time.Now().UnixMilli()}
}

func seed(t testing.TB, g *stockgate.Gate, sku string, stock, limit int64) {
	t.Helper()
	ok, err := g.Seed(context.Background(), sku, stockgate.Config{PerUserLimit: limit}, stock, nil, nil, nil, nil, "e1")
	if err != nil || !ok {
		t.Fatalf("seed: %v %v", ok, err)
	}
}

func avail(t testing.TB, g *stockgate.Gate, sku string) int64 {
	t.Helper()
	n, ok, err := g.Available(context.Background(), sku)
	if err != nil || !ok {
		t.Fatalf("available: %v %v", ok, err)
	}
	return n
}

func TestReserveRules(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s1", 3, 2)

	steps := []struct {
		user string
		qty  int64
		want error
		left int64
	}{
		{"u1", 2, nil, 1},
		{"u1", 1, sale.ErrLimitReached, 1},
		{"u2", 2, sale.ErrSoldOut, 1},
		{"u2", 1, nil, 0},
		{"u3", 1, sale.ErrSoldOut, 0},
	}
	for i, s := range steps {
		_, err := g.Reserve(ctx, res("s1", s.user, s.qty))
		if !errors.Is(err, s.want) {
			t.Fatalf("step %d: got %v, want %v", i, err, s.want)
		}
		if got := avail(t, g, "s1"); got != s.left {
			t.Fatalf("step %d: available %d, want %d", i, got, s.left)
		}
	}
	if _, err := g.Reserve(ctx, res("nope", "u1", 1)); !errors.Is(err, sale.ErrNotWarmed) {
		t.Fatalf("unloaded sku: %v", err)
	}
	for _, q := range []int64{0, -1, sale.MaxQuantity + 1} {
		if _, err := g.Reserve(ctx, res("s1", "u9", q)); !errors.Is(err, sale.ErrInvalid) {
			t.Fatalf("quantity %d: %v", q, err)
		}
	}
}

func TestReserveWindow(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	now := time.Now()
	for _, c := range []struct {
		sku        string
		start, end time.Time
		want       error
	}{
		{"early", now.Add(time.Hour), time.Time{}, sale.ErrSaleNotOpen},
		{"late", time.Time{}, now.Add(-time.Second), sale.ErrSaleEnded},
		{"open", now.Add(-time.Hour), now.Add(time.Hour), nil},
	} {
		if _, err := g.Seed(ctx, c.sku, stockgate.Config{PerUserLimit: 1, StartsAt: c.start, EndsAt: c.end}, 5, nil, nil, nil, nil, "e"); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Reserve(ctx, res(c.sku, "u", 1)); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v want %v", c.sku, err, c.want)
		}
	}
}

func TestReserveIdempotencyKey(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 5)
	r1 := res("s", "u", 1)
	r1.IdempotencyKey = "k1"
	a, err := g.Reserve(ctx, r1)
	if err != nil || a.Duplicate {
		t.Fatal(a, err)
	}
	r2 := res("s", "u", 1)
	r2.IdempotencyKey = "k1"
	b, err := g.Reserve(ctx, r2)
	if err != nil || !b.Duplicate || b.OrderID != r1.OrderID {
		t.Fatalf("retry: %+v %v, want duplicate of %s", b, err, r1.OrderID)
	}
	// The same key of another user is another purchase.
	r3 := res("s", "v", 1)
	r3.IdempotencyKey = "k1"
	if c, err := g.Reserve(ctx, r3); err != nil || c.Duplicate {
		t.Fatal(c, err)
	}
	// Retrying the same order id is a duplicate too (an internal retry after a timeout).
	if d, err := g.Reserve(ctx, r1); err != nil || !d.Duplicate {
		t.Fatal(d, err)
	}
	if got := avail(t, g, "s"); got != 8 {
		t.Fatalf("available %d, want 8", got)
	}
}

func TestFinalizeExactlyOnce(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 3)
	a, b := res("s", "u1", 2), res("s", "u2", 3)
	for _, r := range []sale.Reservation{a, b} {
		if _, err := g.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	outs := []stockgate.Outcome{{OrderID: a.OrderID}, {OrderID: b.OrderID, Refused: true}}
	for i := 0; i < 3; i++ {
		units, err := g.Finalize(ctx, "s", outs)
		if err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		if i == 0 {
			want = 3
		}
		if units != want {
			t.Fatalf("call %d gave back %d units, want %d", i, units, want)
		}
	}
	if got := avail(t, g, "s"); got != 8 {
		t.Fatalf("available %d, want 8", got)
	}
	if h, _ := g.Held(ctx, "s", "u2"); h != 0 {
		t.Fatalf("u2 holds %d after refusal", h)
	}
	if h, _ := g.Held(ctx, "s", "u1"); h != 2 {
		t.Fatalf("u1 holds %d, want 2", h)
	}
	f, err := g.ReadInFlight(ctx, "s")
	if err != nil || len(f.Reservations) != 0 {
		t.Fatalf("in flight after finalize: %+v %v", f, err)
	}
	if n, _ := g.OutboxLen(ctx, "s"); n != 0 {
		t.Fatalf("outbox %d", n)
	}
}

// TestResyncNeverResells: units in flight (reserved in Redis, not yet in the
// database) are not made available again by a resync from the database.
func TestResyncNeverResells(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 10)
	applied, refused, flying := res("s", "a", 2), res("s", "b", 1), res("s", "c", 3)
	for _, r := range []sale.Reservation{applied, refused, flying} {
		if _, err := g.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	f, err := g.ReadInFlight(ctx, "s")
	if err != nil || f.Units() != 6 || f.Available != 4 {
		t.Fatalf("in flight: %+v %v", f, err)
	}
	// A reservation made after the read, not yet in the database snapshot.
	late := res("s", "d", 1)
	if _, err := g.Reserve(ctx, late); err != nil {
		t.Fatal(err)
	}
	// Database: 'applied' took 2, 'refused' took nothing; stock 8.
	got, err := g.Resync(ctx, "s", stockgate.Config{PerUserLimit: 10}, f, 8, map[string]bool{applied.OrderID: false, refused.OrderID: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 8 - 3 (flying) - 1 (late) = 4: refused's unit is back, nothing re-sold.
	if got != 4 {
		t.Fatalf("available after resync %d, want 4", got)
	}
	if h, _ := g.Held(ctx, "s", "b"); h != 0 {
		t.Fatalf("refused buyer still holds %d", h)
	}
	// A late finalize of the entries resync closed gives nothing back again.
	if units, _ := g.Finalize(ctx, "s", []stockgate.Outcome{{OrderID: refused.OrderID, Refused: true}}); units != 0 {
		t.Fatalf("double compensation: %d units", units)
	}
}

func TestAdjust(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 5, 1)
	if _, err := g.Reserve(ctx, res("s", "u", 1)); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Adjust(ctx, "s", stockgate.Config{PerUserLimit: 2}, 10); err != nil || n != 14 {
		t.Fatalf("restock: %d %v", n, err)
	}
	if _, err := g.Adjust(ctx, "s", stockgate.Config{PerUserLimit: 2}, -15); !errors.Is(err, sale.ErrStockConflict) {
		t.Fatalf("over-reduction: %v", err)
	}
	if n, err := g.Adjust(ctx, "s", stockgate.Config{PerUserLimit: 2}, -14); err != nil || n != 0 {
		t.Fatalf("reduction: %d %v", n, err)
	}
	if _, err := g.Adjust(ctx, "missing", stockgate.Config{PerUserLimit: 1}, 1); !errors.Is(err, sale.ErrNotWarmed) {
		t.Fatalf("missing: %v", err)
	}
}

// TestReserveConcurrent: many buyers at once, some clicking twice, never oversell.
func TestReserveConcurrent(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const stock, buyers = 100, 1000
	seed(t, g, "hot", stock, 1)
	var accepted, soldOut, limited atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < buyers; i++ {
		for click := 0; click < 1+i%2; click++ {
			wg.Add(1)
			go func(user string) {
				defer wg.Done()
				_, err := g.Reserve(ctx, res("hot", user, 1))
				switch {
				case err == nil:
					accepted.Add(1)
				case errors.Is(err, sale.ErrSoldOut):
					soldOut.Add(1)
				case errors.Is(err, sale.ErrLimitReached):
					limited.Add(1)
				default:
					t.Error(err)
				}
			}(fmt.Sprintf("user%d", i))
		}
	}
	wg.Wait()
	if accepted.Load() != stock {
		t.Fatalf("accepted %d, want %d (sold out %d, limited %d)", accepted.Load(), stock, soldOut.Load(), limited.Load())
	}
	if got := avail(t, g, "hot"); got != 0 {
		t.Fatalf("available %d", got)
	}
	f, err := g.ReadInFlight(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]int64{}
	for _, r := range f.Reservations {
		users[r.User] += r.Quantity
	}
	if len(f.Reservations) != stock || len(users) != stock {
		t.Fatalf("%d reservations by %d users, want %d each", len(f.Reservations), len(users), stock)
	}
	if n, _ := g.OutboxLen(ctx, "hot"); n != stock {
		t.Fatalf("outbox %d", n)
	}
}

func TestExpireKeepsInFlight(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	now := time.Now()
	if _, err := g.Seed(ctx, "s", stockgate.Config{PerUserLimit: 1, EndsAt: now.Add(time.Minute)}, 5, nil, nil, nil, nil, "e"); err != nil {
		t.Fatal(err)
	}
	r := res("s", "u", 1)
	if _, err := g.Reserve(ctx, r); err != nil {
		t.Fatal(err)
	}
	later := now.Add(2 * time.Hour)
	if dropped, err := g.Expire(ctx, "s", now, time.Hour); err != nil || dropped {
		t.Fatalf("sale not ended: dropped=%v err=%v", dropped, err)
	}
	if dropped, err := g.Expire(ctx, "s", later, time.Hour); err != nil || dropped {
		t.Fatalf("reservation in flight: dropped=%v err=%v", dropped, err)
	}
	if _, err := g.Finalize(ctx, "s", []stockgate.Outcome{{OrderID: r.OrderID}}); err != nil {
		t.Fatal(err)
	}
	if dropped, err := g.Expire(ctx, "s", later, time.Hour); err != nil || !dropped {
		t.Fatalf("idle ended sale: dropped=%v err=%v", dropped, err)
	}
	n, err := c.Do(ctx, c.B().Exists().Key(g.KeysOf("s").Meta, g.KeysOf("s").Buyers).Build()).AsInt64()
	if err != nil || n != 0 {
		t.Fatalf("keys left: %d %v", n, err)
	}
	if skus, _ := g.SKUs(ctx); len(skus) != 0 {
		t.Fatalf("still registered: %v", skus)
	}
}

// TestFenceAndSeed: a fenced SKU refuses purchases; finalize while fenced
// closes entries without touching units; a seed restores the in-flight
// entries so their outcome can still be closed once.
func TestFenceAndSeed(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 5)
	a, b := res("s", "u1", 2), res("s", "u2", 1)
	for _, r := range []sale.Reservation{a, b} {
		if _, err := g.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Fence(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reserve(ctx, res("s", "u3", 1)); !errors.Is(err, sale.ErrNotWarmed) {
		t.Fatalf("fenced sku accepted: %v", err)
	}
	if _, ok, _ := g.Available(ctx, "s"); ok {
		t.Fatal("fenced sku reports available units")
	}
	// b is refused by the database while fenced: only its entry goes.
	if units, err := g.Finalize(ctx, "s", []stockgate.Outcome{{OrderID: b.OrderID, Refused: true}}); err != nil || units != 0 {
		t.Fatalf("finalize while fenced: %d %v", units, err)
	}
	f, err := g.ReadInFlight(ctx, "s")
	if err != nil || f.Loaded || len(f.Reservations) != 1 || f.Reserved != 3 {
		t.Fatalf("in flight while fenced: %+v %v", f, err)
	}
	// Rebuild: 10 in the database, a still in flight.
	ok, err := g.Seed(ctx, "s", stockgate.Config{PerUserLimit: 5}, 8, map[string]int64{"u1": 2}, f.Reservations, nil, nil, "e2")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got := avail(t, g, "s"); got != 8 {
		t.Fatalf("available %d", got)
	}
	if ok, _ := g.Seed(ctx, "s", stockgate.Config{PerUserLimit: 5}, 99, nil, nil, nil, nil, "e3"); ok {
		t.Fatal("seeded a loaded sku")
	}
	if units, _ := g.Finalize(ctx, "s", []stockgate.Outcome{{OrderID: a.OrderID, Refused: true}}); units != 2 {
		t.Fatalf("refusal after rebuild gave back %d, want 2", units)
	}
	if h, _ := g.Held(ctx, "s", "u1"); h != 0 {
		t.Fatalf("u1 holds %d", h)
	}
	if f, _ := g.ReadInFlight(ctx, "s"); f.Reserved != 3 || !f.Loaded {
		t.Fatalf("reserved counter went backwards or not loaded: %+v", f)
	}
}

// TestRestoreOnce: a release's units and buyer slot come back once, however
// often the restore runs; a resync that already counted a pending release
// (the database stock includes it) marks it done instead.
func TestRestoreOnce(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 2)
	a, b := res("s", "ann", 2), res("s", "bob", 1)
	for _, r := range []sale.Reservation{a, b} {
		if _, err := g.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Finalize(ctx, "s", []stockgate.Outcome{{OrderID: a.OrderID}, {OrderID: b.OrderID}}); err != nil {
		t.Fatal(err)
	}
	// a is released: restored three times, counted once.
	for i := 0; i < 3; i++ {
		units, err := g.Restore(ctx, "s", []stockgate.Release{{OrderID: a.OrderID, User: "ann", Quantity: 2}})
		if err != nil || (i == 0) != (units == 2) {
			t.Fatalf("restore %d: %d units, %v", i, units, err)
		}
	}
	if got := avail(t, g, "s"); got != 9 {
		t.Fatalf("available %d, want 9", got)
	}
	if h, _ := g.Held(ctx, "s", "ann"); h != 0 {
		t.Fatalf("ann holds %d", h)
	}
	// b is released in the database (stock 10 now), its restore still pending:
	// the resync counts it from the database and marks it done.
	f, _ := g.ReadInFlight(ctx, "s")
	rel := []stockgate.Release{{OrderID: b.OrderID, User: "bob", Quantity: 1}}
	if n, err := g.Resync(ctx, "s", stockgate.Config{PerUserLimit: 2}, f, 10, nil, rel); err != nil || n != 10 {
		t.Fatalf("resync: %d %v", n, err)
	}
	if units, _ := g.Restore(ctx, "s", rel); units != 0 {
		t.Fatalf("restore after resync gave %d units again", units)
	}
	if h, _ := g.Held(ctx, "s", "bob"); h != 0 {
		t.Fatalf("bob holds %d", h)
	}
	if got := avail(t, g, "s"); got != 10 {
		t.Fatalf("available %d, want 10", got)
	}
	if err := g.Fence(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Restore(ctx, "s", []stockgate.Release{{OrderID: "x", User: "u", Quantity: 1}}); !errors.Is(err, sale.ErrNotWarmed) {
		t.Fatalf("restore on an unloaded sku: %v", err)
	}
}

// TestResyncRefusesAcrossReseed: a resync computed from an in-flight read
// of an earlier load (Redis lost the sale and it was seeded again since) is
// refused: its reserved counter belongs to another life of the SKU.
func TestResyncRefusesAcrossReseed(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 5)
	for i := 0; i < 4; i++ {
		if _, err := g.Reserve(ctx, res("s", fmt.Sprintf("u%d", i), 1)); err != nil {
			t.Fatal(err)
		}
	}
	f, err := g.ReadInFlight(ctx, "s")
	if err != nil || f.Epoch == "" {
		t.Fatal(f, err)
	}
	if err := g.Fence(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if ok, err := g.Seed(ctx, "s", stockgate.Config{PerUserLimit: 5}, 6, nil, nil, nil, nil, "other"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := g.Resync(ctx, "s", stockgate.Config{PerUserLimit: 5}, f, 10, nil, nil); !errors.Is(err, stockgate.ErrReseeded) {
		t.Fatalf("resync across a reseed: %v", err)
	}
	if got := avail(t, g, "s"); got != 6 {
		t.Fatalf("available %d, want the seed's 6", got)
	}
}

// TestLateRetryAfterClose: a retry of an order id that arrives after the
// reservation was applied and closed is a duplicate, never a second
// reservation.
func TestLateRetryAfterClose(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 5)
	r := res("s", "ivan", 1)
	if _, err := g.Reserve(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Finalize(ctx, "s", []stockgate.Outcome{{OrderID: r.OrderID}}); err != nil {
		t.Fatal(err)
	}
	again, err := g.Reserve(ctx, r)
	if err != nil || !again.Duplicate || again.OrderID != r.OrderID {
		t.Fatalf("late retry: %+v %v", again, err)
	}
	if got := avail(t, g, "s"); got != 9 {
		t.Fatalf("available %d, want 9", got)
	}
	if h, _ := g.Held(ctx, "s", "ivan"); h != 1 {
		t.Fatalf("ivan holds %d", h)
	}
}

// TestResyncRefusedAfterMove: units taken in Redis between a resync's
// in-flight read and its write (a fallback sale's debit applied by the
// restorer, here) may be missing from its database snapshot: the write is
// refused (nothing changed) and a fresh read-snapshot-write applies.
func TestResyncRefusedAfterMove(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	cfg := stockgate.Config{PerUserLimit: 5}
	seed(t, g, "s", 10, 5)
	f, err := g.ReadInFlight(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot the resync took saw 10 units; then the database fallback
	// sold 3 and the restorer took them from Redis.
	if _, err := g.Restore(ctx, "s", []stockgate.Release{{OrderID: "sale-1", Quantity: -3}}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Resync(ctx, "s", cfg, f, 10, nil, nil); !errors.Is(err, stockgate.ErrMoved) {
		t.Fatalf("resync after a move: %v, want ErrMoved", err)
	}
	if got := avail(t, g, "s"); got != 7 {
		t.Fatalf("available %d after the refused resync, want 7", got)
	}
	f, _ = g.ReadInFlight(ctx, "s")
	if n, err := g.Resync(ctx, "s", cfg, f, 7, nil, nil); err != nil || n != 7 {
		t.Fatalf("fresh resync: %d %v", n, err)
	}
}

// TestChangeLockFences: Seed, Resync and Adjust given a lock token write
// only while it holds the SKU's change lock.
func TestChangeLockFences(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 5)
	if ok, err := g.LockSKU(ctx, "s", "a", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, _ := g.LockSKU(ctx, "s", "b", time.Minute); ok {
		t.Fatal("a second holder took the lock")
	}
	if _, err := g.Adjust(ctx, "s", stockgate.Config{PerUserLimit: 5, Lock: "b"}, 5); !errors.Is(err, stockgate.ErrLockLost) {
		t.Fatalf("adjust without the lock: %v", err)
	}
	f, _ := g.ReadInFlight(ctx, "s")
	if _, err := g.Resync(ctx, "s", stockgate.Config{PerUserLimit: 5, Lock: "b"}, f, 99, nil, nil); !errors.Is(err, stockgate.ErrLockLost) {
		t.Fatalf("resync without the lock: %v", err)
	}
	if _, err := g.Adjust(ctx, "s", stockgate.Config{PerUserLimit: 5, Lock: "a"}, 5); err != nil {
		t.Fatalf("adjust with the lock: %v", err)
	}
	if err := g.UnlockSKU(ctx, "s", "b"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := g.LockSKU(ctx, "s", "b", time.Minute); ok {
		t.Fatal("unlock by a non-holder released the lock")
	}
	if err := g.UnlockSKU(ctx, "s", "a"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := g.LockSKU(ctx, "s", "b", time.Minute); !ok {
		t.Fatal("the lock was not released")
	}
	if got := avail(t, g, "s"); got != 15 {
		t.Fatalf("available %d, want 15", got)
	}
}

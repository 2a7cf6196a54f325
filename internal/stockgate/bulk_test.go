package stockgate_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestFinalizeAndUnqueueInBulk: the relay's unqueue and the consumer's
// finalize read and write whole batches at once, in chunks; a batch larger
// than a chunk, with every kind of outcome, ids given twice and ids that
// were never reserved, closes each reservation exactly once and leaves the
// counters as one call per reservation would.
func TestFinalizeAndUnqueueInBulk(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	const n = 1300 // more than two chunks of 500
	seed(t, g, "bulk", 2*n, 2)
	var rs []sale.Reservation
	var sold int64
	for i := range n {
		r := res("bulk", fmt.Sprintf("u%d", i), 1+int64(i%2))
		r.IdempotencyKey = fmt.Sprintf("k%d", i)
		if _, err := g.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
		sold += r.Quantity
	}
	// The stream acknowledged the first 1,000 (one given twice, and two ids
	// the outbox never held): they move to the accepted index.
	ids := []string{rs[0].OrderID, "00000000-0000-8000-8000-000000000001"}
	for _, r := range rs[:1000] {
		ids = append(ids, r.OrderID)
	}
	ids = append(ids, "00000000-0000-8000-8000-000000000002")
	if err := g.Unqueue(ctx, "bulk", ids...); err != nil {
		t.Fatal(err)
	}
	if got, _ := g.OutboxLen(ctx, "bulk"); got != n-1000 {
		t.Fatalf("outbox %d after unqueue, want %d", got, n-1000)
	}
	k := g.KeysOf("bulk")
	if got := zcard(t, c, g.Prefix()+":{bulk}:accepted"); got != 1000 {
		t.Fatalf("accepted index %d, want 1000", got)
	}

	// Outcomes: every third refused, every seventh refused because its key
	// made another order (the first reservation's), the rest applied; the
	// first id twice (its first outcome wins), and an id never reserved.
	var outs []stockgate.Outcome
	var wantUnits int64
	refused := map[string]bool{}
	for i, r := range rs {
		o := stockgate.Outcome{OrderID: r.OrderID}
		switch {
		case i > 0 && i%7 == 0:
			o.Refused, o.KeyOrderID = true, rs[0].OrderID
		case i > 0 && i%3 == 0:
			o.Refused = true
		}
		if o.Refused {
			wantUnits += r.Quantity
			refused[r.User] = true
		}
		outs = append(outs, o)
	}
	// The first id again within the first chunk and in the last one.
	outs = append(outs[:2], outs[1:]...)
	outs[1] = stockgate.Outcome{OrderID: rs[0].OrderID, Refused: true}
	outs = append(outs, outs[1], stockgate.Outcome{OrderID: "00000000-0000-8000-8000-000000000003"})
	units, err := g.Finalize(ctx, "bulk", outs)
	if err != nil {
		t.Fatal(err)
	}
	if units != wantUnits {
		t.Fatalf("gave back %d units, want %d", units, wantUnits)
	}
	if again, err := g.Finalize(ctx, "bulk", outs); err != nil || again != 0 {
		t.Fatalf("second finalize gave back %d (%v), want 0", again, err)
	}
	if got, want := avail(t, g, "bulk"), 2*n-sold+wantUnits; got != want {
		t.Fatalf("available %d, want %d", got, want)
	}
	for i, r := range rs {
		h, _ := g.Held(ctx, "bulk", r.User)
		if want := r.Quantity; refused[r.User] && h != 0 || !refused[r.User] && h != want {
			t.Fatalf("buyer %d holds %d (refused %v, bought %d)", i, h, refused[r.User], r.Quantity)
		}
	}
	gs, err := g.ReadGauges(ctx, "bulk")
	if err != nil || gs.Units != 0 || gs.InFlight != 0 {
		t.Fatalf("in flight after finalize: %+v %v", gs, err)
	}
	for _, key := range []string{k.Outbox, g.Prefix() + ":{bulk}:accepted"} {
		if got := zcard(t, c, key); got != 0 {
			t.Fatalf("%s holds %d after finalize", key, got)
		}
	}
	if got := zcard(t, c, k.Closed); got != n {
		t.Fatalf("%d closed markers, want %d", got, n)
	}
	// A late retry of a closed order id is a duplicate, never a new unit;
	// a key refused for another order now names that order.
	late := rs[5]
	if rr, err := g.Reserve(ctx, late); err != nil || !rr.Duplicate || rr.OrderID != late.OrderID {
		t.Fatalf("retry of closed order: %+v %v", rr, err)
	}
	if id, ok, err := g.Duplicate(ctx, "bulk", rs[7].User, rs[7].IdempotencyKey); err != nil || !ok || id != rs[0].OrderID {
		t.Fatalf("key of a refused-for-its-key order names %q %v %v, want %s", id, ok, err, rs[0].OrderID)
	}
}

// TestReserveCountersExact: the reserve script writes avail, reserved and
// inflight as the numbers it computed (one HSET instead of three HINCRBYs):
// they stay exact integers at the largest stock a sale may have.
func TestReserveCountersExact(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	seed(t, g, "big", sale.MaxStock, 5)
	var got int64
	for i := range 20 {
		r := res("big", fmt.Sprintf("u%d", i), 1+int64(i%5))
		if _, err := g.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		got += r.Quantity
	}
	m, err := c.Do(ctx, c.B().Hmget().Key(g.KeysOf("big").Meta).Field("avail", "reserved", "inflight").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{sale.MaxStock - got, got, got} {
		if m[i] != strconv.FormatInt(want, 10) {
			t.Fatalf("meta field %d is %q, want %d", i, m[i], want)
		}
	}
}

// TestDuplicateOfSplitSale: the sold-out path's key look-up reads the bucket
// count and bucket 0's key together; a buyer whose home is another bucket
// is looked up there.
func TestDuplicateOfSplitSale(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	const k = 4
	seedSplit(t, g, "dup", k, 40, 1)
	for b := range k {
		r := res("dup", userIn(b, k, 0), 1)
		r.IdempotencyKey = "key-" + strconv.Itoa(b)
		rr, err := g.ReserveIn(ctx, r, stockgate.Limits{}, k)
		if err != nil {
			t.Fatal(err)
		}
		id, ok, err := g.Duplicate(ctx, "dup", r.User, r.IdempotencyKey)
		if err != nil || !ok || id != rr.OrderID {
			t.Fatalf("bucket %d: look-up %q %v %v, want %s", b, id, ok, err, rr.OrderID)
		}
		if _, ok, err := g.Duplicate(ctx, "dup", r.User, "other"); err != nil || ok {
			t.Fatalf("bucket %d: unknown key found (%v, %v)", b, ok, err)
		}
	}
	// Unsplit: one round trip, found and not found.
	seed(t, g, "dup1", 5, 1)
	r := res("dup1", "u", 1)
	r.IdempotencyKey = "k"
	rr, err := g.Reserve(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok, err := g.Duplicate(ctx, "dup1", "u", "k"); err != nil || !ok || id != rr.OrderID {
		t.Fatalf("unsplit look-up %q %v %v", id, ok, err)
	}
	if _, ok, err := g.Duplicate(ctx, "dup1", "v", "k"); err != nil || ok {
		t.Fatalf("another user's key found (%v, %v)", ok, err)
	}
	// A Redis that does not answer is an error, never "not found".
	cctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	time.Sleep(time.Millisecond)
	if _, _, err := g.Duplicate(cctx, "dup1", "u", "k"); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("look-up past its deadline: %v, want an error", err)
	}
}

func zcard(t *testing.T, c rueidis.Client, key string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Zcard().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDuplicateCoalesced: look-ups of one SKU asked while one is in flight
// go together in the next round trip (Redis paused: every look-up after the
// first waits for it), each gets its own answer, and a caller whose context
// ends stops waiting without disturbing the others.
func TestDuplicateCoalesced(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := testenv.RedisClient(t, srv.URL)
	g := stockgate.New(c, "co")
	ctx := context.Background()
	seed(t, g, "co", 100, 1)
	made := map[string]string{}
	for i := range 50 {
		r := res("co", fmt.Sprintf("u%d", i), 1)
		r.IdempotencyKey = "k"
		rr, err := g.Reserve(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		made[r.User] = rr.OrderID
	}
	hmgets := func() int64 {
		s, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(s, "\r\n") {
			if v, ok := strings.CutPrefix(line, "cmdstat_hmget:calls="); ok {
				n, _ := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	before := hmgets()
	srv.Pause()
	const n = 200
	type answer struct {
		id  string
		ok  bool
		err error
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &answers[i]
			a.id, a.ok, a.err = g.Duplicate(ctx, "co", fmt.Sprintf("u%d", i%100), "k")
		}()
	}
	// One more with a short deadline: it gives up while Redis is paused.
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, _, err := g.Duplicate(sctx, "co", "u1", "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("look-up past its deadline: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	srv.Resume()
	wg.Wait()
	for i, a := range answers {
		want, made := made[fmt.Sprintf("u%d", i%100)]
		if a.err != nil || a.ok != made || a.id != want {
			t.Fatalf("look-up %d: %q %v %v, want %q %v", i, a.id, a.ok, a.err, want, made)
		}
	}
	if calls := hmgets() - before; calls > 3 {
		t.Fatalf("%d look-ups made %d HMGETs, want them coalesced into at most 3", n+1, calls)
	}
}

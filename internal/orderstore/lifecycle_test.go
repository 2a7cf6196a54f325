package orderstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// applyOne applies r and fails unless it is pending_payment.
func applyOne(t *testing.T, s *orderstore.Store, r sale.Reservation) {
	t.Helper()
	out, err := s.ApplyBatch(testContext(t), []sale.Reservation{r})
	if err != nil || out[0].Status != sale.StatusPendingPayment {
		t.Fatalf("apply %s: %+v %v", r.OrderID, out, err)
	}
}

func restoresOf(t *testing.T, s *orderstore.Store) map[string]orderstore.Restore {
	t.Helper()
	rs, err := s.PendingRestores(testContext(t), 1000)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]orderstore.Restore{}
	for _, r := range rs {
		m[r.OrderID] = r
	}
	return m
}

func transitions(t *testing.T, s *orderstore.Store, id string) []string {
	t.Helper()
	rows, err := s.DB().QueryContext(testContext(t), s.Rebind(`SELECT concat(coalesce(from_status, ''), '>', to_status, ':', cause) FROM order_transitions WHERE order_id = ? ORDER BY id`), id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPayAndCancel(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "L", 10)
	now := time.Now()
	a, b := newResv("L", "ann", 2), newResv("L", "bob", 3)
	applyOne(t, s, a)
	applyOne(t, s, b)

	o, again, err := s.Pay(ctx, a.OrderID, "ann", "ref-1", now)
	if err != nil || again || o.Status != sale.StatusPaid || o.PaidAt == nil {
		t.Fatalf("pay: %+v %v %v", o, again, err)
	}
	if _, again, err := s.Pay(ctx, a.OrderID, "ann", "ref-1", now); err != nil || !again {
		t.Fatalf("pay again: %v %v", again, err)
	}
	if _, _, err := s.Pay(ctx, a.OrderID, "bob", "", now); !errors.Is(err, sale.ErrOrderNotFound) {
		t.Fatalf("pay someone else's order: %v", err)
	}
	if _, _, err := s.Cancel(ctx, a.OrderID, "ann", sale.CancelByUser, now); !errors.Is(err, sale.ErrOrderPaid) {
		t.Fatalf("cancel a paid order: %v", err)
	}
	o, again, err = s.Cancel(ctx, b.OrderID, "bob", sale.CancelByUser, now)
	if err != nil || again || o.Status != sale.StatusCancelled || o.CancelReason != sale.CancelByUser || o.CancelledAt == nil {
		t.Fatalf("cancel: %+v %v %v", o, again, err)
	}
	if _, again, err := s.Cancel(ctx, b.OrderID, "bob", sale.CancelByUser, now); err != nil || !again {
		t.Fatalf("cancel again: %v %v", again, err)
	}
	if _, _, err := s.Pay(ctx, b.OrderID, "bob", "", now); !errors.Is(err, sale.ErrOrderExpired) {
		t.Fatalf("pay a cancelled order: %v", err)
	}
	l := checkInvariants(t, s, "L")
	if l.Stock != 8 || l.Live != 2 {
		t.Fatalf("ledger %+v", l)
	}
	rs := restoresOf(t, s)
	if len(rs) != 1 || rs[b.OrderID].Quantity != 3 || rs[b.OrderID].User != "bob" {
		t.Fatalf("restores %+v", rs)
	}
	if got := transitions(t, s, b.OrderID); len(got) != 2 || got[1] != "pending_payment>cancelled:user_cancel" {
		t.Fatalf("transitions %v", got)
	}
	if err := s.RestoresDone(ctx, []string{b.OrderID}); err != nil || len(restoresOf(t, s)) != 0 {
		t.Fatalf("restores done: %v", err)
	}
}

func TestExpireNeverEarly(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "E", 10)
	r := newResv("E", "u", 1)
	applyOne(t, s, r)
	o, _ := s.Order(ctx, r.OrderID)
	before := o.ExpiresAt.Add(-time.Millisecond)
	if _, released, err := s.Expire(ctx, r.OrderID, before); err != nil || released {
		t.Fatalf("expired before its deadline: %v %v", released, err)
	}
	if got, err := s.ExpireDue(ctx, before, 100); err != nil || len(got) != 0 {
		t.Fatalf("sweeper released early: %v %v", got, err)
	}
	if _, released, err := s.Expire(ctx, r.OrderID, *o.ExpiresAt); err != nil || !released {
		t.Fatalf("not released at its deadline: %v %v", released, err)
	}
	if _, released, err := s.Expire(ctx, r.OrderID, *o.ExpiresAt); err != nil || released {
		t.Fatalf("released twice: %v %v", released, err)
	}
	if l := checkInvariants(t, s, "E"); l.Stock != 10 {
		t.Fatalf("ledger %+v", l)
	}
}

// TestPayAfterDeadline: a pay at or after expires_at is refused with
// sale.ErrOrderExpired even though the timer has not released the order
// yet; the order stays pending_payment, holding its stock, until the normal
// expiry releases it; a pay just before the deadline succeeds.
func TestPayAfterDeadline(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "PD", 10)
	late, onTime := newResv("PD", "ann", 1), newResv("PD", "bob", 1)
	applyOne(t, s, late)
	applyOne(t, s, onTime)
	o, err := s.Order(ctx, late.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Time{*o.ExpiresAt, o.ExpiresAt.Add(time.Second)} {
		if _, _, err := s.Pay(ctx, late.OrderID, "ann", "ref-late", at); !errors.Is(err, sale.ErrOrderExpired) {
			t.Fatalf("pay at %v, deadline %v: %v, want ErrOrderExpired", at, *o.ExpiresAt, err)
		}
	}
	if cur, _ := s.Order(ctx, late.OrderID); cur.Status != sale.StatusPendingPayment || cur.PaidAt != nil {
		t.Fatalf("after a refused late pay: %+v", cur)
	}
	if _, released, err := s.Expire(ctx, late.OrderID, o.ExpiresAt.Add(time.Second)); err != nil || !released {
		t.Fatalf("expiry after a refused pay: %v %v", released, err)
	}
	if _, _, err := s.Pay(ctx, late.OrderID, "ann", "ref-late", o.ExpiresAt.Add(time.Second)); !errors.Is(err, sale.ErrOrderExpired) {
		t.Fatalf("pay of the expired order: %v", err)
	}
	b, _ := s.Order(ctx, onTime.OrderID)
	if p, _, err := s.Pay(ctx, onTime.OrderID, "bob", "ref-ok", b.ExpiresAt.Add(-time.Millisecond)); err != nil || p.Status != sale.StatusPaid {
		t.Fatalf("pay a millisecond before the deadline: %+v %v", p, err)
	}
	if l := checkInvariants(t, s, "PD"); l.Stock != 9 || l.Live != 1 {
		t.Fatalf("ledger %+v", l)
	}
}

// TestPayRacesExpiry: payment and expiry of the same orders at the same
// moment, from several goroutines: each order ends paid or cancelled, never
// both; stock comes back once per cancelled order.
func TestPayRacesExpiry(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const n = 200
	putSKUChange(t, s, orderstore.SKUChange{ID: "R", TotalStock: n, PerUserLimit: 1})
	var rs []sale.Reservation
	for i := 0; i < n; i++ {
		rs = append(rs, newResv("R", fmt.Sprintf("user%d", i), 1))
	}
	if out, err := s.ApplyBatch(ctx, rs); err != nil || out[n-1].Status != sale.StatusPendingPayment {
		t.Fatal(out, err)
	}
	due := time.UnixMilli(rs[0].AcceptedAt).Add(16 * time.Minute)
	payAt := due.Add(-2 * time.Minute) // before the deadline: a later pay is refused outright
	var paid, expired atomic.Int64
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(3)
		go func() {
			defer wg.Done()
			if _, again, err := s.Pay(ctx, r.OrderID, r.User, "", payAt); err == nil && !again {
				paid.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			if _, released, err := s.Expire(ctx, r.OrderID, due); err == nil && released {
				expired.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			got, _ := s.ExpireDue(ctx, due, 7)
			expired.Add(int64(len(got)))
		}()
	}
	wg.Wait()
	for {
		got, err := s.ExpireDue(ctx, due, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		expired.Add(int64(len(got)))
	}
	if paid.Load()+expired.Load() != n {
		t.Fatalf("%d paid + %d expired != %d", paid.Load(), expired.Load(), n)
	}
	l := checkInvariants(t, s, "R")
	if l.Stock != expired.Load() || l.Live != paid.Load() {
		t.Fatalf("ledger %+v, paid %d, expired %d", l, paid.Load(), expired.Load())
	}
	if got := len(restoresOf(t, s)); int64(got) != expired.Load() {
		t.Fatalf("%d restores owed for %d releases", got, expired.Load())
	}
	t.Logf("%d paid, %d expired", paid.Load(), expired.Load())
}

// TestCancelWhileQueued: a cancel requested before the reservation lands
// makes it land cancelled, taking no stock and owing its Redis units back.
func TestCancelWhileQueued(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "Q", 5)
	r, other := newResv("Q", "quinn", 2), newResv("Q", "otto", 1)
	if _, landed, err := s.RequestCancel(ctx, r.OrderID, "quinn", time.Now()); err != nil || landed {
		t.Fatalf("request cancel: %v %v", landed, err)
	}
	// Someone else's request for otto's order does not cancel it.
	if _, _, err := s.RequestCancel(ctx, other.OrderID, "mallory", time.Now()); err != nil {
		t.Fatal(err)
	}
	out, err := s.ApplyBatch(ctx, []sale.Reservation{r, other})
	if err != nil || out[0].Status != sale.StatusCancelled || out[1].Status != sale.StatusPendingPayment {
		t.Fatalf("apply: %+v %v", out, err)
	}
	o, _ := s.Order(ctx, r.OrderID)
	if o.CancelReason != sale.CancelByUser || o.ExpiresAt != nil {
		t.Fatalf("order %+v", o)
	}
	if l := checkInvariants(t, s, "Q"); l.Stock != 4 {
		t.Fatalf("ledger %+v", l)
	}
	if rs := restoresOf(t, s); rs[r.OrderID].Quantity != 2 || len(rs) != 1 {
		t.Fatalf("restores %+v", rs)
	}
	// After landing, a request cancels at once.
	o, landed, err := s.RequestCancel(ctx, other.OrderID, "otto", time.Now())
	if err != nil || !landed || o.Status != sale.StatusCancelled {
		t.Fatalf("request cancel of a landed order: %+v %v %v", o, landed, err)
	}
}

// TestPublishTransitions: the outbox hands transitions over oldest first, at
// most limit at a time, marks them published only when publish succeeds, and
// two publishers at once never get the same row (SKIP LOCKED).
func TestPublishTransitions(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "P", 10)
	a, b, c := newResv("P", "ann", 1), newResv("P", "bob", 2), newResv("P", "cat", 1)
	for _, r := range []sale.Reservation{a, b, c} {
		applyOne(t, s, r)
	}
	now := time.Date(2030, 5, 6, 7, 20, 0, 250_000_000, time.UTC) // before the payment deadline
	if _, _, err := s.Pay(ctx, a.OrderID, "ann", "ref", now); err != nil {
		t.Fatal(err)
	}

	// A failing publish changes nothing.
	boom := errors.New("broker down")
	if n, err := s.PublishTransitions(ctx, 10, func([]orderstore.Transition) error { return boom }); !errors.Is(err, boom) || n != 0 {
		t.Fatalf("failing publish: %d, %v", n, err)
	}

	var got []orderstore.Transition
	collect := func(ts []orderstore.Transition) error { got = append(got, ts...); return nil }
	if n, err := s.PublishTransitions(ctx, 2, collect); err != nil || n != 2 {
		t.Fatalf("first page: %d, %v", n, err)
	}
	if n, err := s.PublishTransitions(ctx, 10, collect); err != nil || n != 2 {
		t.Fatalf("second page: %d, %v", n, err)
	}
	if n, err := s.PublishTransitions(ctx, 10, collect); err != nil || n != 0 {
		t.Fatalf("drained outbox: %d, %v", n, err)
	}
	if len(got) != 4 {
		t.Fatalf("published %d transitions, want 4: %+v", len(got), got)
	}
	for i := 1; i < len(got); i++ {
		if got[i].ID <= got[i-1].ID {
			t.Fatalf("not oldest first: %+v", got)
		}
	}
	paid := got[3]
	want := orderstore.Transition{ID: paid.ID, OrderID: a.OrderID, SKU: "P", User: "ann", Quantity: 1,
		From: string(sale.StatusPendingPayment), To: string(sale.StatusPaid), Cause: "payment", At: now}
	if paid.At.Equal(now) {
		want.At = paid.At // compare the instant, not the representation
	}
	if paid != want {
		t.Errorf("payment transition\n got %+v\nwant %+v", paid, want)
	}
	if got[0].From != "" || got[0].To != string(sale.StatusPendingPayment) || got[0].OrderID != a.OrderID {
		t.Errorf("first transition %+v", got[0])
	}
	if n := queryInt(t, s, `SELECT count(*) FROM order_transitions WHERE published_at IS NULL`); n != 0 {
		t.Errorf("%d transitions left unpublished", n)
	}

	// Two publishers at once: the second skips the rows the first holds.
	if _, _, err := s.Cancel(ctx, b.OrderID, "bob", sale.CancelByUser, now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Cancel(ctx, c.OrderID, "cat", sale.CancelByUser, now); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan []orderstore.Transition, 1), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := s.PublishTransitions(ctx, 1, func(ts []orderstore.Transition) error {
			held <- ts
			<-release
			return nil
		}); err != nil {
			t.Error(err)
		}
	})
	first := <-held
	var second []orderstore.Transition
	if n, err := s.PublishTransitions(ctx, 10, func(ts []orderstore.Transition) error { second = ts; return nil }); err != nil || n != 1 {
		t.Errorf("second publisher: %d, %v", n, err)
	}
	close(release)
	wg.Wait()
	if len(first) != 1 || len(second) != 1 || first[0].ID == second[0].ID {
		t.Errorf("publishers shared rows: %+v and %+v", first, second)
	}
}

// TestRestoresOldestFirst: PendingRestores lists owed restores oldest first,
// up to limit, and RestoresDone forgets exactly the ones named.
func TestRestoresOldestFirst(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "O", 10)
	var rs []sale.Reservation
	for i := range 3 {
		r := newResv("O", fmt.Sprintf("u%d", i), 1)
		applyOne(t, s, r)
		rs = append(rs, r)
	}
	for _, r := range rs {
		if _, _, err := s.Cancel(ctx, r.OrderID, r.User, sale.CancelByUser, time.Now()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // distinct created_at
	}
	got, err := s.PendingRestores(ctx, 2)
	if err != nil || len(got) != 2 || got[0].OrderID != rs[0].OrderID || got[1].OrderID != rs[1].OrderID {
		t.Fatalf("PendingRestores(2) = %+v, %v", got, err)
	}
	if got[0] != (orderstore.Restore{OrderID: rs[0].OrderID, SKU: "O", User: "u0", Quantity: 1}) {
		t.Errorf("restore %+v", got[0])
	}
	if err := s.RestoresDone(ctx, []string{rs[0].OrderID, rs[2].OrderID, "not-there"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RestoresDone(ctx, nil); err != nil {
		t.Fatal(err)
	}
	left := restoresOf(t, s)
	if len(left) != 1 || left[rs[1].OrderID].Quantity != 1 {
		t.Errorf("left %+v", left)
	}
}

// TestRequestCancelRacesApply: cancels requested while the reservations are
// being applied all take effect, whichever side commits first: every order
// ends cancelled and the stock is whole again.
func TestRequestCancelRacesApply(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	const n = 60
	putSKUChange(t, s, orderstore.SKUChange{ID: "RC", TotalStock: n, PerUserLimit: 1})
	var rs []sale.Reservation
	for i := range n {
		rs = append(rs, newResv("RC", fmt.Sprintf("user%d", i), 1))
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; i < n; i += 5 {
			if _, err := s.ApplyBatch(ctx, rs[i:i+5]); err != nil {
				t.Error(err)
			}
		}
	})
	for _, r := range rs {
		wg.Go(func() {
			if _, _, err := s.RequestCancel(ctx, r.OrderID, r.User, time.Now()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, r := range rs {
		o, err := s.Order(ctx, r.OrderID)
		if err != nil || o.Status != sale.StatusCancelled || o.CancelReason != sale.CancelByUser {
			t.Errorf("order %s: %+v, %v", r.OrderID, o, err)
		}
	}
	if l := checkInvariants(t, s, "RC"); l.Stock != n || l.Live != 0 {
		t.Errorf("ledger %+v", l)
	}
	if got := len(restoresOf(t, s)); got != n {
		t.Errorf("%d restores owed, want %d", got, n)
	}
}

// TestCancelCrowdLeavesPoolFree: a crowd cancelling one sale at once while
// its inventory row is locked (by an apply, say) does not take every
// connection of the pool: an order look-up still answers while every
// cancel waits, and once the row is free every cancel completes.
func TestCancelCrowdLeavesPoolFree(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "hot", 100)
	const crowd = 40
	rs := make([]sale.Reservation, crowd)
	for i := range rs {
		rs[i] = resv(oid(90, i), "hot", fmt.Sprintf("u%d", i), 1)
	}
	if _, err := s.ApplyBatch(ctx, rs); err != nil {
		t.Fatal(err)
	}

	// Another writer holds the sale's inventory row.
	locker, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback()
	if _, err := locker.ExecContext(ctx, s.Rebind(`UPDATE inventory SET stock = stock WHERE sku_id = ?`), "hot"); err != nil {
		t.Fatal(err)
	}
	var finished atomic.Int32
	errs := make(chan error, crowd)
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() {
			// A cancel kept waiting past the lock timeout (5 s) on a busy
			// machine is refused as transient: sent again, as a client does.
			for {
				_, _, err := s.Cancel(ctx, r.OrderID, r.User, sale.CancelByUser, time.Now())
				if err == nil || !orderstore.IsTransient(err) || ctx.Err() != nil {
					if err == nil {
						finished.Add(1)
					}
					errs <- err
					return
				}
			}
		})
	}
	// Wait until the cancels hold every connection they may take.
	base := s.Stats().Max
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st := s.Stats(); st.InUse >= base/4 || time.Now().After(deadline) {
			break
		}
	}
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := s.Order(lctx, rs[0].OrderID); err != nil {
		t.Fatalf("order look-up while %d cancels wait on the inventory row: %v (pool %+v)", crowd, err, s.Stats())
	}
	if n := finished.Load(); n != 0 {
		t.Fatalf("%d cancels finished while the inventory row was locked", n)
	}
	if err := locker.Rollback(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("cancel: %v", err)
		}
	}
	if l := checkInvariants(t, s, "hot"); l.Stock != 100 || l.Live != 0 {
		t.Errorf("after every cancel: %+v", l)
	}
}

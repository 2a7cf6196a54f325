package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// TestSplitSaleEndToEnd: a sale split in 4 stock buckets through the real
// service (admin API, gate, relay, stream, consumer, database, restorer):
// the field is validated (400 invalid_buckets) and answered; 200 buyers
// with a limit of 1 buy 30 units: exactly 30 sell, every other buyer hears
// sold_out; cancellations give units back to the buyers' home buckets and
// sell again; the sale is re-split to 2 once idle; every invariant holds in
// the database and Redis after each phase. Exactly 30 and sold_out in the
// order purchases happened are the gate's answers; the database fallback
// (a breaker opened by gate calls timing out on a busy machine) answers
// 202 to a purchase that may end failed, which has tests of its own: it is
// off here.
func TestSplitSaleEndToEnd(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_FALLBACK_CONCURRENCY", "0"))
	admin := "Authorization: Bearer " + testAdmin
	for _, body := range []string{`{"stock":30,"per_user_limit":1,"buckets":0}`, `{"stock":30,"per_user_limit":1,"buckets":65}`} {
		if r := h.putSKU("split", body); r.Status != http.StatusBadRequest || r.code() != "invalid_buckets" {
			t.Fatalf("PUT %s: %d %s, want 400 invalid_buckets", body, r.Status, r.Raw)
		}
	}
	// Sent again while 503 (the sale's first load into four buckets can
	// outlast the request on a busy machine): a PUT is a replacement.
	r := h.doUntilAnswered(http.MethodPut, "/admin/v1/skus/split", `{"stock":30,"per_user_limit":1,"buckets":4}`, admin)
	if (r.Status != http.StatusCreated && r.Status != http.StatusOK) || r.Body["buckets"] != float64(4) {
		t.Fatalf("PUT: %d %s", r.Status, r.Raw)
	}
	if r := h.do(http.MethodGet, "/admin/v1/skus/split", "", admin); r.Body["buckets"] != float64(4) {
		t.Fatalf("GET: %s", r.Raw)
	}
	if r := h.do(http.MethodPatch, "/admin/v1/skus/split", `{"buckets":65}`, admin); r.Status != http.StatusBadRequest || r.code() != "invalid_buckets" {
		t.Fatalf("PATCH 65: %d %s", r.Status, r.Raw)
	}
	if k, err := h.a.gate.Buckets(context.Background(), "split"); err != nil || k != 4 {
		t.Fatalf("redis buckets %d %v", k, err)
	}

	// Every call's start and end on one sequence: a sold_out answered
	// before a purchase that succeeded had even begun would be a sold_out
	// while the sale still had units (it is checked after each wave).
	var seq atomic.Int64
	buyAll := func(prefix string, n int) (accepted []string, users []string, codes map[string]int) {
		var okStarts, soldOutEnds []int64
		defer func() {
			for _, e := range soldOutEnds {
				for _, s := range okStarts {
					if s > e {
						t.Errorf("%s: a sold_out (seq %d) before a successful purchase began (seq %d)", prefix, e, s)
						return
					}
				}
			}
		}()
		var mu sync.Mutex
		codes = map[string]int{}
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				u := fmt.Sprintf("%s-%d", prefix, i)
				start := seq.Add(1)
				// With a key, sent again while answered 503 (a gate call
				// that timed out on a busy machine: an unknown outcome), as
				// a client does: every buyer ends with an answer that says.
				r := h.buyUntilAnswered(u, "split", 1, u+"-key", 30*time.Second)
				end := seq.Add(1)
				mu.Lock()
				defer mu.Unlock()
				if r.Status == http.StatusAccepted {
					accepted, users = append(accepted, r.str("order_id")), append(users, u)
					okStarts = append(okStarts, start)
				}
				if r.code() == "sold_out" {
					soldOutEnds = append(soldOutEnds, end)
				}
				codes[fmt.Sprint(r.Status, " ", r.code())]++
			}()
		}
		wg.Wait()
		return accepted, users, codes
	}
	ids, users, codes := buyAll("b", 200)
	if len(ids) != 30 || codes["409 sold_out"] != 170 {
		t.Fatalf("first wave: %d accepted, %v; want 30 and 170 sold_out", len(ids), codes)
	}
	rep := settle(t, h.a, "split", ids, 30*time.Second)
	if rep.LiveUnits != 30 || rep.DBStock != 0 {
		t.Fatalf("after the first wave: %+v", rep)
	}

	// Cancel 5: their units go back (to each buyer's home bucket) and sell again.
	for i := range 5 {
		if r := h.do(http.MethodPost, "/api/v1/orders/"+ids[i]+"/cancel", "", "Authorization: Bearer "+userToken(t, users[i])); r.Status != http.StatusOK {
			t.Fatalf("cancel: %d %s", r.Status, r.Raw)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, err := h.a.gate.ReadInFlight(context.Background(), "split")
		if err != nil {
			t.Fatal(err)
		}
		if f.Available == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("units given back: %d of 5", f.Available)
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.a.buy.Noticed("split", false)
	more, _, codes := buyAll("c", 50)
	if len(more) != 5 {
		t.Fatalf("second wave: %d accepted, %v; want 5", len(more), codes)
	}
	rep = settle(t, h.a, "split", append(ids[5:], more...), 30*time.Second)
	if rep.LiveUnits != 30 {
		t.Fatalf("after the second wave: %+v", rep)
	}

	// Idle: the split can change.
	if r := h.doUntilAnswered(http.MethodPatch, "/admin/v1/skus/split", `{"buckets":2,"stock":40}`, admin); r.Status != http.StatusOK || r.Body["buckets"] != float64(2) {
		t.Fatalf("PATCH buckets 2: %d %s", r.Status, r.Raw)
	}
	if k, _ := h.a.gate.Buckets(context.Background(), "split"); k != 2 {
		t.Fatalf("redis buckets after the re-split: %d", k)
	}
	for _, n := range stockgate.BucketNames("split", 4)[1:] {
		if n == stockgate.BucketNames("split", 2)[1] {
			continue
		}
		if _, loaded, _ := h.a.gate.Available(context.Background(), n); loaded {
			t.Fatalf("bucket %s of the old split still loaded", n)
		}
	}
	final, _, codes := buyAll("d", 40)
	if len(final) != 10 {
		t.Fatalf("after the re-split: %d accepted, %v; want 10", len(final), codes)
	}
	rep = settle(t, h.a, "split", append(append(ids[5:], more...), final...), 30*time.Second)
	if rep.LiveUnits != 40 || rep.TotalStock != 40 {
		t.Fatalf("at the end: %+v", rep)
	}
}

// TestResplitRetryFinishes: a re-split saved in the database whose Redis
// side did not finish (its answer was a 503) is finished by the client's
// retry of the same PATCH, which finds nothing to change in the database.
func TestResplitRetryFinishes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded"))
	admin := "Authorization: Bearer " + testAdmin
	if r := h.putSKUAnswered("half", `{"stock":40,"per_user_limit":1,"buckets":4}`); !saved(r) {
		t.Fatalf("put: %d %s", r.Status, r.Raw)
	}
	ctx := context.Background()
	// The database has the new split, Redis the old one: the state a PATCH
	// leaves when it times out after saving.
	if _, _, _, err := h.a.store.PutSKU(ctx, orderstore.SKUChange{ID: "half", TotalStock: 40, PerUserLimit: 1, Buckets: 2}); err != nil {
		t.Fatal(err)
	}
	if k, _ := h.a.gate.Buckets(ctx, "half"); k != 4 {
		t.Fatalf("redis buckets before the retry: %d, want 4", k)
	}
	if r := h.doUntilAnswered(http.MethodPatch, "/admin/v1/skus/half", `{"buckets":2}`, admin); r.Status != http.StatusOK || r.Body["buckets"] != float64(2) {
		t.Fatalf("the retried PATCH: %d %s", r.Status, r.Raw)
	}
	if k, _ := h.a.gate.Buckets(ctx, "half"); k != 2 {
		t.Fatalf("redis buckets after the retry: %d, want 2", k)
	}
	settle(t, h.a, "half", nil, 30*time.Second)
}

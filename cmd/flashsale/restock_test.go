package main

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestRestockAndPatchRaceStayExact: restocks by a delta, merge patches of
// the per-user limit (which rewrite the whole sale from the values read)
// and PUTs of the same allocation race each other and a stream of buyers.
// Each change is computed from the sale under the SKU's change lock, so no
// restock is lost or doubled: the allocation ends exactly at the start plus
// the deltas, and every invariant holds in the database and Redis.
func TestRestockAndPatchRaceStayExact(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded"))
	const start, restockers, each = 20, 4, 5
	h.mustPutSKU("rs", start, 1)
	admin := "Authorization: Bearer " + testAdmin
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for w := range restockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if r := h.do(http.MethodPost, "/admin/v1/skus/rs/restock", `{"delta":1}`, admin); r.Status != http.StatusOK {
					errs <- fmt.Sprintf("restock %d/%d: %d %s", w, i, r.Status, r.Raw)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 2 * each {
			r := h.do(http.MethodPatch, "/admin/v1/skus/rs", fmt.Sprintf(`{"per_user_limit":%d}`, 1+i%2), admin, "Content-Type: application/merge-patch+json")
			if r.Status != http.StatusOK {
				errs <- fmt.Sprintf("patch %d: %d %s", i, r.Status, r.Raw)
			}
		}
	}()
	done := make(chan *history)
	go func() { done <- runBuyers(t, h, "rs", 60, 200, 8) }()
	wg.Wait()
	hs := <-done
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	r := h.do(http.MethodGet, "/admin/v1/skus/rs", "", admin)
	want := start + restockers*each
	if r.Body["total_stock"] != float64(want) {
		t.Fatalf("allocation after the race: %s, want total_stock %d", r.Raw, want)
	}
	rep := settle(t, h.a, "rs", hs.ids(), 30*time.Second)
	if rep.TotalStock != int64(want) || rep.DBStock+rep.LiveUnits != int64(want) {
		t.Fatalf("after the race: %+v, want allocation %d", rep, want)
	}
	t.Logf("%d accepted; %+v", len(hs.ids()), rep)
}

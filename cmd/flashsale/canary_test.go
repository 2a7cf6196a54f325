package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/canary"
	"github.com/flashsale/flashsale/internal/cluster"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// TestCanaryTrial runs canary trials end to end: a stable and a canary
// instance of one sale (one database, Redis prefix and stream) behind the
// shipped HAProxy configuration, buyers buying through HAProxy, and the
// trial raising the canary's share through the runtime API. The canary
// shadows the sale. A canary whose gate decides as the live path does is
// promoted (share 100); one whose gate lets a buyer past the per-user limit
// (live: the database refuses what it let through; in its shadow: it
// differs where the stable gate refused limit_reached) is aborted at the
// first step, its share set back to 0. Either way the sale's invariants
// hold, checked from the database, and the dashboard's overview
// shows both instances, their groups and the trial.
func TestCanaryTrial(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	for _, wrong := range []bool{false, true} {
		t.Run(map[bool]string{false: "same_gate", true: "wrong_gate"}[wrong], func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t, "external")
			stable := newHarness(t, cfg)
			ccfg := cfg
			ccfg.ReleaseGroup, ccfg.ShadowSKUs = "canary", "ct"
			// The candidate is another script than the live one, as the
			// next release's is (decisions made by a script identical to
			// the candidate are not compared): here one that decides the
			// same.
			ccfg.shadowScript = stockgate.ReserveScript() + "\n-- the next release's gate, deciding as this one\n"
			if wrong {
				// The candidate's gate, live and in its shadow, lets a
				// buyer one unit past the per-user limit.
				ccfg.shadowScript = strings.Replace(stockgate.ReserveScript(), "if held + qty > limit then", "if held + qty > limit + 1 then", 1)
				ccfg.reserveScript = ccfg.shadowScript
			}
			stable.mustPutSKU("ct", 100000, 1)
			can := newHarness(t, ccfg)
			host := func(h *harness) string { return strings.TrimPrefix(h.srvURL, "http://") }
			lb := cluster.StartHAProxyCanary(t, []string{host(stable), host(stable), host(stable)}, []string{host(can)})
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				st, err := lb.BackendStates("flashsale-canary")
				if err == nil && st["flashsale-canary-1"] == "UP" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the canary is not up in haproxy: %v %v", st, err)
				}
			}
			// The shadow journals from the moment it holds the lease.
			for deadline := time.Now().Add(20 * time.Second); !stable.a.gate.JournalLeased(context.Background(), "ct"); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the canary's shadow did not start")
				}
			}

			// Buyers, through HAProxy, from the trial's first step on: each
			// buys twice (the second is limit_reached for the live gate), a
			// new buyer every time.
			ctx, stop := context.WithCancel(context.Background())
			var ids sync.Map
			var n atomic.Int64
			var wg sync.WaitGroup
			lbh := &harness{t: t, srvURL: lb.URL, hc: stable.hc}
			buyers := sync.OnceFunc(func() {
				for w := 0; w < 8; w++ {
					wg.Go(func() {
						for ctx.Err() == nil {
							user := fmt.Sprintf("buyer-%d", n.Add(1))
							for range 2 {
								r := lbh.buy(user, "ct", 1, "")
								if r.Status == http.StatusAccepted {
									ids.Store(r.str("order_id"), true)
								}
							}
						}
					})
				}
			})
			record := recordTrial(stable.a.fleet)
			c := canary.Config{Canary: []string{can.srvURL}, Stable: []string{stable.srvURL}, Steps: []int{20, 100}, StepDuration: 2 * time.Second,
				SetShare: canary.ShareSetter(lb.Socket, lb.CanaryMap),
				Check:    func(ctx context.Context) ([]string, error) { return checkSales(ctx, stable.a) },
				State: func(ctx context.Context, s canary.State) error {
					if s.State == "running" && s.Share > 0 {
						buyers()
					}
					return record(ctx, s)
				}}
			// Errors and latency are compared as in production, with room
			// for a loaded test machine: both groups run in this one
			// process, so their differences here are noise, not the
			// candidate. The unit tests of internal/canary cover those rules.
			c.Thresholds = canary.DefaultThresholds
			// And any canary traffic is enough to judge: how many requests
			// a 2 s step gets depends on the machine (a loaded CI run gave
			// the canary 18), and the too-little-traffic rule is
			// unit-tested too.
			c.Thresholds.MinRequests, c.Thresholds.MaxErrorRateDelta, c.Thresholds.P99Floor = 1, 0.2, 5*time.Second
			rep, err := canary.Run(context.Background(), c)
			stop()
			wg.Wait()
			if err != nil {
				t.Fatal(err)
			}
			var text strings.Builder
			_ = canary.WriteText(&text, rep)
			t.Logf("trial:\n%s", text.String())

			var accepted []string
			ids.Range(func(k, _ any) bool { accepted = append(accepted, k.(string)); return true })
			settle(t, stable.a, "ct", accepted, 30*time.Second)

			cs, err := stable.a.fleet.Canary(context.Background())
			if err != nil || cs == nil {
				t.Fatalf("trial state: %v %v", cs, err)
			}
			if !wrong {
				if rep.Outcome != "promoted" || rep.FinalShare != 100 || cs.State != "promoted" || cs.Share != 100 {
					t.Fatalf("a canary with the same gate: %s, state %+v", rep.Outcome, cs)
				}
				for _, s := range rep.Steps {
					if s.Canary.ShadowMatch == 0 || s.Canary.ShadowMismatch != 0 {
						t.Fatalf("step %d%%: shadow %d match, %d mismatch", s.Share, s.Canary.ShadowMatch, s.Canary.ShadowMismatch)
					}
				}
			} else {
				if rep.Outcome != "aborted" || len(rep.Steps) != 1 || rep.Steps[0].Canary.ShadowMismatch == 0 || cs.State != "aborted" || cs.Share != 0 {
					t.Fatalf("a canary with a wrong gate: %s (%s), state %+v", rep.Outcome, rep.Reason, cs)
				}
				if !strings.Contains(rep.Reason, "shadow decisions differ") {
					t.Fatalf("aborted for another reason: %s", rep.Reason)
				}
				// Meanwhile the canary's gate let its buyers' second clicks
				// through and the database refused them (settle above
				// checked no buyer holds more than the limit).
				var refused int
				if err := stable.a.store.DB().QueryRowContext(context.Background(),
					`SELECT count(*) FROM orders WHERE sku_id = 'ct' AND status = 'failed' AND fail_reason = 'limit_reached'`).Scan(&refused); err != nil {
					t.Fatal(err)
				}
				if refused == 0 {
					t.Fatal("no purchase over the limit reached the database: the wrong gate was not exercised")
				}
				t.Logf("the database refused %d purchases the canary's gate let over the limit", refused)
				// Share 0: every buyer meets the stable instance again.
				before := can.a.metrics.Snapshot().Purchases["accepted"]
				for i := 0; i < 50; i++ {
					lbh.buy(fmt.Sprintf("after-%d", i), "ct", 1, "")
				}
				if after := can.a.metrics.Snapshot().Purchases["accepted"]; after != before {
					t.Fatalf("the canary still served %d buyers at share 0", after-before)
				}
			}

			// The dashboard's data: both instances, their groups, the trial.
			r := stable.do(http.MethodGet, "/admin/v1/overview", "", "Authorization: Bearer "+testAdmin)
			rel, _ := r.Body["release"].(map[string]any)
			ins, _ := rel["instances"].([]any)
			groups := map[string]int{}
			for _, i := range ins {
				groups[i.(map[string]any)["group"].(string)]++
			}
			cv, _ := rel["canary"].(map[string]any)
			if groups["stable"] != 1 || groups["canary"] != 1 || cv == nil || cv["state"] != cs.State {
				t.Fatalf("overview release: %v", rel)
			}
		})
	}
}

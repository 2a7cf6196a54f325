package canary

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// exposition renders the metrics an instance exposes, as the service's
// registry writes them (the route, code and result labels it uses).
func exposition(orders, orders5xx, mismatch, dead int64, fastMs bool) string {
	var b strings.Builder
	b.WriteString("# TYPE flashsale_http_request_duration_seconds histogram\n")
	write := func(code string, n int64) {
		le := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
		for _, u := range le {
			c := n
			if !fastMs && u <= 0.25 {
				c = 0 // every answer between 250 and 500 ms
			}
			fmt.Fprintf(&b, "flashsale_http_request_duration_seconds_bucket{code=%q,route=\"POST /api/v1/orders\",le=\"%g\"} %d\n", code, u, c)
		}
		fmt.Fprintf(&b, "flashsale_http_request_duration_seconds_bucket{code=%q,route=\"POST /api/v1/orders\",le=\"+Inf\"} %d\n", code, n)
		fmt.Fprintf(&b, "flashsale_http_request_duration_seconds_sum{code=%q,route=\"POST /api/v1/orders\"} 1\n", code)
		fmt.Fprintf(&b, "flashsale_http_request_duration_seconds_count{code=%q,route=\"POST /api/v1/orders\"} %d\n", code, n)
	}
	write("202", orders-orders5xx)
	write("503", orders5xx)
	// Probes are not buyer traffic.
	b.WriteString("flashsale_http_request_duration_seconds_bucket{code=\"200\",route=\"GET /readyz\",le=\"+Inf\"} 1000\n")
	b.WriteString("flashsale_http_request_duration_seconds_sum{code=\"200\",route=\"GET /readyz\"} 1\n")
	b.WriteString("flashsale_http_request_duration_seconds_count{code=\"200\",route=\"GET /readyz\"} 1000\n")
	fmt.Fprintf(&b, "# TYPE flashsale_shadow_decisions_total counter\nflashsale_shadow_decisions_total{result=\"match\"} 10\nflashsale_shadow_decisions_total{result=\"mismatch\"} %d\n", mismatch)
	fmt.Fprintf(&b, "# TYPE flashsale_dead_letters_total counter\nflashsale_dead_letters_total %d\n", dead)
	b.WriteString("# TYPE flashsale_reconcile_alerts_total counter\nflashsale_reconcile_alerts_total 0\n")
	return b.String()
}

func TestParseMetrics(t *testing.T) {
	s, err := ParseMetrics(strings.NewReader(exposition(100, 7, 3, 2, true)))
	if err != nil {
		t.Fatal(err)
	}
	if s.Requests != 100 || s.Errors5xx != 7 || s.Orders != 100 || s.ShadowMismatch != 3 || s.ShadowMatch != 10 || s.DeadLetters != 2 {
		t.Fatalf("%+v", s)
	}
	if p, ok := quantile(s.OrderBuckets, 0.99); !ok || p > 0.5 {
		t.Fatalf("p99 of sub-ms answers: %v %v", p, ok)
	}
	slow, _ := ParseMetrics(strings.NewReader(exposition(100, 0, 0, 0, false)))
	if p, _ := quantile(slow.OrderBuckets, 0.99); p < 250 || p > 500 {
		t.Fatalf("p99 of 250-500 ms answers: %v", p)
	}
}

func TestQuantileMatchesPrometheus(t *testing.T) {
	// histogram_quantile(0.5) of 10 in (0,10], 10 in (10,20] is 10; of 0.75 is 15.
	bs := []Bucket{{10, 10}, {20, 20}, {math.Inf(1), 20}}
	for q, want := range map[float64]float64{0.5: 10, 0.75: 15, 1: 20} {
		if got, _ := quantile(bs, q); math.Abs(got-want) > 1e-9 {
			t.Errorf("q%v = %v, want %v", q, got, want)
		}
	}
	if _, ok := quantile([]Bucket{{math.Inf(1), 0}}, 0.99); ok {
		t.Error("a quantile of no observations")
	}
}

// fleet is a fake trial environment: instances whose counters grow while
// the canary's share is above 0, as traffic would.
type fleet struct {
	mu       sync.Mutex
	share    int
	shares   []int
	ticks    map[string]int64
	bad      string // "", "5xx", "slow", "mismatch", "dead", "restart", "early-mismatch"
	restarts int
}

func (f *fleet) setShare(_ context.Context, p int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.share = p
	f.shares = append(f.shares, p)
	return nil
}

func (f *fleet) scrape(_ context.Context, url string) (Sample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	canary := strings.Contains(url, "canary")
	// Traffic follows the share: the canary serves none at 0, stable none
	// at 100.
	if canary && f.share > 0 || !canary && f.share < 100 {
		f.ticks[url] += 100
	}
	n := f.ticks[url]
	var e5, mm, dead int64
	fast := true
	start := 1.7e9
	if canary {
		switch f.bad {
		case "5xx":
			e5 = n / 10
		case "slow":
			fast = false
		case "mismatch":
			mm = n / 100
		case "early-mismatch":
			mm = 3 // found while shadowing at share 0
		case "dead":
			dead = n / 100
		case "restart":
			// Restarted during the first step: counters from zero again.
			f.restarts++
			if f.restarts > 2 { // the pre-trial and step-start readings came first
				start, n = 1.8e9, 50
			}
		}
	}
	text := exposition(n, e5, mm, dead, fast) + fmt.Sprintf("# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %g\n", start)
	return ParseMetrics(strings.NewReader(text))
}

func TestTrial(t *testing.T) {
	for _, bad := range []string{"", "5xx", "slow", "mismatch", "dead", "invariant", "restart", "early-mismatch"} {
		t.Run("bad="+bad, func(t *testing.T) {
			f := &fleet{ticks: map[string]int64{}, bad: bad}
			var states []State
			cfg := Config{Canary: []string{"http://canary-1"}, Stable: []string{"http://stable-1", "http://stable-2"},
				Steps: []int{5, 50, 100}, StepDuration: time.Millisecond, ShadowLag: time.Millisecond, Thresholds: DefaultThresholds,
				SetShare: f.setShare, Scrape: f.scrape,
				Check: func(context.Context) ([]string, error) {
					if bad == "invariant" {
						return []string{"I1: stock -1"}, nil
					}
					return nil, nil
				},
				State: func(_ context.Context, s State) error { states = append(states, s); return nil }}
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			var text strings.Builder
			if err := WriteText(&text, rep); err != nil {
				t.Fatal(err)
			}
			last := states[len(states)-1]
			if bad == "" {
				// At 100 % stable serves no buyer: the canary is compared
				// with stable's last step with traffic, and says so.
				if rep.Outcome != "promoted" || rep.FinalShare != 100 || len(rep.Steps) != 3 || f.share != 100 || last.State != "promoted" ||
					rep.Steps[2].Stable.Requests != 0 || !strings.Contains(rep.Steps[2].Baseline, "last step with traffic") {
					t.Fatalf("a good canary: %+v, share %d, state %+v\n%s", rep, f.share, last, text.String())
				}
				return
			}
			why := map[string]string{"5xx": "5xx rate", "slow": "p99 of orders", "mismatch": "shadow decisions differ", "dead": "dead-lettered",
				"invariant": "invariants violated", "restart": "restarted during the step", "early-mismatch": "before the trial"}[bad]
			if bad == "early-mismatch" {
				// Aborted before the first step: the share never left 0.
				if rep.Outcome != "aborted" || len(rep.Steps) != 0 || !strings.Contains(rep.Reason, why) || f.share != 0 || slices.Contains(f.shares, 5) {
					t.Fatalf("mismatches found before the trial: %+v, shares %v", rep, f.shares)
				}
				return
			}
			if rep.Outcome != "aborted" || f.share != 0 || len(rep.Steps) != 1 || rep.Steps[0].Passed || last.State != "aborted" || last.Share != 0 {
				t.Fatalf("a bad canary (%s): %+v, shares %v, state %+v\n%s", bad, rep, f.shares, last, text.String())
			}
			if !strings.Contains(rep.Reason, why) {
				t.Fatalf("a bad canary (%s) aborted for another reason: %s", bad, rep.Reason)
			}
			if !strings.Contains(text.String(), "ABORTED") || !strings.Contains(text.String(), "FAIL: ") {
				t.Fatalf("report:\n%s", text.String())
			}
		})
	}
}

func TestTrialNeedsTraffic(t *testing.T) {
	quiet := func(context.Context, string) (Sample, error) { return Sample{}, nil }
	share := -1
	rep, err := Run(context.Background(), Config{Canary: []string{"c"}, Stable: []string{"s"}, Steps: []int{10}, StepDuration: time.Millisecond, ShadowLag: -1,
		Thresholds: DefaultThresholds, Scrape: quiet, SetShare: func(_ context.Context, p int) error { share = p; return nil }})
	if err != nil || rep.Outcome != "aborted" || share != 0 || !strings.Contains(rep.Reason, "too little traffic") {
		t.Fatalf("a step without traffic: %+v %v (share %d)", rep, err, share)
	}
}

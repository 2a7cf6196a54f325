package capacity

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func sales(stock int64, ratios ...float64) []PastSale {
	var out []PastSale
	for i, r := range ratios {
		out = append(out, PastSale{SKU: "S", StartsAt: time.Unix(int64(1e9+i*86400), 0), Stock: stock, PeakAttempts: int64(math.Round(r * float64(stock)))})
	}
	return out
}

func near(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

// TestPredictKnownAnswer: ratios 2 and 8 (per unit of stock) have the
// geometric mean 4 and the log deviation √2·ln 2, so with K=2 (t 3.078):
// P50 = 4·stock and P90 = 4·stock·e^(3.078·√2·ln2·√1.5).
func TestPredictKnownAnswer(t *testing.T) {
	f, err := Predict(sales(1000, 2, 8), Upcoming{Stock: 2000})
	if err != nil {
		t.Fatal(err)
	}
	wantP90 := 8000 * math.Exp(3.078*math.Sqrt2*math.Ln2*math.Sqrt(1.5))
	if !near(f.P50, 8000, 1e-9) || !near(f.P90, wantP90, 1e-9) || f.Basis != "stock" || len(f.Similar) != 2 {
		t.Fatalf("got P50 %v P90 %v basis %s K %d; want 8000, %v, stock, 2", f.P50, f.P90, f.Basis, len(f.Similar), wantP90)
	}
	// Identical sales: no spread, P90 = P50.
	f, err = Predict(sales(500, 3, 3, 3), Upcoming{Stock: 500})
	if err != nil || !near(f.P50, 1500, 1e-9) || !near(f.P90, 1500, 1e-9) {
		t.Fatalf("identical sales: %+v %v", f, err)
	}
	// One sale: P90 is OneSaleSpread x P50.
	f, err = Predict(sales(500, 3), Upcoming{Stock: 500})
	if err != nil || !near(f.P50, 1500, 1e-9) || !near(f.P90, 3000, 1e-9) || !strings.Contains(f.Note, "one similar sale") {
		t.Fatalf("one sale: %+v %v", f, err)
	}
}

func TestPredictSelects(t *testing.T) {
	h := append(sales(100, 10), sales(1000, 5, 5)...) // stock 100 is 10x away from 1000
	h = append(h, PastSale{SKU: "FLAG", StartsAt: time.Unix(2e9, 0), Stock: 10, PeakAttempts: 70})
	f, err := Predict(h, Upcoming{Stock: 1000})
	if err != nil || len(f.Similar) != 2 || !near(f.P50, 5000, 1e-9) {
		t.Fatalf("by stock: %+v %v", f, err)
	}
	// Like: only FLAG's sales, scaled by stock: 7/unit.
	f, err = Predict(h, Upcoming{Stock: 1000, Like: "FLAG"})
	if err != nil || len(f.Similar) != 1 || !near(f.P50, 7000, 1e-9) {
		t.Fatalf("like: %+v %v", f, err)
	}
	// Tag: only the sales recorded with it, whatever their stock.
	tagged := append(h, PastSale{SKU: "T1", Tag: "phones", Stock: 10, PeakAttempts: 30}, PastSale{SKU: "T2", Tag: "phones", Stock: 100_000, PeakAttempts: 300_000})
	f, err = Predict(tagged, Upcoming{Stock: 1000, Tag: "phones"})
	if err != nil || len(f.Similar) != 2 || !near(f.P50, 3000, 1e-9) {
		t.Fatalf("tag: %+v %v", f, err)
	}
	if _, err := Predict(tagged, Upcoming{Stock: 1000, Tag: "shoes"}); err == nil || !strings.Contains(err.Error(), `no recorded sale tagged "shoes"`) {
		t.Fatalf("an unknown tag: %v", err)
	}
	if _, err := Predict(h, Upcoming{Stock: 1000, Like: "NONE"}); err == nil || !strings.Contains(err.Error(), `no recorded sale of SKU "NONE"`) {
		t.Fatalf("like an unknown SKU: %v", err)
	}
	if _, err := Predict(h, Upcoming{Stock: 1_000_000}); err == nil || !strings.Contains(err.Error(), "within 4x of 1000000") {
		t.Fatalf("nothing similar: %v", err)
	}
	if _, err := Predict(nil, Upcoming{Stock: 0}); err == nil {
		t.Fatal("stock 0 accepted")
	}
	// Joins: 2 past sales with joins, 20 and 80 attempts/s per join: the
	// geometric mean 40 per join x 300 joins.
	j := []PastSale{{SKU: "A", Stock: 1000, PeakAttempts: 20_000, QueueJoins: 1000}, {SKU: "B", Stock: 1000, PeakAttempts: 8000, QueueJoins: 100},
		{SKU: "C", Stock: 1000, PeakAttempts: 5000}}
	f, err = Predict(j, Upcoming{Stock: 1000, Joins: 300})
	if err != nil || f.Basis != "joins" || len(f.Similar) != 2 || !near(f.P50, 12000, 1e-9) {
		t.Fatalf("joins: %+v %v", f, err)
	}
	f, err = Predict(j[1:], Upcoming{Stock: 1000, Joins: 300})
	if err != nil || f.Basis != "stock" || !strings.Contains(f.Note, "scaled by stock instead") {
		t.Fatalf("joins with one past sale that has them: %+v %v", f, err)
	}
}

// TestPredictCalibrated: on synthetic log-normal histories (m = ln 5,
// s = 0.6) of K = 3, 5 and 20 sales, a new sale's peak falls below P90 in
// 90% of trials and below P50 in 50% (within 2 points over 4000 trials):
// the small-sample correction holds its promise.
func TestPredictCalibrated(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	draw := func() float64 { return math.Exp(math.Log(5) + 0.6*rng.NormFloat64()) }
	for _, k := range []int{3, 5, 20} {
		const trials = 4000
		below50, below90 := 0, 0
		for range trials {
			h := make([]PastSale, k)
			for i := range h {
				h[i] = PastSale{SKU: "S", Stock: 1000, PeakAttempts: int64(draw() * 1000)}
			}
			f, err := Predict(h, Upcoming{Stock: 1000})
			if err != nil {
				t.Fatal(err)
			}
			next := draw() * 1000
			if next <= f.P50 {
				below50++
			}
			if next <= f.P90 {
				below90++
			}
		}
		if p := float64(below90) / trials; math.Abs(p-0.90) > 0.02 {
			t.Errorf("K=%d: %.3f of new sales below P90, want 0.90", k, p)
		}
		if p := float64(below50) / trials; math.Abs(p-0.50) > 0.03 {
			t.Errorf("K=%d: %.3f of new sales below P50, want 0.50", k, p)
		}
	}
}

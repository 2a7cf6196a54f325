package capacity

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// PastSale is what a forecast reads of one recorded sale (a sale_history row).
type PastSale struct {
	SKU          string
	Tag          string // the SKU's tag when it was recorded
	StartsAt     time.Time
	Stock        int64
	PeakAttempts int64
	// QueueJoins is the buyers who joined its waiting room; 0: unknown (no room).
	QueueJoins int64
}

// Upcoming is the sale to forecast.
type Upcoming struct {
	Stock int64
	// Like, if set, names a past sale's SKU: only its recorded sales are
	// similar. Else Tag, if set: only the sales recorded with that tag.
	// Otherwise sales whose stock is within StockFactor of Stock are.
	Like string
	Tag  string
	// Joins, if above 0, is the interest already known: buyers in the
	// upcoming sale's waiting room. The peak then scales from the past
	// sales' peak per join instead of per unit of stock.
	Joins int64
}

// StockFactor bounds "similar by stock": a past sale is similar when its
// stock is within a factor of 4 of the upcoming one's.
const StockFactor = 4.0

// Forecast is a predicted peak of attempts per second on the sale's SKU.
type Forecast struct {
	// Basis is what the peak scales with: "stock" or "joins".
	Basis string
	// Similar are the past sales used, newest first.
	Similar []PastSale
	// Ratios are their peaks per unit of the basis, in Similar's order.
	Ratios []float64
	// Mu and Sigma are the log-normal fit of the ratios (Sigma 0 for one sale).
	Mu, Sigma float64
	// P50 and P90 are peak attempts per second: the median and the 90th
	// percentile of the prediction for one new sale.
	P50, P90 float64
	// Note says what limits the forecast, if anything.
	Note string
}

// tQuantile90 is Student's t 0.90 quantile by degrees of freedom (1..30).
var tQuantile90 = [...]float64{3.078, 1.886, 1.638, 1.533, 1.476, 1.440, 1.415, 1.397, 1.383, 1.372,
	1.363, 1.356, 1.350, 1.345, 1.341, 1.337, 1.333, 1.330, 1.328, 1.325,
	1.323, 1.321, 1.319, 1.318, 1.316, 1.315, 1.314, 1.313, 1.311, 1.310}

// z90 is the standard normal 0.90 quantile.
const z90 = 1.2815515655446004

func t90(df int) float64 {
	if df >= 1 && df <= len(tQuantile90) {
		return tQuantile90[df-1]
	}
	return z90
}

// OneSaleSpread is the factor P90/P50 assumed when a single similar sale
// is known: one sale shows no spread, and a factor of 2 is a wide default.
const OneSaleSpread = 2.0

// Predict forecasts the upcoming sale's peak from history (docs/capacity.md,
// "Forecast"). The peak of a sale is taken as proportional to its basis
// (stock, or waiting-room joins when both the upcoming and at least two
// similar past sales have them), with a log-normal factor: ln(peak/basis)
// of the similar sales is fitted by its mean m and sample deviation s, and
// the prediction for one new sale is Student's t with K-1 degrees of
// freedom: P50 = basis·e^m, P90 = basis·e^(m + t(0.90, K-1)·s·√(1+1/K)).
// The t quantile and the √(1+1/K) are the small-sample correction: with few
// sales both the fit's centre and its spread are uncertain, so P90 widens.
// One similar sale: P50 is its ratio, P90 is OneSaleSpread times P50. None:
// an error that says what was looked for and what exists.
func Predict(history []PastSale, u Upcoming) (Forecast, error) {
	if u.Stock < 1 {
		return Forecast{}, errors.New("forecast: stock must be at least 1")
	}
	var similar []PastSale
	for _, p := range history {
		if p.PeakAttempts < 1 || p.Stock < 1 {
			continue // nothing was counted, or nothing was offered: no ratio
		}
		if u.Like != "" || u.Tag != "" {
			if (u.Like != "" && p.SKU == u.Like) || (u.Like == "" && p.Tag == u.Tag) {
				similar = append(similar, p)
			}
			continue
		}
		if r := float64(p.Stock) / float64(u.Stock); r >= 1/StockFactor && r <= StockFactor {
			similar = append(similar, p)
		}
	}
	if len(similar) == 0 {
		what := fmt.Sprintf("no recorded sale with a stock within %gx of %d", StockFactor, u.Stock)
		switch {
		case u.Like != "":
			what = fmt.Sprintf("no recorded sale of SKU %q with attempts counted", u.Like)
		case u.Tag != "":
			what = fmt.Sprintf("no recorded sale tagged %q with attempts counted", u.Tag)
		}
		return Forecast{}, fmt.Errorf("forecast: %s (%d recorded sales in all): give -like a past sale or -tag, or plan from -rate", what, len(history))
	}
	slices.SortStableFunc(similar, func(a, b PastSale) int { return b.StartsAt.Compare(a.StartsAt) })
	f := Forecast{Basis: "stock", Similar: similar}
	basis := float64(u.Stock)
	withJoins := 0
	for _, p := range similar {
		if p.QueueJoins > 0 {
			withJoins++
		}
	}
	switch {
	case u.Joins > 0 && withJoins >= 2:
		f.Basis, basis = "joins", float64(u.Joins)
		f.Similar = slices.DeleteFunc(slices.Clone(similar), func(p PastSale) bool { return p.QueueJoins < 1 })
	case u.Joins > 0:
		f.Note = fmt.Sprintf("%d similar sales with waiting-room joins recorded (2 needed): scaled by stock instead", withJoins)
	}
	logs := make([]float64, len(f.Similar))
	for i, p := range f.Similar {
		den := float64(p.Stock)
		if f.Basis == "joins" {
			den = float64(p.QueueJoins)
		}
		f.Ratios = append(f.Ratios, float64(p.PeakAttempts)/den)
		logs[i] = math.Log(f.Ratios[i])
	}
	k := len(logs)
	for _, x := range logs {
		f.Mu += x
	}
	f.Mu /= float64(k)
	f.P50 = basis * math.Exp(f.Mu)
	if k == 1 {
		f.P90 = OneSaleSpread * f.P50
		f.Note = join(f.Note, fmt.Sprintf("one similar sale: no spread can be measured, P90 is %g x P50", OneSaleSpread))
		return f, nil
	}
	var ss float64
	for _, x := range logs {
		ss += (x - f.Mu) * (x - f.Mu)
	}
	f.Sigma = math.Sqrt(ss / float64(k-1))
	f.P90 = basis * math.Exp(f.Mu+t90(k-1)*f.Sigma*math.Sqrt(1+1/float64(k)))
	if k < 5 {
		f.Note = join(f.Note, fmt.Sprintf("%d similar sales: P90 is wide by design (Student's t, %s)", k, count(k-1, "degree of freedom", "degrees of freedom")))
	}
	return f, nil
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// Lines returns the forecast as lines for a terminal.
func (f Forecast) Lines(u Upcoming) []string {
	out := []string{}
	basis := fmt.Sprintf("stock %d", u.Stock)
	unit := "attempts/s per unit of stock"
	if f.Basis == "joins" {
		basis, unit = fmt.Sprintf("%d waiting-room joins", u.Joins), "attempts/s per join"
	}
	out = append(out, fmt.Sprintf("forecast: peak %.0f attempts/s (P50), %.0f (P90), from %s and %s",
		f.P50, f.P90, count(len(f.Similar), "similar sale", "similar sales"), basis))
	out = append(out, fmt.Sprintf("method: log-normal fit of %s, m=%.3f s=%.3f; P90 = e^(m + t(0.90, K-1)·s·√(1+1/K)) (docs/capacity.md)", unit, f.Mu, f.Sigma))
	var b strings.Builder
	for i, p := range f.Similar {
		if i == 8 {
			fmt.Fprintf(&b, " ... %d more", len(f.Similar)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s@%s (stock %d, peak %d/s: %.3g)", p.SKU, p.StartsAt.UTC().Format("2006-01-02"), p.Stock, p.PeakAttempts, f.Ratios[i])
	}
	out = append(out, "similar: "+b.String())
	if f.Note != "" {
		out = append(out, "note: "+f.Note)
	}
	return out
}

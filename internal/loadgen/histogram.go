package loadgen

import (
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// CurvePoint is one point of a latency percentile curve.
type CurvePoint struct {
	Percentile float64
	Value      time.Duration
}

// curvePercentiles are where PercentileCurve samples: dense in the tail,
// where flash sales hurt.
var curvePercentiles = []float64{0, 10, 20, 30, 40, 50, 60, 70, 75, 80, 85, 90, 92.5, 95, 96.25, 97.5, 98.75,
	99, 99.375, 99.5, 99.6875, 99.8, 99.9, 99.95, 99.99, 99.999, 100}

// PercentileCurve samples h (microseconds) at fixed percentiles, 0 to 100.
func PercentileCurve(h *hdrhistogram.Histogram) []CurvePoint {
	if h.TotalCount() == 0 {
		return nil
	}
	vals := h.ValueAtPercentilesSlice(curvePercentiles)
	out := make([]CurvePoint, len(vals))
	for i, v := range vals {
		out[i] = CurvePoint{Percentile: curvePercentiles[i], Value: time.Duration(v) * time.Microsecond}
	}
	return out
}

// durationMs returns d in milliseconds.
func durationMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

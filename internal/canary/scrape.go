package canary

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is what one reading of an instance's /metrics says (counters since
// it started).
type Sample struct {
	Requests       int64 // buyer API requests answered (routes under /api/)
	Errors5xx      int64 // of which 5xx
	Orders         int64 // POST /api/v1/orders answered
	OrderBuckets   []Bucket
	ShadowMatch    int64
	ShadowMismatch int64
	ShadowDropped  int64
	ShadowSame     int64
	DeadLetters    int64
	// StartTime is the process' start (process_start_time_seconds): a
	// change between two readings is a restart.
	StartTime       float64
	ReconcileAlerts int64
	Err             error // the instance could not be read
}

// Bucket is a cumulative histogram bucket: Count observations <= UpperMs.
type Bucket struct {
	UpperMs float64
	Count   int64
}

// orderRoute is the route label of purchases.
const orderRoute = "POST /api/v1/orders"

// ScrapeHTTP reads GET <base>/metrics.
func ScrapeHTTP(ctx context.Context, base string) (Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/metrics", nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("%s/metrics answered %s", base, resp.Status)
	}
	return ParseMetrics(resp.Body)
}

// ParseMetrics reads a Prometheus text exposition.
func ParseMetrics(r io.Reader) (Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Sample{}, fmt.Errorf("metrics: %w", err)
	}
	var s Sample
	if f := fams["flashsale_http_request_duration_seconds"]; f != nil {
		var orders []Bucket
		for _, m := range f.GetMetric() {
			route, code := label(m, "route"), label(m, "code")
			if !strings.Contains(route, " /api/") {
				continue
			}
			h := m.GetHistogram()
			n := int64(h.GetSampleCount())
			s.Requests += n
			if strings.HasPrefix(code, "5") {
				s.Errors5xx += n
			}
			if route == orderRoute {
				s.Orders += n
				var bs []Bucket
				for _, b := range h.GetBucket() {
					bs = append(bs, Bucket{UpperMs: 1000 * b.GetUpperBound(), Count: int64(b.GetCumulativeCount())})
				}
				if len(bs) == 0 || !math.IsInf(bs[len(bs)-1].UpperMs, 1) {
					bs = append(bs, Bucket{UpperMs: math.Inf(1), Count: n})
				}
				orders = addBuckets(orders, bs)
			}
		}
		s.OrderBuckets = orders
	}
	if f := fams["flashsale_shadow_decisions_total"]; f != nil {
		for _, m := range f.GetMetric() {
			switch label(m, "result") {
			case "match":
				s.ShadowMatch += int64(m.GetCounter().GetValue())
			case "mismatch":
				s.ShadowMismatch += int64(m.GetCounter().GetValue())
			}
		}
	}
	s.ShadowDropped = counter(fams, "flashsale_shadow_dropped_total")
	s.ShadowSame = counter(fams, "flashsale_shadow_same_script_total")
	if f := fams["process_start_time_seconds"]; f != nil && len(f.GetMetric()) > 0 {
		s.StartTime = f.GetMetric()[0].GetGauge().GetValue()
	}
	s.DeadLetters = counter(fams, "flashsale_dead_letters_total")
	s.ReconcileAlerts = counter(fams, "flashsale_reconcile_alerts_total")
	return s, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func counter(fams map[string]*dto.MetricFamily, name string) int64 {
	var n int64
	if f := fams[name]; f != nil {
		for _, m := range f.GetMetric() {
			n += int64(m.GetCounter().GetValue())
		}
	}
	return n
}

// addBuckets sums two cumulative histograms bucket by bucket (the same
// bounds; a missing side counts as empty).
func addBuckets(a, b []Bucket) []Bucket {
	m := map[float64]int64{}
	for _, x := range a {
		m[x.UpperMs] += x.Count
	}
	for _, x := range b {
		m[x.UpperMs] += x.Count
	}
	out := make([]Bucket, 0, len(m))
	for u, c := range m {
		out = append(out, Bucket{UpperMs: u, Count: c})
	}
	slices.SortFunc(out, func(x, y Bucket) int {
		switch {
		case x.UpperMs < y.UpperMs:
			return -1
		case x.UpperMs > y.UpperMs:
			return 1
		}
		return 0
	})
	return out
}

// subBuckets is b - a (a window of a cumulative histogram).
func subBuckets(b, a []Bucket) []Bucket {
	neg := make([]Bucket, len(a))
	for i, x := range a {
		neg[i] = Bucket{UpperMs: x.UpperMs, Count: -x.Count}
	}
	return addBuckets(b, neg)
}

// quantile estimates the q quantile of cumulative buckets, interpolating
// linearly inside the bucket as Prometheus' histogram_quantile does; the
// last finite bound when it falls in the +Inf bucket.
func quantile(bs []Bucket, q float64) (float64, bool) {
	if len(bs) == 0 {
		return 0, false
	}
	total := bs[len(bs)-1].Count
	if total <= 0 {
		return 0, false
	}
	rank := q * float64(total)
	prevUpper, prevCount := 0.0, int64(0)
	for _, b := range bs {
		if float64(b.Count) >= rank {
			if math.IsInf(b.UpperMs, 1) {
				return prevUpper, true
			}
			in := b.Count - prevCount
			if in <= 0 {
				return b.UpperMs, true
			}
			return prevUpper + (b.UpperMs-prevUpper)*(rank-float64(prevCount))/float64(in), true
		}
		prevUpper, prevCount = b.UpperMs, b.Count
	}
	return prevUpper, true
}

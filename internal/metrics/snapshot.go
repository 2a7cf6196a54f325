package metrics

import (
	"math"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Snapshot is a reading of the counters an operator watches, cumulative
// since the process started: a reader derives rates (and percentiles over a
// window) from the difference of two snapshots. Counters are this process's
// own; several instances each have theirs.
type Snapshot struct {
	// Purchases counts purchase decisions by outcome (accepted, sold_out,
	// limit_reached, unknown_sku, not_open, invalid, busy, error).
	Purchases map[string]uint64 `json:"purchases"`
	// Applied counts reservations decided by the consumer (applied, refused, duplicate).
	Applied      map[string]uint64 `json:"applied"`
	BatchErrors  uint64            `json:"batch_errors"`
	DeadLettered uint64            `json:"dead_lettered"`
	// Latency is the HTTP request latency by route pattern, every status code merged.
	Latency map[string]Histogram `json:"-"`
}

// Histogram is a cumulative latency histogram in seconds.
type Histogram struct {
	Count uint64  `json:"count"`
	Sum   float64 `json:"sum_seconds"`
	// Buckets have ascending finite upper bounds and cumulative counts;
	// observations above the last bound are counted only in Count.
	Buckets []Bucket `json:"buckets"`
}

// Bucket is one cumulative histogram bucket: Count observations were <= LE seconds.
type Bucket struct {
	LE    float64 `json:"le"`
	Count uint64  `json:"count"`
}

// Snapshot reads the collectors. It is safe for concurrent use and cheap
// enough to call every second (it skips the Go and process collectors).
func (m *Metrics) Snapshot() Snapshot {
	s := Snapshot{Purchases: map[string]uint64{}, Applied: map[string]uint64{}, Latency: map[string]Histogram{}}
	for _, d := range collect(m.purchases) {
		s.Purchases[label(d, "outcome")] += uint64(d.GetCounter().GetValue())
	}
	for _, d := range collect(m.applied) {
		s.Applied[label(d, "result")] += uint64(d.GetCounter().GetValue())
	}
	for _, d := range collect(m.batchErrors) {
		s.BatchErrors += uint64(d.GetCounter().GetValue())
	}
	for _, d := range collect(m.deadLetters) {
		s.DeadLettered += uint64(d.GetCounter().GetValue())
	}
	for _, d := range collect(m.httpDuration) {
		route := label(d, "route")
		s.Latency[route] = s.Latency[route].add(d.GetHistogram())
	}
	return s
}

// collect reads the current values of c's metrics.
func collect(c prometheus.Collector) []*dto.Metric {
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	var out []*dto.Metric
	for pm := range ch {
		d := new(dto.Metric)
		if pm.Write(d) == nil {
			out = append(out, d)
		}
	}
	return out
}

func label(d *dto.Metric, name string) string {
	for _, l := range d.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// add merges a collected histogram (same buckets) into h.
func (h Histogram) add(d *dto.Histogram) Histogram {
	out := Histogram{Count: h.Count + d.GetSampleCount(), Sum: h.Sum + d.GetSampleSum()}
	bs := d.GetBucket()
	for i, b := range bs {
		if math.IsInf(b.GetUpperBound(), +1) {
			continue
		}
		n := b.GetCumulativeCount()
		if i < len(h.Buckets) {
			n += h.Buckets[i].Count
		}
		out.Buckets = append(out.Buckets, Bucket{LE: b.GetUpperBound(), Count: n})
	}
	return out
}

// Quantile estimates the q-quantile (0 <= q <= 1) in seconds the way
// Prometheus' histogram_quantile does: linear interpolation inside the
// bucket that holds the rank. Observations above the last bound are reported
// as that bound. ok is false when h is empty.
func (h Histogram) Quantile(q float64) (seconds float64, ok bool) {
	if h.Count == 0 || len(h.Buckets) == 0 || math.IsNaN(q) {
		return 0, false
	}
	q = min(max(q, 0), 1)
	rank := q * float64(h.Count)
	i := sort.Search(len(h.Buckets), func(i int) bool { return float64(h.Buckets[i].Count) >= rank })
	if i == len(h.Buckets) {
		return h.Buckets[len(h.Buckets)-1].LE, true
	}
	lower, below := 0.0, uint64(0)
	if i > 0 {
		lower, below = h.Buckets[i-1].LE, h.Buckets[i-1].Count
	}
	in := h.Buckets[i].Count - below
	if in == 0 {
		return h.Buckets[i].LE, true
	}
	return lower + (h.Buckets[i].LE-lower)*(rank-float64(below))/float64(in), true
}

// Crowd is this instance's crowd counters: challenges by result, refusals
// of solutions and purchases by code, waiting-room events, and the
// waiting room's ETA error.
type Crowd struct {
	Challenges     map[string]uint64 `json:"challenges"`
	TicketsRefused map[string]uint64 `json:"tickets_refused"`
	RoomEvents     map[string]uint64 `json:"room_events"`
	EtaError       Histogram         `json:"-"`
}

// CrowdSnapshot reads the crowd's collectors.
func (m *Metrics) CrowdSnapshot() Crowd {
	c := Crowd{Challenges: map[string]uint64{}, TicketsRefused: map[string]uint64{}, RoomEvents: map[string]uint64{}}
	for _, d := range collect(m.challenges) {
		c.Challenges[label(d, "result")] += uint64(d.GetCounter().GetValue())
	}
	for _, d := range collect(m.ticketsRefused) {
		c.TicketsRefused[label(d, "reason")] += uint64(d.GetCounter().GetValue())
	}
	for _, d := range collect(m.roomEvents) {
		c.RoomEvents[label(d, "event")] += uint64(d.GetCounter().GetValue())
	}
	for _, d := range collect(m.roomEtaError) {
		c.EtaError = c.EtaError.add(d.GetHistogram())
	}
	return c
}

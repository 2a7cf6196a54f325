package dashboard

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"
)

const (
	// SamplePeriod is how often the recorder samples the charted figures:
	// the page's own polling period.
	SamplePeriod = time.Second
	// HistorySamples bounds the history: ten minutes at SamplePeriod, the
	// span of the page's charts.
	HistorySamples = 600
	// ChartSales is how many sales the stock chart draws (the first ones
	// the overview lists); only their stock is sampled.
	ChartSales = 6
)

// Sample is one reading of the figures the page charts.
type Sample struct {
	At time.Time
	// Purchases and Applied are the instance's cumulative counters by
	// outcome (metrics.Snapshot).
	Purchases map[string]uint64
	Applied   map[string]uint64
	// Available is the units the gate will still sell, per sale; a sale
	// missing was not loaded in Redis or could not be read.
	Available map[string]int64
}

// History is a bounded ring of the most recent samples, so that a page
// opened in the middle of a sale draws its charts at once. Memory is
// bounded by HistorySamples samples of a few counters and ChartSales sales.
type History struct {
	mu   sync.Mutex
	ring []Sample
	next int // where the next sample goes once the ring is full
}

// NewHistory keeps the last n samples (n >= 1).
func NewHistory(n int) *History {
	return &History{ring: make([]Sample, 0, max(n, 1))}
}

// Add appends a sample, dropping the oldest one when the ring is full. The
// sample's maps are kept: the caller must not change them afterwards.
func (h *History) Add(s Sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ring) < cap(h.ring) {
		h.ring = append(h.ring, s)
		return
	}
	h.ring[h.next] = s
	h.next = (h.next + 1) % len(h.ring)
}

// Samples returns the samples taken at or before now, oldest first.
func (h *History) Samples(now time.Time) []Sample {
	h.mu.Lock()
	out := make([]Sample, 0, len(h.ring))
	out = append(out, h.ring[h.next:]...)
	out = append(out, h.ring[:h.next]...)
	h.mu.Unlock()
	return slices.DeleteFunc(out, func(s Sample) bool { return s.At.After(now) })
}

// Series is the history as the overview serves it (the field "history"):
// one array per figure, aligned with T. A counter left out, or absent
// from a sample, is 0 (it has not counted yet); a sale's stock not read is
// null. Ten minutes of a busy sale are some 30-60 KB of JSON.
type Series struct {
	PeriodSeconds float64 `json:"period_seconds"`
	// T is each sample's time in milliseconds since the Unix epoch.
	T         []int64             `json:"t"`
	Purchases map[string][]uint64 `json:"purchases"`
	Applied   map[string][]uint64 `json:"applied"`
	Available map[string][]*int64 `json:"available"`
}

// Series returns the samples taken at or before now as columns.
func (h *History) Series(now time.Time) Series {
	samples := h.Samples(now)
	sr := Series{PeriodSeconds: SamplePeriod.Seconds(), T: make([]int64, len(samples)),
		Purchases: map[string][]uint64{}, Applied: map[string][]uint64{}, Available: map[string][]*int64{}}
	counters := func(dst map[string][]uint64, get func(Sample) map[string]uint64) {
		for i, s := range samples {
			for k, v := range get(s) {
				if v == 0 && dst[k] == nil {
					continue // a column of zeros is left out
				}
				if dst[k] == nil {
					dst[k] = make([]uint64, len(samples))
				}
				dst[k][i] = v
			}
		}
	}
	counters(sr.Purchases, func(s Sample) map[string]uint64 { return s.Purchases })
	counters(sr.Applied, func(s Sample) map[string]uint64 { return s.Applied })
	for i, s := range samples {
		sr.T[i] = s.At.UnixMilli()
		for sku, v := range s.Available {
			if sr.Available[sku] == nil {
				sr.Available[sku] = make([]*int64, len(samples))
			}
			sr.Available[sku][i] = &v
		}
	}
	return sr
}

// Stock reads what the gate will still sell of a sale (stockgate.Gate):
// ok is false for a sale not loaded in Redis.
type Stock interface {
	Available(ctx context.Context, sku string) (n int64, ok bool, err error)
}

// Recorder samples the charted figures into a History: counters from
// memory and, for the ChartSales sales the overview lists first, one Redis
// read of the stock each. It reads nothing for the requests it serves.
type Recorder struct {
	History *History
	// Counters returns the cumulative purchase and apply counters.
	Counters func() (purchases, applied map[string]uint64)
	// Sales lists the sales in the overview's order.
	Sales func(now time.Time) []string
	Stock Stock
}

// RunOnce takes one sample at now and returns it.
func (r *Recorder) RunOnce(ctx context.Context, now time.Time) Sample {
	p, a := r.Counters()
	s := Sample{At: now, Purchases: maps.Clone(p), Applied: maps.Clone(a), Available: map[string]int64{}}
	skus := r.Sales(now)
	if len(skus) > ChartSales {
		skus = skus[:ChartSales]
	}
	ctx, cancel := context.WithTimeout(ctx, SamplePeriod)
	defer cancel()
	for _, sku := range skus {
		n, ok, err := r.Stock.Available(ctx, sku)
		if err != nil {
			break // Redis is out or slow: this sample has no stock
		}
		if ok {
			s.Available[sku] = n
		}
	}
	r.History.Add(s)
	return s
}

// Run samples every SamplePeriod until ctx is done.
func (r *Recorder) Run(ctx context.Context) {
	t := time.NewTicker(SamplePeriod)
	defer t.Stop()
	r.RunOnce(ctx, time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.RunOnce(ctx, now)
		}
	}
}

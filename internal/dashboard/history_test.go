package dashboard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/internal/dashboard"
)

func ptr(n int64) *int64 { return &n }

// TestHistoryRing: the ring keeps the last n samples in order, serves only
// those taken by now, and gives absent counters 0 and unread stock null.
func TestHistoryRing(t *testing.T) {
	h := dashboard.NewHistory(3)
	t0 := time.UnixMilli(1_700_000_000_000)
	for i := range 5 {
		s := dashboard.Sample{At: t0.Add(time.Duration(i) * time.Second),
			Purchases: map[string]uint64{"accepted": uint64(10 * i)}, Applied: map[string]uint64{},
			Available: map[string]int64{}}
		if i == 4 {
			s.Purchases["sold_out"] = 1
		}
		s.Purchases["busy"] = 0 // never counted: left out
		if i != 3 {
			s.Available["phone-1"] = int64(100 - i)
		}
		h.Add(s)
	}
	got := h.Series(t0.Add(4 * time.Second))
	want := dashboard.Series{PeriodSeconds: 1,
		T:         []int64{t0.UnixMilli() + 2000, t0.UnixMilli() + 3000, t0.UnixMilli() + 4000},
		Purchases: map[string][]uint64{"accepted": {20, 30, 40}, "sold_out": {0, 0, 1}},
		Applied:   map[string][]uint64{},
		Available: map[string][]*int64{"phone-1": {ptr(98), nil, ptr(96)}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("series (-want +got):\n%s", d)
	}
	if got := h.Series(t0.Add(3500 * time.Millisecond)).T; len(got) != 2 {
		t.Errorf("samples taken by 3.5 s: %v, want 2 (none from the future)", got)
	}
	if got := dashboard.NewHistory(600).Series(t0); got.T == nil || len(got.T) != 0 {
		t.Errorf("empty history: T = %#v, want [] (not null)", got.T)
	}
}

type stock map[string]int64

func (s stock) Available(_ context.Context, sku string) (int64, bool, error) {
	if sku == "down" {
		return 0, false, errors.New("redis down")
	}
	n, ok := s[sku]
	return n, ok, nil
}

// TestRecorder: a sample holds copies of the counters and the stock of the
// first ChartSales sales only; a sale not loaded is left out.
func TestRecorder(t *testing.T) {
	counters := map[string]uint64{"accepted": 3}
	skus := []string{"a", "not-loaded", "c", "d", "e", "f", "g"}
	r := &dashboard.Recorder{
		History:  dashboard.NewHistory(10),
		Counters: func() (map[string]uint64, map[string]uint64) { return counters, map[string]uint64{"applied": 2} },
		Sales:    func(time.Time) []string { return skus },
		Stock:    stock{"a": 1, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7},
	}
	now := time.Now()
	s := r.RunOnce(context.Background(), now)
	counters["accepted"] = 99 // the sample kept its own copy
	want := map[string]int64{"a": 1, "c": 3, "d": 4, "e": 5, "f": 6}
	if d := cmp.Diff(want, s.Available); d != "" {
		t.Errorf("available (-want +got):\n%s", d)
	}
	got := r.History.Samples(now)
	if len(got) != 1 || got[0].Purchases["accepted"] != 3 || got[0].Applied["applied"] != 2 {
		t.Errorf("history: %+v", got)
	}
	skus = []string{"down", "a"}
	if s := r.RunOnce(context.Background(), now.Add(time.Second)); len(s.Available) != 0 || s.Purchases["accepted"] != 99 {
		t.Errorf("with Redis down: %+v, want the counters and no stock", s)
	}
}

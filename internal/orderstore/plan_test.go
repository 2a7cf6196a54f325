package orderstore

import (
	"testing"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/google/go-cmp/cmp"
)

func TestAllocate(t *testing.T) {
	r := func(id, sku string, qty int64) sale.Reservation {
		return sale.Reservation{OrderID: id, SKU: sku, Quantity: qty}
	}
	ok := func(id string) Outcome { return Outcome{OrderID: id, Status: sale.StatusPendingPayment} }
	short := func(id string) Outcome {
		return Outcome{OrderID: id, Status: sale.StatusFailed, Reason: ReasonInsufficientStock}
	}
	unknown := func(id string) Outcome {
		return Outcome{OrderID: id, Status: sale.StatusFailed, Reason: ReasonUnknownSKU}
	}
	tests := []struct {
		name     string
		rs       []sale.Reservation
		stock    map[string]int64
		want     []Outcome
		wantTake map[string]int64
	}{
		{
			name:     "all fit",
			rs:       []sale.Reservation{r("a", "X", 1), r("b", "X", 2)},
			stock:    map[string]int64{"X": 3},
			want:     []Outcome{ok("a"), ok("b")},
			wantTake: map[string]int64{"X": 3},
		},
		{
			name:     "input order decides, a later small one still fits",
			rs:       []sale.Reservation{r("a", "X", 3), r("b", "X", 3), r("c", "X", 2), r("d", "X", 1)},
			stock:    map[string]int64{"X": 5},
			want:     []Outcome{ok("a"), short("b"), ok("c"), short("d")},
			wantTake: map[string]int64{"X": 5},
		},
		{
			name:     "sold out takes nothing",
			rs:       []sale.Reservation{r("a", "X", 1)},
			stock:    map[string]int64{"X": 0},
			want:     []Outcome{short("a")},
			wantTake: map[string]int64{},
		},
		{
			name:     "unknown sku",
			rs:       []sale.Reservation{r("a", "Y", 1), r("b", "X", 1)},
			stock:    map[string]int64{"X": 1},
			want:     []Outcome{unknown("a"), ok("b")},
			wantTake: map[string]int64{"X": 1},
		},
		{
			name:     "skus are independent",
			rs:       []sale.Reservation{r("a", "X", 2), r("b", "Y", 2), r("c", "X", 1)},
			stock:    map[string]int64{"X": 2, "Y": 1},
			want:     []Outcome{ok("a"), short("b"), short("c")},
			wantTake: map[string]int64{"X": 2},
		},
		{
			name:     "non-positive quantity never takes",
			rs:       []sale.Reservation{r("a", "X", 0), r("b", "X", -5)},
			stock:    map[string]int64{"X": 1},
			want:     []Outcome{short("a"), short("b")},
			wantTake: map[string]int64{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stock := make(map[string]int64)
			for k, v := range tt.stock {
				stock[k] = v
			}
			got, take := allocate(tt.rs, stock)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantTake, take); diff != "" {
				t.Errorf("take (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.stock, stock); diff != "" {
				t.Errorf("allocate modified its stock argument (-before +after):\n%s", diff)
			}
		})
	}
}

func TestDedupe(t *testing.T) {
	rs := []sale.Reservation{{OrderID: "a", Quantity: 1}, {OrderID: "b"}, {OrderID: "a", Quantity: 2}, {OrderID: "c"}, {OrderID: "b"}}
	uniq, idx := dedupe(rs)
	wantUniq := []sale.Reservation{{OrderID: "a", Quantity: 1}, {OrderID: "b"}, {OrderID: "c"}}
	if diff := cmp.Diff(wantUniq, uniq); diff != "" {
		t.Errorf("uniq (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 1, 0, 2, 1}, idx); diff != "" {
		t.Errorf("idx (-want +got):\n%s", diff)
	}
}

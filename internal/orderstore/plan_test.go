package orderstore

import (
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/google/go-cmp/cmp"
)

func TestAllocate(t *testing.T) {
	r := func(id, sku, user string, qty int64) sale.Reservation {
		return sale.Reservation{OrderID: id, SKU: sku, User: user, Quantity: qty}
	}
	ok := func(id string) Outcome { return Outcome{OrderID: id, Status: sale.StatusPendingPayment} }
	short := func(id string) Outcome {
		return Outcome{OrderID: id, Status: sale.StatusFailed, Reason: ReasonInsufficientStock}
	}
	unknown := func(id string) Outcome {
		return Outcome{OrderID: id, Status: sale.StatusFailed, Reason: ReasonUnknownSKU}
	}
	limit := func(id string) Outcome {
		return Outcome{OrderID: id, Status: sale.StatusFailed, Reason: ReasonLimitReached}
	}
	// stock returns inventory rows with a limit no test below reaches.
	stock := func(kv ...any) map[string]lockedSKU {
		m := make(map[string]lockedSKU)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = lockedSKU{Stock: int64(kv[i+1].(int)), PerUserLimit: 1000}
		}
		return m
	}
	tests := []struct {
		name     string
		rs       []sale.Reservation
		skus     map[string]lockedSKU
		held     map[holder]int64
		want     []Outcome
		wantTake map[string]int64
	}{
		{
			name:     "all fit",
			rs:       []sale.Reservation{r("a", "X", "u1", 1), r("b", "X", "u2", 2)},
			skus:     stock("X", 3),
			want:     []Outcome{ok("a"), ok("b")},
			wantTake: map[string]int64{"X": 3},
		},
		{
			name:     "input order decides, a later small one still fits",
			rs:       []sale.Reservation{r("a", "X", "u1", 3), r("b", "X", "u2", 3), r("c", "X", "u3", 2), r("d", "X", "u4", 1)},
			skus:     stock("X", 5),
			want:     []Outcome{ok("a"), short("b"), ok("c"), short("d")},
			wantTake: map[string]int64{"X": 5},
		},
		{
			name:     "sold out takes nothing",
			rs:       []sale.Reservation{r("a", "X", "u1", 1)},
			skus:     stock("X", 0),
			want:     []Outcome{short("a")},
			wantTake: map[string]int64{},
		},
		{
			name:     "unknown sku",
			rs:       []sale.Reservation{r("a", "Y", "u1", 1), r("b", "X", "u1", 1)},
			skus:     stock("X", 1),
			want:     []Outcome{unknown("a"), ok("b")},
			wantTake: map[string]int64{"X": 1},
		},
		{
			name:     "skus are independent",
			rs:       []sale.Reservation{r("a", "X", "u1", 2), r("b", "Y", "u2", 2), r("c", "X", "u3", 1)},
			skus:     stock("X", 2, "Y", 1),
			want:     []Outcome{ok("a"), short("b"), short("c")},
			wantTake: map[string]int64{"X": 2},
		},
		{
			name:     "non-positive quantity never takes",
			rs:       []sale.Reservation{r("a", "X", "u1", 0), r("b", "X", "u1", -5)},
			skus:     stock("X", 1),
			want:     []Outcome{short("a"), short("b")},
			wantTake: map[string]int64{},
		},
		{
			name:     "live holdings count against the limit",
			rs:       []sale.Reservation{r("a", "X", "u1", 1), r("b", "X", "u2", 2), r("c", "X", "u2", 1)},
			skus:     map[string]lockedSKU{"X": {Stock: 10, PerUserLimit: 2}},
			held:     map[holder]int64{{"X", "u1"}: 2, {"X", "u2"}: 1},
			want:     []Outcome{limit("a"), limit("b"), ok("c")},
			wantTake: map[string]int64{"X": 1},
		},
		{
			name:     "holdings accumulate within the batch",
			rs:       []sale.Reservation{r("a", "X", "u1", 2), r("b", "X", "u1", 1), r("c", "X", "u2", 3), r("d", "X", "u2", 1)},
			skus:     map[string]lockedSKU{"X": {Stock: 10, PerUserLimit: 3}},
			want:     []Outcome{ok("a"), ok("b"), ok("c"), limit("d")},
			wantTake: map[string]int64{"X": 6},
		},
		{
			name:     "limit is checked before stock; a refusal takes nothing",
			rs:       []sale.Reservation{r("a", "X", "u1", 2), r("b", "X", "u1", 2), r("c", "X", "u2", 2)},
			skus:     map[string]lockedSKU{"X": {Stock: 2, PerUserLimit: 3}},
			want:     []Outcome{ok("a"), limit("b"), short("c")},
			wantTake: map[string]int64{"X": 2},
		},
		{
			name:     "a stock refusal does not count as held",
			rs:       []sale.Reservation{r("a", "X", "u1", 3), r("b", "X", "u1", 2)},
			skus:     map[string]lockedSKU{"X": {Stock: 2, PerUserLimit: 3}},
			want:     []Outcome{short("a"), ok("b")},
			wantTake: map[string]int64{"X": 2},
		},
		{
			name:     "limits are per sku",
			rs:       []sale.Reservation{r("a", "X", "u1", 1), r("b", "Y", "u1", 1)},
			skus:     map[string]lockedSKU{"X": {Stock: 5, PerUserLimit: 1}, "Y": {Stock: 5, PerUserLimit: 1}},
			held:     map[holder]int64{{"X", "u1"}: 1},
			want:     []Outcome{limit("a"), ok("b")},
			wantTake: map[string]int64{"Y": 1},
		},
		{
			name:     "a lowered limit below holdings refuses more",
			rs:       []sale.Reservation{r("a", "X", "u1", 1)},
			skus:     map[string]lockedSKU{"X": {Stock: 5, PerUserLimit: 2}},
			held:     map[holder]int64{{"X", "u1"}: 4},
			want:     []Outcome{limit("a")},
			wantTake: map[string]int64{},
		},
		{
			name:     "unknown sku before the limit",
			rs:       []sale.Reservation{r("a", "Y", "u1", 1)},
			skus:     stock("X", 1),
			held:     map[holder]int64{{"Y", "u1"}: 9999},
			want:     []Outcome{unknown("a")},
			wantTake: map[string]int64{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			skus, held := maps.Clone(tt.skus), maps.Clone(tt.held)
			got, take := allocate(tt.rs, skus, held)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantTake, take); diff != "" {
				t.Errorf("take (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.skus, skus); diff != "" {
				t.Errorf("allocate modified its skus argument (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(tt.held, held); diff != "" {
				t.Errorf("allocate modified its held argument (-before +after):\n%s", diff)
			}
		})
	}
}

func TestCheckDirect(t *testing.T) {
	start := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	end := start.Add(time.Hour)
	sku := sale.SKU{ID: "X", Stock: 5, PerUserLimit: 3, StartsAt: start, EndsAt: end}
	unbounded := sale.SKU{ID: "X", Stock: 5, PerUserLimit: 3}
	tests := []struct {
		name string
		sku  sale.SKU
		held int64
		qty  int64
		now  time.Time
		want error
	}{
		{"open", sku, 0, 1, start, nil},
		{"before start", sku, 0, 1, start.Add(-time.Nanosecond), sale.ErrSaleNotOpen},
		{"at end", sku, 0, 1, end, sale.ErrSaleEnded},
		{"just before end", sku, 0, 1, end.Add(-time.Nanosecond), nil},
		{"no window", unbounded, 0, 1, time.Time{}, nil},
		{"up to the limit", sku, 2, 1, start, nil},
		{"over the limit", sku, 2, 2, start, sale.ErrLimitReached},
		{"window before limit", sku, 3, 1, end, sale.ErrSaleEnded},
		{"all the stock", unbounded, 0, 3, start, nil},
		{"more than the stock", sale.SKU{Stock: 2, PerUserLimit: 3}, 0, 3, start, sale.ErrSoldOut},
		{"limit before stock", sale.SKU{Stock: 0, PerUserLimit: 1}, 1, 1, start, sale.ErrLimitReached},
		{"sold out", sale.SKU{Stock: 0, PerUserLimit: 1}, 0, 1, start, sale.ErrSoldOut},
		{"zero quantity", unbounded, 0, 0, start, sale.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkDirect(tt.sku, tt.held, tt.qty, tt.now)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("checkDirect = %v, want %v", err, tt.want)
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

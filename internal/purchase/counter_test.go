package purchase

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

type countingCounter struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *countingCounter) Record(sku, outcome string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d < 0 {
		outcome += "(negative latency)"
	}
	c.seen[sku+" "+outcome]++
}

// TestCounterSeesKnownSKUsOnly: the sale history counts every purchase of
// a catalog SKU with its outcome; junk ids and invalid requests are not
// counted (they must not make keys).
func TestCounterSeesKnownSKUsOnly(t *testing.T) {
	g := &fakeGate{avail: 1}
	s, _ := newTestService(t, g, Limits{})
	c := &countingCounter{seen: map[string]int{}}
	s.counter = c
	_ = buy(s, "ann", 1)  // accepted
	_ = buy(s, "bob", 1)  // sold out
	_ = buy(s, "cy", 0)   // invalid
	_ = buy(s, "dee", 99) // over the per-user limit
	_, _ = s.Buy(t.Context(), Request{User: "eve", SKU: "nope", Quantity: 1})
	want := map[string]int{"s accepted": 1, "s sold_out": 1, "s limit_reached": 1}
	if d := cmp.Diff(want, c.seen); d != "" {
		t.Errorf("counted (-want +got):\n%s", d)
	}
}

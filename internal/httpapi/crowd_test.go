package httpapi

import (
	"fmt"
	"testing"
	"time"
)

// TestBuyerLimit: PerSecond requests of a buyer a second, then refusals
// with the wait to the next second; other buyers unaffected; a flood of
// ids keeps the memory bounded and forgets the buyers untouched longest.
func TestBuyerLimit(t *testing.T) {
	l := &BuyerLimit{PerSecond: 3}
	now := time.Unix(1000, 0)
	for i := range 3 {
		if _, ok := l.Allow("a", now.Add(time.Duration(i)*100*time.Millisecond)); !ok {
			t.Fatalf("request %d refused", i)
		}
	}
	if _, ok := l.Allow("a", now.Add(500*time.Millisecond)); ok {
		t.Fatal("a fourth request in the second allowed")
	}
	if _, ok := l.Allow("b", now); !ok {
		t.Fatal("another buyer refused")
	}
	if _, ok := l.Allow("a", now.Add(time.Second)); !ok {
		t.Fatal("the next second refused")
	}
	for i := range maxBuyerEntries {
		l.Allow(fmt.Sprint("x", i), now)
	}
	if n := len(l.cur) + len(l.prev); n > maxBuyerEntries {
		t.Fatalf("%d entries remembered, bound %d", n, maxBuyerEntries)
	}
	var nilLimit *BuyerLimit
	if _, ok := nilLimit.Allow("a", now); !ok {
		t.Fatal("a nil limit refused")
	}
}

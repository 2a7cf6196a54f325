package stockgate_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// TestOrderIDTag: an order id is a valid lower-case UUID (the API's
// OrderID), unique, carrying its SKU's tag; ids of older versions carry none.
func TestOrderIDTag(t *testing.T) {
	seen := map[string]bool{}
	for i := range 10_000 {
		sku := "sku-" + string(rune('a'+i%26))
		id := stockgate.NewOrderID(sku)
		if !sale.ValidOrderID(id) || seen[id] {
			t.Fatalf("id %q: valid %v, seen before %v", id, sale.ValidOrderID(id), seen[id])
		}
		seen[id] = true
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 8 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("id %q: %v, version %d, variant %v", id, err, u.Version(), u.Variant())
		}
		if tag, ok := stockgate.OrderTag(id); !ok || tag != stockgate.SKUTag(sku) {
			t.Fatalf("id %q: tag %d %v, want %d", id, tag, ok, stockgate.SKUTag(sku))
		}
	}
	if _, ok := stockgate.OrderTag(uuid.Must(uuid.NewV7()).String()); ok {
		t.Fatal("a version 7 id (older versions) has a tag")
	}
}

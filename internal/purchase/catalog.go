package purchase

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// SKULister reads every SKU's configuration from the database.
type SKULister interface {
	SKUs(ctx context.Context) ([]sale.SKU, error)
}

// Catalog is an in-memory copy of every SKU's sale configuration, so that
// unknown ids and closed windows are answered without a Redis or database
// call: an exact set (no false positives, unlike a Bloom filter), replaced
// whole (atomic swap) on each refresh. Instances keep in step through change
// notices (Kick) and, as a safety net, a periodic refresh (Run).
type Catalog struct {
	src  SKULister
	skus atomic.Pointer[map[string]sale.SKU]
	tags atomic.Pointer[map[uint16][]string] // stockgate.SKUTag -> SKU ids
	kick chan struct{}
}

// NewCatalog returns an empty catalog over src; call Refresh before use.
func NewCatalog(src SKULister) *Catalog {
	c := &Catalog{src: src, kick: make(chan struct{}, 1)}
	empty := map[string]sale.SKU{}
	c.skus.Store(&empty)
	c.tags.Store(&map[uint16][]string{})
	return c
}

// Refresh reloads the catalog from the database.
func (c *Catalog) Refresh(ctx context.Context) error {
	list, err := c.src.SKUs(ctx)
	if err != nil {
		return err
	}
	m := make(map[string]sale.SKU, len(list))
	tags := make(map[uint16][]string, len(list))
	for _, s := range list {
		m[s.ID] = s
		t := stockgate.SKUTag(s.ID)
		tags[t] = append(tags[t], s.ID)
	}
	c.skus.Store(&m)
	c.tags.Store(&tags)
	return nil
}

// Tagged returns the SKUs whose tag (stockgate.SKUTag) is t: those an
// order id carrying t may belong to (usually one).
func (c *Catalog) Tagged(t uint16) []string { return (*c.tags.Load())[t] }

// Get returns the configuration of id.
func (c *Catalog) Get(id string) (sale.SKU, bool) {
	s, ok := (*c.skus.Load())[id]
	return s, ok
}

// ID returns the id of the sale b names as the catalog holds it, if there
// is one: a caller holding the id as bytes gets a string made at the last
// refresh instead of a copy of its own.
func (c *Catalog) ID(b []byte) (string, bool) {
	s, ok := (*c.skus.Load())[string(b)]
	return s.ID, ok
}

// All returns every SKU in the catalog.
func (c *Catalog) All() []sale.SKU {
	m := *c.skus.Load()
	out := make([]sale.SKU, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	return out
}

// Kick asks Run to refresh now (a SKU changed on some instance). Kicks
// while a refresh is pending coalesce into it; Kick never blocks.
func (c *Catalog) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run refreshes the catalog every period, and at once when kicked, until
// ctx is done, so SKUs created through another instance become known here
// as soon as its notice arrives, and within one period if it is lost.
func (c *Catalog) Run(ctx context.Context, period time.Duration, onErr func(error)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kick:
		}
		rctx, cancel := context.WithTimeout(ctx, period)
		if err := c.Refresh(rctx); err != nil && ctx.Err() == nil && onErr != nil {
			onErr(err)
		}
		cancel()
	}
}

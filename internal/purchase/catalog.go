package purchase

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// SKULister reads every SKU's configuration from the database.
type SKULister interface {
	SKUs(ctx context.Context) ([]sale.SKU, error)
}

// Catalog is an in-memory copy of every SKU's sale configuration, so that
// unknown ids and closed windows are answered without a Redis or database
// call. It is replaced whole (atomic swap) on each refresh.
type Catalog struct {
	src  SKULister
	skus atomic.Pointer[map[string]sale.SKU]
}

// NewCatalog returns an empty catalog over src; call Refresh before use.
func NewCatalog(src SKULister) *Catalog {
	c := &Catalog{src: src}
	empty := map[string]sale.SKU{}
	c.skus.Store(&empty)
	return c
}

// Refresh reloads the catalog from the database.
func (c *Catalog) Refresh(ctx context.Context) error {
	list, err := c.src.SKUs(ctx)
	if err != nil {
		return err
	}
	m := make(map[string]sale.SKU, len(list))
	for _, s := range list {
		m[s.ID] = s
	}
	c.skus.Store(&m)
	return nil
}

// Get returns the configuration of id.
func (c *Catalog) Get(id string) (sale.SKU, bool) {
	s, ok := (*c.skus.Load())[id]
	return s, ok
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

// Run refreshes the catalog every period until ctx is done, so SKUs created
// through another instance become known here within one period.
func (c *Catalog) Run(ctx context.Context, period time.Duration, onErr func(error)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, period)
			if err := c.Refresh(rctx); err != nil && ctx.Err() == nil && onErr != nil {
				onErr(err)
			}
			cancel()
		}
	}
}

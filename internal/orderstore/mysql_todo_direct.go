//go:build !mysqlwip_direct

// Stubs until the MySQL implementation in this group lands (built with -tags mysqlwip_direct).

package orderstore

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

var _ = time.Now
var _ sale.Status

func (s *myStore) BuyDirect(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, errTODO
}
func (s *myStore) BuyConditional(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, errTODO
}
func (s *myStore) BuyFenced(ctx context.Context, r sale.Reservation, now time.Time, token int64) (sale.Order, bool, error) {
	return sale.Order{}, false, errTODO
}
func (s *myStore) Fence(ctx context.Context, sku string) (int64, error) { return 0, errTODO }
func (s *myStore) BuyOptimistic(ctx context.Context, r sale.Reservation, now time.Time, attempts int) (sale.Order, bool, error) {
	return sale.Order{}, false, errTODO
}

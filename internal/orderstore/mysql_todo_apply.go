//go:build !mysqlwip_apply

// Stubs until the MySQL implementation in this group lands (built with -tags mysqlwip_apply).

package orderstore

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

var _ = time.Now
var _ sale.Status

func (s *myStore) ApplyBatch(ctx context.Context, rs []sale.Reservation) ([]Outcome, error) {
	return nil, errTODO
}
func (s *myStore) Discard(ctx context.Context, r sale.Reservation) (bool, sale.Status, error) {
	return false, "", errTODO
}
func (s *myStore) Order(ctx context.Context, id string) (sale.Order, error) {
	return sale.Order{}, errTODO
}
func (s *myStore) Snapshot(ctx context.Context, sku string, ids []string) (Snapshot, error) {
	return Snapshot{}, errTODO
}
func (s *myStore) SeedSnapshot(ctx context.Context, sku string, ids []string) (Snapshot, error) {
	return Snapshot{}, errTODO
}
func (s *myStore) Processed(ctx context.Context, ids []string) (map[string]sale.Status, error) {
	return nil, errTODO
}
func (s *myStore) LiveHoldings(ctx context.Context, sku string) (map[string]int64, error) {
	return nil, errTODO
}

//go:build !mysqlwip_lifecycle

// Stubs until the MySQL implementation in this group lands (built with -tags mysqlwip_lifecycle).

package orderstore

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

var _ = time.Now
var _ sale.Status

func (s *myStore) PutSKU(ctx context.Context, c SKUChange) (sale.SKU, int64, bool, error) {
	return sale.SKU{}, 0, false, errTODO
}
func (s *myStore) SKU(ctx context.Context, id string) (sale.SKU, error) { return sale.SKU{}, errTODO }
func (s *myStore) SKUs(ctx context.Context) ([]sale.SKU, error)         { return nil, errTODO }
func (s *myStore) Pay(ctx context.Context, id, user, ref string, now time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, errTODO
}
func (s *myStore) Cancel(ctx context.Context, id, user, cause string, now time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, errTODO
}
func (s *myStore) Expire(ctx context.Context, id string, now time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, errTODO
}
func (s *myStore) ExpireDue(ctx context.Context, now time.Time, limit int) ([]Restore, error) {
	return nil, errTODO
}
func (s *myStore) RequestCancel(ctx context.Context, id, user string, now time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, errTODO
}
func (s *myStore) PendingRestores(ctx context.Context, limit int) ([]Restore, error) {
	return nil, errTODO
}
func (s *myStore) RestoresDone(ctx context.Context, ids []string) error { return errTODO }
func (s *myStore) AuditRedis(ctx context.Context, sku string, delta int64, reason string) error {
	return errTODO
}
func (s *myStore) Audit(ctx context.Context, sku string, after int64, limit int) ([]AuditEntry, error) {
	return nil, errTODO
}
func (s *myStore) PublishTransitions(ctx context.Context, limit int, publish func([]Transition) error) (int, error) {
	return 0, errTODO
}

// Package strategy maps a purchase strategy's name to the seller the purchase path uses, and holds the redis-lock strategy.
//
// The strategies are the approaches the seeds compare, all behind the same
// HTTP API and checked by the same invariants (flashsale bench,
// docs/performance.md):
//
//	pipeline        Redis Lua gate -> JetStream -> batched apply (the service's design; no seller)
//	db-conditional  one transaction: UPDATE ... WHERE stock >= n, then the order (orderstore.BuyConditional)
//	db-pessimistic  SELECT ... FOR UPDATE, check in Go, UPDATE (orderstore.BuyDirect, the breaker's fallback)
//	db-optimistic   read a version, UPDATE ... WHERE version = v, bounded retries (orderstore.BuyOptimistic)
//	redis-lock      a per-SKU Redis lock with a fencing token around the database update (RedisLock)
package strategy

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/sale"
)

// Names of the strategies.
const (
	Pipeline      = "pipeline"
	DBConditional = "db-conditional"
	DBPessimistic = "db-pessimistic"
	DBOptimistic  = "db-optimistic"
	RedisLockName = "redis-lock"
)

// Names returns every strategy name, the default (pipeline) first.
func Names() []string {
	return []string{Pipeline, DBConditional, DBPessimistic, DBOptimistic, RedisLockName}
}

// Valid returns nil if name is a strategy, else an error listing them.
func Valid(name string) error {
	for _, n := range Names() {
		if n == name {
			return nil
		}
	}
	return fmt.Errorf("unknown purchase strategy %q (one of %s)", name, strings.Join(Names(), ", "))
}

// OptimisticAttempts is how many reads and compare-and-sets db-optimistic
// tries per purchase before answering sale.ErrBusy.
const OptimisticAttempts = 8

// Deps are what the strategies are built from.
type Deps struct {
	Store *orderstore.Store
	// Redis and Prefix are used by redis-lock only (keys under Prefix).
	Redis  rueidis.Client
	Prefix string
	// Lock tunes redis-lock.
	Lock LockConfig
}

// New returns the seller of the named strategy: every purchase goes to it
// (purchase.Deps.Seller). It returns nil for pipeline, whose purchases take
// the gate and the queue, and an error for an unknown name.
func New(name string, d Deps) (purchase.DirectBuyer, error) {
	if err := Valid(name); err != nil {
		return nil, err
	}
	if name != Pipeline && d.Store == nil {
		return nil, fmt.Errorf("strategy %s needs the database", name)
	}
	switch name {
	case DBConditional:
		return conditional{d.Store}, nil
	case DBPessimistic:
		return d.Store, nil
	case DBOptimistic:
		return optimistic{d.Store, OptimisticAttempts}, nil
	case RedisLockName:
		if d.Redis == nil {
			return nil, fmt.Errorf("strategy %s needs redis", name)
		}
		return NewRedisLock(d.Redis, d.Prefix, d.Store, d.Lock), nil
	}
	return nil, nil
}

type conditional struct{ s *orderstore.Store }

func (c conditional) BuyDirect(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
	return c.s.BuyConditional(ctx, r, now)
}

type optimistic struct {
	s        *orderstore.Store
	attempts int
}

func (o optimistic) BuyDirect(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
	return o.s.BuyOptimistic(ctx, r, now, o.attempts)
}

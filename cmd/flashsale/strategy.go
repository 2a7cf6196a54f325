package main

import (
	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/strategy"
)

// validStrategy checks the -purchase-strategy setting.
func validStrategy(name string) error { return strategy.Valid(name) }

// sellerFor returns the seller of a's purchase strategy (purchase.Deps.Seller):
// nil for pipeline, the default, whose purchases take the gate and the queue.
func sellerFor(a *app) (purchase.DirectBuyer, error) {
	s, err := strategy.New(a.cfg.PurchaseStrategy, strategy.Deps{Store: a.store, Redis: a.redis, Prefix: a.cfg.RedisPrefix})
	if err == nil && s != nil {
		a.log.Warn("purchase strategy: every purchase is sold straight from the database (a comparison strategy, not the service's design)",
			"strategy", a.cfg.PurchaseStrategy)
	}
	return s, err
}

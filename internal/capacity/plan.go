// Package capacity sizes a deployment from the measured cost of each step
// of the purchase path: the arithmetic of `flashsale plan` and
// docs/scaling.md.
package capacity

import (
	"errors"
	"fmt"
	"math"
)

// Load is the traffic to plan for.
type Load struct {
	// Rate is purchase attempts per second over every SKU.
	Rate float64
	// HotShare is the share of Rate aimed at the one hot SKU (0..1).
	HotShare float64
	// SKUs is the number of other (normal) SKUs; their attempts are assumed
	// to sell (an upper bound on orders).
	SKUs int
	// HotStock is the hot SKU's units: only they become orders, every
	// other attempt on it is refused.
	HotStock int64
}

// Costs are the measured cost of each step, in µs of one core (Redis: of a
// primary's single thread).
type Costs struct {
	HandlerUS float64 // a flashsale instance's CPU per request (HTTP, JWT, checks, gate and relay calls)
	RedisUS   float64 // the Redis primary's CPU per reserve.lua call
	NATSUS    float64 // JetStream per message stored and acknowledged (one stream's leader)
	DBUS      float64 // the database per order applied in a batch (one applier)
}

// Sizing are the deployment's choices.
type Sizing struct {
	InstanceCores int     // cores of one flashsale instance
	Headroom      float64 // target utilisation of every part (0..1]: 0.5 leaves room for bursts and failover
	NATSReplicas  int     // FLASHSALE_NATS_REPLICAS (nodes = replicas)
	Batch         int     // FLASHSALE_APPLY_BATCH
}

// Plan is the sizing that follows.
type Plan struct {
	HotRate, NormalRate float64 // attempts/s
	// HotSellSeconds is how long the hot SKU's stock lasts at HotRate; after
	// it the instances answer its attempts from their sold-out flag, without
	// Redis.
	HotSellSeconds float64
	HotRefusedRate float64 // hot attempts/s refused once it is sold out

	RedisLoadHot, RedisLoadNormal float64 // Redis cores busy while the hot SKU sells
	Buckets                       int     // stock buckets of the hot SKU ("buckets": K), one hash tag each
	RedisPrimaries                int     // primaries: one per hot bucket plus the normal SKUs' share
	ReservesPerBucket             float64 // reserve calls/s on each hot bucket

	InstanceCoresBusy float64
	Instances         int

	OrdersNormal     float64 // orders/s sustained
	OrdersHotBurst   int64   // orders of the hot SKU, accepted within HotSellSeconds
	StreamCapacity   float64 // messages/s one order stream's leader takes at Headroom
	StreamPeak       float64 // messages/s offered while the hot SKU sells
	StreamBurstDrain float64 // seconds to store the hot burst (the Redis outbox holds the rest meanwhile)
	NATSNodes        int

	Appliers         int     // appliers the database work needs at Headroom
	HotDrainSeconds  float64 // seconds to apply the hot SKU's orders (one row lock: serial)
	DBBusyCores      float64 // database cores busy with the normal SKUs' orders
	TransactionsRate float64 // batches/s at the sustained rate when batches fill
	AppliersPerInst  int     // FLASHSALE_APPLY_WORKERS so the instances have Appliers between them
	Batch            int
}

// Make computes the plan. It fails on inputs that have no meaning
// (a negative rate, a share outside 0..1, a cost of zero).
func Make(l Load, c Costs, s Sizing) (Plan, error) {
	switch {
	case !(l.Rate > 0):
		return Plan{}, errors.New("rate must be above 0 attempts/s")
	case l.HotShare < 0 || l.HotShare > 1 || math.IsNaN(l.HotShare):
		return Plan{}, errors.New("hot-share must be in 0..1")
	case l.SKUs < 0:
		return Plan{}, errors.New("skus must be 0 or more")
	case l.SKUs == 0 && l.HotShare < 1:
		return Plan{}, errors.New("skus is 0 but hot-share leaves attempts for other SKUs")
	case l.HotStock < 0:
		return Plan{}, errors.New("stock must be 0 or more")
	case !(c.HandlerUS > 0), !(c.RedisUS > 0), !(c.NATSUS > 0), !(c.DBUS > 0):
		return Plan{}, errors.New("every cost (handler-us, redis-us, nats-us, db-us) must be above 0")
	case s.InstanceCores < 1:
		return Plan{}, errors.New("instance-cores must be at least 1")
	case !(s.Headroom > 0) || s.Headroom > 1:
		return Plan{}, errors.New("headroom must be in (0, 1]")
	case s.NATSReplicas < 1 || s.NATSReplicas > 5:
		return Plan{}, errors.New("nats-replicas must be 1..5")
	case s.Batch < 1:
		return Plan{}, errors.New("batch must be at least 1")
	}
	var p Plan
	p.Batch = s.Batch
	p.HotRate = l.Rate * l.HotShare
	p.NormalRate = l.Rate - p.HotRate
	if p.HotRate > 0 {
		p.HotSellSeconds = float64(l.HotStock) / p.HotRate
	}
	p.HotRefusedRate = p.HotRate

	// Redis: every attempt is one reserve call while the hot SKU sells (the
	// rate limits and the stock check are inside it). A hot SKU's calls all
	// go to one slot, one primary's thread: split over K buckets.
	p.RedisLoadHot = p.HotRate * c.RedisUS / 1e6
	p.RedisLoadNormal = p.NormalRate * c.RedisUS / 1e6
	p.Buckets = max(1, ceil(p.RedisLoadHot/s.Headroom))
	if p.HotRate > 0 {
		p.ReservesPerBucket = p.HotRate / float64(p.Buckets)
	}
	p.RedisPrimaries = p.Buckets + ceil(p.RedisLoadNormal/s.Headroom)
	if p.HotRate == 0 {
		p.Buckets, p.ReservesPerBucket = 0, 0
		p.RedisPrimaries = max(1, ceil(p.RedisLoadNormal/s.Headroom))
	}

	p.InstanceCoresBusy = l.Rate * c.HandlerUS / 1e6
	p.Instances = max(1, ceil(p.InstanceCoresBusy/(float64(s.InstanceCores)*s.Headroom)))

	// Orders: only units sold reach the stream and the database.
	p.OrdersNormal = p.NormalRate
	p.OrdersHotBurst = l.HotStock
	p.StreamCapacity = s.Headroom * 1e6 / c.NATSUS
	p.StreamPeak = p.NormalRate
	if p.HotRate > 0 && l.HotStock > 0 {
		p.StreamPeak += p.HotRate
	}
	if spare := p.StreamCapacity - p.OrdersNormal; spare > 0 {
		p.StreamBurstDrain = float64(l.HotStock) / spare
	} else {
		p.StreamBurstDrain = math.Inf(1)
	}
	p.NATSNodes = max(s.NATSReplicas, 1)
	if s.NATSReplicas > 1 && s.NATSReplicas%2 == 0 {
		p.NATSNodes = s.NATSReplicas + 1 // a quorum needs an odd count
	}

	p.DBBusyCores = p.OrdersNormal * c.DBUS / 1e6
	p.HotDrainSeconds = float64(l.HotStock) * c.DBUS / 1e6
	// One applier for the hot SKU's row (its batches serialise on the
	// row lock) plus what the normal SKUs need.
	p.Appliers = ceil(p.DBBusyCores/s.Headroom) + 1
	p.TransactionsRate = p.OrdersNormal / float64(s.Batch)
	p.AppliersPerInst = max(1, ceil(float64(p.Appliers)/float64(p.Instances)))
	return p, nil
}

func ceil(x float64) int { return int(math.Ceil(x - 1e-9)) }

// Lines returns the plan as "what: figure (how)" lines for a terminal.
func (p Plan) Lines(l Load, c Costs, s Sizing) []string {
	f := func(format string, a ...any) string { return fmt.Sprintf(format, a...) }
	drain := "never (the normal SKUs' orders alone fill the stream)"
	if !math.IsInf(p.StreamBurstDrain, 1) {
		drain = f("%.1f s", p.StreamBurstDrain)
	}
	// Every instance runs FLASHSALE_APPLY_WORKERS appliers: the deployment
	// runs that many times the instances, at least the appliers needed.
	workers := f("FLASHSALE_APPLY_WORKERS=%d on each of the %s runs %d", p.AppliersPerInst, count(p.Instances, "instance", "instances"),
		p.AppliersPerInst*p.Instances)
	if p.Instances == 1 {
		workers = f("FLASHSALE_APPLY_WORKERS=%d on the one instance", p.AppliersPerInst)
	}
	return []string{
		f("load: %.0f attempts/s: %.0f on the hot SKU (stock %d, sold out after %.2f s), %.0f over %s",
			l.Rate, p.HotRate, l.HotStock, p.HotSellSeconds, p.NormalRate, count(l.SKUs, "other SKU", "other SKUs")),
		f("costs: handler %.1f µs/request, Redis %.1f µs/reserve, JetStream %.1f µs/message, database %.1f µs/order; headroom %.0f%%",
			c.HandlerUS, c.RedisUS, c.NATSUS, c.DBUS, s.Headroom*100),
		"",
		f("redis: hot SKU %.1f primary threads busy -> %s (%.0f reserves/s each); other SKUs %.2f -> %s in all (each with a replica)",
			p.RedisLoadHot, count(p.Buckets, "stock bucket", "stock buckets"), p.ReservesPerBucket, p.RedisLoadNormal,
			count(p.RedisPrimaries, "primary", "primaries")),
		f("flashsale: %.1f cores busy -> %s of %s", p.InstanceCoresBusy, count(p.Instances, "instance", "instances"),
			count(s.InstanceCores, "core", "cores")),
		f("nats: %s (FLASHSALE_NATS_REPLICAS=%d); one order stream takes %.0f messages/s at the headroom; %.0f offered while the hot SKU sells; its %s stored in %s",
			count(p.NATSNodes, "node", "nodes"), s.NATSReplicas, p.StreamCapacity, p.StreamPeak, count64(p.OrdersHotBurst, "order", "orders"), drain),
		f("consumers: %s needed: %s; FLASHSALE_APPLY_BATCH=%d: %.0f transactions/s when batches fill",
			count(p.Appliers, "applier", "appliers"), workers, p.Batch, p.TransactionsRate),
		f("database: %.0f orders/s from the other SKUs (%.2f cores busy); the hot SKU's %s applied in %.1f s (one row: serial); the %.0f refused attempts/s never reach it",
			p.OrdersNormal, p.DBBusyCores, count64(p.OrdersHotBurst, "order", "orders"), p.HotDrainSeconds, p.HotRefusedRate),
	}
}

// count is n with the noun that fits it: "1 instance", "2 instances".
func count(n int, one, many string) string { return count64(int64(n), one, many) }

func count64(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// InFlight is the gate's record of reservations in flight, the source the
// republisher recovers from.
type InFlight interface {
	SKUs(ctx context.Context) ([]string, error)
	Stuck(ctx context.Context, sku string, before time.Time, offset, limit int) ([]stockgate.Stuck, error)
	IndexInFlight(ctx context.Context, sku string, cursor uint64, count int) (next uint64, added int, err error)
}

// Holder tells which reservations of a SKU the broker still holds: not yet
// acknowledged by the consumer, or dead-lettered (waiting for an operator).
type Holder interface {
	Unapplied(ctx context.Context, sku string) ([]sale.Reservation, error)
}

// BulkHolder is a Holder that answers for every SKU in one read (one
// consumer, however many SKUs): the republisher reads it at most once per
// pass instead of once per SKU.
type BulkHolder interface {
	UnappliedAll(ctx context.Context) (map[string][]sale.Reservation, error)
}

// RepublishConfig tunes the republisher. Zero values take the defaults.
type RepublishConfig struct {
	// After is how long a reservation may stay in flight after its
	// acceptance before it is published again (default 30s). It must exceed
	// the normal time from acceptance to the database's decision.
	After time.Duration
	// Every is the period of Run (default 1s).
	Every time.Duration
	// Batch is the most candidates looked at per SKU and pass (default 512).
	Batch int
	// Scan is the in-flight entries indexed per SKU and pass (default 256).
	Scan int
	// Timeout bounds one publish round (default 10s).
	Timeout time.Duration
}

func (c RepublishConfig) withDefaults() RepublishConfig {
	if c.After == 0 {
		c.After = 30 * time.Second
	}
	if c.Every == 0 {
		c.Every = time.Second
	}
	if c.Batch == 0 {
		c.Batch = 512
	}
	if c.Scan == 0 {
		c.Scan = 256
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	return c
}

// Republisher publishes again, from its Redis payload, a reservation the
// stream acknowledged that is still in flight After its acceptance: the
// broker lost it (a store lost with a backlog, a stream deleted or
// re-created empty). The database's idempotency log makes a copy harmless
// and the consumer closes a reservation it finds already decided.
//
// A reservation the broker still holds (pending for the consumer, or in
// the dead letters, waiting for an operator) is left alone, so a slow
// database or a dead letter never makes copies. Each reservation is
// looked at at most once per After, and a pass does bounded work per SKU
// (Batch candidates, Scan entries indexed). Not safe for concurrent RunOnce.
type Republisher struct {
	box  InFlight
	held Holder
	pub  Publisher
	log  *slog.Logger
	cfg  RepublishConfig

	skus  map[string]*skuScan
	tried map[string]time.Time // order id -> last looked at

	pass map[string][]sale.Reservation // this pass's BulkHolder read (nil: not read yet)
}

type skuScan struct {
	offset int
	cursor uint64
	held   map[string]bool
	heldAt time.Time
}

// NewRepublisher returns a republisher reading box, asking held, publishing to pub.
func NewRepublisher(box InFlight, held Holder, pub Publisher, log *slog.Logger, cfg RepublishConfig) *Republisher {
	return &Republisher{box: box, held: held, pub: pub, log: log, cfg: cfg.withDefaults(),
		skus: map[string]*skuScan{}, tried: map[string]time.Time{}}
}

// RepublishResult is what one pass did.
type RepublishResult struct {
	Republished int // published again
	Held        int // candidates the broker still holds (pending or dead-lettered)
	Indexed     int // in-flight entries added to the gate's accepted index
	Failed      int // candidates the stream did not acknowledge (tried again after After)
}

// Run republishes every Every until ctx is done.
func (r *Republisher) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			res, err := r.RunOnce(ctx, now)
			if err != nil && ctx.Err() == nil {
				r.log.Warn("republisher", "err", err)
			}
			if res.Republished > 0 || res.Failed > 0 {
				r.log.Warn("republished reservations still in flight that the stream no longer held",
					"republished", res.Republished, "failed", res.Failed, "after", r.cfg.After)
			}
		}
	}
}

// RunOnce does one pass over every SKU at time now.
func (r *Republisher) RunOnce(ctx context.Context, now time.Time) (RepublishResult, error) {
	var res RepublishResult
	skus, err := r.box.SKUs(ctx)
	if err != nil {
		return res, err
	}
	var firstErr error
	seen := map[string]bool{}
	r.pass = nil
	defer func() { r.pass = nil }()
	for _, sku := range skus {
		seen[sku] = true
		if err := r.sku(ctx, sku, now, &res); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for sku := range r.skus {
		if !seen[sku] {
			delete(r.skus, sku)
		}
	}
	for id, at := range r.tried {
		if now.Sub(at) > 2*r.cfg.After {
			delete(r.tried, id)
		}
	}
	return res, firstErr
}

func (r *Republisher) sku(ctx context.Context, sku string, now time.Time, res *RepublishResult) error {
	st := r.skus[sku]
	if st == nil {
		st = &skuScan{}
		r.skus[sku] = st
	}
	next, added, err := r.box.IndexInFlight(ctx, sku, st.cursor, r.cfg.Scan)
	if err != nil {
		return err
	}
	st.cursor = next
	res.Indexed += added

	page, err := r.box.Stuck(ctx, sku, now.Add(-r.cfg.After), st.offset, r.cfg.Batch)
	if err != nil {
		return err
	}
	if len(page) < r.cfg.Batch {
		st.offset = 0
	} else {
		st.offset += len(page)
	}
	var cand []stockgate.Stuck
	for _, s := range page {
		if at, ok := r.tried[s.OrderID]; ok && now.Sub(at) < r.cfg.After {
			continue
		}
		cand = append(cand, s)
	}
	if len(cand) == 0 {
		return nil
	}
	if st.held == nil || now.Sub(st.heldAt) >= r.cfg.After {
		// Read the stream before trusting an absence: a reservation pending
		// for the consumer or dead-lettered must not be published again.
		// (a stock bucket's reservations are on its SKU's subject)
		held, err := r.unapplied(ctx, sale.SKUOfBucket(sku))
		if err != nil {
			return err
		}
		st.held, st.heldAt = make(map[string]bool, len(held)), now
		for _, h := range held {
			st.held[h.OrderID] = true
		}
	}
	msgs := make([]orderqueue.Message, 0, len(cand))
	for _, s := range cand {
		r.tried[s.OrderID] = now
		if st.held[s.OrderID] {
			res.Held++
			continue
		}
		msgs = append(msgs, orderqueue.Message{ID: s.OrderID, SKU: sku, Data: s.Payload})
	}
	if len(msgs) == 0 {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	for i, err := range r.pub.Publish(pctx, msgs) {
		if err != nil {
			r.log.Debug("republish", "order_id", msgs[i].ID, "err", err)
			res.Failed++
			continue
		}
		res.Republished++
	}
	return nil
}

// unapplied is what the broker holds of sku: from one read of every SKU per
// pass when the holder can, else from a read of this SKU.
func (r *Republisher) unapplied(ctx context.Context, sku string) ([]sale.Reservation, error) {
	bulk, ok := r.held.(BulkHolder)
	if !ok {
		return r.held.Unapplied(ctx, sku)
	}
	if r.pass == nil {
		all, err := bulk.UnappliedAll(ctx)
		if err != nil {
			return nil, err
		}
		if all == nil {
			all = map[string][]sale.Reservation{}
		}
		r.pass = all
	}
	return r.pass[sku], nil
}

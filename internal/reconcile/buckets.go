package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// BucketGate is the part of the gate a sale split in stock buckets needs
// (see stockgate's buckets.go).
type BucketGate interface {
	Buckets(ctx context.Context, sku string) (int, error)
	ReadBuckets(ctx context.Context, names []string, withRes bool) ([]stockgate.BucketState, error)
	SeedSplit(ctx context.Context, sku string, cfg stockgate.Config, k int, available int64, holdings map[string]int64, inflight []sale.Reservation, released []stockgate.Release, idem map[string]string, epoch string) (bool, error)
	LockBuckets(ctx context.Context, names []string, token string, ttl time.Duration) error
	UnlockBuckets(ctx context.Context, names []string, token string) error
	DropBuckets(ctx context.Context, names []string) error
	Finalize(ctx context.Context, bucket string, outcomes []stockgate.Outcome) (int64, error)
}

// union returns a then the names of b not in a.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, n := range b {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// gathered is what a fenced sale has in flight, as a database snapshot
// decides it.
type gathered struct {
	snap     orderstore.Snapshot
	inflight []sale.Reservation // not processed by the database, oldest first
	units    int64
	// decided are the in-flight entries, by bucket, that the database had
	// processed at the snapshot (see forgetDecided).
	decided map[string][]string
}

// gather reads, with every bucket of names fenced, the reservations they
// hold and those the stream holds unacknowledged or dead-lettered, then one
// database snapshot: those it has not processed are in flight.
func (s *Syncer) gather(ctx context.Context, id string, names []string) (gathered, error) {
	bs, err := s.gate.ReadBuckets(ctx, names, true)
	if err != nil {
		return gathered{}, err
	}
	cand := map[string]sale.Reservation{}
	in := map[string][]string{} // bucket -> its entries
	for _, b := range bs {
		for _, r := range b.Reservations {
			cand[r.OrderID] = r
			in[b.Name] = append(in[b.Name], r.OrderID)
		}
	}
	if s.queue != nil {
		more, err := s.queue.Unapplied(ctx, id)
		if err != nil {
			return gathered{}, fmt.Errorf("reading the stream's in-flight reservations: %w", err)
		}
		for _, r := range more {
			cand[r.OrderID] = r
		}
	}
	ids := make([]string, 0, len(cand))
	for oid := range cand {
		ids = append(ids, oid)
	}
	snap, err := s.store.SeedSnapshot(ctx, id, ids)
	if err != nil {
		return gathered{}, err
	}
	g := gathered{snap: snap, decided: map[string][]string{}}
	for b, oids := range in {
		for _, oid := range oids {
			if _, done := snap.Processed[oid]; done {
				g.decided[b] = append(g.decided[b], oid)
			}
		}
	}
	for oid, r := range cand {
		if _, done := snap.Processed[oid]; done {
			continue
		}
		g.inflight = append(g.inflight, r)
		g.units += r.Quantity
	}
	slices.SortFunc(g.inflight, func(a, b sale.Reservation) int {
		return cmp.Or(cmp.Compare(a.AcceptedAt, b.AcceptedAt), cmp.Compare(a.OrderID, b.OrderID))
	})
	return g, nil
}

// fenceBuckets unloads every bucket of names (the gate refuses them) and
// writes the change lock token into each bucket's own lock. It returns the
// function that gives the bucket locks up.
func (s *Syncer) fenceBuckets(ctx context.Context, id, token string, names []string) (func(), error) {
	others := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == id })
	if err := s.gate.LockBuckets(ctx, others, token, lockTTL); err != nil {
		return nil, err
	}
	unlock := func() {
		if err := s.gate.UnlockBuckets(context.WithoutCancel(ctx), others, token); err != nil {
			s.log.Warn("bucket locks: release (they expire)", "sku_id", id, "err", err)
		}
	}
	for _, n := range names {
		if err := s.gate.Fence(ctx, n); err != nil {
			unlock()
			return nil, err
		}
	}
	return unlock, nil
}

// splitLoad (re)loads sku split in sku.BucketCount() buckets, as a rebuild:
// every bucket of fence and of the new split is fenced first (so nothing
// moves while the units in flight are counted), then seeded from one
// database snapshot (SeedSplit: sum of the buckets' units + units in
// flight = database stock), then the reservations the database decided
// between the snapshot and the seed are closed (Finalize: a refusal gives
// its units back to its bucket, exactly once), and buckets of fence the
// split no longer uses are dropped. Called under the change lock token.
func (s *Syncer) splitLoad(ctx context.Context, sku sale.SKU, token string, fence []string) (WarmResult, error) {
	k := sku.BucketCount()
	names := stockgate.BucketNames(sku.ID, k)
	all := union(names, fence)
	unlock, err := s.fenceBuckets(ctx, sku.ID, token, all)
	if err != nil {
		return WarmResult{}, err
	}
	defer unlock()
	g, err := s.gather(ctx, sku.ID, all)
	if err != nil {
		return WarmResult{}, err
	}
	for b, ids := range g.decided {
		if err := s.forgetDecided(ctx, b, ids); err != nil {
			return WarmResult{}, err
		}
	}
	holdings := g.snap.Holdings
	if holdings == nil {
		holdings = map[string]int64{}
	}
	for _, r := range g.inflight {
		holdings[r.User] += r.Quantity
	}
	cfg := stockgate.ConfigOf(sku)
	cfg.Lock = token
	avail := g.snap.Stock - g.units
	if _, err := s.gate.SeedSplit(ctx, sku.ID, cfg, k, avail, holdings, g.inflight, releases(g.snap.Restores), g.snap.IdempotencyKeys, newEpoch()); err != nil {
		return WarmResult{}, err
	}
	if err := s.closeDecided(ctx, sku.ID, names); err != nil {
		return WarmResult{}, err
	}
	if dead := slices.DeleteFunc(slices.Clone(all), func(n string) bool { return slices.Contains(names, n) }); len(dead) > 0 {
		if err := s.gate.DropBuckets(ctx, dead); err != nil {
			return WarmResult{}, err
		}
	}
	s.log.Info("sale loaded into redis", "sku_id", sku.ID, "buckets", k, "available", avail, "in_flight", g.units)
	return WarmResult{SKU: sku.ID, Seeded: true, Available: avail, DBStock: g.snap.Stock, InFlight: g.units}, nil
}

// forgetDecided closes, in bucket name (unloaded: fenced or lost), the
// in-flight entries ids that the database had processed at the snapshot a
// seed is computed from: the seed counts their outcome from the database
// (a refusal's units available, its buyer's slot free) and only adds
// entries, so an entry left in place would give a refusal back a second
// time when the consumer's late Finalize, or closeDecided, closes it.
// Closed as applied, they can give nothing back, whatever happens to the
// bucket meanwhile; the consumer's Finalize then finds no entry. Each
// entry's closed marker is written as a Finalize writes it.
func (s *Syncer) forgetDecided(ctx context.Context, name string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	outs := make([]stockgate.Outcome, len(ids))
	for i, id := range ids {
		outs[i] = stockgate.Outcome{OrderID: id}
	}
	if _, err := s.gate.Finalize(ctx, name, outs); err != nil {
		return fmt.Errorf("closing the entries the database decided: %w", err)
	}
	return nil
}

// closeDecided closes, in each bucket, the reservations the database has
// decided (a seed re-recorded them from a snapshot taken before): as the
// consumer would have.
func (s *Syncer) closeDecided(ctx context.Context, id string, names []string) error {
	bs, err := s.gate.ReadBuckets(ctx, names, true)
	if err != nil {
		return err
	}
	var ids []string
	for _, b := range bs {
		for _, r := range b.Reservations {
			ids = append(ids, r.OrderID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	snap, err := s.store.Snapshot(ctx, id, ids)
	if err != nil {
		return err
	}
	for _, b := range bs {
		var outs []stockgate.Outcome
		for _, r := range b.Reservations {
			if st, done := snap.Processed[r.OrderID]; done {
				outs = append(outs, stockgate.Outcome{OrderID: r.OrderID, Refused: st == sale.StatusFailed})
			}
		}
		if _, err := s.gate.Finalize(ctx, b.Name, outs); err != nil {
			return err
		}
	}
	return nil
}

// loadedSplit reports a sale split in k > 1 buckets that Redis holds with
// that split, every bucket loaded: what a warm-up leaves alone.
func (s *Syncer) loadedSplit(ctx context.Context, sku sale.SKU) (WarmResult, bool, error) {
	bs, err := s.gate.ReadBuckets(ctx, stockgate.BucketNames(sku.ID, sku.BucketCount()), true)
	if err != nil {
		return WarmResult{}, false, err
	}
	r := WarmResult{SKU: sku.ID, DBStock: sku.Stock}
	for _, b := range bs {
		if !b.Loaded || b.Buckets != sku.BucketCount() {
			return WarmResult{}, false, nil
		}
		r.Available += b.Avail - b.Debt + b.Transit
		for _, res := range b.Reservations {
			r.InFlight += res.Quantity
		}
	}
	return r, true, nil
}

// putSplit is put for an existing sale split in buckets, before or after
// the change: every bucket is fenced, the change is checked against the
// units in flight (a reduction takes only units not in flight; a new
// number of buckets needs none in flight: sale.ErrBucketsInFlight), written
// to the database, and the sale is loaded again with its new split. On a
// refusal the sale is loaded again as it was.
func (s *Syncer) putSplit(ctx context.Context, token string, cur sale.SKU, c orderstore.SKUChange) (sale.SKU, error) {
	old := stockgate.BucketNames(cur.ID, cur.BucketCount())
	next := stockgate.BucketNames(cur.ID, max(c.Buckets, 1))
	all := union(old, next)
	unlock, err := s.fenceBuckets(ctx, cur.ID, token, all)
	if err != nil {
		return sale.SKU{}, err
	}
	reload := func(err error) (sale.SKU, error) {
		unlock()
		sku, serr := s.store.SKU(ctx, cur.ID)
		if serr == nil {
			_, serr = s.splitLoad(ctx, sku, token, all)
		}
		if serr != nil {
			return sale.SKU{}, fmt.Errorf("%w (and loading redis again failed, retry warmup: %v)", err, serr)
		}
		return sale.SKU{}, err
	}
	g, err := s.gather(ctx, cur.ID, all)
	if err != nil {
		return reload(err)
	}
	if max(c.Buckets, 1) != cur.BucketCount() && g.units > 0 {
		return reload(fmt.Errorf("%w: %d units in flight", sale.ErrBucketsInFlight, g.units))
	}
	if delta := c.TotalStock - cur.TotalStock; delta < 0 && g.snap.Stock-g.units < -delta {
		return reload(fmt.Errorf("%w: %d units not in flight, reduction of %d", sale.ErrStockConflict, g.snap.Stock-g.units, -delta))
	}
	sku, _, _, err := s.store.PutSKU(ctx, c)
	if err != nil {
		return reload(err)
	}
	unlock()
	if _, err := s.splitLoad(ctx, sku, token, all); err != nil {
		return sku, fmt.Errorf("saved, but loading redis failed (retry warmup): %w", err)
	}
	return sku, nil
}

// split reports whether sku is, in the database or in Redis, split in
// more than one bucket, and the number Redis holds it with.
func (s *Syncer) split(ctx context.Context, sku sale.SKU) (int, bool, error) {
	k, err := s.gate.Buckets(ctx, sku.ID)
	if err != nil {
		return 0, false, err
	}
	return k, k > 1 || sku.BucketCount() > 1, nil
}

// Repair brings a drifted sale back to the database's truth: a resync
// (Warm) for a sale in one bucket, a Rebuild for a split one (a resync
// cannot write several buckets at once).
func (s *Syncer) Repair(ctx context.Context, id string) (WarmResult, error) {
	sku, err := s.store.SKU(ctx, id)
	if err != nil {
		return WarmResult{}, err
	}
	if _, split, err := s.split(ctx, sku); err != nil {
		return WarmResult{}, err
	} else if split {
		return s.Rebuild(ctx, id)
	}
	return s.Warm(ctx, id)
}

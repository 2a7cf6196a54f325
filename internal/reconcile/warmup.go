// Package reconcile keeps Redis in step with the database of record: it
// loads sales into the gate (warm-up), re-synchronises them without
// re-selling units in flight, and applies admin stock changes to both sides
// in the order that can never oversell.
package reconcile

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// Store is the database side.
type Store interface {
	SKU(ctx context.Context, id string) (sale.SKU, error)
	PutSKU(ctx context.Context, c orderstore.SKUChange) (sale.SKU, int64, bool, error)
	Snapshot(ctx context.Context, sku string, ids []string) (orderstore.Snapshot, error)
	SeedSnapshot(ctx context.Context, sku string, ids []string) (orderstore.Snapshot, error)
	LockedSnapshot(ctx context.Context, sku string, read func(ctx context.Context) ([]string, error)) (orderstore.Snapshot, error)
}

// Queue finds reservations that may be in flight in the stream (not yet
// acknowledged by the consumer, or dead-lettered).
type Queue interface {
	Unapplied(ctx context.Context, sku string) ([]sale.Reservation, error)
}

// BulkQueue is a Queue that reads every SKU's in-flight reservations in
// one pass (one consumer, not one per SKU): RebuildAll uses it when the
// queue has it.
type BulkQueue interface {
	UnappliedAll(ctx context.Context) (map[string][]sale.Reservation, error)
}

// Gate is the Redis side.
type Gate interface {
	Seed(ctx context.Context, sku string, cfg stockgate.Config, available int64, holdings map[string]int64, inflight []sale.Reservation, released []stockgate.Release, idem map[string]string, epoch string) (bool, error)
	Register(ctx context.Context, sku string) error
	Fence(ctx context.Context, sku string) error
	ReadInFlight(ctx context.Context, sku string) (stockgate.InFlight, error)
	Resync(ctx context.Context, sku string, cfg stockgate.Config, f stockgate.InFlight, dbStock int64, processed map[string]bool, released []stockgate.Release) (int64, error)
	Adjust(ctx context.Context, sku string, cfg stockgate.Config, delta int64) (int64, error)
	LockSKU(ctx context.Context, sku, token string, ttl time.Duration) (bool, error)
	UnlockSKU(ctx context.Context, sku, token string) error
	BucketGate
}

// Timing of the SKU change lock (see lock).
const (
	// lockTTL bounds how long a dead instance's lock holds the others off.
	// A live holder that outlasts it (a database stalled for longer) is
	// fenced: its Redis writes are refused (stockgate.ErrLockLost).
	lockTTL = 30 * time.Second
	// lockWait is the longest a change waits for another instance's.
	lockWait = lockTTL + 5*time.Second
	// syncAttempts bounds the read-snapshot-write retries of a resync
	// whose units moved meanwhile (busy refusals and releases); the
	// reconciler comes back later.
	syncAttempts = 5
	// lockedReadTimeout bounds the Redis read a resync makes while the
	// database holds the SKU's stock row (LockedSnapshot).
	lockedReadTimeout = 2 * time.Second
)

// Syncer loads and re-synchronises sales between the database and Redis.
type Syncer struct {
	store Store
	gate  Gate
	queue Queue
	log   *slog.Logger

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// NewSyncer returns a Syncer. queue may be nil (then only Redis' own
// in-flight records count as in flight).
func NewSyncer(store Store, gate Gate, queue Queue, log *slog.Logger) *Syncer {
	return &Syncer{store: store, gate: gate, queue: queue, log: log, locks: map[string]*sync.Mutex{}}
}

// lock serialises the changes of one SKU that read the database and then
// write its units in Redis (warm-ups, resyncs, rebuilds, admin changes):
// within this process by a mutex, across every instance on the Redis prefix
// by the SKU's change lock in Redis (stockgate LockSKU), whose token the
// caller passes to every gate write (stockgate.Config.Lock) so that a
// holder that stalled past lockTTL cannot write over its successor. An
// instance that dies holding it delays the SKU's next change by at most
// lockTTL; what it left half done (a Redis reduction whose database half
// never committed: Redis shows fewer units) is an undersell the reconciler
// corrects. It returns the token and the function that releases both.
func (s *Syncer) lock(ctx context.Context, id string) (string, func(), error) {
	s.mu.Lock()
	l, ok := s.locks[id]
	if !ok {
		l = &sync.Mutex{}
		s.locks[id] = l
	}
	s.mu.Unlock()
	l.Lock()
	token := newEpoch()
	wait := time.NewTimer(lockWait)
	defer wait.Stop()
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		ok, err := s.gate.LockSKU(ctx, id, token, lockTTL)
		if err != nil {
			l.Unlock()
			return "", nil, fmt.Errorf("sku %s change lock: %w", id, err)
		}
		if ok {
			break
		}
		err = fmt.Errorf("%w: another instance is changing sku %s", sale.ErrUnavailable, id)
		select {
		case <-ctx.Done():
			l.Unlock()
			return "", nil, fmt.Errorf("sku %s change lock: %w (%w)", id, ctx.Err(), err)
		case <-wait.C:
			l.Unlock()
			return "", nil, err
		case <-time.After(delay):
		}
	}
	return token, func() {
		if err := s.gate.UnlockSKU(context.WithoutCancel(ctx), id, token); err != nil {
			s.log.Warn("sku change lock: release (it expires)", "sku_id", id, "err", err)
		}
		l.Unlock()
	}, nil
}

// WarmResult says what Warm did.
type WarmResult struct {
	SKU    string `json:"sku_id"`
	Seeded bool   `json:"seeded"` // Redis did not hold the sale and was loaded from scratch
	// Available is what the gate may sell, net of its debt: negative when
	// fewer units are in the database than in flight (see stockgate restore.lua).
	Available int64 `json:"available"`
	DBStock   int64 `json:"db_stock"`
	InFlight  int64 `json:"in_flight"`
}

// Warm loads sku into Redis from the database, or re-synchronises it if Redis
// already holds it: available = database stock - units in flight (reserved
// in Redis, not yet applied in the database). It never re-sells units in
// flight; a reservation racing with it can only make Redis show fewer units
// for a moment. Errors wrap sale.ErrUnknownSKU when the SKU does not exist.
func (s *Syncer) Warm(ctx context.Context, id string) (WarmResult, error) {
	token, unlock, err := s.lock(ctx, id)
	if err != nil {
		return WarmResult{}, err
	}
	defer unlock()
	return s.warm(ctx, id, token)
}

// Rebuild unloads sku from Redis (the gate refuses it meanwhile) and loads it
// again from the database: for a Redis that lost or may have lost writes,
// and after the database fallback sold while Redis was out. Buyers' holdings
// are rebuilt from live orders plus reservations in flight.
func (s *Syncer) Rebuild(ctx context.Context, id string) (WarmResult, error) {
	return s.rebuild(ctx, id, nil)
}

// rebuildWorkers bounds the SKUs RebuildAll rebuilds at once (each holds a
// database connection for its snapshots).
const rebuildWorkers = 8

// RebuildAll rebuilds every SKU of ids (see Rebuild), rebuildWorkers at a
// time. The stream's in-flight reservations are read once for all of them
// when the queue is a BulkQueue: the read comes after the loss it repairs
// (the caller noticed it), every reservation accepted later is in Redis'
// own records, and one applied since the read is in the database snapshot
// each SKU reads afterwards, so no reservation is missed or counted twice.
// It returns the results of the SKUs rebuilt and the errors of the others,
// joined.
func (s *Syncer) RebuildAll(ctx context.Context, ids []string) ([]WarmResult, error) {
	var pre map[string][]sale.Reservation
	if bq, ok := s.queue.(BulkQueue); ok {
		var err error
		if pre, err = bq.UnappliedAll(ctx); err != nil {
			return nil, fmt.Errorf("reading the stream's in-flight reservations: %w", err)
		}
		if pre == nil {
			pre = map[string][]sale.Reservation{}
		}
	}
	var (
		mu   sync.Mutex
		out  []WarmResult
		errs []error
		wg   sync.WaitGroup
		next = make(chan string)
	)
	for range min(rebuildWorkers, len(ids)) {
		wg.Go(func() {
			for id := range next {
				r, err := s.rebuild(ctx, id, pre)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", id, err))
				} else {
					out = append(out, r)
				}
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return out, errors.Join(errs...)
}

// rebuild is Rebuild with the stream's in-flight reservations of every SKU
// already read (pre; nil: read this SKU's from the queue).
func (s *Syncer) rebuild(ctx context.Context, id string, pre map[string][]sale.Reservation) (WarmResult, error) {
	token, unlock, err := s.lock(ctx, id)
	if err != nil {
		return WarmResult{}, err
	}
	defer unlock()
	sku, err := s.store.SKU(ctx, id)
	if err != nil {
		return WarmResult{}, err
	}
	if k, split, err := s.split(ctx, sku); err != nil {
		return WarmResult{}, err
	} else if split {
		return s.splitLoad(ctx, sku, token, stockgate.BucketNames(id, k))
	}
	if err := s.gate.Fence(ctx, id); err != nil {
		return WarmResult{}, err
	}
	return s.warmWith(ctx, id, token, pre)
}

// warm loads or resyncs id under the change lock token. A resync whose
// units moved (or whose SKU was re-seeded) since its in-flight read is
// retried from the read, up to syncAttempts times; then it gives up with an
// error wrapping stockgate.ErrMoved, having written nothing.
func (s *Syncer) warm(ctx context.Context, id, token string) (WarmResult, error) {
	return s.warmWith(ctx, id, token, nil)
}

func (s *Syncer) warmWith(ctx context.Context, id, token string, pre map[string][]sale.Reservation) (WarmResult, error) {
	for attempt := 1; ; attempt++ {
		r, err := s.warmOnce(ctx, id, token, pre)
		if !errors.Is(err, stockgate.ErrReseeded) && !errors.Is(err, stockgate.ErrMoved) {
			return r, err
		}
		if attempt == syncAttempts {
			return r, fmt.Errorf("resync of %s: gave up after %d attempts: %w", id, attempt, err)
		}
	}
}

func (s *Syncer) warmOnce(ctx context.Context, id, token string, pre map[string][]sale.Reservation) (WarmResult, error) {
	// Re-register every time: the relay and the janitor work from this list.
	if err := s.gate.Register(ctx, id); err != nil {
		return WarmResult{}, err
	}
	sku, err := s.store.SKU(ctx, id)
	if err != nil {
		return WarmResult{}, err
	}
	if k, split, err := s.split(ctx, sku); err != nil {
		return WarmResult{}, err
	} else if split {
		// A split sale loaded as the database says is left alone (a
		// repair is a Rebuild); otherwise it is loaded anew.
		if r, ok, err := s.loadedSplit(ctx, sku); err != nil || ok {
			return r, err
		}
		return s.splitLoad(ctx, sku, token, stockgate.BucketNames(id, k))
	}
	cfg := stockgate.ConfigOf(sku)
	cfg.Lock = token
	f, err := s.gate.ReadInFlight(ctx, id)
	if err != nil {
		return WarmResult{}, err
	}
	if !f.Loaded {
		res, seeded, err := s.seed(ctx, sku, cfg, f, pre)
		if err != nil {
			return WarmResult{}, err
		}
		if seeded {
			s.log.Info("sale loaded into redis", "sku_id", id, "available", res.Available, "in_flight", res.InFlight)
		}
		// Close what was applied between the reads and the seed (or resync
		// what another instance seeded meanwhile).
		r2, err := s.resync(ctx, id, cfg)
		r2.Seeded = seeded
		return r2, err
	}
	return s.resync(ctx, id, cfg)
}

// seed loads an unloaded SKU. In flight are the reservations Redis still
// records and those the stream holds unacknowledged or dead-lettered, less
// those the database has processed.
func (s *Syncer) seed(ctx context.Context, sku sale.SKU, cfg stockgate.Config, f stockgate.InFlight, pre map[string][]sale.Reservation) (WarmResult, bool, error) {
	cand := map[string]sale.Reservation{}
	for _, r := range f.Reservations {
		cand[r.OrderID] = r
	}
	if pre != nil {
		for _, r := range pre[sku.ID] {
			cand[r.OrderID] = r
		}
	} else if s.queue != nil {
		more, err := s.queue.Unapplied(ctx, sku.ID)
		if err != nil {
			return WarmResult{}, false, fmt.Errorf("reading the stream's in-flight reservations: %w", err)
		}
		for _, r := range more {
			cand[r.OrderID] = r
		}
	}
	ids := make([]string, 0, len(cand))
	for id := range cand {
		ids = append(ids, id)
	}
	// Holdings and keys come from the same snapshot as the stock: a release
	// between two reads would otherwise be counted in one and not the other.
	snap, err := s.store.SeedSnapshot(ctx, sku.ID, ids)
	if err != nil {
		return WarmResult{}, false, err
	}
	stock, processed, restores, holdings := snap.Stock, snap.Processed, snap.Restores, snap.Holdings
	var decided []string
	for _, r := range f.Reservations {
		if _, done := processed[r.OrderID]; done {
			decided = append(decided, r.OrderID)
		}
	}
	if err := s.forgetDecided(ctx, sku.ID, decided); err != nil {
		return WarmResult{}, false, err
	}
	var inflight []sale.Reservation
	var units int64
	for id, r := range cand {
		if _, done := processed[id]; done {
			continue
		}
		inflight = append(inflight, r)
		units += r.Quantity
		holdings[r.User] += r.Quantity
	}
	// Oldest first: of two in flight with one Idempotency-Key (made before
	// the database refused doubles), the gate names the first.
	slices.SortFunc(inflight, func(a, b sale.Reservation) int {
		return cmp.Or(cmp.Compare(a.AcceptedAt, b.AcceptedAt), cmp.Compare(a.OrderID, b.OrderID))
	})
	// Negative when a decrement made outside the gate left fewer units than
	// are in flight: the gate records the shortfall as debt.
	avail := stock - units
	seeded, err := s.gate.Seed(ctx, sku.ID, cfg, avail, holdings, inflight, releases(restores), snap.IdempotencyKeys, newEpoch())
	if err != nil {
		return WarmResult{}, false, err
	}
	return WarmResult{SKU: sku.ID, Seeded: seeded, Available: avail, DBStock: stock, InFlight: units}, seeded, nil
}

// resync re-synchronises a loaded SKU: it reads Redis' reservations in
// flight while the database holds the SKU's stock still (LockedSnapshot),
// so that a unit reserved after the read cannot also be in the snapshot's
// stock (Resync counts it as reserved since the read: it would be taken
// twice, and stay out of Redis for good).
func (s *Syncer) resync(ctx context.Context, id string, cfg stockgate.Config) (WarmResult, error) {
	var f stockgate.InFlight
	snap, err := s.store.LockedSnapshot(ctx, id, func(ctx context.Context) ([]string, error) {
		// Bounded well below the writers' lock wait (5 s): a stalled Redis
		// fails this resync, not the applies and releases of the SKU.
		ctx, cancel := context.WithTimeout(ctx, lockedReadTimeout)
		defer cancel()
		var err error
		if f, err = s.gate.ReadInFlight(ctx, id); err != nil {
			return nil, err
		}
		ids := make([]string, len(f.Reservations))
		for i, r := range f.Reservations {
			ids[i] = r.OrderID
		}
		return ids, nil
	})
	if err != nil {
		return WarmResult{}, err
	}
	stock, processed, restores := snap.Stock, snap.Processed, snap.Restores
	refused := make(map[string]bool, len(processed))
	var flying int64
	for _, r := range f.Reservations {
		st, done := processed[r.OrderID]
		if !done {
			flying += r.Quantity
			continue
		}
		refused[r.OrderID] = st == sale.StatusFailed
	}
	avail, err := s.gate.Resync(ctx, id, cfg, f, stock, refused, releases(restores))
	if err != nil {
		return WarmResult{}, err
	}
	return WarmResult{SKU: id, Available: avail, DBStock: stock, InFlight: flying}, nil
}

// Put creates or changes a sale. TotalStock is the sale's allocation: a
// change adds the difference to the database stock and to Redis' available
// units. A reduction is taken from Redis first, and only from units not
// reserved, so no buyer who was accepted loses their unit; it fails with
// sale.ErrStockConflict when too few units are left.
func (s *Syncer) Put(ctx context.Context, c orderstore.SKUChange) (sale.SKU, bool, error) {
	// One change of a SKU at a time across every instance, and never during
	// its warm-up or rebuild: a resync whose snapshot fell between the
	// database and the Redis half of a change would lose or double the
	// delta, and a reduction whose first half ran against another change's
	// total could not take the rest from Redis.
	token, unlock, err := s.lock(ctx, c.ID)
	if err != nil {
		return sale.SKU{}, false, err
	}
	defer unlock()
	return s.put(ctx, token, c)
}

// SKU returns the sale as the database has it (allocation, stock, limit,
// window). An absent SKU gives an error wrapping sale.ErrUnknownSKU.
func (s *Syncer) SKU(ctx context.Context, id string) (sale.SKU, error) {
	return s.store.SKU(ctx, id)
}

// Patch changes an existing sale: change gets the sale as the database has
// it now and returns its new description, which is then applied as by Put,
// all under the SKU's change lock. So a change computed from the current
// values (a restock by a delta, one field replaced) is exact whatever Puts,
// Patches or sales race with it: no other change of the SKU's allocation
// or settings can fall between the read and the write. An absent SKU gives
// an error wrapping sale.ErrUnknownSKU; an error from change is returned
// as it is, with nothing changed. A change equal to the sale writes nothing.
func (s *Syncer) Patch(ctx context.Context, id string, change func(cur sale.SKU) (orderstore.SKUChange, error)) (sale.SKU, error) {
	token, unlock, err := s.lock(ctx, id)
	if err != nil {
		return sale.SKU{}, err
	}
	defer unlock()
	cur, err := s.store.SKU(ctx, id)
	if err != nil {
		return sale.SKU{}, err
	}
	c, err := change(cur)
	if err != nil {
		return sale.SKU{}, err
	}
	c.ID = id
	if c.TotalStock == cur.TotalStock && c.PerUserLimit == cur.PerUserLimit && c.StartsAt.Equal(cur.StartsAt) && c.EndsAt.Equal(cur.EndsAt) &&
		max(c.Buckets, 1) == cur.BucketCount() && c.Crowd.Equal(cur.Crowd) && c.Tag == cur.Tag {
		// Nothing to change in the database. A re-split saved there whose
		// Redis side did not finish (its answer was a 503, "retry") is
		// finished by the retry: Redis is loaded into the saved buckets.
		if k, err := s.gate.Buckets(ctx, id); err == nil && k != cur.BucketCount() {
			if _, err := s.splitLoad(ctx, cur, token, stockgate.BucketNames(id, k)); err != nil {
				return sale.SKU{}, err
			}
		}
		return cur, nil // no write, no audit row
	}
	sku, _, err := s.put(ctx, token, c)
	return sku, err
}

// put is Put under the change lock held with token.
func (s *Syncer) put(ctx context.Context, token string, c orderstore.SKUChange) (sale.SKU, bool, error) {
	cfg := stockgate.Config{PerUserLimit: c.PerUserLimit, StartsAt: c.StartsAt, EndsAt: c.EndsAt, Lock: token}
	cur, err := s.store.SKU(ctx, c.ID)
	exists := err == nil
	if err != nil && !errors.Is(err, sale.ErrUnknownSKU) {
		return sale.SKU{}, false, err
	}
	if exists && (cur.BucketCount() > 1 || max(c.Buckets, 1) > 1) {
		sku, err := s.putSplit(ctx, token, cur, c)
		return sku, false, err
	}
	var takenFromRedis int64
	redisLoaded := true
	if exists && c.TotalStock < cur.TotalStock {
		delta := c.TotalStock - cur.TotalStock
		_, err := s.gate.Adjust(ctx, c.ID, cfg, delta)
		switch {
		case err == nil:
			takenFromRedis = delta
		case errors.Is(err, sale.ErrNotWarmed):
			// Redis does not hold the sale (being rebuilt, or lost): the
			// units in flight are not known here, and the database stock
			// still counts them. Refuse rather than take a promised unit.
			return sale.SKU{}, false, fmt.Errorf("%w (%w): warm it up, then reduce", sale.ErrUnavailable, sale.ErrNotWarmed)
		default:
			return sale.SKU{}, false, err
		}
	}
	sku, delta, created, err := s.store.PutSKU(ctx, c)
	if err != nil {
		if takenFromRedis != 0 {
			back := stockgate.ConfigOf(cur)
			back.Lock = token
			if _, gerr := s.gate.Adjust(ctx, c.ID, back, -takenFromRedis); gerr != nil {
				s.log.Error("admin: could not give back units taken from redis; reconcile will", "sku_id", c.ID, "units", -takenFromRedis, "err", gerr)
			}
		}
		return sale.SKU{}, false, err
	}
	if created || !redisLoaded {
		if _, err := s.warm(ctx, c.ID, token); err != nil {
			return sku, created, fmt.Errorf("saved, but loading redis failed (retry warmup): %w", err)
		}
		return sku, created, nil
	}
	// Apply the rest of the change (a restock, a concurrent admin's change,
	// or only the settings) to Redis.
	if _, err := s.gate.Adjust(ctx, c.ID, cfg, delta-takenFromRedis); err != nil {
		if errors.Is(err, sale.ErrNotWarmed) {
			_, err = s.warm(ctx, c.ID, token)
		}
		if err != nil {
			return sku, false, fmt.Errorf("saved, but updating redis failed (retry warmup): %w", err)
		}
	}
	return sku, false, nil
}

func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// releases converts the restores a database snapshot shows pending.
func releases(rs []orderstore.Restore) []stockgate.Release {
	out := make([]stockgate.Release, len(rs))
	for i, r := range rs {
		out[i] = stockgate.Release{OrderID: r.OrderID, User: r.User, Quantity: r.Quantity}
	}
	return out
}

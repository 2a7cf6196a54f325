package stockgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// Config is the sale configuration the gate enforces.
type Config struct {
	PerUserLimit     int64
	StartsAt, EndsAt time.Time
	// Lock is the token of the SKU's change lock (LockSKU) the caller
	// holds, or "" for none. Seed, Resync and Adjust given a token write
	// only while that token still holds the lock (fencing): a holder whose
	// lock expired gets ErrLockLost and changes nothing.
	Lock string
}

// ConfigOf returns the gate configuration of s.
func ConfigOf(s sale.SKU) Config {
	return Config{PerUserLimit: s.PerUserLimit, StartsAt: s.StartsAt, EndsAt: s.EndsAt}
}

func ms(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

// Seed loads a SKU that Redis does not hold: available units,
// configuration, the buyers' holdings (user -> units of live orders and of
// reservations in flight) and the reservations in flight (recorded again so
// that their outcome can still be closed exactly once). It returns false and
// changes nothing if the SKU is already loaded (use Resync then). idem maps
// user NUL Idempotency-Key to the order it made, so that a retry after a
// reload still returns the same order.
//
// A large sale is written in chunks of about SeedChunk entries per script
// call (Redis serves other calls between them); the SKU stays unloaded,
// refused by the gate, until the last chunk marks it loaded.
//
// With SetSeedLease a sale that has sold (buyers holding units, keys,
// reservations in flight or releases) starts with a sold-out lease: only
// a sale that sold out can have been leased. A new sale, and a bucket of a
// split sale (SeedSplit), start without one.
func (g *Gate) Seed(ctx context.Context, sku string, cfg Config, available int64, holdings map[string]int64, inflight []sale.Reservation, released []Release, idem map[string]string, epoch string) (bool, error) {
	var lease int64
	if len(holdings) > 0 || len(inflight) > 0 || len(released) > 0 || len(idem) > 0 {
		lease = g.seedLease.Load()
	}
	return g.seedLeased(ctx, sku, cfg, available, holdings, inflight, released, idem, epoch, lease)
}

// seedLeased is Seed with a sold-out lease of leaseMs (0: none).
func (g *Gate) seedLeased(ctx context.Context, sku string, cfg Config, available int64, holdings map[string]int64, inflight []sale.Reservation, released []Release, idem map[string]string, epoch string, leaseMs int64) (bool, error) {
	k := g.KeysOf(sku)
	var chunks []seedChunk
	cur := &seedChunk{}
	next := func() {
		if cur.entries >= SeedChunk {
			chunks = append(chunks, *cur)
			cur = &seedChunk{}
		}
	}
	// Holdings, releases and keys first, then reservations oldest first
	// (the order seed.lua records their keys in), each kind in its own
	// section of a chunk.
	for _, u := range slices.Sorted(maps.Keys(holdings)) {
		next()
		cur.buyers = append(cur.buyers, u, strconv.FormatInt(holdings[u], 10))
		cur.entries++
	}
	for _, r := range released {
		next()
		cur.rel = append(cur.rel, r.OrderID)
		cur.entries++
	}
	for _, key := range slices.Sorted(maps.Keys(idem)) {
		next()
		cur.idem = append(cur.idem, key, idem[key])
		cur.entries++
	}
	for _, r := range inflight {
		b, err := json.Marshal(r)
		if err != nil {
			return false, err
		}
		next()
		cur.res = append(cur.res, r.OrderID, string(b))
		cur.entries++
	}
	chunks = append(chunks, *cur)
	token := epoch + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var n int64
	for i, c := range chunks {
		phase := "m"
		switch {
		case len(chunks) == 1:
			phase = "o"
		case i == 0:
			phase = "f"
		case i == len(chunks)-1:
			phase = "l"
		}
		args := make([]string, 0, 12+len(c.buyers)+len(c.rel)+len(c.idem)+len(c.res))
		args = append(args, strconv.FormatInt(available, 10), strconv.FormatInt(cfg.PerUserLimit, 10), ms(cfg.StartsAt), ms(cfg.EndsAt), epoch,
			strconv.Itoa(len(c.buyers)/2), strconv.Itoa(len(c.rel)), strconv.Itoa(len(c.idem)/2), cfg.Lock, token, phase,
			strconv.FormatInt(leaseMs, 10))
		args = append(append(append(append(args, c.buyers...), c.rel...), c.idem...), c.res...)
		err := afterLease(ctx, func() (int64, error) {
			var err error
			n, err = g.seed.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Res, k.Rel, k.Idem, k.Lock}, args).AsInt64()
			if err != nil || n > -1000000 {
				return 0, err
			}
			// The first chunk met a live sold-out lease: it ends in
			// -1,000,000 - n ms (see soldlease.lua).
			return -1000000 - n, nil
		})
		if err != nil {
			return false, fmt.Errorf("stockgate: seed: %w", err)
		}
		switch n {
		case -5:
			return false, ErrLockLost
		case -6:
			return false, ErrSeedTakenOver
		case 0:
			return false, nil // loaded meanwhile (another instance's seed)
		}
		if afterSeedChunk != nil && i < len(chunks)-1 {
			afterSeedChunk(i)
		}
	}
	if n == 1 {
		if err := g.Register(ctx, sku); err != nil {
			return true, fmt.Errorf("stockgate: register: %w", err)
		}
	}
	return n == 1, nil
}

// SeedChunk is about how many entries (buyers, releases, keys, reservations)
// one seed script call writes.
var SeedChunk = 1000

// afterSeedChunk, if set (tests), is called after each chunk but the last.
var afterSeedChunk func(i int)

// seedChunk is one seed.lua call's share of a load.
type seedChunk struct {
	buyers, rel, idem, res []string
	entries                int
}

// ErrSeedTakenOver is returned by Seed when another load of the SKU started
// while this one was writing its chunks: this one stops, the other goes on.
var ErrSeedTakenOver = errors.New("stockgate: another seed of the sku took over")

// Fence unloads sku: the gate refuses it (sale.ErrNotWarmed) until Seed
// loads it again. In-flight entries and the reserved counter are kept.
func (g *Gate) Fence(ctx context.Context, sku string) error {
	if err := g.fence.Exec(ctx, g.c, []string{g.KeysOf(sku).Meta}, nil).Error(); err != nil {
		return fmt.Errorf("stockgate: fence: %w", err)
	}
	return nil
}

// Resync sets a loaded SKU's available units from a database snapshot taken
// after f was read, with the SKU's stock row locked from before the read
// until the snapshot (orderstore's LockedSnapshot: a unit reserved after the
// read must not be in dbStock, as it is also counted below as reserved
// since the read): available = dbStock - (units of f not processed) -
// (units reserved since f was read). processed maps the ids of f the database
// has decided to true when refused; those entries are closed here. released
// are the releases whose Redis restore the snapshot shows pending: dbStock
// includes their units, so they are marked restored (buyer slot given back)
// and a later Restore of them does nothing.
// It returns the units the gate may now sell net of its debt (negative when
// the database has fewer units than are in flight), or sale.ErrNotWarmed
// when the SKU is not loaded.
func (g *Gate) Resync(ctx context.Context, sku string, cfg Config, f InFlight, dbStock int64, processed map[string]bool, released []Release) (int64, error) {
	var pending int64
	args := []string{strconv.FormatInt(dbStock, 10), strconv.FormatInt(f.Reserved, 10), "",
		strconv.FormatInt(cfg.PerUserLimit, 10), ms(cfg.StartsAt), ms(cfg.EndsAt), "", f.Epoch,
		strconv.FormatInt(f.Moves, 10), cfg.Lock}
	nproc := 0
	for _, r := range f.Reservations {
		refused, done := processed[r.OrderID]
		if !done {
			pending += r.Quantity
			continue
		}
		flag := "a"
		if refused {
			flag = "f"
		}
		args = append(args, r.OrderID, flag)
		nproc++
	}
	args[2], args[6] = strconv.FormatInt(pending, 10), strconv.Itoa(nproc)
	for _, r := range released {
		args = append(args, r.OrderID, r.User, strconv.FormatInt(r.Quantity, 10))
	}
	k := g.KeysOf(sku)
	vals, err := g.resync.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Res, k.Outbox, k.Rel, k.Idem, k.Lock, k.Closed}, args).AsIntSlice()
	if err != nil {
		return 0, fmt.Errorf("stockgate: resync: %w", err)
	}
	switch vals[0] {
	case -2:
		return 0, sale.ErrNotWarmed
	case -3:
		return 0, ErrReseeded
	case -4:
		return 0, ErrMoved
	case -5:
		return 0, ErrLockLost
	}
	return vals[0] - vals[1], nil // available net of debt
}

// ErrReseeded is returned by Resync when the SKU was loaded again (a rebuild,
// a Redis that lost its data) after the in-flight read it was given: read
// again and retry.
var ErrReseeded = errors.New("stockgate: sku re-seeded since the in-flight read")

// ErrMoved is returned by Resync when units moved in Redis since the
// in-flight read it was given (a refusal or release given back, a debit of
// a fallback sale or of an outside decrement, an admin change): the
// database snapshot may not include the move, or include it twice. Nothing
// was written: read again and retry.
var ErrMoved = errors.New("stockgate: units moved since the in-flight read")

// ErrLockLost is returned by Seed, Resync and Adjust when the change lock
// token the caller passed no longer holds the SKU's lock (it expired, or
// another instance took it over): nothing was written.
var ErrLockLost = errors.New("stockgate: the sku's change lock is no longer held")

// Adjust changes a loaded SKU's available units by delta and sets its
// configuration. A reduction larger than the units available is refused with
// sale.ErrStockConflict (units already reserved are never taken back);
// sale.ErrNotWarmed when the SKU is not loaded.
func (g *Gate) Adjust(ctx context.Context, sku string, cfg Config, delta int64) (int64, error) {
	k := g.KeysOf(sku)
	vals, err := g.adjust.Exec(ctx, g.c, []string{k.Meta, k.Lock},
		[]string{strconv.FormatInt(delta, 10), strconv.FormatInt(cfg.PerUserLimit, 10), ms(cfg.StartsAt), ms(cfg.EndsAt), cfg.Lock},
	).AsIntSlice()
	if err != nil {
		return 0, fmt.Errorf("stockgate: adjust: %w", err)
	}
	switch vals[0] {
	case -5:
		return 0, ErrLockLost
	case -2:
		return 0, sale.ErrNotWarmed
	case 0:
		return vals[1], fmt.Errorf("%w: %d units available in redis, reduction of %d", sale.ErrStockConflict, vals[1], -delta)
	}
	return vals[1], nil
}

// Expire drops the keys of sku if its sale ended more than retention before
// now and nothing of it is in flight, and unregisters it. It reports whether
// the keys were dropped. A sale without an end is never dropped.
func (g *Gate) Expire(ctx context.Context, sku string, now time.Time, retention time.Duration) (bool, error) {
	k := g.KeysOf(sku)
	n, err := g.expire.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Res, k.Outbox, k.Idem, k.Rel, g.acceptedKey(sku), k.Closed},
		[]string{strconv.FormatInt(now.UnixMilli(), 10), strconv.FormatInt(retention.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("stockgate: expire: %w", err)
	}
	if n == 1 {
		for _, key := range []string{g.xferKey(sku), g.xinKey(sku), k.Journal, g.shadowsKey(sku)} {
			if err := g.c.Do(ctx, g.c.B().Del().Key(key).Build()).Error(); err != nil {
				return true, err
			}
		}
		if err := g.c.Do(ctx, g.c.B().Srem().Key(g.registry()).Member(sku).Build()).Error(); err != nil {
			return n == 1, err
		}
	}
	return n == 1, nil
}

// Release is a released order (cancelled or expired) whose units and buyer
// slot the gate gives back.
type Release struct {
	OrderID  string
	User     string
	Quantity int64
	// IdempotencyKey is set on a direct sale's debit (Quantity < 0) whose
	// order carries a key: Restore records that the key made KeyOrderID.
	IdempotencyKey string
	KeyOrderID     string
}

// Restore gives released orders' units and buyer slots back, once per order
// id however often it is called. It returns the units given back now, or
// sale.ErrNotWarmed when the SKU is not loaded (a rebuild then counts the
// releases from the database; call again after it). A release with no order
// id or zero units fails the whole call with sale.ErrInvalid, nothing written.
func (g *Gate) Restore(ctx context.Context, sku string, rs []Release) (int64, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	for _, r := range rs {
		if r.OrderID == "" || r.Quantity == 0 {
			return 0, fmt.Errorf("%w: restore of order %q with %d units", sale.ErrInvalid, r.OrderID, r.Quantity)
		}
	}
	k, err := g.Buckets(ctx, sku)
	if err != nil {
		return 0, fmt.Errorf("stockgate: restore: %w", err)
	}
	if k > 1 {
		return g.restoreBuckets(ctx, sku, rs, k)
	}
	return g.restoreIn(ctx, sku, rs)
}

// restoreIn is Restore in one bucket.
func (g *Gate) restoreIn(ctx context.Context, sku string, rs []Release) (int64, error) {
	args := make([]string, 0, 3*len(rs))
	for _, r := range rs {
		if r.OrderID == "" || r.Quantity == 0 {
			return 0, fmt.Errorf("%w: restore of order %q with %d units", sale.ErrInvalid, r.OrderID, r.Quantity)
		}
		args = append(args, r.OrderID, r.User, strconv.FormatInt(r.Quantity, 10))
	}
	// A direct sale's key made its order: a retry through the gate of any
	// instance is answered with it. Recorded by the script (on every call,
	// also when the units were taken by an earlier one), which waits for a
	// live sold-out lease to end before it adds a key.
	keys := []string{"0"}
	for _, r := range rs {
		if r.IdempotencyKey != "" && r.KeyOrderID != "" {
			keys = append(keys, r.User+"\x00"+r.IdempotencyKey, r.KeyOrderID)
		}
	}
	keys[0] = strconv.Itoa((len(keys) - 1) / 2)
	args = append(keys, args...)
	k := g.KeysOf(sku)
	var vals []int64
	err := afterLease(ctx, func() (int64, error) {
		var err error
		vals, err = g.restore.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Rel, k.Idem}, args).AsIntSlice()
		if err != nil || vals[0] != -3 {
			return 0, err
		}
		return vals[1], nil // a key to add meets a live sold-out lease
	})
	if err != nil {
		return 0, fmt.Errorf("stockgate: restore: %w", err)
	}
	if vals[0] == -2 {
		return 0, sale.ErrNotWarmed
	}
	return vals[1], nil
}

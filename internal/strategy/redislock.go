package strategy

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

var (
	//go:embed lock.lua
	lockLua string
	//go:embed unlock.lua
	unlockLua string
	//go:embed raise.lua
	raiseLua string
)

// FencedStore is what RedisLock needs of the database.
type FencedStore interface {
	// BuyFenced sells r if no change of the row carried a token >= token
	// (else an error wrapping orderstore.ErrStaleFence, nothing written).
	BuyFenced(ctx context.Context, r sale.Reservation, now time.Time, token int64) (sale.Order, bool, error)
	// Fence returns the highest token that changed the SKU's row.
	Fence(ctx context.Context, sku string) (int64, error)
}

// LockConfig tunes RedisLock. Zero values take the defaults.
type LockConfig struct {
	// TTL is how long a taken lock lives unless released (default 2s). A
	// holder slower than that may lose it; the fence keeps that harmless.
	TTL time.Duration
	// Wait bounds how long one purchase waits for the lock (default 3s);
	// then it fails with sale.ErrBusy.
	Wait time.Duration
}

// counterKeep is how long an unused token counter is kept in Redis. A lost
// counter is repaired from the database (raise.lua), so this only bounds
// the keys a finished sale leaves behind.
const counterKeep = 24 * time.Hour

// RedisLock is the redis-lock strategy: each purchase of a SKU takes a
// per-SKU Redis lock (SET NX PX) with a fencing token (INCR), sells from the
// database with BuyFenced, and releases the lock. The database refuses a
// token not above the last one that changed the row, so a holder whose lock
// expired cannot write after its successor; a refusal takes the lock again.
// Correctness rests on the database (stock guard, limit read under the row
// lock), never on the lock: the lock only serialises the buyers.
//
// Buyers of one SKU in this process queue in memory and only the head of
// the queue contends in Redis (with a jittered back-off against other
// instances), as a lock client that waits on notifications would: a
// thousand goroutines polling Redis would measure the polling, not the
// strategy. Keys: <prefix>:{sku}:lock and <prefix>:{sku}:fence (the SKU's
// hash tag, one Redis Cluster slot). Safe for concurrent use.
type RedisLock struct {
	c      rueidis.Client
	prefix string
	store  FencedStore
	cfg    LockConfig
	lock   *rueidis.Lua
	unlock *rueidis.Lua
	raise  *rueidis.Lua
	local  sync.Map // sku -> chan struct{} (capacity 1): the in-process queue
}

// NewRedisLock returns the redis-lock strategy on client c (keys under prefix).
func NewRedisLock(c rueidis.Client, prefix string, store FencedStore, cfg LockConfig) *RedisLock {
	if cfg.TTL <= 0 {
		cfg.TTL = 2 * time.Second
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 3 * time.Second
	}
	return &RedisLock{c: c, prefix: prefix, store: store, cfg: cfg,
		lock: rueidis.NewLuaScript(lockLua), unlock: rueidis.NewLuaScript(unlockLua), raise: rueidis.NewLuaScript(raiseLua)}
}

// LockKeys returns the lock and token counter keys of sku.
func (l *RedisLock) LockKeys(sku string) (lock, fence string) {
	base := l.prefix + ":{" + sku + "}:"
	return base + "lock", base + "fence"
}

// maxStaleRetries bounds how often one purchase takes the lock again after
// the database refused its token.
const maxStaleRetries = 3

// BuyDirect sells r under the SKU's lock (purchase.DirectBuyer). Errors:
// those of orderstore.BuyDirect; sale.ErrBusy when the lock was not had
// within the configured wait (or the token was refused too often); Redis
// errors as they are (nothing was sold: the database was not reached).
func (l *RedisLock) BuyDirect(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error) {
	wctx, cancel := context.WithTimeout(ctx, l.cfg.Wait)
	defer cancel()
	q := l.queue(r.SKU)
	select {
	case q <- struct{}{}:
	case <-wctx.Done():
		return sale.Order{}, false, l.busy(ctx, r, "waiting in this instance")
	}
	defer func() { <-q }()

	lockKey, fenceKey := l.LockKeys(r.SKU)
	for stale := 0; ; stale++ {
		owner := r.OrderID + ":" + nonce()
		token, err := l.take(wctx, lockKey, fenceKey, owner)
		if err != nil {
			// The wait ran out: wctx is done, or the client saw its deadline
			// pass first (rueidis answers DeadlineExceeded from the deadline,
			// a moment before the context's own timer fires).
			if (wctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)) && ctx.Err() == nil {
				return sale.Order{}, false, l.busy(ctx, r, "waiting for the redis lock")
			}
			return sale.Order{}, false, err
		}
		o, dup, err := l.store.BuyFenced(ctx, r, now, token)
		l.release(ctx, lockKey, owner)
		if !errors.Is(err, orderstore.ErrStaleFence) {
			return o, dup, err
		}
		if stale == maxStaleRetries {
			return sale.Order{}, false, fmt.Errorf("strategy: redis-lock %s: %w: lock token refused %d times: %v", r.SKU, sale.ErrBusy, stale+1, err)
		}
		// Redis handed out a token the database has seen before: its counter
		// was lost or reset. Move it past the database's fence and retry.
		fence, ferr := l.store.Fence(ctx, r.SKU)
		if ferr != nil {
			return sale.Order{}, false, ferr
		}
		if err := l.raise.Exec(ctx, l.c, []string{fenceKey},
			[]string{strconv.FormatInt(fence, 10), strconv.FormatInt(counterKeep.Milliseconds(), 10)}).Error(); err != nil {
			return sale.Order{}, false, fmt.Errorf("strategy: redis-lock: raise token counter: %w", err)
		}
	}
}

func (l *RedisLock) busy(ctx context.Context, r sale.Reservation, where string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("strategy: redis-lock %s: %w", r.SKU, ctx.Err())
	}
	return fmt.Errorf("strategy: redis-lock %s: %w: no lock within %v (%s)", r.SKU, sale.ErrBusy, l.cfg.Wait, where)
}

func (l *RedisLock) queue(sku string) chan struct{} {
	if q, ok := l.local.Load(sku); ok {
		return q.(chan struct{})
	}
	q, _ := l.local.LoadOrStore(sku, make(chan struct{}, 1))
	return q.(chan struct{})
}

// take returns a fencing token once the lock is had, retrying with a
// jittered back-off (another instance holds it) until ctx ends.
func (l *RedisLock) take(ctx context.Context, lockKey, fenceKey, owner string) (int64, error) {
	args := []string{owner, strconv.FormatInt(l.cfg.TTL.Milliseconds(), 10), strconv.FormatInt(counterKeep.Milliseconds(), 10)}
	backoff := 500 * time.Microsecond
	for {
		token, err := l.lock.Exec(ctx, l.c, []string{lockKey, fenceKey}, args).AsInt64()
		if err != nil {
			return 0, fmt.Errorf("strategy: redis-lock: take: %w", err)
		}
		if token > 0 {
			return token, nil
		}
		t := time.NewTimer(time.Duration(mrand.Int64N(int64(backoff))) + 100*time.Microsecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, 20*time.Millisecond)
	}
}

// release gives the lock back if it is still ours. A failure only delays
// the next holder until the lock's TTL.
func (l *RedisLock) release(ctx context.Context, lockKey, owner string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = l.unlock.Exec(rctx, l.c, []string{lockKey}, []string{owner}).Error()
}

func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

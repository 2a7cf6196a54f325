package strategy_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/strategy"
	"github.com/flashsale/flashsale/internal/testenv"
)

func TestStrategyNewMapsEveryName(t *testing.T) {
	st := &orderstore.Store{} // not used: nothing is called
	for _, name := range strategy.Names() {
		b, err := strategy.New(name, strategy.Deps{Store: st, Redis: fakeClient{}, Prefix: "p"})
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if (b == nil) != (name == strategy.Pipeline) {
			t.Errorf("%s: seller %T; want nil only for pipeline", name, b)
		}
	}
	if _, err := strategy.New("db-magic", strategy.Deps{Store: st}); err == nil || strategy.Valid("db-magic") == nil {
		t.Error("an unknown name was accepted")
	}
	if _, err := strategy.New(strategy.RedisLockName, strategy.Deps{Store: st}); err == nil {
		t.Error("redis-lock without redis was accepted")
	}
	if _, err := strategy.New(strategy.DBConditional, strategy.Deps{}); err == nil {
		t.Error("db-conditional without a database was accepted")
	}
}

// fakeClient stands in for a Redis client where none is called.
type fakeClient struct{ rueidis.Client }

type env struct {
	store  *orderstore.Store
	redis  rueidis.Client
	prefix string
}

func newEnv(t *testing.T) env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, prefix := testenv.Redis(t)
	dbURL := testenv.Database(t)
	st, err := orderstore.Open(ctx, dbURL, orderstore.Options{MaxConns: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.DisableCache = true
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		testenv.Unavailable(t, "redis", err)
	}
	t.Cleanup(rc.Close)
	return env{store: st, redis: rc, prefix: prefix}
}

func (e env) putSKU(t *testing.T, id string, stock, limit int64) {
	t.Helper()
	if _, _, _, err := e.store.PutSKU(context.Background(), orderstore.SKUChange{ID: id, TotalStock: stock, PerUserLimit: limit}); err != nil {
		t.Fatal(err)
	}
}

func resv(sku, user string) sale.Reservation {
	return sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: user, Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
}

// ledger reads what the database says about sku.
func ledger(t *testing.T, st *orderstore.Store, sku string) (stock, live, orders, maxHeld int64) {
	t.Helper()
	err := st.DB().QueryRowContext(context.Background(), st.Rebind(`
SELECT i.stock,
       (SELECT coalesce(sum(quantity), 0) FROM orders WHERE sku_id = ? AND status IN ('pending_payment', 'paid')),
       (SELECT count(*) FROM orders WHERE sku_id = ?),
       (SELECT coalesce(max(n), 0) FROM (SELECT sum(quantity) n FROM orders WHERE sku_id = ? GROUP BY user_id) u)
FROM inventory i WHERE i.sku_id = ?`), sku, sku, sku, sku).Scan(&stock, &live, &orders, &maxHeld)
	if err != nil {
		t.Fatal(err)
	}
	return
}

// TestStrategyRedisLockSellsExactlyTheStock: buyers race on one SKU through the lock
// (two strategy instances: two "processes" contending in Redis).
func TestStrategyRedisLockSellsExactlyTheStock(t *testing.T) {
	e := newEnv(t)
	e.putSKU(t, "HOT", 30, 1)
	a := strategy.NewRedisLock(e.redis, e.prefix, e.store, strategy.LockConfig{Wait: 20 * time.Second})
	b := strategy.NewRedisLock(e.redis, e.prefix, e.store, strategy.LockConfig{Wait: 20 * time.Second})
	ctx := context.Background()
	var (
		wg             sync.WaitGroup
		mu             sync.Mutex
		sold, refused  int
		errs           []error
		users, perUser = 40, 3 // 40 users want 1 each, clicking 3 times at once
	)
	for u := 0; u < users; u++ {
		for c := 0; c < perUser; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := a
				if c%2 == 1 {
					l = b
				}
				_, _, err := l.BuyDirect(ctx, resv("HOT", fmt.Sprintf("u%d", u)), time.Now())
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					sold++
				case errors.Is(err, sale.ErrSoldOut), errors.Is(err, sale.ErrLimitReached):
					refused++
				default:
					errs = append(errs, err)
				}
			}()
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
	stock, live, orders, maxHeld := ledger(t, e.store, "HOT")
	if sold != 30 || live != 30 || stock != 0 || orders != 30 || maxHeld > 1 {
		t.Errorf("sold %d (refused %d); database: stock %d, live %d, %d orders, max per user %d; want 30 sold, 0 left, 1 per user",
			sold, refused, stock, live, orders, maxHeld)
	}
	lockKey, _ := a.LockKeys("HOT")
	if n, err := e.redis.Do(ctx, e.redis.B().Exists().Key(lockKey).Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("lock still held after every purchase returned (%d, %v)", n, err)
	}
}

// TestStrategyRedisLockRepairsALostCounter: Redis loses the token counter (restart
// without persistence); the database refuses the low tokens, the counter is
// moved past the fence and the purchase goes through.
func TestStrategyRedisLockRepairsALostCounter(t *testing.T) {
	e := newEnv(t)
	e.putSKU(t, "LOST", 10, 5)
	l := strategy.NewRedisLock(e.redis, e.prefix, e.store, strategy.LockConfig{})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, _, err := l.BuyDirect(ctx, resv("LOST", "alice"), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	_, fenceKey := l.LockKeys("LOST")
	if err := e.redis.Do(ctx, e.redis.B().Del().Key(fenceKey).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.BuyDirect(ctx, resv("LOST", "bob"), time.Now()); err != nil {
		t.Fatalf("after the counter was lost: %v", err)
	}
	f, err := e.store.Fence(ctx, "LOST")
	if err != nil || f != 4 {
		t.Errorf("database fence %d, %v; want 4 (3 tokens, then one above them)", f, err)
	}
	if _, live, _, _ := ledger(t, e.store, "LOST"); live != 4 {
		t.Errorf("live %d, want 4", live)
	}
}

// TestStrategyRedisLockBusy: another instance holds the lock past the wait.
func TestStrategyRedisLockBusy(t *testing.T) {
	e := newEnv(t)
	e.putSKU(t, "HELD", 10, 5)
	l := strategy.NewRedisLock(e.redis, e.prefix, e.store, strategy.LockConfig{Wait: 150 * time.Millisecond})
	ctx := context.Background()
	lockKey, _ := l.LockKeys("HELD")
	if err := e.redis.Do(ctx, e.redis.B().Set().Key(lockKey).Value("someone-else").Px(10*time.Second).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, _, err := l.BuyDirect(ctx, resv("HELD", "alice"), time.Now())
	if !errors.Is(err, sale.ErrBusy) {
		t.Fatalf("err = %v, want sale.ErrBusy", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("gave up after %v, want about the wait (150ms)", d)
	}
	if _, live, orders, _ := ledger(t, e.store, "HELD"); live != 0 || orders != 0 {
		t.Errorf("busy purchase wrote %d orders", orders)
	}
	if v, err := e.redis.Do(ctx, e.redis.B().Get().Key(lockKey).Build()).ToString(); err != nil || v != "someone-else" {
		t.Errorf("the other holder's lock was touched: %q, %v", v, err)
	}
}

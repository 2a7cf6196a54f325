package stockgate

import (
	"context"
	"time"

	"github.com/redis/rueidis"
)

var releaseLua = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// Acquire takes the lease name for owner for ttl (renewing it if owner holds
// it). It reports whether owner holds it now.
func (g *Gate) Acquire(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	key := g.prefix + ":lease:" + name
	err := g.c.Do(ctx, g.c.B().Set().Key(key).Value(owner).Nx().Px(ttl).Build()).Error()
	if err == nil {
		return true, nil
	}
	if !rueidis.IsRedisNil(err) {
		return false, err
	}
	cur, err := g.c.Do(ctx, g.c.B().Get().Key(key).Build()).ToString()
	if err != nil || cur != owner {
		return false, nil
	}
	return true, g.c.Do(ctx, g.c.B().Pexpire().Key(key).Milliseconds(ttl.Milliseconds()).Build()).Error()
}

// Release gives the lease up if owner holds it.
func (g *Gate) Release(ctx context.Context, name, owner string) error {
	return releaseLua.Exec(ctx, g.c, []string{g.prefix + ":lease:" + name}, []string{owner}).Error()
}

// LockSKU takes sku's change lock for token for ttl: the lock that
// serialises, across every instance sharing this Redis prefix, the changes
// that read the database and then write the SKU's units in Redis (admin
// stock changes, warm-ups, resyncs, rebuilds). It reports whether token
// holds it now (false: another holder has it; try again later). The lock
// lives under the SKU's hash tag, so Seed, Resync and Adjust check it in
// the same script that writes (Config.Lock): a holder that stalled past ttl
// is fenced off instead of writing over its successor. A holder that dies
// leaves it to expire after ttl.
func (g *Gate) LockSKU(ctx context.Context, sku, token string, ttl time.Duration) (bool, error) {
	err := g.c.Do(ctx, g.c.B().Set().Key(g.KeysOf(sku).Lock).Value(token).Nx().Px(ttl).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	return err == nil, err
}

// UnlockSKU gives sku's change lock up if token holds it.
func (g *Gate) UnlockSKU(ctx context.Context, sku, token string) error {
	return releaseLua.Exec(ctx, g.c, []string{g.KeysOf(sku).Lock}, []string{token}).Error()
}

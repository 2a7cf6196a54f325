package stockgate

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// DatabaseKey is the key, under the prefix, that names the database whose
// deployment owns the prefix: "<deployment id> <database identity>"
// (orderstore.Store.DatabaseIdentity), beside <prefix>:owner (ClaimPrefix),
// which names the deployment alone and which the previous release reads.
func (g *Gate) DatabaseKey() string { return g.prefix + ":owner:database" }

// claimDatabaseScript records ARGV[2] (a value whose first word is the
// deployment id ARGV[1]) unless a value of that deployment is recorded,
// and returns the value recorded now. A value of another deployment is
// stale (the owner key was claimed anew since): it is replaced.
var claimDatabaseScript = rueidis.NewLuaScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then return v end
redis.call('SET', KEYS[1], ARGV[2])
return ARGV[2]`)

// ClaimDatabase records identity as the database of deployment id that
// owns this prefix (DatabaseKey), unless one of that deployment is
// recorded, and returns the identity recorded now: identity itself, or
// the one of the database of deployment id that claimed first. Call it
// once ClaimPrefix has made sure the prefix is deployment id's.
func (g *Gate) ClaimDatabase(ctx context.Context, id, identity string) (string, error) {
	v, err := claimDatabaseScript.Exec(ctx, g.c, []string{g.DatabaseKey()}, []string{id, id + " " + identity}).ToString()
	if err != nil {
		return "", fmt.Errorf("stockgate: claim prefix database: %w", err)
	}
	return v[len(id)+1:], nil
}

// ClaimPrefix records owner as the deployment this Redis prefix belongs to
// (<prefix>:owner, set once: SET NX) and returns the owner recorded now:
// owner itself, or another deployment's that claimed it first. A prefix
// whose keys were lost (a Redis that restarted empty) is claimed again by
// the first instance to ask.
func (g *Gate) ClaimPrefix(ctx context.Context, owner string) (string, error) {
	prev, err := g.c.Do(ctx, g.c.B().Set().Key(g.prefix+":owner").Value(owner).Nx().Get().Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return owner, nil
	}
	if err != nil {
		return "", fmt.Errorf("stockgate: claim prefix: %w", err)
	}
	return prev, nil
}

package stockgate

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/redis/rueidis"
)

// ErrEvicting is returned when a Redis primary may evict keys: its
// maxmemory-policy is not noeviction. The gate's keys (the stock left,
// each buyer's holdings, the reservations in flight, the outbox) are its
// only copy of state the database has not yet seen; a key Redis drops under
// memory pressure silently oversells, refuses buyers or loses an accepted
// order, and no restart monitor sees it. With noeviction a full Redis
// refuses writes instead (the purchase fails, the breaker opens, the
// database fallback sells).
var ErrEvicting = errors.New("stockgate: redis may evict the gate's keys")

// CheckEviction returns an error wrapping ErrEvicting, naming each primary,
// its policy and the fix, unless every primary's maxmemory-policy is
// noeviction. The policy is read with CONFIG GET maxmemory-policy, or, where
// CONFIG is disabled (managed Redis services rename or forbid it), from INFO
// memory's maxmemory_policy. Any other error (Redis unreachable, no way to
// read the policy) is returned as is, not wrapping ErrEvicting.
func (g *Gate) CheckEviction(ctx context.Context) error {
	prim, err := g.Primaries(ctx)
	if err != nil {
		return err
	}
	var bad []string
	for addr, c := range prim {
		policy, err := maxmemoryPolicy(ctx, c)
		if err != nil {
			if addr != "" {
				return fmt.Errorf("stockgate: primary %s: %w", addr, err)
			}
			return err
		}
		if policy != "noeviction" {
			name := "redis"
			if addr != "" {
				name = "redis primary " + addr
			}
			bad = append(bad, fmt.Sprintf("%s has maxmemory-policy %s", name, policy))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("%w: %s; set maxmemory-policy noeviction on every primary "+
		"(CONFIG SET maxmemory-policy noeviction and the same line in redis.conf, or the managed service's parameter group): "+
		"an evicted gate key oversells, refuses buyers or loses an accepted order",
		ErrEvicting, strings.Join(bad, ", "))
}

// maxmemoryPolicy reads one server's maxmemory-policy.
func maxmemoryPolicy(ctx context.Context, c rueidis.Client) (string, error) {
	m, err := c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
	if err == nil {
		if p, ok := m["maxmemory-policy"]; ok {
			return p, nil
		}
	}
	if err != nil && !isRedisErr(err) {
		return "", fmt.Errorf("stockgate: config get maxmemory-policy: %w", err)
	}
	// CONFIG refused (renamed or forbidden) or silent: INFO memory says it too.
	info, ierr := c.Do(ctx, c.B().Info().Section("memory").Build()).ToString()
	if ierr != nil {
		return "", fmt.Errorf("stockgate: reading maxmemory-policy: config get: %v; info memory: %w", err, ierr)
	}
	if p, ok := infoFields(info)["maxmemory_policy"]; ok {
		return p, nil
	}
	return "", fmt.Errorf("stockgate: reading maxmemory-policy: config get: %v; info memory has no maxmemory_policy", err)
}

// isRedisErr reports whether err is an error reply of the server (not a
// failure to reach it).
func isRedisErr(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

package ticket

import (
	"context"
	"time"

	"github.com/redis/rueidis"
)

// RedisReplays is the replay set in Redis: one key per claimed challenge,
// "<prefix>:altcha:<signature>", expiring with the challenge. The keys
// carry no hash tag, so a crowd's claims spread over a cluster's slots
// instead of landing on one node.
type RedisReplays struct {
	Client rueidis.Client
	Prefix string
}

// Claim sets the key, empty, if it is absent (SET NX PX: a relative TTL,
// so no clock but Redis' decides when it goes) and reports whether it did.
func (r RedisReplays) Claim(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	err := r.Client.Do(ctx, r.Client.B().Set().Key(r.key(id)).Value("").Nx().Px(max(ttl, time.Second)).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	return err == nil, err
}

// Settle writes the ticket into the claimed key, keeping its TTL.
func (r RedisReplays) Settle(ctx context.Context, id, ticket string) error {
	return r.Client.Do(ctx, r.Client.B().Set().Key(r.key(id)).Value(ticket).Xx().Keepttl().Build()).Error()
}

// Settled reads the ticket a claim made ("" for none).
func (r RedisReplays) Settled(ctx context.Context, id string) (string, error) {
	v, err := r.Client.Do(ctx, r.Client.B().Get().Key(r.key(id)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	return v, err
}

func (r RedisReplays) key(id string) string { return r.Prefix + ":altcha:" + id }

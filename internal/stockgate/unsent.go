package stockgate

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// Unsent returns the payload of reservation orderID of user on sku if it is
// still in the outbox (accepted, not yet acknowledged by the stream), and
// the bucket holding it; a nil payload when it is not: in the stream,
// closed, or unknown. The purchase path asks it before answering a retried
// Idempotency-Key with the order the key made: only an order the stream
// holds survives a Redis that loses its data. One round trip for a sale in
// one bucket (its bucket count is read with it), two for a buyer of a split
// sale whose home is not bucket 0. An error means Redis could not say.
func (g *Gate) Unsent(ctx context.Context, sku, user, orderID string) (payload []byte, bucket string, err error) {
	k0 := g.KeysOf(sku)
	rs := g.c.DoMulti(ctx,
		g.c.B().Hget().Key(k0.Meta).Field("buckets").Build(),
		g.c.B().Zscore().Key(k0.Outbox).Member(orderID).Build(),
		g.c.B().Hget().Key(k0.Res).Field(orderID).Build())
	k := 1
	switch v, err := rs[0].AsInt64(); {
	case err == nil:
		k = max(int(v), 1)
	case !rueidis.IsRedisNil(err):
		return nil, "", fmt.Errorf("stockgate: unsent: %w", err)
	}
	bucket = HomeName(sku, user, k)
	if bucket != sku {
		rs = g.c.DoMulti(ctx,
			g.c.B().Zscore().Key(g.KeysOf(bucket).Outbox).Member(orderID).Build(),
			g.c.B().Hget().Key(g.KeysOf(bucket).Res).Field(orderID).Build())
	} else {
		rs = rs[1:]
	}
	if err := rs[0].Error(); rueidis.IsRedisNil(err) {
		return nil, bucket, nil // not in the outbox: acknowledged by the stream, or closed
	} else if err != nil {
		return nil, "", fmt.Errorf("stockgate: unsent: %w", err)
	}
	payload, err = rs[1].AsBytes()
	if rueidis.IsRedisNil(err) {
		return nil, bucket, nil // closed already (the relay drops such an entry)
	}
	if err != nil {
		return nil, "", fmt.Errorf("stockgate: unsent: %w", err)
	}
	return payload, bucket, nil
}

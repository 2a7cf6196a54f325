package loadgen_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/loadgen"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestDeleteKeysCluster: on a Redis Cluster every key under the prefix is
// deleted, on every primary (a keyless SCAN reaches one node only), and
// nothing else.
func TestDeleteKeysCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	rc := testenv.StartRedisCluster(t)
	c := rc.Client()
	ctx := context.Background()
	var keys []string
	for i := range 300 {
		keys = append(keys, fmt.Sprintf("bench:{sku%d}:meta", i))
	}
	set := func(k string) rueidis.Completed { return c.B().Set().Key(k).Value("1").Build() }
	for _, k := range append(keys, "other:{sku1}:meta") {
		if err := c.Do(ctx, set(k)).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := loadgen.DeleteKeys(ctx, c, "bench"); err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, k := range keys {
		if n, err := c.Do(ctx, c.B().Exists().Key(k).Build()).AsInt64(); err != nil || n != 0 {
			left++
		}
	}
	if left != 0 {
		t.Errorf("%d of %d keys under the prefix left", left, len(keys))
	}
	if n, _ := c.Do(ctx, c.B().Exists().Key("other:{sku1}:meta").Build()).AsInt64(); n != 1 {
		t.Errorf("a key of another prefix was deleted")
	}
}

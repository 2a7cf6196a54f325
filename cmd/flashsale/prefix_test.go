package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
)

// TestPrefixBelongsToOneDatabase: an instance pointed at a Redis prefix
// that another database's deployment owns refuses to start, naming both;
// the owner loses nothing (every order it accepts lands in its database).
// Instances of the same database share the prefix.
func TestPrefixBelongsToOneDatabase(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	cfgA := testConfig(t, "external")
	h := newHarness(t, cfgA)
	h.mustPutSKU("own", 50, 2)
	var ids []string
	for i := range 5 {
		ids = append(ids, h.buy(fmt.Sprintf("a%d", i), "own", 1, "").str("order_id"))
	}

	// Another deployment: its own database, the same Redis and prefix.
	cfgB := testConfig(t, "external", "FLASHSALE_REDIS_URL", cfgA.RedisURL, "FLASHSALE_REDIS_PREFIX", cfgA.RedisPrefix)
	if cfgB.DatabaseURL == cfgA.DatabaseURL {
		t.Fatal("test setup: the second deployment shares the first's database")
	}
	b, refusal := start(context.Background(), cfgB, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if refusal == nil {
		b.close()
		t.Fatal("an instance of another database started on a prefix it does not own")
	}
	idA, err := h.a.store.DeploymentID(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stB, err := orderstore.Open(context.Background(), cfgB.DatabaseURL, orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	idB, err := stB.DeploymentID(context.Background())
	stB.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{cfgA.RedisPrefix, idA, h.a.store.Describe(), idB} {
		if !strings.Contains(refusal.Error(), want) {
			t.Errorf("refusal %q does not name %q", refusal, want)
		}
	}
	t.Logf("refused: %v", refusal)

	// The owner loses nothing: what it accepted before and after lands.
	for i := range 5 {
		ids = append(ids, h.buy(fmt.Sprintf("b%d", i), "own", 1, "").str("order_id"))
	}
	rep := settle(t, h.a, "own", ids, 15*time.Second)
	if rep.RedisAvailable != 40 {
		t.Fatalf("owner after the refusal: %+v", rep)
	}

	// Redis loses the owner key (with everything else, in real life): the
	// rebuild that follows claims the prefix again for its database.
	ctx := context.Background()
	rc := h.a.redis
	if err := rc.Do(ctx, rc.B().Del().Key(cfgA.RedisPrefix+":owner").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := h.a.rebuildAll(ctx); err != nil {
		t.Fatalf("rebuild after the owner key was lost: %v", err)
	}
	if owner, err := rc.Do(ctx, rc.B().Get().Key(cfgA.RedisPrefix+":owner").Build()).ToString(); err != nil || !strings.HasPrefix(owner, idA+" ") {
		t.Fatalf("owner after the rebuild: %q, %v; want %s", owner, err, idA)
	}

	// A second instance of the same database shares the prefix.
	cfgC := testConfig(t, "external", "FLASHSALE_DATABASE_URL", cfgA.DatabaseURL,
		"FLASHSALE_REDIS_URL", cfgA.RedisURL, "FLASHSALE_REDIS_PREFIX", cfgA.RedisPrefix)
	c, err := start(context.Background(), cfgC, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("a second instance of the same database: %v", err)
	}
	c.close()
}

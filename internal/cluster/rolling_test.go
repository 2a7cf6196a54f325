package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/chaos"
	"github.com/flashsale/flashsale/internal/testenv"
)

const (
	userSecret = "cluster-user-secret"
	adminToken = "cluster-admin-token"
)

// baseEnv is the environment every instance of a test shares.
func baseEnv(t *testing.T, dbURL, redisURL, natsURL string) map[string]string {
	return map[string]string{
		"FLASHSALE_DATABASE_URL":      dbURL,
		"FLASHSALE_REDIS_URL":         redisURL,
		"FLASHSALE_REDIS_PREFIX":      "cl",
		"FLASHSALE_NATS_URL":          natsURL,
		"FLASHSALE_USER_TOKEN_SECRET": userSecret,
		"FLASHSALE_ADMIN_TOKEN":       adminToken,
		"FLASHSALE_LOG_LEVEL":         "warn",
		"FLASHSALE_RELAY_GRACE":       "300ms",
		"FLASHSALE_DB_MAX_CONNS":      "8",
	}
}

func copyEnv(m map[string]string, kv ...string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		c[kv[i]] = kv[i+1]
	}
	return c
}

// startInstances starts n flashsale instances with env (the first alone, so
// it runs the migrations, then the others together).
func startInstances(t *testing.T, bin string, n int, env func(i int) map[string]string) []*chaos.Service {
	t.Helper()
	out := make([]*chaos.Service, n)
	out[0] = chaos.StartService(t, bin, env(0))
	errs := make(chan error, n)
	for i := 1; i < n; i++ {
		go func() {
			s, err := chaos.LaunchService(t, bin, env(i), 60*time.Second)
			out[i] = s
			errs <- err
		}()
	}
	for i := 1; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func serverName(i int) string { return fmt.Sprintf("flashsale-%d", i+1) }

// TestRollingRestart: three instances behind HAProxy (the shipped
// configuration); buyers with Idempotency-Keys buy a hot SKU and two normal
// ones through the balancer while every instance in turn is stopped
// (SIGTERM: it drains, HAProxy marks it DOWN before it exits), exits 0, is
// started again and taken back in. The buyers see no 5xx and no failed
// connection, and the invariants hold after.
func TestRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("three instances behind HAProxy, restarted in turn (about a minute)")
	}
	bins := chaos.Build(t)
	redis := chaos.StartRedis(t)
	nats := chaos.StartNATS(t, bins.NATS)
	dbURL := testenv.Database(t)
	env := baseEnv(t, dbURL, redis.URL, nats.URL)
	svcs := startInstances(t, bins.Flashsale, 3, func(int) map[string]string { return copyEnv(env) })
	var addrs []string
	for _, s := range svcs {
		addrs = append(addrs, s.Env["FLASHSALE_HTTP_ADDR"])
	}
	lb := StartHAProxy(t, addrs)
	for i := range svcs {
		if _, err := lb.WaitState(serverName(i), "UP", 15*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	ctx := context.Background()
	c := chaos.NewClient(lb.URL, userSecret, adminToken, 10*time.Second)
	skus := map[string]int{"hot": 1500, "n1": 300, "n2": 300}
	for sku, stock := range skus {
		if err := c.PutSKU(ctx, sku, stock, 1); err != nil {
			t.Fatal(err)
		}
	}
	sale := StartSale(c, []chaos.Load{
		{SKU: "hot", Buyers: 100000, Workers: 12, Rate: 50, Tries: 6, For: 3 * time.Minute, Users: "h"},
		{SKU: "n1", Buyers: 100000, Workers: 4, Rate: 10, Tries: 6, For: 3 * time.Minute, Users: "a"},
		{SKU: "n2", Buyers: 100000, Workers: 4, Rate: 10, Tries: 6, For: 3 * time.Minute, Users: "b"},
	})
	time.Sleep(2 * time.Second)
	for i, s := range svcs {
		start := time.Now()
		s.Term()
		// The balancer takes the instance out while it still serves: its
		// checks see 503 draining before the listener closes.
		down, err := lb.WaitState(serverName(i), "DOWN", 15*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if s.Exited(0) {
			t.Fatalf("%s exited before HAProxy marked it DOWN (%v after SIGTERM): the balancer sent it traffic it could not take", serverName(i), down)
		}
		if !s.Exited(30 * time.Second) {
			t.Fatalf("%s still running 30s after SIGTERM", serverName(i))
		}
		if code := s.ExitCode(); code != 0 {
			t.Fatalf("%s exited %d after SIGTERM:\n%s", serverName(i), code, s.Log())
		}
		stopped := time.Since(start)
		s.Restart(t)
		up, err := lb.WaitState(serverName(i), "UP", 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: DOWN in HAProxy %v after SIGTERM, exited after %v, UP again %v after its restart", serverName(i),
			down.Round(100*time.Millisecond), stopped.Round(100*time.Millisecond), up.Round(100*time.Millisecond))
	}
	time.Sleep(2 * time.Second)
	sale.Stop()
	t.Logf("outcomes: %s", sale.Summary())
	if sale.Accepted() == 0 {
		t.Fatal("nothing was bought: the test proves nothing")
	}
	for _, f := range sale.Failures() {
		t.Errorf("buyer saw: %s", f)
	}
	ck := chaos.NewChecker(t, dbURL, redis.URL, "cl")
	took, viol := Verify(ctx, ck, sale, 60*time.Second, true)
	for _, v := range viol {
		t.Error(v)
	}
	t.Logf("idle with the invariants holding %v after the sale", took.Round(100*time.Millisecond))
}

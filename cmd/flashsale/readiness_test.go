package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestReadyWhileDatabaseSlotsExhausted: another client takes every
// connection slot of the database (a private PostgreSQL or MariaDB with
// max_connections lowered), so flashsale's pool cannot reconnect. Purchases
// still go through Redis into the outbox, so /readyz stays 200, "degraded",
// naming the database's check and why; once the slots are free every
// accepted purchase becomes one order. Before, the database's check decided
// readiness: 503 on every instance at once (a balancer would empty its pool)
// while purchases were accepted.
func TestReadyWhileDatabaseSlotsExhausted(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	db := testenv.StartDatabase(t)
	testenv.LimitConnections(t, db, 30)
	cfg := testConfig(t, "embedded", "FLASHSALE_DATABASE_URL", db.URL("flashsale"),
		"FLASHSALE_DB_MAX_CONNS", "8", "FLASHSALE_APPLY_BACKOFF", "200ms")
	h := newHarness(t, cfg)
	h.mustPutSKU("slots", 100, 1)
	var accepted []string
	buy := func(i int) {
		t.Helper()
		r := h.buy(fmt.Sprintf("u%d", i), "slots", 1, "")
		if r.Status != http.StatusAccepted {
			t.Fatalf("buy %d: %d %s", i, r.Status, r.Raw)
		}
		accepted = append(accepted, r.str("order_id"))
	}
	for i := range 5 {
		buy(i)
	}

	hog := testenv.HoldConnections(t, db)
	t.Logf("another client holds all %d connection slots", hog.Held())
	dbCheck := string(h.a.store.Dialect())
	waitReady(t, h, http.StatusOK, `"`+dbCheck+`":"connection slots exhausted`, 20*time.Second)
	for i := 5; i < 25; i++ {
		buy(i)
		// A check that did not answer within /readyz's bound (700 ms) is
		// a starved machine, not the slots (a CI run at load 10: Redis,
		// the database and the purchases check all late at once): asked
		// again, for up to 10 s. Any other answer is the test's.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			r := h.do(http.MethodGet, "/readyz", "")
			if r.Status == http.StatusOK && r.str("status") == "degraded" && strings.Contains(r.Raw, `"purchases":"ok"`) {
				break
			}
			if !strings.Contains(r.Raw, "did not answer within") || time.Now().After(deadline) {
				t.Fatalf("/readyz while the slots are exhausted: %d %s", r.Status, r.Raw)
			}
		}
	}
	hog.Release()
	rep := settle(t, h.a, "slots", accepted, 60*time.Second)
	if rep.Orders != int64(len(accepted)) {
		t.Fatalf("%d orders for %d accepted", rep.Orders, len(accepted))
	}
	waitReady(t, h, http.StatusOK, `"status":"ok"`, 20*time.Second)
}

// TestEvictingRedisRefused: a Redis whose maxmemory-policy may evict keys
// (allkeys-lru) is refused at start, naming the setting and the fix; one
// switched to it while running takes the instance out of /readyz (unready,
// with the reason) until it is set back to noeviction.
func TestEvictingRedisRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	evicting := testenv.StartRedis(t, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
	cfg := testConfig(t, "embedded", "FLASHSALE_REDIS_URL", evicting.URL)
	a, err := start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		a.close()
		t.Fatal("started on a Redis with maxmemory-policy allkeys-lru")
	}
	for _, want := range []string{"maxmemory-policy allkeys-lru", "noeviction"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("start: %v; want it to name %q", err, want)
		}
	}

	rs := testenv.StartRedis(t)
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_REDIS_URL", rs.URL))
	waitReady(t, h, http.StatusOK, `"redis-maxmemory-policy":"ok"`, 10*time.Second)
	c := testenv.RedisClient(t, rs.URL)
	setPolicy := func(p string) {
		t.Helper()
		if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", p).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	setPolicy("volatile-lru")
	waitReady(t, h, http.StatusServiceUnavailable, `"redis-maxmemory-policy":"a redis primary's maxmemory-policy is not noeviction`, 10*time.Second)
	setPolicy("noeviction")
	waitReady(t, h, http.StatusOK, `"status":"ok"`, 10*time.Second)
}

// TestReadyWhileRedisHangs: Redis frozen (SIGSTOP) with the database
// fallback on: /readyz answers within its bound, 200 degraded (the fallback
// sells), not 503 because the purchases check waited for the hung PING as
// long as /readyz itself did.
func TestReadyWhileRedisHangs(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_REDIS_URL", rs.URL))
	waitReady(t, h, http.StatusOK, `"status":"ok"`, 10*time.Second)
	rs.Pause()
	defer rs.Resume()
	// Ten answers while the database answers its own check: one where the
	// database itself did not answer within the bound (a loaded machine;
	// a CI run on MariaDB) says nothing about the hung Redis, and is
	// asked again.
	db := `"` + testenv.Dialect() + `":"ok"`
	for i, skipped := 0, 0; i < 10; {
		r := h.do(http.MethodGet, "/readyz", "")
		if !strings.Contains(r.Raw, db) && skipped < 20 {
			skipped++
			continue
		}
		if r.Status != http.StatusOK || !strings.Contains(r.Raw, `"purchases":"redis gate unusable: the database fallback sells"`) {
			t.Fatalf("/readyz %d with Redis frozen: %d %s", i, r.Status, r.Raw)
		}
		i++
	}
}

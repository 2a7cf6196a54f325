package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestKeyRetryThenRedisLost: the instance that made a reservation stops
// between the gate and the stream; the buyer retries the Idempotency-Key on
// another instance and is answered 202; then Redis loses its data (no
// persistence, killed and restarted) before any sweeper published the
// reservation. A 202 for a key means what a first 202 means: the order
// reaches the database, its owner reads it, and the next retry gets it.
func TestKeyRetryThenRedisLost(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	rs := testenv.StartRedis(t)
	env := procEnv(t)
	env["FLASHSALE_REDIS_URL"] = rs.URL
	// No sweeper or republisher takes the first instance's reservation in
	// the test's time: only the retry's answer can have put it in the stream.
	env["FLASHSALE_RELAY_GRACE"] = "1h"
	env["FLASHSALE_INFLIGHT_REPUBLISH_AFTER"] = "1h"
	env["FLASHSALE_REDIS_MONITOR_EVERY"] = "100ms"
	env2 := map[string]string{}
	for k, v := range env {
		env2[k] = v
	}
	env2["FLASHSALE_HTTP_ADDR"] = freeAddr(t)
	env2["FLASHSALE_DATA_DIR"] = t.TempDir()
	env["FLASHSALE_DATA_DIR"] = t.TempDir()
	env["FLASHSALE_FAILPOINTS"] = failpoint.AfterGateBeforeRelay + "=hang"

	p1 := startProc(t, env)
	h1 := procClient(t, p1.url)
	h1.mustPutSKU("k", 10, 1)
	first := h1.buy("u1", "k", 1, "key-1")
	if first.Status != http.StatusAccepted {
		t.Fatalf("first attempt: %d %s", first.Status, first.Raw)
	}
	id := first.str("order_id")
	if !strings.Contains(p1.log(), "failpoint "+failpoint.AfterGateBeforeRelay+" fired") {
		t.Fatalf("failpoint did not fire; log:\n%s", p1.log())
	}
	p1.kill()

	p2 := startProc(t, env2)
	h2 := procClient(t, p2.url)
	// A 503 is the answer while the stream has not acknowledged the
	// republished order within FLASHSALE_STREAM_ACK (a freshly started
	// embedded JetStream on a starved machine: a CI run); the client asks
	// again with the key. One that lasts 30 s is a retry that does not
	// publish.
	retry := h2.buyUntilAnswered("u1", "k", 1, "key-1", 30*time.Second)
	switch {
	case retry.Status == http.StatusServiceUnavailable && retry.code() == "unavailable":
		t.Fatalf("retry on the second instance: 503 for 30 s although the stream is up: %s", retry.Raw)
	case retry.str("order_id") != id ||
		!(retry.Status == http.StatusAccepted || retry.Status == http.StatusOK && retry.str("status") == "pending_payment"):
		// 202 while the order is in flight; 200 with the order once the
		// consumer applied the reservation the retry published (a busy
		// machine can apply it before the retry is answered).
		t.Fatalf("retry on the second instance: %d %s, want 202, or 200 pending_payment, with %s", retry.Status, retry.Raw, id)
	}

	rs.Kill()
	rs.Restart()

	auth := "Authorization: Bearer " + userToken(t, "u1")
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := h2.do(http.MethodGet, "/api/v1/orders/"+id, "", auth)
		if o.Status == http.StatusOK && o.str("status") == "pending_payment" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the order answered 202 twice is not in the database 20 s after Redis lost its data: GET %d %s", o.Status, o.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The order is in the database now: the retry answers it (200 with its
	// state, as any retry of a decided order is answered).
	if again := h2.buy("u1", "k", 1, "key-1"); !purchaseAccepted(again) || again.str("order_id") != id {
		t.Fatalf("retry after the loss: %d %s, want the order %s", again.Status, again.Raw, id)
	}
}

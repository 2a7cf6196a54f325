package chaos

import (
	"fmt"
	"net/http"
	"time"

	"github.com/flashsale/flashsale/internal/failpoint"
)

// keyRetryRedisLost: the instance that accepted reservations stops between
// the gate and the stream (failpoint after_gate_before_relay=hang) and is
// killed; every buyer retries its key on a second instance, whose relay
// sweeper would take the outbox only after an hour; then Redis is killed
// and comes back empty. A 202 to a retry means what a first 202 means:
// every order a buyer was promised reaches the database (I4, I11).
func keyRetryRedisLost(r *rig) {
	n := StartNATS(r.t, r.bins.NATS)
	r.set("FLASHSALE_NATS_URL", n.URL)
	first := copyEnv(r.env)
	first["FLASHSALE_FAILPOINTS"] = failpoint.AfterGateBeforeRelay + "=hang"
	a := StartService(r.t, r.bins.Flashsale, first)
	ca := r.client(a)
	r.putSKU(ca, 200, 2)
	Drive(r.ctx, ca, Load{SKU: r.sku, Buyers: 120, Workers: 12, Rate: 100, Tries: 1, For: 10 * time.Second}, r.hist)
	if !waitFired(a, failpoint.AfterGateBeforeRelay, 5*time.Second) {
		r.res.note = "failpoint did not fire"
		return
	}
	a.Kill()

	second := copyEnv(r.env)
	second["FLASHSALE_RELAY_GRACE"] = "1h"
	second["FLASHSALE_DATA_DIR"] = r.t.TempDir()
	b := StartService(r.t, r.bins.Flashsale, second)
	cb := r.client(b)
	type uk struct{ user, key string }
	seen := map[uk]bool{}
	retried := 0
	for _, at := range r.hist.Attempts() {
		k := uk{at.User, at.Key}
		if seen[k] {
			continue
		}
		seen[k] = true
		before := len(r.hist.Attempts())
		buyKey(r.ctx, cb, Load{SKU: r.sku, Tries: 8}, r.hist, k.user, k.key)
		for _, got := range r.hist.Attempts()[before:] {
			if got.Status == http.StatusAccepted {
				retried++
			}
		}
	}
	r.res.fired = retried > 0
	r.redis.Kill()
	r.redis.Restart(r.t)
	healed := time.Now()
	r.res.note = fmt.Sprintf("%d retries answered 202 by the second instance before Redis lost its data", retried)
	r.finish(cb, healed)
}

package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/testenv"
)

const (
	userSecret = "chaos-user-secret"
	adminToken = "chaos-admin-token"
)

// scenario is one fault: run injects it into a rig under load, heals, and
// fills the result (finish does the common part). A scenario runs beside
// the others (each has its own Redis, database, JetStream and flashsale
// processes) unless alone: its fault reaches past its own database to the
// whole server the scenarios share.
type scenario struct {
	name  string
	run   func(r *rig)
	alone bool
}

// scenarios is the suite, in the order it runs. docs/faults.md describes each.
var scenarios = []scenario{
	{"kill_before_relay", killBeforeRelay, false},
	{"consumer_before_commit", consumerKilled(failpoint.ConsumerBeforeCommit), false},
	{"consumer_after_commit", consumerKilled(failpoint.ConsumerAfterCommitBeforeAck), false},
	{"redis_lost", redisLost, false},
	{"redis_hung", redisHung, false},
	{"redis_dead", redisDead, false},
	{"queue_store_lost", queueStoreLost, false},
	{"nats_restarted_empty", natsRestartedEmpty, false},
	{"db_resets", dbResets, false},
	// MariaDB's read_only is a server setting (readonly_test.go).
	{"db_read_only", dbReadOnly, true},
	{"key_retry_fallback", keyRetryFallback, false},
	{"key_retry_redis_lost", keyRetryRedisLost, false},
	{"shared_prefix", sharedPrefix, false},
	{"pay_races_expiry", payRacesExpiry, false},
	{"js_disk_full", jsDiskFull, false},
}

// shortSet is the default of FLASHSALE_CHAOS=short: the scenarios CI runs.
const shortSet = "kill_before_relay,consumer_after_commit,redis_lost,redis_hung,queue_store_lost,nats_restarted_empty,db_resets,key_retry_fallback,shared_prefix,pay_races_expiry,db_read_only,js_disk_full"

// result is one row of the table.
type result struct {
	name                       string
	requests, accepted, orders int
	violations                 []string
	recovery                   time.Duration
	fired                      bool
	recovered                  bool // idle with every invariant holding within the bound
	note                       string
	mu                         sync.Mutex
}

func (res *result) fail(format string, args ...any) {
	res.mu.Lock()
	res.violations = append(res.violations, fmt.Sprintf(format, args...))
	res.mu.Unlock()
}

// selection reads FLASHSALE_CHAOS: "all", "short" (shortSet) or a comma
// list of scenario names.
func selection(t *testing.T) map[string]bool {
	spec := os.Getenv("FLASHSALE_CHAOS")
	switch spec {
	case "":
		t.Skip("the fault suite runs when FLASHSALE_CHAOS is set: all, short or scenario names (make chaos, make test-chaos-short)")
	case "short":
		spec = shortSet
	case "all":
		var names []string
		for _, s := range scenarios {
			names = append(names, s.name)
		}
		spec = strings.Join(names, ",")
	}
	sel := map[string]bool{}
	known := map[string]bool{}
	for _, s := range scenarios {
		known[s.name] = true
	}
	for _, n := range strings.Split(spec, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !known[n] {
			t.Fatalf("FLASHSALE_CHAOS: unknown scenario %q", n)
		}
		sel[n] = true
	}
	return sel
}

// TestChaos runs the selected scenarios, each on its own database, Redis
// and flashsale processes, up to -parallel of them at once (those marked
// alone by themselves, before the others), and prints one row per scenario
// once all have ended.
func TestChaos(t *testing.T) {
	sel := selection(t)
	bins := Build(t)
	db := testenv.StartDatabase(t)
	var results []*result
	// The table is printed after every scenario, parallel ones included,
	// has ended: cleanups run after a test's subtests.
	t.Cleanup(func() { report(results) })
	for i, sc := range scenarios {
		if !sel[sc.name] {
			continue
		}
		res := &result{name: sc.name}
		results = append(results, res)
		t.Run(sc.name, func(t *testing.T) {
			if !sc.alone {
				t.Parallel()
			}
			r := newRig(t, bins, db, fmt.Sprintf("chaos_%d_%s", i, testenv.RandomName("")), res)
			sc.run(r)
			if !res.fired {
				res.fail("the fault did not fire: the scenario proves nothing")
			}
			for _, v := range res.violations {
				t.Error(v)
			}
		})
	}
}

// report prints the suite's table (and writes it to FLASHSALE_CHAOS_REPORT).
func report(results []*result) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-24s %8s %8s %7s %10s %10s  %s\n", "fault", "requests", "accepted", "orders", "violations", "recovery", "notes")
	for _, res := range results {
		rec := res.recovery.Round(100 * time.Millisecond).String()
		if !res.recovered {
			rec = "never"
		}
		fmt.Fprintf(&b, "%-24s %8d %8d %7d %10d %10s  %s\n", res.name, res.requests, res.accepted, res.orders,
			len(res.violations), rec, res.note)
		for _, v := range res.violations {
			fmt.Fprintf(&b, "%-24s   - %s\n", "", v)
		}
	}
	fmt.Print(b.String())
	if path := os.Getenv("FLASHSALE_CHAOS_REPORT"); path != "" {
		_ = os.WriteFile(path, []byte(b.String()), 0o644)
	}
}

// rig is one scenario's world: a private Redis, a database of its own on the
// suite's private server, the flashsale environment, a client and a checker.
type rig struct {
	t     *testing.T
	bins  Binaries
	db    testenv.DatabaseServer
	dbURL string // direct, for the checker
	redis *Redis
	pfx   string
	env   map[string]string
	sku   string
	hist  *History
	res   *result
	ctx   context.Context
}

func newRig(t *testing.T, bins Binaries, db testenv.DatabaseServer, dbName string, res *result) *rig {
	r := &rig{t: t, bins: bins, db: db, dbURL: db.URL(dbName), redis: StartRedis(t), pfx: "chaos",
		sku: "s", hist: &History{}, res: res, ctx: context.Background()}
	r.env = map[string]string{
		"FLASHSALE_DATABASE_URL":      r.dbURL,
		"FLASHSALE_REDIS_URL":         r.redis.URL,
		"FLASHSALE_REDIS_PREFIX":      r.pfx,
		"FLASHSALE_USER_TOKEN_SECRET": userSecret,
		"FLASHSALE_ADMIN_TOKEN":       adminToken,
		"FLASHSALE_DATA_DIR":          t.TempDir(),
		"FLASHSALE_LOG_LEVEL":         "warn",
		"FLASHSALE_DB_MAX_CONNS":      "8",
		// The suite runs with the defaults a user gets (ack wait, relay
		// grace, apply backoff) but one: a reservation the broker lost is
		// published again from Redis after 30 s by default, a bound that
		// must stay above the normal drain time of a production backlog;
		// the queue-loss scenarios would then measure that wait, not the
		// recovery. A build that does not know a setting ignores it.
		"FLASHSALE_INFLIGHT_REPUBLISH_AFTER": "3s",
	}
	return r
}

// set overrides environment entries, "" removing one.
func (r *rig) set(kv ...string) {
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(r.env, kv[i])
		} else {
			r.env[kv[i]] = kv[i+1]
		}
	}
}

func (r *rig) start() *Service { return StartService(r.t, r.bins.Flashsale, copyEnv(r.env)) }

func copyEnv(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (r *rig) client(s *Service) *Client {
	return NewClient(s.URL, userSecret, adminToken, 2*time.Second)
}

func (r *rig) putSKU(c *Client, stock, limit int) {
	r.t.Helper()
	if err := c.PutSKU(r.ctx, r.sku, stock, limit); err != nil {
		r.t.Fatal(err)
	}
}

// load starts buyers in the background; wait for them with the returned func.
func (r *rig) load(c *Client, l Load) (wait func()) {
	l.SKU = r.sku
	done := make(chan struct{})
	go func() { defer close(done); Drive(r.ctx, c, l, r.hist) }()
	return func() { <-done }
}

// viaProxy returns the database URL with its host replaced by addr.
func (r *rig) viaProxy(addr string) string {
	u, err := url.Parse(r.dbURL)
	if err != nil {
		r.t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// dbAddr returns the database server's host:port.
func (r *rig) dbAddr() string {
	u, err := url.Parse(r.dbURL)
	if err != nil {
		r.t.Fatal(err)
	}
	return u.Host
}

// finish is the end every scenario shares: retry the unknown outcomes with
// their keys, wait until idle with every invariant holding (the recovery
// time counts from healed), check that fresh buyers get exactly what is
// left, that no dead letter is left, and fill the row.
func (r *rig) finish(c *Client, healed time.Time) {
	ck := NewChecker(r.t, r.dbURL, r.redis.URL, r.pfx)
	if left := Settle(r.ctx, c, r.sku, r.hist, 60*time.Second); left > 0 {
		r.res.fail("I9: %d keys still had no answer after the faults healed", left)
	}
	_, _, viol := ck.Idle(r.ctx, r.sku, r.hist, 60*time.Second)
	r.res.recovery = time.Since(healed)
	r.res.recovered = len(viol) == 0
	for _, v := range viol {
		r.res.fail("%s", v)
	}
	if len(viol) == 0 {
		for _, v := range BuyRest(r.ctx, c, ck, r.sku, r.hist) {
			r.res.fail("%s", v)
		}
		if _, _, v := ck.Idle(r.ctx, r.sku, r.hist, 30*time.Second); len(v) > 0 {
			for _, s := range v {
				r.res.fail("after the fresh buyers: %s", s)
			}
		}
	}
	if n, err := DeadLetters(r.ctx, c); err != nil {
		r.res.fail("I10: %v", err)
	} else if n > 0 {
		r.res.fail("I10: %d dead letters left", n)
	}
	r.res.requests, r.res.accepted, r.res.orders = r.hist.Counts()
	r.t.Logf("outcomes: %v", r.hist.Summary())
}

// waitFired waits until failpoint name fired in s.
func waitFired(s *Service, name string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for !s.Fired(name) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// breakerWatch watches s's log for the breaker opening (the service logs
// every state change at warn) and, once stop is closed, returns when it was
// first seen open (zero if never). /readyz is no witness: it asks Redis,
// and hangs with it.
func breakerWatch(s *Service, stop <-chan struct{}) <-chan time.Time {
	out := make(chan time.Time, 1)
	seen := strings.Count(s.Log(), "to=open")
	go func() {
		var opened time.Time
		for {
			select {
			case <-stop:
				out <- opened
				return
			case <-time.After(50 * time.Millisecond):
			}
			if opened.IsZero() && strings.Count(s.Log(), "to=open") > seen {
				opened = time.Now()
			}
		}
	}()
	return out
}

// killBeforeRelay: the service is killed while accepted reservations sit
// between the gate and the stream (the relay hangs at its failpoint).
func killBeforeRelay(r *rig) {
	r.set("FLASHSALE_FAILPOINTS", failpoint.AfterGateBeforeRelay+"=hang")
	s := r.start()
	c := r.client(s)
	r.putSKU(c, 200, 2)
	wait := r.load(c, Load{Buyers: 400, Workers: 16, Rate: 200, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 20 * time.Second})
	r.res.fired = waitFired(s, failpoint.AfterGateBeforeRelay, 10*time.Second)
	time.Sleep(time.Second)
	s.Kill()
	time.Sleep(500 * time.Millisecond)
	s.SetEnv("FLASHSALE_FAILPOINTS", "")
	s.Restart(r.t)
	healed := time.Now()
	wait()
	r.finish(c, healed)
}

// consumerKilled: the consumer's process dies at the failpoint (before its
// transaction, or after the commit before the acks) and is restarted.
func consumerKilled(fp string) func(r *rig) {
	return func(r *rig) {
		r.set("FLASHSALE_FAILPOINTS", fp+"="+failpoint.Exit)
		s := r.start()
		c := r.client(s)
		r.putSKU(c, 200, 2)
		wait := r.load(c, Load{Buyers: 400, Workers: 16, Rate: 200, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 20 * time.Second})
		if !s.Exited(20 * time.Second) {
			r.res.note = "process did not exit"
		}
		exited := time.Now()
		r.res.fired = s.Fired(fp)
		s.SetEnv("FLASHSALE_FAILPOINTS", "")
		s.Restart(r.t)
		healed := time.Now()
		wait()
		r.finish(c, healed)
		if r.res.note == "" {
			// The dead consumer's batch waits the ack wait from its delivery.
			r.res.note = fmt.Sprintf("idle %v after the exit", (r.res.recovery + healed.Sub(exited)).Round(100*time.Millisecond))
		}
	}
}

// redisLost: Redis (no persistence) is killed mid-sale and comes back empty.
func redisLost(r *rig) {
	s := r.start()
	c := r.client(s)
	r.putSKU(c, 300, 2)
	wait := r.load(c, Load{Buyers: 600, Workers: 24, Rate: 150, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 25 * time.Second})
	time.Sleep(time.Second)
	r.redis.Kill()
	r.res.fired = true
	time.Sleep(time.Second)
	r.redis.Restart(r.t)
	healed := time.Now()
	wait()
	r.finish(c, healed)
}

// redisHung: Redis is frozen (SIGSTOP) for 7 s mid-sale, with the default
// breaker settings: the breaker must open within 2 s.
func redisHung(r *rig) { redisOut(r, false) }

// redisDead: Redis is killed and stays dead for 6 s, then comes back empty.
func redisDead(r *rig) { redisOut(r, true) }

func redisOut(r *rig, dead bool) {
	s := r.start()
	c := r.client(s)
	r.putSKU(c, 400, 2)
	wait := r.load(c, Load{Buyers: 1200, Workers: 32, Rate: 120, TwoKeys: 7, DoubleClick: 5, Tries: 10, For: 30 * time.Second})
	time.Sleep(1500 * time.Millisecond)
	stop := make(chan struct{})
	opened := breakerWatch(s, stop)
	at := time.Now()
	if dead {
		r.redis.Kill()
	} else {
		r.redis.Freeze()
	}
	r.res.fired = true
	time.Sleep(7 * time.Second)
	close(stop)
	if dead {
		r.redis.Restart(r.t)
	} else {
		r.redis.Thaw()
	}
	healed := time.Now()
	if o := <-opened; o.IsZero() {
		r.res.fail("breaker: never open during 7 s of a %s Redis under load", map[bool]string{true: "dead", false: "hung"}[dead])
	} else if d := o.Sub(at); d > 2*time.Second {
		r.res.fail("breaker: open %v after Redis went out, want within 2 s", d.Round(100*time.Millisecond))
	} else {
		r.res.note = fmt.Sprintf("breaker open after %v", o.Sub(at).Round(100*time.Millisecond))
	}
	wait()
	r.finish(c, healed)
}

// queueStoreLost: with the database cut off a backlog sits in the embedded
// stream; the process is killed and its JetStream store deleted (an
// ephemeral disk); the database comes back and the process restarts.
func queueStoreLost(r *rig) {
	px := testenv.StartProxy(r.t, r.dbAddr())
	r.set("FLASHSALE_DATABASE_URL", r.viaProxy(px.Addr()))
	s := r.start()
	c := r.client(s)
	r.putSKU(c, 300, 2)
	ck := NewChecker(r.t, r.dbURL, r.redis.URL, r.pfx)
	wait := r.load(c, Load{Buyers: 600, Workers: 16, Rate: 200, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 30 * time.Second})
	time.Sleep(500 * time.Millisecond)
	px.Cut()
	time.Sleep(3 * time.Second)
	rep, _, err := ck.Check(r.ctx, r.sku, r.hist, false)
	if err != nil {
		r.t.Fatal(err)
	}
	r.res.fired = rep.InFlight > rep.Outbox && rep.InFlight > 0
	r.res.note = fmt.Sprintf("backlog %d units in the stream", rep.InFlight-rep.Outbox)
	s.Kill()
	if err := os.RemoveAll(filepath.Join(r.env["FLASHSALE_DATA_DIR"], "nats")); err != nil {
		r.t.Fatal(err)
	}
	px.Restore()
	s.Restart(r.t)
	healed := time.Now()
	wait()
	r.finish(c, healed)
}

// natsRestartedEmpty: the external nats-server is killed mid-sale and
// restarted on an empty store while flashsale keeps running.
func natsRestartedEmpty(r *rig) {
	n := StartNATS(r.t, r.bins.NATS)
	r.set("FLASHSALE_NATS_URL", n.URL)
	s := r.start()
	c := r.client(s)
	r.putSKU(c, 300, 2)
	wait := r.load(c, Load{Buyers: 600, Workers: 16, Rate: 150, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 30 * time.Second})
	time.Sleep(1500 * time.Millisecond)
	n.Kill()
	entries, _ := os.ReadDir(n.Dir)
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(n.Dir, e.Name())); err != nil {
			r.t.Fatal(err)
		}
	}
	r.res.fired = true
	time.Sleep(time.Second)
	n.Restart(r.t)
	healed := time.Now()
	wait()
	r.finish(c, healed)
}

// dbResets: 5% of the TCP segments between flashsale and the database are
// replaced by a reset, the server staying up.
func dbResets(r *rig) {
	px := testenv.StartProxy(r.t, r.dbAddr())
	r.set("FLASHSALE_DATABASE_URL", r.viaProxy(px.Addr()))
	s := r.start()
	c := r.client(s)
	r.putSKU(c, 300, 2)
	px.Flaky(0.05)
	Drive(r.ctx, c, Load{SKU: r.sku, Buyers: 600, Workers: 16, Rate: 120, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 20 * time.Second}, r.hist)
	time.Sleep(2 * time.Second) // let the consumer meet resets on its redeliveries too
	px.Restore()
	healed := time.Now()
	r.res.fired = px.Resets() > 0
	r.res.note = fmt.Sprintf("%d connections reset", px.Resets())
	r.finish(c, healed)
}

// keyRetryFallback: Redis stalls while buyers retry their keys; the breaker
// (set to open fast) sends retries to the database fallback while the first
// attempts may still sit queued behind the stalled Redis.
func keyRetryFallback(r *rig) {
	px := testenv.StartProxy(r.t, r.redis.Addr)
	r.set("FLASHSALE_REDIS_URL", "redis://"+px.Addr()+"/0", "FLASHSALE_REDIS_TIMEOUT", "200ms",
		"FLASHSALE_BREAKER_MIN_REQUESTS", "5", "FLASHSALE_BREAKER_OPEN_FOR", "1s", "FLASHSALE_BREAKER_WINDOW", "2s", "FLASHSALE_REDIS_MONITOR_EVERY", "200ms")
	s := r.start()
	c := NewClient(s.URL, userSecret, adminToken, 1500*time.Millisecond)
	r.putSKU(c, 600, 3)
	wait := r.load(c, Load{Buyers: 900, Workers: 32, Rate: 100, DoubleClick: 3, Tries: 12, For: 30 * time.Second})
	time.Sleep(1500 * time.Millisecond)
	stop := make(chan struct{})
	opened := breakerWatch(s, stop)
	px.Blackhole()
	time.Sleep(6 * time.Second)
	close(stop)
	px.Restore()
	healed := time.Now()
	wait()
	direct := 0
	for _, a := range r.hist.Attempts() {
		if a.Status == http.StatusAccepted && a.OrderStat == "pending_payment" {
			direct++
		}
	}
	o := <-opened
	r.res.fired = direct > 0
	r.res.note = fmt.Sprintf("breaker opened: %v; %d 202s from the database fallback", !o.IsZero(), direct)
	r.finish(c, healed)
}

// sharedPrefix: a second deployment with another database is pointed at the
// first one's Redis and prefix. It must refuse to start; the first loses
// nothing.
func sharedPrefix(r *rig) {
	a := r.start()
	c := r.client(a)
	r.putSKU(c, 300, 2)
	other := copyEnv(r.env)
	other["FLASHSALE_DATABASE_URL"] = r.db.URL(strings.Replace(strings.TrimPrefix(mustPath(r.t, r.dbURL), "/"), "chaos_", "other_", 1))
	other["FLASHSALE_DATA_DIR"] = r.t.TempDir()
	other["FLASHSALE_HTTP_ADDR"] = ""
	r.res.fired = true
	b, err := LaunchService(r.t, r.bins.Flashsale, other, 20*time.Second)
	if err == nil {
		r.res.fail("prefix: a second deployment with another database started on the first one's Redis prefix")
		// Both deployments sell the same sale, as a mistaken configuration would.
		cb := r.client(b)
		if err := cb.PutSKU(r.ctx, r.sku, 300, 2); err != nil {
			r.t.Log(err)
		}
	} else if exited, out := b.ExitedWith(5 * time.Second); exited {
		r.res.note = "second refused: " + lastLine(out)
	} else {
		r.res.fail("prefix: the second deployment neither refused nor became ready within 20 s: %v; log: %s", err, tail(b.Log(), 15))
	}
	Drive(r.ctx, c, Load{SKU: r.sku, Buyers: 500, Workers: 16, Rate: 200, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 20 * time.Second}, r.hist)
	r.finish(c, time.Now())
}

func mustPath(t *testing.T, raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Path
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// payRacesExpiry: every order is paid at its deadline give or take 100 ms
// with a 2 s payment timeout: each ends in exactly one terminal state, none
// paid after its deadline, none released before it, units back only for the
// released ones.
func payRacesExpiry(r *rig) {
	r.set("FLASHSALE_PAYMENT_TIMEOUT", "2s", "FLASHSALE_SWEEP_EVERY", "300ms")
	s := r.start()
	c := r.client(s)
	const n = 300
	r.putSKU(c, n, 1)
	Drive(r.ctx, c, Load{SKU: r.sku, Buyers: n, Workers: 32, Tries: 8, For: 20 * time.Second}, r.hist)
	ck := NewChecker(r.t, r.dbURL, r.redis.URL, r.pfx)
	if _, _, v := ck.Idle(r.ctx, r.sku, r.hist, 30*time.Second); len(v) > 0 {
		for _, s := range v {
			r.res.fail("before paying: %s", s)
		}
		return
	}
	type order struct {
		id, user string
		expires  time.Time
		told     string
	}
	rows, err := ck.Store.DB().QueryContext(r.ctx, ck.Store.Rebind(`SELECT order_id, user_id, expires_at FROM orders WHERE sku_id = ? AND status = 'pending_payment'`), r.sku)
	if err != nil {
		r.t.Fatal(err)
	}
	var orders []*order
	for rows.Next() {
		o := &order{}
		if err := rows.Scan(&o.id, &o.user, &o.expires); err != nil {
			r.t.Fatal(err)
		}
		orders = append(orders, o)
	}
	rows.Close()
	var wg sync.WaitGroup
	for i, o := range orders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(o.expires.Add(time.Duration(i%200-100) * time.Millisecond)))
			p := c.Do(r.ctx, http.MethodPost, "/api/v1/orders/"+o.id+"/pay", "", c.User(o.user))
			switch {
			case p.Status == http.StatusOK && p.Str("status") == "paid":
				o.told = "paid"
			case p.Status == http.StatusConflict && p.Code() == "order_expired":
				o.told = "cancelled"
			default:
				o.told = fmt.Sprintf("%d %s", p.Status, p.Code())
			}
		}()
	}
	wg.Wait()
	r.res.fired = len(orders) > 0
	healed := time.Now()
	_, _, _ = ck.Idle(r.ctx, r.sku, r.hist, 15*time.Second)
	var paidLate, early, wrong, notOne, paid, cancelled int
	for _, o := range orders {
		var status string
		var paidAt, cancelledAt *time.Time
		var terminal int
		err := ck.Store.DB().QueryRowContext(r.ctx, ck.Store.Rebind(`
SELECT o.status, o.paid_at, o.cancelled_at,
       (SELECT COUNT(*) FROM order_transitions x WHERE x.order_id = o.order_id AND x.to_status IN ('paid','cancelled'))
FROM orders o WHERE o.order_id = ?`), o.id).Scan(&status, &paidAt, &cancelledAt, &terminal)
		if err != nil {
			r.t.Fatal(err)
		}
		switch {
		case terminal != 1:
			notOne++
		case status != o.told:
			wrong++
		case status == "paid" && paidAt != nil && paidAt.After(o.expires):
			paidLate++
		case status == "cancelled" && cancelledAt != nil && cancelledAt.Before(o.expires):
			early++
		}
		switch status {
		case "paid":
			paid++
		case "cancelled":
			cancelled++
		}
	}
	if notOne > 0 {
		r.res.fail("I8: %d orders without exactly one terminal transition", notOne)
	}
	if wrong > 0 {
		r.res.fail("I8: %d payers told another outcome than the database's", wrong)
	}
	if paidLate > 0 {
		r.res.fail("I8: %d orders paid after their deadline", paidLate)
	}
	if early > 0 {
		r.res.fail("I8: %d orders released before their deadline", early)
	}
	r.res.note = fmt.Sprintf("%d paid, %d expired", paid, cancelled)
	r.finish(c, healed)
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// scriptMonitor counts the scripts (EVALSHA and EVAL) a Redis server runs
// whose arguments name one of the test's own tokens (a user id, a SKU), read
// from a MONITOR connection. The service's background work (the
// republisher's pass over every SKU each second, the janitor, the
// reconciler) runs scripts at any time; those never carry the test's buyers,
// so they are not counted.
type scriptMonitor struct {
	t     *testing.T
	c     net.Conn
	lines chan string
}

func monitorScripts(t *testing.T, addr string) *scriptMonitor {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "MONITOR\r\n"); err != nil {
		t.Fatal(err)
	}
	m := &scriptMonitor{t: t, c: c, lines: make(chan string, 1<<16)}
	br := bufio.NewReader(c)
	if l, err := br.ReadString('\n'); err != nil || strings.TrimSpace(l) != "+OK" {
		t.Fatalf("MONITOR: %q %v", l, err)
	}
	go func() {
		defer close(m.lines)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			m.lines <- l
		}
	}()
	return m
}

// count runs f, then returns how many scripts Redis ran meanwhile whose
// command line contains token. It waits for a marker command sent after f
// (MONITOR shows commands in the order Redis ran them), not for a time.
func (m *scriptMonitor) count(h *harness, token string, f func()) int {
	m.t.Helper()
	m.drain()
	f()
	marker := testenv.RandomName("monitor-marker-")
	c := h.a.redis
	if err := c.Do(context.Background(), c.B().Echo().Message(marker).Build()).Error(); err != nil {
		m.t.Fatal(err)
	}
	n := 0
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-m.lines:
			if !ok {
				m.t.Fatal("MONITOR connection closed")
			}
			if strings.Contains(l, marker) {
				return n
			}
			if isScript(l) && strings.Contains(l, token) {
				m.t.Logf("script call of this test: %s", strings.TrimSpace(l))
				n++
			}
		case <-timeout:
			m.t.Fatalf("MONITOR never showed marker %s", marker)
		}
	}
}

// drain drops the lines already read.
func (m *scriptMonitor) drain() {
	for {
		select {
		case <-m.lines:
		default:
			return
		}
	}
}

// isScript reports whether a MONITOR line is an EVALSHA or EVAL call:
// `1700000000.000000 [0 127.0.0.1:1234] "evalsha" "sha" ...`.
func isScript(line string) bool {
	_, rest, ok := strings.Cut(line, "] ")
	if !ok {
		return false
	}
	cmd, _, _ := strings.Cut(rest, " ")
	cmd = strings.ToLower(strings.Trim(cmd, `"`))
	return cmd == "evalsha" || cmd == "eval" || cmd == "evalsha_ro" || cmd == "eval_ro"
}

// TestJunkNeverReachesGate: unknown SKUs, requests before or after the sale
// window and purchases of a sold-out SKU are answered from memory: the Redis
// gate (a script call) never runs for them. Counted on a private
// redis-server with INFO commandstats.
func TestJunkNeverReachesGate(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	h := newHarness(t, testConfig(t, "external", "FLASHSALE_REDIS_URL", rs.URL, "FLASHSALE_SOLD_OUT_TTL", "1h"))
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	pastStart := time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339)
	if r := h.putSKUAnswered("later", `{"stock":5,"per_user_limit":1,"starts_at":"`+future+`"}`); !saved(r) {
		t.Fatal(r.Raw)
	}
	if r := h.putSKUAnswered("over", `{"stock":5,"per_user_limit":1,"starts_at":"`+pastStart+`","ends_at":"`+past+`"}`); !saved(r) {
		t.Fatal(r.Raw)
	}
	h.mustPutSKU("live", 3, 1)
	var accepted []string
	for i := 0; i < 3; i++ {
		r := h.buy(fmt.Sprintf("early-%d", i), "live", 1, fmt.Sprintf("k%d", i))
		if r.Status != http.StatusAccepted {
			t.Fatal(r.Raw)
		}
		accepted = append(accepted, r.str("order_id"))
	}
	settle(t, h.a, "live", accepted, 20*time.Second)

	mon := monitorScripts(t, rs.Addr)
	// The service's own background passes run scripts on every SKU at any
	// time (the republisher each second); a burst of them here must not
	// count as the test's.
	noise, stopNoise := context.WithCancel(context.Background())
	defer stopNoise()
	noiseDone := make(chan struct{})
	go func() {
		defer close(noiseDone)
		for noise.Err() == nil {
			_, _ = h.a.gate.Stuck(noise, "live", time.Now(), 0, 16)
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() { stopNoise(); <-noiseDone }()

	// The counter works: one purchase that does reach the gate is seen.
	h.mustPutSKU("control", 5, 1)
	if d := mon.count(h, "control-buyer", func() {
		if r := h.buy("control-buyer", "control", 1, ""); r.Status != http.StatusAccepted {
			t.Fatal(r.Raw)
		}
	}); d < 1 {
		t.Fatalf("a purchase that reached the gate ran %d scripts", d)
	}

	type junk struct {
		sku, code string
		status    int
	}
	classes := []junk{
		{"no-such-sku", "unknown_sku", http.StatusNotFound},
		{"later", "sale_not_started", http.StatusConflict},
		{"over", "sale_ended", http.StatusConflict},
		{"live", "sold_out", http.StatusConflict},
	}
	for _, c := range classes {
		t.Run(c.code, func(t *testing.T) {
			var bad atomic.Int64
			buyer := "late-" + c.code + "-"
			d := mon.count(h, buyer, func() {
				var wg sync.WaitGroup
				for i := 0; i < 100; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sku := c.sku
						if c.code == "unknown_sku" {
							sku = fmt.Sprintf("junk-%d", i)
						}
						r := h.buy(fmt.Sprintf("%s%d", buyer, i), sku, 1, "")
						if r.Status != c.status || r.code() != c.code {
							bad.Add(1)
							t.Errorf("%s: %d %s, want %d %s", sku, r.Status, r.Raw, c.status, c.code)
						}
					}()
				}
				wg.Wait()
			})
			if d != 0 {
				t.Fatalf("%d gate calls for %s requests, want 0", d, c.code)
			}
		})
	}
	// A retry of a sold-out SKU with the key that bought it still gets its
	// order (one HGET, no script).
	if d := mon.count(h, "early-1", func() {
		if r := h.buy("early-1", "live", 1, "k1"); !purchaseAccepted(r) || r.str("order_id") != accepted[1] {
			t.Errorf("keyed retry after sell-out: %d %s, want order %s", r.Status, r.Raw, accepted[1])
		}
	}); d != 0 {
		t.Fatalf("keyed retry ran %d scripts", d)
	}
	settle(t, h.a, "live", accepted, 20*time.Second)
}

// TestFloodIsLimited: one user hammering gets 429 rate_limited with
// Retry-After, so does a bot rotating user ids from one address, while 2,000
// honest buyers (each from its own address, through a trusted proxy) buy the
// whole stock; no honest buyer is limited and every invariant holds.
func TestFloodIsLimited(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	const stock, buyers = 400, 2000
	h := newHarness(t, testConfig(t, "external",
		"FLASHSALE_TRUSTED_PROXIES", "127.0.0.1/32, ::1",
		"FLASHSALE_RATE_LIMIT_IP", "5", "FLASHSALE_RATE_LIMIT_IP_BURST", "10"))
	h.mustPutSKU("hot", stock, 1)

	type tally struct {
		mu       sync.Mutex
		codes    map[string]int
		accepted map[string]string // order id -> user
		badRetry int
	}
	newTally := func() *tally { return &tally{codes: map[string]int{}, accepted: map[string]string{}} }
	record := func(tl *tally, user string, r reply, hdr http.Header) {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		switch {
		case r.Status == http.StatusAccepted:
			tl.codes["accepted"]++
			tl.accepted[r.str("order_id")] = user
		case r.Status == 0:
			tl.codes["transport"]++
		default:
			tl.codes[r.code()]++
		}
		if r.Status == http.StatusTooManyRequests {
			if n, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || n < 1 {
				tl.badRetry++
			}
		}
	}
	buyAs := func(tl *tally, user, ip, key string) {
		req, err := http.NewRequest(http.MethodPost, h.srvURL+"/api/v1/orders", strings.NewReader(`{"sku_id":"hot","quantity":1}`))
		if err != nil {
			t.Error(err)
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+userToken(t, user))
		req.Header.Set("X-Forwarded-For", ip)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		var r reply
		resp, err := h.hc.Do(req)
		if err != nil {
			record(tl, user, r, nil)
			return
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r.Status, r.Raw = resp.StatusCode, string(raw)
		_ = json.Unmarshal(raw, &r.Body)
		record(tl, user, r, resp.Header)
	}

	honest, flooder, bot := newTally(), newTally(), newTally()
	start := time.Now()
	stop := make(chan struct{})
	var fw sync.WaitGroup
	var botN atomic.Int64
	for w := 0; w < 4; w++ {
		fw.Add(2)
		go func() { // one user, hammering
			defer fw.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				buyAs(flooder, "flooder", "198.51.100.7", "")
			}
		}()
		go func() { // a bot with many accounts behind one address
			defer fw.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				u := fmt.Sprintf("bot-%d", botN.Add(1))
				buyAs(bot, u, "198.51.100.66", "")
			}
		}()
	}

	// The honest buyers come once the flooder and the bot have each been
	// limited: started at once, on a busy machine the honest crowd could
	// sell out before the bot made more than its burst of attempts, and
	// sold-out answers come from memory, before any limit.
	waitFor(t, 30*time.Second, "the flooder and the bot answered 429", func() bool {
		limited := func(tl *tally) bool { tl.mu.Lock(); defer tl.mu.Unlock(); return tl.codes["rate_limited"] > 0 }
		return limited(flooder) && limited(bot)
	})
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				user := fmt.Sprintf("buyer-%d", i)
				ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
				clicks := 1
				if i%5 == 0 {
					clicks = 2 // an impatient double click
				}
				for c := 0; c < clicks; c++ {
					buyAs(honest, user, ip, fmt.Sprintf("hot-%d-%d", i, c))
				}
			}
		}()
	}
	for i := 0; i < buyers; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(stop)
	fw.Wait()
	elapsed := time.Since(start)
	t.Logf("in %v: honest %v; flooder %v; bot %v", elapsed.Round(time.Millisecond), honest.codes, flooder.codes, bot.codes)

	if honest.codes["rate_limited"] != 0 || honest.codes["transport"] != 0 {
		t.Errorf("honest buyers were limited or lost: %v", honest.codes)
	}
	if flooder.codes["accepted"] > 1 {
		t.Errorf("the flooder bought %d units (per-user limit 1)", flooder.codes["accepted"])
	}
	if flooder.codes["rate_limited"] == 0 || bot.codes["rate_limited"] == 0 {
		t.Errorf("no 429 for the flooder (%v) or the bot (%v)", flooder.codes, bot.codes)
	}
	if flooder.badRetry+bot.badRetry > 0 {
		t.Errorf("%d 429s without a whole-second Retry-After", flooder.badRetry+bot.badRetry)
	}
	// The bot's address may buy its burst plus 5 a second while the sale lasts.
	if most := 10 + int(5*elapsed.Seconds()) + 5; bot.codes["accepted"] > most {
		t.Errorf("the bot bought %d units behind one address, want at most %d", bot.codes["accepted"], most)
	}
	var ids []string
	for _, tl := range []*tally{honest, flooder, bot} {
		for id := range tl.accepted {
			ids = append(ids, id)
		}
	}
	if len(ids) != stock {
		t.Errorf("%d purchases accepted, want the whole stock %d", len(ids), stock)
	}
	if honest.codes["accepted"] < stock-1-bot.codes["accepted"] {
		t.Errorf("honest buyers got %d units", honest.codes["accepted"])
	}
	rep := settle(t, h.a, "hot", ids, 60*time.Second)
	if rep.LiveUnits != stock || rep.MaxUserUnits > 1 {
		t.Fatalf("after the sale: %+v", rep)
	}
}

// TestReleasedUnitSoldAgain: a sold-out SKU is answered from memory, but a
// unit given back by a cancellation is sold again at once on every
// instance: the restorer announces it (the sold-out TTL here is an hour, so
// only the notice can clear the flag).
func TestReleasedUnitSoldAgain(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	cfg := testConfig(t, "external", "FLASHSALE_SOLD_OUT_TTL", "1h", "FLASHSALE_CATALOG_REFRESH", "1h")
	a, b := newHarness(t, cfg), newHarness(t, cfg)
	a.mustPutSKU("one", 1, 1)
	waitFor(t, 5*time.Second, "instance b learns the new sale", func() bool {
		return b.do(http.MethodGet, "/api/v1/skus/one", "").Status == http.StatusOK
	})
	first := a.buy("alice", "one", 1, "")
	if first.Status != http.StatusAccepted {
		t.Fatal(first.Raw)
	}
	settle(t, a.a, "one", []string{first.str("order_id")}, 20*time.Second)
	for _, h := range []*harness{a, b} {
		if r := h.buy("bob", "one", 1, ""); r.code() != "sold_out" {
			t.Fatalf("before the release: %d %s", r.Status, r.Raw)
		}
		if !h.a.buy.SoldOutFlagged("one") {
			t.Fatal("sold-out flag not set")
		}
	}
	if r := a.do(http.MethodPost, "/api/v1/orders/"+first.str("order_id")+"/cancel", "", "Authorization: Bearer "+userToken(t, "alice")); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	var second reply
	waitFor(t, 5*time.Second, "the released unit is sold again on instance b", func() bool {
		second = b.buy("bob", "one", 1, "bob-1")
		return second.Status == http.StatusAccepted
	})
	if r := a.buy("carol", "one", 1, ""); r.code() != "sold_out" {
		t.Fatalf("instance a after the resale: %d %s", r.Status, r.Raw)
	}
	rep := settle(t, a.a, "one", []string{second.str("order_id")}, 20*time.Second)
	if rep.LiveUnits != 1 {
		t.Fatalf("after the resale: %+v", rep)
	}

	// A restock through instance a reaches instance b's flag too.
	if r := b.buy("dave", "one", 1, ""); r.code() != "sold_out" {
		t.Fatalf("after the resale: %d %s", r.Status, r.Raw)
	}
	a.mustPutSKU("one", 2, 1)
	waitFor(t, 5*time.Second, "the restocked unit is sold on instance b", func() bool {
		return b.buy("dave", "one", 1, "dave-1").Status == http.StatusAccepted
	})
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestOthersOrdersInvisible: a user cannot read, pay or cancel another
// user's order; the answer is the same as for an order that does not exist.
func TestOthersOrdersInvisible(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("s", 5, 1)
	r := h.buy("alice", "s", 1, "")
	if r.Status != http.StatusAccepted {
		t.Fatal(r.Raw)
	}
	id := r.str("order_id")
	check := func(when string) {
		bob := "Authorization: Bearer " + userToken(t, "bob")
		for _, req := range []struct{ method, path string }{
			{http.MethodGet, "/api/v1/orders/" + id},
			{http.MethodPost, "/api/v1/orders/" + id + "/pay"},
			{http.MethodPost, "/api/v1/orders/" + id + "/cancel"},
		} {
			got := h.do(req.method, req.path, "", bob)
			if got.Status != http.StatusNotFound || got.code() != "order_not_found" || strings.Contains(got.Raw, "alice") {
				t.Errorf("%s: bob %s %s: %d %s, want 404 order_not_found", when, req.method, req.path, got.Status, got.Raw)
			}
		}
		if got := h.do(http.MethodGet, "/api/v1/orders/"+id, "", "Authorization: Bearer "+userToken(t, "alice")); got.Status != http.StatusOK {
			t.Errorf("%s: alice reads her order: %d %s", when, got.Status, got.Raw)
		}
	}
	check("queued")
	settle(t, h.a, "s", []string{id}, 20*time.Second)
	check("in the database")
	settle(t, h.a, "s", []string{id}, 20*time.Second) // nothing changed
}

// TestSlowClientsCut: the real server (its timeouts, header limit) cuts a
// client that dribbles its headers, refuses oversized headers with 431, and
// keeps serving others meanwhile.
func TestSlowClientsCut(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for the 5s header timeout")
	}
	h := newHarness(t, testConfig(t, "external"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- h.a.serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-served
	})
	addr := ln.Addr().String()

	// Ten slow clients, each sending a header line a second and never finishing.
	type result struct {
		lines   int
		elapsed time.Duration
	}
	results := make(chan result, 10)
	for i := 0; i < 10; i++ {
		go func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				results <- result{}
				return
			}
			defer c.Close()
			start := time.Now()
			closed := make(chan struct{})
			go func() { _, _ = io.Copy(io.Discard, c); close(closed) }()
			_, _ = io.WriteString(c, "POST /api/v1/orders HTTP/1.1\r\nHost: x\r\n")
			lines := 0
			for {
				select {
				case <-closed:
					results <- result{lines, time.Since(start)}
					return
				case <-time.After(time.Second):
				}
				if time.Since(start) > 20*time.Second {
					results <- result{lines, -1}
					return
				}
				if _, err := fmt.Fprintf(c, "X-Slow-%d: %d\r\n", lines, lines); err != nil {
					<-closed
					results <- result{lines, time.Since(start)}
					return
				}
				lines++
			}
		}()
	}

	// Meanwhile others are served.
	time.Sleep(500 * time.Millisecond)
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz while slow clients hang on: %v %v", resp, err)
	}
	resp.Body.Close()

	// Headers past the limit: 431, the server stays up.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 64<<10))
	status, _ := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if !strings.Contains(status, "431") {
		t.Errorf("oversized headers: %q, want 431", status)
	}

	for i := 0; i < 10; i++ {
		r := <-results
		if r.elapsed < 0 || r.elapsed > 9*time.Second {
			t.Errorf("a slow client sent %d header lines and was not cut within 9s (%v)", r.lines, r.elapsed)
		}
	}
	resp, err = http.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz after the slow clients: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestTrustedGatewayMode: with the mode on, a trusted proxy names the user
// in the header and needs no token; from an untrusted peer the header is
// ignored. The settings are checked at start.
func TestTrustedGatewayMode(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	body := `{"sku_id":"g","quantity":1}`
	trusted := newHarness(t, testConfig(t, "external",
		"FLASHSALE_TRUSTED_PROXIES", "127.0.0.1", "FLASHSALE_TRUSTED_GATEWAY_HEADER", "X-User-Id"))
	trusted.mustPutSKU("g", 5, 1)
	if r := trusted.do(http.MethodPost, "/api/v1/orders", body, "X-User-Id: gw-alice"); r.Status != http.StatusAccepted {
		t.Fatalf("from the trusted gateway: %d %s", r.Status, r.Raw)
	}
	if r := trusted.do(http.MethodPost, "/api/v1/orders", body, "X-User-Id: not a user"); r.Status != http.StatusUnauthorized {
		t.Fatalf("a bad user id from the gateway: %d %s", r.Status, r.Raw)
	}

	untrusted := newHarness(t, testConfig(t, "external",
		"FLASHSALE_TRUSTED_PROXIES", "10.0.0.0/8", "FLASHSALE_TRUSTED_GATEWAY_HEADER", "X-User-Id"))
	untrusted.mustPutSKU("g", 5, 1)
	if r := untrusted.do(http.MethodPost, "/api/v1/orders", body, "X-User-Id: gw-alice"); r.Status != http.StatusUnauthorized {
		t.Fatalf("header from an untrusted peer: %d %s", r.Status, r.Raw)
	}
	if r := untrusted.do(http.MethodPost, "/api/v1/orders", body, "X-User-Id: gw-alice", "Authorization: Bearer "+userToken(t, "bob")); r.Status != http.StatusAccepted {
		t.Fatalf("token from an untrusted peer: %d %s", r.Status, r.Raw)
	}

	for _, bad := range [][]string{
		{"FLASHSALE_TRUSTED_GATEWAY_HEADER", "X-User-Id"}, // no trusted proxies
		{"FLASHSALE_TRUSTED_PROXIES", "10.0.0.0/33"},
		{"FLASHSALE_TRUSTED_PROXIES", "10.0.0.1", "FLASHSALE_TRUSTED_GATEWAY_HEADER", "Authorization"},
		{"FLASHSALE_TRUSTED_PROXIES", "10.0.0.1", "FLASHSALE_TRUSTED_GATEWAY_HEADER", "X User"},
		{"FLASHSALE_RATE_LIMIT_USER", "-1"},
		{"FLASHSALE_RATE_LIMIT_IP_BURST", "-5"},
		{"FLASHSALE_SOLD_OUT_TTL", "-1s"},
		{"FLASHSALE_SOLD_OUT_LEASE", "50ms"},
		{"FLASHSALE_SOLD_OUT_LEASE", "soon"},
	} {
		env := map[string]string{}
		for i := 0; i+1 < len(bad); i += 2 {
			env[bad[i]] = bad[i+1]
		}
		if _, err := parseConfig("test", nil, func(k string) string { return env[k] }, io.Discard, nil); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

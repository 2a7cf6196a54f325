package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/internal/fleet"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestDashboard drives the operators' page in headless Chromium against an
// in-process flashsale: it loads behind the admin token (a wrong one is
// refused), its numbers follow a sale bought through the API, its forms
// restock and create sales and replay a dead letter, it fits a phone, and
// it says so when the server goes away.
//
// FLASHSALE_DASHBOARD_SCREENSHOT=path also runs a sale for half a minute and
// saves a screenshot of the page during it (docs/dashboard.png).
func TestDashboard(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	chrome := chromiumPath(t)
	cfg := testConfig(t, "external", "FLASHSALE_APPLY_BACKOFF", "50ms", "FLASHSALE_MAX_DELIVER", "2", "FLASHSALE_CHALLENGE_COST", "20")
	// Redis through a proxy, to cut it off at the end.
	ru, err := url.Parse(cfg.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	redisProxy := testenv.StartProxy(t, ru.Host)
	ru.Host = redisProxy.Addr()
	cfg.RedisURL = ru.String()
	h := newHarness(t, cfg)
	h.mustPutSKU("phone-1", 60, 2)
	p := openBrowser(t, chrome)

	t.Run("wrong token refused", func(t *testing.T) {
		p.t = t
		p.do(chromedp.Navigate(h.srvURL + "/"))
		p.waitFor("the redirect to /dashboard/ and the token form", `location.pathname === "/dashboard/" && !document.querySelector("#login").hidden`)
		p.do(chromedp.SendKeys(chromedp.ID("token"), "not-the-token"), chromedp.Click(chromedp.CSS("#token-form button")))
		p.waitFor("the refusal", `!document.querySelector("#token-error").hidden && document.querySelector("#token-error").textContent.includes("refused")`)
		p.waitFor("no data shown and nothing kept", `document.querySelector("#main").hidden && sessionStorage.length === 0 && !location.href.includes("token")`)
	})

	t.Run("loads with the right token", func(t *testing.T) {
		p.t = t
		p.do(chromedp.SetValue(chromedp.ID("token"), testAdmin), chromedp.Click(chromedp.CSS("#token-form button")))
		p.waitFor("the sale's row", `!document.querySelector("#main").hidden && cell("phone-1", "avail") === "60" && cell("phone-1", "state") === "on sale"`)
		if got := p.eval(`location.href`); strings.Contains(got, testAdmin) {
			t.Fatalf("the token is in the URL: %s", got)
		}
		p.waitFor("the pipeline figures", `document.querySelector("#kpi-dlq").textContent === "0" && document.querySelector("#breaker").textContent === "breaker closed"`)
	})

	t.Run("shows the release", func(t *testing.T) {
		p.t = t
		p.waitFor("this instance, stable, and no trial", `document.querySelectorAll("#instances tbody tr").length === 1 &&
			document.querySelector("#instances tbody tr td:nth-child(2)").textContent === "stable" &&
			document.querySelector("#canary-state").textContent.startsWith("No canary trial")`)
		now := time.Now().UTC()
		if err := h.a.fleet.SetCanary(context.Background(), fleet.Canary{Share: 5, State: "running", Steps: []int{5, 50, 100}, StartedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		p.waitFor("the trial's share and state", `document.querySelector("#canary-state").textContent.startsWith("Canary: 5% of buyers, running (steps 5% → 50% → 100%)")`)
	})

	t.Run("shows the crowd", func(t *testing.T) {
		p.t = t
		p.waitFor("no room yet", `!document.querySelector("#rooms-empty").hidden && document.querySelector("#crowd-tickets").textContent.startsWith("No challenge")`)
		if r := h.putSKUAnswered("queue-1", `{"stock":4,"per_user_limit":1,"waiting_room":true,"ticket_required":true}`); !saved(r) {
			t.Fatalf("put: %d %s", r.Status, r.Raw)
		}
		tk := h.ticketFor("fan-1", "queue-1")
		if r := h.do(http.MethodPost, "/api/v1/skus/queue-1/queue", "", "Authorization: Bearer "+userToken(t, "fan-1"), "Flashsale-Ticket: "+tk); r.Status != http.StatusCreated {
			t.Fatalf("join: %d %s", r.Status, r.Raw)
		}
		p.waitFor("the room and the challenge", `document.querySelector('#rooms tbody tr[data-sku="queue-1"] td:nth-child(2)')?.textContent === "1" &&
			document.querySelector('#rooms tbody tr[data-sku="queue-1"] td:nth-child(6)')?.textContent === "4" &&
			document.querySelector("#crowd-tickets").textContent.startsWith("Challenges: 1 issued, 1 solved, 0 refused.")`)
	})

	t.Run("numbers move during a sale", func(t *testing.T) {
		p.t = t
		for i := range 10 {
			if r := h.buy(fmt.Sprintf("buyer-%d", i), "phone-1", 1, ""); r.Status != http.StatusAccepted {
				t.Fatalf("buy: %d %s", r.Status, r.Raw)
			}
		}
		r := h.buy("buyer-0", "phone-1", 2, "") // over the limit of 2: refused
		if r.code() != "limit_reached" {
			t.Fatalf("third unit: %d %s", r.Status, r.Raw)
		}
		// The per-second figures cover the window since the page's last
		// poll: read them at once, before waiting for the database (which
		// takes its time on a busy machine, and with it the window).
		p.waitFor("the per-second figures", `Number(document.querySelector("#kpi-accepted").textContent) > 0 &&
			/^[0-9.]+ · [0-9.]+ · [0-9.]+$/.test(document.querySelector("#kpi-latency").textContent)`)
		p.waitFor("available down by 10", `cell("phone-1", "avail") === "50" && cell("phone-1", "db") === "50"`)
		p.waitFor("the counters", `document.querySelector("#kpi-accepted-total").textContent.startsWith("10 ") &&
			document.querySelector("#kpi-rejected-why").textContent.includes("limit")`)
	})

	t.Run("a fresh load draws the recent history", func(t *testing.T) {
		p.t = t
		// The overview serves the instance's recent samples; wait until
		// they span a few seconds and show the sale's purchases.
		var hist map[string]any
		deadline := time.Now().Add(15 * time.Second)
		for {
			r := h.do(http.MethodGet, "/admin/v1/overview", "", "Authorization: Bearer "+testAdmin)
			hist, _ = r.Body["history"].(map[string]any)
			ts, _ := hist["t"].([]any)
			purchases, _ := hist["purchases"].(map[string]any)
			acc, _ := purchases["accepted"].([]any)
			available, _ := hist["available"].(map[string]any)
			avail, _ := available["phone-1"].([]any)
			if len(ts) >= 6 && len(acc) == len(ts) && len(avail) == len(ts) &&
				acc[len(acc)-1] == float64(10) && avail[len(avail)-1] == float64(50) &&
				ts[len(ts)-1].(float64)-ts[0].(float64) >= 5000 {
				if hist["period_seconds"] != float64(1) {
					t.Errorf("period_seconds = %v, want 1", hist["period_seconds"])
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("history after 10 purchases: %d %s", r.Status, r.Raw)
			}
			time.Sleep(200 * time.Millisecond)
		}

		// A reload (the token is kept for the tab) charts at once what
		// happened before it: points older than the page itself.
		p.do(chromedp.Reload())
		p.waitFor("the page unlocked and charted", `!document.querySelector("#main").hidden &&
			document.querySelector("#rate-chart").dataset.points !== undefined && cell("phone-1", "avail") === "50"`)
		// The page's own samples are all later than its load (the server's
		// clock is the browser's): older points came with the overview.
		got := p.eval(`JSON.stringify({origin: performance.timeOrigin,
			rate: document.querySelector("#rate-chart").dataset, stock: document.querySelector("#stock-chart").dataset})`)
		var drawn struct {
			Origin      float64
			Rate, Stock struct{ Points, From string }
		}
		if err := json.Unmarshal([]byte(got), &drawn); err != nil {
			t.Fatal(err)
		}
		for name, c := range map[string]struct{ Points, From string }{"rate": drawn.Rate, "stock": drawn.Stock} {
			from, err := strconv.ParseFloat(c.From, 64)
			if n, _ := strconv.Atoi(c.Points); err != nil || n < 4 || drawn.Origin-from < 3000 {
				t.Errorf("%s chart: %s points from %.0f ms before the load, want the recent history (%s)",
					name, c.Points, drawn.Origin-from, got)
			}
		}
		if path := os.Getenv("FLASHSALE_DASHBOARD_RELOAD_SCREENSHOT"); path != "" {
			shot, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, shot, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("restock and create through the form", func(t *testing.T) {
		p.t = t
		p.do(chromedp.Click(chromedp.CSS(`tr[data-sku="phone-1"] button.edit`)))
		p.waitFor("the form filled in", `document.querySelector("#f-sku").value === "phone-1" && document.querySelector("#f-stock").value === "60" && document.querySelector("#f-limit").value === "2"`)
		p.do(chromedp.SetValue(chromedp.ID("f-stock"), "90"), chromedp.Click(chromedp.ID("f-submit")))
		p.waitFor("the confirmation", `document.querySelector("#sku-result").textContent.startsWith("Saved phone-1: allocation 90")`)
		if r := h.do(http.MethodGet, "/api/v1/skus/phone-1", ""); r.Body["available"] != float64(80) || r.Body["per_user_limit"] != float64(2) {
			t.Fatalf("after the restock the API says %d %s, want 80 available, limit 2", r.Status, r.Raw)
		}
		p.waitFor("the new stock on the page", `cell("phone-1", "avail") === "80"`)

		p.do(chromedp.SetValue(chromedp.ID("f-sku"), "watch-2"), chromedp.SetValue(chromedp.ID("f-stock"), "25"),
			chromedp.SetValue(chromedp.ID("f-limit"), "1"), chromedp.Click(chromedp.ID("f-submit")))
		p.waitFor("the new sale", `document.querySelector("#sku-result").textContent.startsWith("Created watch-2") && cell("watch-2", "avail") === "25"`)
		if r := h.do(http.MethodGet, "/api/v1/skus/watch-2", ""); r.Body["available"] != float64(25) {
			t.Fatalf("created sale: %d %s", r.Status, r.Raw)
		}

		p.do(chromedp.SetValue(chromedp.ID("f-stock"), "-5"), chromedp.Click(chromedp.ID("f-submit")))
		// The browser's own check refuses a negative allocation before any request.
		if r := h.do(http.MethodGet, "/api/v1/skus/watch-2", ""); r.Body["available"] != float64(25) {
			t.Fatalf("after an invalid form: %d %s", r.Status, r.Raw)
		}
	})

	t.Run("dead letter listed and replayed", func(t *testing.T) {
		p.t = t
		pool := h.a.store.DB()
		if _, err := pool.ExecContext(context.Background(), `ALTER TABLE orders ADD CONSTRAINT no_mallory CHECK (user_id <> 'mallory' OR status = 'failed')`); err != nil {
			t.Fatal(err)
		}
		r := h.buy("mallory", "watch-2", 1, "")
		if r.Status != http.StatusAccepted {
			t.Fatalf("buy: %d %s", r.Status, r.Raw)
		}
		p.waitFor("the dead letter", `document.querySelector("#kpi-dlq").textContent === "1" &&
			document.querySelectorAll("#dlq tbody tr").length === 1 &&
			document.querySelector("#dlq tbody tr .order").textContent === `+jsString(r.str("order_id"))+` &&
			cell("watch-2", "flight") === "1"`)
		if _, err := pool.ExecContext(context.Background(), `ALTER TABLE orders DROP CONSTRAINT no_mallory`); err != nil {
			t.Fatal(err)
		}
		p.do(chromedp.Click(chromedp.CSS("#dlq tbody tr button.replay")))
		p.waitFor("the replay", `document.querySelector("#dlq-result").textContent.includes("replayed") &&
			document.querySelectorAll("#dlq tbody tr").length === 0 && document.querySelector("#kpi-dlq").textContent === "0"`)
		settle(t, h.a, "watch-2", []string{r.str("order_id")}, 10*time.Second)
		p.waitFor("the order applied", `cell("watch-2", "flight") === "0" && cell("watch-2", "db") === "24"`)
	})

	t.Run("reconcile pass from the page", func(t *testing.T) {
		p.t = t
		p.do(chromedp.Click(chromedp.ID("reconcile")))
		p.waitFor("the pass", `document.querySelector("#reconcile-result").textContent.startsWith("Pass done: ") &&
			document.querySelector("#reconcile-result").textContent.endsWith("all agree.") &&
			document.querySelector("#kpi-reconcile").textContent === "ok"`)
	})

	t.Run("overview API", func(t *testing.T) {
		if r := h.do(http.MethodGet, "/admin/v1/overview", "", "Authorization: Bearer wrong"); r.Status != http.StatusUnauthorized {
			t.Fatalf("wrong token: %d %s", r.Status, r.Raw)
		}
		r := h.do(http.MethodGet, "/admin/v1/overview", "", "Authorization: Bearer "+testAdmin)
		if r.Status != http.StatusOK {
			t.Fatalf("overview: %d %s", r.Status, r.Raw)
		}
		sales, _ := r.Body["sales"].([]any)
		var phone map[string]any
		for _, s := range sales {
			if m := s.(map[string]any); m["sku_id"] == "phone-1" {
				phone = m
			}
		}
		want := map[string]any{"state": "on_sale", "per_user_limit": float64(2), "total_stock": float64(90), "db_stock": float64(80),
			"redis_loaded": true, "redis_available": float64(80), "in_flight": float64(0), "outbox": float64(0), "starts_at": nil, "ends_at": nil}
		for k, v := range want {
			if phone[k] != v {
				t.Errorf("phone-1 %s = %v, want %v (%s)", k, phone[k], v, r.Raw)
			}
		}
		pl, _ := r.Body["pipeline"].(map[string]any)
		if pl["breaker"] != "closed" || pl["dead_letters"] != float64(0) || pl["queue_pending"] == nil {
			t.Errorf("pipeline: %v", pl)
		}
		rc, _ := r.Body["reconcile"].(map[string]any)
		if rc["at"] == nil {
			t.Errorf("reconcile: %v, want the last pass", r.Body["reconcile"])
		}
		c, _ := r.Body["counters"].(map[string]any)
		if pu, _ := c["purchases"].(map[string]any); pu["accepted"] == nil || pu["limit_reached"] == nil {
			t.Errorf("purchases: %v", c["purchases"])
		}
		if l, _ := c["order_latency"].(map[string]any); l["p99_ms"] == nil || l["count"] == float64(0) {
			t.Errorf("order latency: %v", c["order_latency"])
		}
		if _, ok := r.Body["errors"]; ok {
			t.Errorf("errors with every service up: %v", r.Body["errors"])
		}
	})

	if path := os.Getenv("FLASHSALE_DASHBOARD_SCREENSHOT"); path != "" {
		t.Run("screenshot during a sale", func(t *testing.T) {
			p.t = t
			screenshotSale(t, h, p, path)
		})
	}

	t.Run("fits a phone", func(t *testing.T) {
		p.t = t
		p.do(chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
		p.waitFor("no sideways scrolling and the table as cards",
			`document.documentElement.scrollWidth <= innerWidth &&
			getComputedStyle(document.querySelector('tr[data-sku="phone-1"]')).display === "block" &&
			cell("phone-1", "avail") === "80"`)
		p.do(chromedp.EmulateReset())
	})

	t.Run("redis cut off is shown", func(t *testing.T) {
		p.t = t
		redisProxy.Cut()
		p.waitFor("the degraded banner", `!document.querySelector("#banner").hidden &&
			document.querySelector("#banner").textContent.startsWith("Degraded") &&
			document.querySelector("#banner").textContent.includes("redis: ") &&
			cell("phone-1", "avail") === "—" && cell("phone-1", "db") === "80"`)
		redisProxy.Restore()
		p.waitFor("the banner gone", `document.querySelector("#banner").hidden && cell("phone-1", "avail") === "80"`)
	})

	p.noErrors()

	t.Run("server down is shown", func(t *testing.T) {
		p.t = t
		h.srv.Close()
		p.waitFor("the banner", `!document.querySelector("#banner").hidden &&
			document.querySelector("#banner").textContent.startsWith("Server unreachable") &&
			document.querySelector("#conn").textContent === "server down" &&
			document.querySelector("#main").classList.contains("stale")`)
	})
}

// chromiumPath finds Chromium: FLASHSALE_TEST_CHROMIUM, else chromium on
// PATH. Missing, the test skips, or fails when services are required.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FLASHSALE_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Unavailable(t, "chromium (apt-get install chromium)", errors.New("no chromium on PATH and FLASHSALE_TEST_CHROMIUM unset"))
	return ""
}

// browserPage is one tab of a headless Chromium with a fresh profile.
type browserPage struct {
	t      *testing.T
	ctx    context.Context
	mu     sync.Mutex
	errors []string // uncaught exceptions and console.error calls of the page
}

func openBrowser(t *testing.T, chrome string) *browserPage {
	t.Helper()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chrome),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	p := &browserPage{t: t, ctx: ctx}
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", chrome, err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError && len(m.Args) > 0 {
				p.mu.Lock()
				p.errors = append(p.errors, fmt.Sprintf("%s:%d %s", m.URL, m.Line+1, m.Text))
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// cellJS defines cell(sku, class): the text of a cell of a sale's row.
const cellJS = `function cell(sku, cls) {
	const td = document.querySelector('tr[data-sku="' + sku + '"] td.' + cls);
	return td ? td.textContent : null;
}`

func (p *browserPage) do(actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("browser: %v\npage:\n%s", err, p.text())
	}
}

func (p *browserPage) eval(expr string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		p.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return s
}

// waitFor waits until the JavaScript predicate (which may call cell) is true.
func (p *browserPage) waitFor(what, predicate string) {
	p.t.Helper()
	p.waitForWithin(10*time.Second, what, predicate)
}

// waitForWithin is waitFor with its own bound, for what takes real work
// (the buyer page's proof of work on a busy machine).
func (p *browserPage) waitForWithin(within time.Duration, what, predicate string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, within+time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void]("(() => { "+cellJS+"\n return !!("+predicate+"); })()",
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(within)))
	if err != nil {
		p.t.Fatalf("waiting for %s: %v\npage:\n%s", what, err, p.text())
	}
}

// text is what the page shows, for failure messages.
func (p *browserPage) text() string {
	ctx, cancel := context.WithTimeout(p.ctx, 2*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	return s
}

// noErrors fails the test if the page threw or logged an error.
func (p *browserPage) noErrors() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errors) > 0 {
		p.t.Errorf("the page reported errors:\n%s", strings.Join(p.errors, "\n"))
	}
}

func jsString(s string) string { return fmt.Sprintf("%q", s) }

// screenshotSale runs a sale with a varying crowd of buyers for half a
// minute with the page open, then saves a screenshot of it.
func screenshotSale(t *testing.T, h *harness, p *browserPage, path string) {
	ends := time.Now().Add(17 * time.Minute).UTC().Format(time.RFC3339)
	if r := h.putSKUAnswered("sneaker-drop", `{"stock":2500,"per_user_limit":2,"ends_at":"`+ends+`"}`); !saved(r) {
		t.Fatalf("put: %d %s", r.Status, r.Raw)
	}
	p.waitFor("the new sale", `cell("sneaker-drop", "avail") === "2,500"`)
	const run = 45 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	start := time.Now()
	var users atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				// Buyers per second rise and fall: a crowd that arrives in waves.
				x := time.Since(start).Seconds()
				rate := 28 + 22*math.Sin(x/4) + 12*math.Sin(x/1.7)
				time.Sleep(time.Duration(float64(8*time.Second) / max(rate, 4)))
				if w == 0 {
					// Another sale sells out and turns buyers away.
					h.buy(fmt.Sprintf("watcher-%d", i), "watch-2", 1, "")
					continue
				}
				n := users.Add(1)
				if n%7 == 0 {
					n-- // clicks again: the per-user limit refuses the extra units
				}
				h.buy(fmt.Sprintf("crowd-%d", n), "sneaker-drop", 1+int(n%2), "")
			}
		})
	}
	// The shot is taken while the buyers are still at it.
	time.Sleep(run - 3*time.Second)
	p.do(chromedp.Click(chromedp.CSS(`tr[data-sku="sneaker-drop"] button.edit`)), // the restock form, filled in
		chromedp.Click(chromedp.ID("reconcile"))) // a pass in the middle of the sale
	time.Sleep(time.Second)
	p.do(chromedp.Evaluate[chromedp.Void](`document.activeElement.blur(), window.scrollTo(0, 0)`))
	shot, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(shot))
}

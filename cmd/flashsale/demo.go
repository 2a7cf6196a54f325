package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/invariant"
	"github.com/flashsale/flashsale/internal/orderstore"
)

// runDemo starts the service and runs a small sale against it over HTTP, so a
// newcomer sees the whole path work: gate, queue, database, invariants.
func runDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var buyers, stock, conc int
	var exit bool
	cfg, err := parseConfig("demo", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.IntVar(&buyers, "buyers", 2000, "distinct buyers (one in five clicks twice)")
		fs.IntVar(&stock, "stock", 100, "units on sale")
		fs.IntVar(&conc, "concurrency", 200, "buyers pressing at the same moment")
		fs.BoolVar(&exit, "exit", false, "stop after the sale instead of serving until interrupted")
	})
	if err != nil {
		return err
	}
	secretFromEnv := cfg.UserTokenSecret != ""
	if !secretFromEnv {
		cfg.UserTokenSecret = randomHex(16)
	}
	if cfg.AdminToken == "" {
		cfg.AdminToken = randomHex(16)
	}
	if getenv("FLASHSALE_LOG_LEVEL") == "" {
		cfg.LogLevel = "warn"
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "starting flashsale ("+dialectName(cfg.DatabaseURL)+", Redis, embedded JetStream)...")
	a, err := start(ctx, cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		log.Warn("demo: address busy, using a free port", "addr", cfg.HTTPAddr, "err", err)
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			a.close()
			return err
		}
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- a.serve(sctx, ln) }()
	base := "http://" + ln.Addr().String()

	sku := fmt.Sprintf("demo-%d", time.Now().Unix())
	err = demoSale(ctx, a, base, cfg, sku, buyers, stock, conc, secretFromEnv, stdout)
	if err != nil || exit {
		stop()
		<-served
		return err
	}
	live := sku + "-live"
	go demoTrickle(sctx, base, cfg, live)
	fmt.Fprintf(stdout, "\nDashboard: %s/dashboard/  (admin token: %s)\n", base, cfg.AdminToken)
	fmt.Fprintf(stdout, "A trickle of buyers keeps a second sale, %s, moving (6 units restocked every 3 s, for up to an hour);\n", live)
	fmt.Fprintf(stdout, "it never touches %s, so the commands above work as printed.\n", sku)
	fmt.Fprintln(stdout, "\nflashsale keeps serving; press Ctrl-C to stop.")
	return <-served
}

func demoSale(ctx context.Context, a *app, base string, cfg config, sku string, buyers, stock, conc int, secretFromEnv bool, out io.Writer) error {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	body := fmt.Sprintf(`{"stock":%d,"per_user_limit":1,"ends_at":%q}`, stock, demoEnds(sku))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, base+"/admin/v1/skus/"+sku, bytes.NewBufferString(body))
	req.Header.Set("Authorization", "Bearer "+cfg.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("creating demo sale: HTTP %d", resp.StatusCode)
	}
	fmt.Fprintf(out, "sale %s: %d units, 1 per buyer; %d buyers (%d at once), one in five clicks twice\n", sku, stock, buyers, conc)

	var mu sync.Mutex
	var accepted []string
	counts := map[string]*atomic.Int64{}
	for _, k := range []string{"accepted", "sold_out", "limit_reached", "other"} {
		counts[k] = new(atomic.Int64)
	}
	start := time.Now()
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				user := fmt.Sprintf("demo-user-%d", i)
				tok, _ := httpapi.Sign(cfg.UserTokenSecret, user, time.Hour)
				clicks := 1
				if i%5 == 0 {
					clicks = 2
				}
				for c := 0; c < clicks; c++ {
					code, id := demoBuy(ctx, hc, base, tok, sku)
					k := code
					if _, ok := counts[k]; !ok {
						k = "other"
					}
					counts[k].Add(1)
					if code == "accepted" {
						mu.Lock()
						accepted = append(accepted, id)
						mu.Unlock()
					}
				}
			}
		}()
	}
	ticker := time.NewTicker(200 * time.Millisecond)
	// On a terminal the progress line is redrawn in place; elsewhere (a
	// file, a pipe, CI) only the final one is written, with no \r.
	tty := isTerminal(out)
	progress := func() {
		if tty {
			fmt.Fprint(out, "\r")
		}
		fmt.Fprintf(out, "  %6.2fs  accepted %4d  sold_out %5d  limit_reached %4d  other %d   ",
			time.Since(start).Seconds(), counts["accepted"].Load(), counts["sold_out"].Load(), counts["limit_reached"].Load(), counts["other"].Load())
	}
	go func() {
		for i := 0; i < buyers; i++ {
			jobs <- i
		}
		close(jobs)
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-ticker.C:
			if tty {
				progress()
			}
		case <-done:
			waiting = false
		}
	}
	ticker.Stop()
	progress()
	elapsed := time.Since(start)
	fmt.Fprintf(out, "\n%d requests in %.2fs (%.0f req/s)\n", buyers+(buyers+4)/5, elapsed.Seconds(), float64(buyers+(buyers+4)/5)/elapsed.Seconds())

	// Wait for the queue to drain into the database, then check from it.
	fmt.Fprint(out, "waiting for every accepted purchase to reach the database... ")
	deadline := time.Now().Add(60 * time.Second)
	var rep invariant.Report
	for {
		rep, err = invariant.Check(ctx, a.store, a.gate, sku, accepted, true)
		if err != nil {
			return err
		}
		if rep.OK() || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(out, "done in %.2fs\n", time.Since(start).Seconds()-elapsed.Seconds())
	fmt.Fprintf(out, "database: %d live orders for %d units, stock left %d, %d idempotency rows; Redis available %d\n",
		rep.LiveOrders, rep.LiveUnits, rep.DBStock, rep.ProcessLog, rep.RedisAvailable)
	if !rep.OK() {
		return fmt.Errorf("invariants violated: %v", rep.Violations)
	}
	fmt.Fprintln(out, "invariants hold: no oversell, no lost order, one order per buyer, nothing applied twice")
	printTryIt(out, base, cfg, sku, stock, secretFromEnv)
	return nil
}

// printTryIt prints the commands a newcomer can paste while the demo runs,
// as the README advises them: read the sale, restock it by a delta of 10,
// buy as alice with an Idempotency-Key (a retry is safe), and mint a token
// for any other buyer from the source tree. The demo's own buyers never
// touch this SKU afterwards, so each works as printed (TestDemoCommands
// runs them).
func printTryIt(out io.Writer, base string, cfg config, sku string, stock int, secretFromEnv bool) {
	userTok, _ := httpapi.Sign(cfg.UserTokenSecret, "alice", 24*time.Hour)
	fmt.Fprintf(out, "\nTry it:\n  curl %s/api/v1/skus/%s\n", base, sku)
	fmt.Fprintf(out, "  curl -X POST -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' \\\n       -d '{\"delta\":10}' %s/admin/v1/skus/%s/restock   # restock 10 more\n",
		cfg.AdminToken, base, sku)
	fmt.Fprintf(out, "  curl -X POST -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -H 'Idempotency-Key: alice-1' \\\n       -d '{\"sku_id\":\"%s\",\"quantity\":1}' %s/api/v1/orders   # buy as alice (a retry with the same key is safe)\n", userTok, sku, base)
	if secretFromEnv {
		fmt.Fprintln(out, "\nTokens for other buyers (signed with your $FLASHSALE_USER_TOKEN_SECRET), from the source tree:")
		fmt.Fprintln(out, "  go run ./cmd/flashsale token -user bob")
	} else {
		fmt.Fprintln(out, "\nTokens for other buyers (this run's user-token secret is random), from the source tree:")
		fmt.Fprintf(out, "  go run ./cmd/flashsale token -user-token-secret %s -user bob\n", cfg.UserTokenSecret)
	}
}

func demoBuy(ctx context.Context, hc *http.Client, base, tok, sku string) (code, orderID string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/orders",
		bytes.NewBufferString(`{"sku_id":"`+sku+`","quantity":1}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "transport", ""
	}
	defer resp.Body.Close()
	var b struct {
		OrderID string `json:"order_id"`
		Error   struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		return "bad_body", ""
	}
	if resp.StatusCode == http.StatusAccepted {
		return "accepted", b.OrderID
	}
	return b.Error.Code, ""
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// demoTrickle keeps a sale of its own (sku, created here) moving after the
// burst, so the dashboard has something to show: 6 more units every 3 s,
// and buyers arriving in waves (from under one to four a second, one in
// five clicking again into the per-user limit), so the stock builds up and
// sells out in turn. It never touches the sale whose commands the demo
// printed: its absolute restocks would conflict with (or undo) a restock by
// hand. It stops with ctx or after an hour.
func demoTrickle(ctx context.Context, base string, cfg config, sku string) {
	hc := &http.Client{Timeout: 5 * time.Second}
	start := time.Now()
	restocked := time.Time{}
	stock := 0
	tok := ""
	for i := 0; time.Since(start) < time.Hour; i++ {
		if time.Since(restocked) >= 3*time.Second {
			restocked = time.Now()
			stock += 6
			req, _ := http.NewRequestWithContext(ctx, http.MethodPut, base+"/admin/v1/skus/"+sku,
				bytes.NewBufferString(fmt.Sprintf(`{"stock":%d,"per_user_limit":1,"ends_at":%q}`, stock, demoEnds(sku))))
			req.Header.Set("Authorization", "Bearer "+cfg.AdminToken)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := hc.Do(req); err == nil {
				resp.Body.Close()
			}
		}
		wave := 1 + 0.7*math.Sin(2*math.Pi*time.Since(start).Seconds()/40)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(float64(400*time.Millisecond) / wave)):
		}
		if i%5 != 4 {
			tok, _ = httpapi.Sign(cfg.UserTokenSecret, fmt.Sprintf("demo-trickle-%d", i), time.Hour)
		}
		demoBuy(ctx, hc, base, tok, sku)
	}
}

// demoEnds is when a demo sale ends: an hour after it was created (its id
// carries the creation time), so old demo sales leave the dashboard and
// their Redis keys are dropped by the janitor.
func demoEnds(sku string) string {
	var created int64
	fmt.Sscanf(sku, "demo-%d", &created)
	return time.Unix(created, 0).Add(time.Hour).UTC().Format(time.RFC3339)
}

// dialectName names the database of url for people.
func dialectName(url string) string {
	if orderstore.DialectOf(url) == orderstore.MySQL {
		return "MySQL/MariaDB"
	}
	return "PostgreSQL"
}

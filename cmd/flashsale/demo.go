package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/flashsale/flashsale/internal/demo"
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

	d := demo.Config{Base: base, AdminToken: cfg.AdminToken, UserTokenSecret: cfg.UserTokenSecret, SecretFromEnv: secretFromEnv,
		SKU: demo.NewSKU(time.Now()), Buyers: buyers, Stock: stock, Concurrency: conc, DB: a.store, Gate: a.gate}
	// Ctrl-C (or SIGTERM) at any time stops the demo as it stops serve:
	// draining first, saying so, then a clean exit.
	drain := func() error {
		fmt.Fprintf(stdout, "\ndraining: /readyz answers 503 draining for %v while requests still succeed, then flashsale stops...\n", cfg.DrainDelay)
		if err := <-served; err != nil {
			return err
		}
		fmt.Fprintln(stdout, "stopped")
		return nil
	}
	err = demo.Sale(ctx, d, stdout)
	if ctx.Err() != nil {
		return drain()
	}
	if err != nil || exit {
		stop()
		<-served
		return err
	}
	live := d.SKU + "-live"
	go demo.Trickle(sctx, d, live)
	fmt.Fprintf(stdout, "\nDashboard: %s/dashboard/  (admin token: %s)\n", base, cfg.AdminToken)
	fmt.Fprintf(stdout, "A trickle of buyers keeps a second sale, %s, moving (6 units restocked every 3 s, for up to an hour);\n", live)
	fmt.Fprintf(stdout, "it never touches %s, so the commands above work as printed.\n", d.SKU)
	fmt.Fprintln(stdout, "\nflashsale keeps serving; press Ctrl-C to stop.")
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		return drain()
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// dialectName names the database of url for people.
func dialectName(url string) string {
	if orderstore.DialectOf(url) == orderstore.MySQL {
		return "MySQL/MariaDB"
	}
	return "PostgreSQL"
}

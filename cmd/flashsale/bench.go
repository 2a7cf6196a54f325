package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/bench"
	"github.com/flashsale/flashsale/internal/loadgen"
	"github.com/flashsale/flashsale/internal/strategy"
)

const benchUsage = `flashsale bench: a load test with correctness checks.

By default it starts one flashsale per strategy in this process (a fresh
database on -database-url's server, a fresh Redis key prefix, an embedded
JetStream in a temporary directory) and measures two paths apart, each
against the empty handler of the same run: the purchase path (a sale with
stock for every request, every answer accepted) and the sold-out path (a
sale sold out first, every answer sold_out), with the apply backlog at the
load's end and its time to drain. -scenario (or -stock) measures a scenario
as a whole instead. After every run it drains, checks I1-I7 from the
database and Redis, and prints a table. With -target it drives a running
flashsale on this machine, in its own process, instead (give its
-admin-token, -user-token-secret, -database-url, -redis-url and
-redis-prefix so the checks read its stores) and reports the CPU of the
server's process and of this one per request. -connections holds that many
keep-alive connections to -target and reports the server's memory. Any
violation makes it exit non-zero.

Flags (the service's flags are accepted too):`

func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var o bench.Options
	var emptyServer, workerAddr, workers string
	var benchFlags *flag.FlagSet
	cfg, err := parseConfig("bench", args, getenv, stderr, func(fs *flag.FlagSet) {
		benchFlags = fs
		fs.Usage = func() {
			fmt.Fprintln(fs.Output(), benchUsage)
			fs.PrintDefaults()
		}
		fs.StringVar(&o.Strategies, "strategies", "", "comma-separated strategies to compare (default: all of "+strings.Join(strategy.Names(), ",")+"; with -target: pipeline, the one the target runs)")
		fs.StringVar(&o.Scenario, "scenario", loadgen.Hot, "hot (one SKU, duplicate clicks), many (SKUs), storm (after sell-out), mix (with pay and cancel) or opening (people and bots at a sale with tickets and a waiting room: -people, -bots, -no-return, -early)")
		fs.IntVar(&o.People, "people", 300, "scenario opening: people (solve the proof, join, poll as told, buy once)")
		fs.IntVar(&o.Bots, "bots", 50, "scenario opening: bot accounts, half buying directly in a tight loop, half getting proofs at machine speed and joining at the opening, polling without pause")
		fs.Float64Var(&o.BotRate, "bot-rate", 20, "scenario opening: purchases a second of each direct bot (0: a tight loop; on a small machine it takes the CPU the rest is measured with)")
		fs.Float64Var(&o.NoReturn, "no-return", 0.2, "scenario opening: share of people who never come back once admitted")
		fs.DurationVar(&o.Early, "early", 3*time.Second, "scenario opening: people arrive uniformly from this long before the opening to 1s after it")
		fs.StringVar(&o.Mode, "mode", string(loadgen.Closed), "closed (-buyers at once) or open (-rate per second, latency from the due time)")
		fs.IntVar(&o.Buyers, "buyers", 1000, "closed loop: concurrent virtual buyers")
		fs.Float64Var(&o.Rate, "rate", 2000, "open loop: requests per second")
		fs.IntVar(&o.MaxInFlight, "max-in-flight", 4000, "open loop: most requests in flight (a due request waits beyond, and its wait counts)")
		fs.DurationVar(&o.Duration, "duration", 5*time.Second, "time bound of each measured run (no request starts after it)")
		fs.DurationVar(&o.Warmup, "warmup", time.Second, "load before each measured run, not measured (connections, pools, caches)")
		fs.Int64Var(&o.Requests, "requests", 0, "count bound of each run (0: the duration only)")
		fs.Int64Var(&o.Stock, "stock", 1000, "units on sale (scenario many: in total)")
		fs.IntVar(&o.SKUs, "skus", 50, "scenario many: number of SKUs")
		fs.Int64Var(&o.Limit, "per-user-limit", 1, "per-user limit of every SKU")
		fs.StringVar(&o.Target, "target", "", "URL of a running flashsale on this machine (loopback only); empty: start one per strategy in-process")
		fs.StringVar(&o.JSONOut, "json", "", "write the report as JSON to `FILE`")
		fs.StringVar(&o.HTMLOut, "html", "", "write the report as an HTML page with charts to `FILE`")
		fs.BoolVar(&o.Baselines, "baselines", true, "measure the empty-handler and Redis-gate baselines first")
		fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of each run to `PREFIX`-<strategy>.pprof, -<strategy>-<path>.pprof with -paths (go tool pprof)")
		fs.BoolVar(&o.Keep, "keep", false, "keep the runs' databases and Redis keys (in-process mode)")
		fs.DurationVar(&o.DrainTimeout, "drain-timeout", time.Minute, "how long to wait for the queue to drain after a run")
		fs.Int64Var(&o.I7Units, "i7-units", 200, "I7: at most this many remaining units are bought back by fresh buyers (the surplus is taken off the sale through the admin API first)")
		fs.BoolVar(&o.Quiet, "quiet", false, "no live progress line")
		fs.StringVar(&o.MachineNote, "machine-note", "", "a note on the machine for the report (e.g. \"shared with other jobs\")")
		fs.StringVar(&o.Paths, "paths", "purchase,sold-out", "paths measured apart, each against the empty handler: purchase (every answer accepted), sold-out (every answer sold_out); \"scenario\": measure -scenario as a whole (the default when -scenario or -stock is given)")
		fs.Int64Var(&o.PurchaseStock, "purchase-stock", 10_000_000, "units of the purchase path's sale: enough for every request of the run")
		fs.IntVar(&o.TargetPID, "target-pid", 0, "with -target: the target's process id (default: the process listening on its port)")
		fs.IntVar(&o.Connections, "connections", 0, "memory test: hold this many keep-alive connections to -target and report its VmRSS and VmHWM (no load runs)")
		fs.DurationVar(&o.ConnHold, "connections-hold", 10*time.Second, "memory test: how long the connections are held once all are open")
		fs.DurationVar(&o.ConnEvery, "connections-every", 5*time.Second, "memory test: each connection sends GET /healthz this often")
		fs.BoolVar(&o.EmptyEach, "empty-each", false, "measure the empty handler again right before each path's run and compare the path with that one (on a machine whose load changes during the bench)")
		fs.StringVar(&emptyServer, "empty-server", "", "serve only the empty handler on `ADDR` until stopped (what the bench starts as its own process with -target)")
		fs.StringVar(&workerAddr, "worker", "", "run as a load worker on `ADDR` until stopped: a coordinator (-workers) sends it its part of a run (docs/drills.md)")
		fs.StringVar(&workers, "workers", "", "comma-separated `URLS` of load workers (flashsale bench -worker on each load machine): the scenario's buyers and rate are split between them, started at one moment, and their histograms merged; needs -target and -worker-token")
		fs.StringVar(&o.WorkerToken, "worker-token", "", "the token a worker accepts and a coordinator sends (env FLASHSALE_WORKER_TOKEN)")
		fs.IntVar(&o.Sources, "sources", 0, "spread the connections to a loopback target over the source addresses 127.0.0.1 to 127.0.0.`N`: one address reaches one port through about 28,000 connections")
		fs.BoolVar(&o.RemoteTarget, "remote-target", false, "accept a -target that is not on this machine (a deployment of yours, for a drill from load machines)")
	})
	if err != nil {
		return err
	}
	if emptyServer != "" {
		return bench.ServeEmpty(ctx, emptyServer, stdout)
	}
	if o.WorkerToken == "" {
		o.WorkerToken = getenv("FLASHSALE_WORKER_TOKEN")
	}
	if workerAddr != "" {
		return bench.ServeWorker(ctx, workerAddr, o.WorkerToken, stdout, stderr)
	}
	if o.Workers, err = loadgen.ParseWorkers(workers); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	explicit := map[string]bool{}
	benchFlags.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if !explicit["paths"] && (explicit["scenario"] || explicit["stock"]) {
		o.Paths = bench.PathScenario
	}
	if o.Scenario == loadgen.Opening {
		// -duration is the people's patience after the opening; the room
		// admits rate = avail/(conv*TTL) (docs/waiting-room.md), so at the
		// service's 2-minute TTL a run of 100 units would take minutes.
		if !explicit["duration"] {
			o.Duration = time.Minute
		}
		if !explicit["admission-ttl"] && getenv("FLASHSALE_ADMISSION_TTL") == "" {
			cfg.AdmissionTTL = 5 * time.Second
		}
		// Every proof is solved on this machine, beside the server: at the
		// service's work (a mean of 250 PBKDF2 derivations, ~0.4 s of CPU
		// here) 300 people would take two minutes of both cores. The
		// report gives the solve time measured at the work used.
		if !explicit["challenge-work"] && getenv("FLASHSALE_CHALLENGE_WORK") == "" {
			cfg.ChallengeWork = 16
		}
	}
	if getenv("FLASHSALE_LOG_LEVEL") == "" {
		cfg.LogLevel = "error" // the servers' warnings would garble the table
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	return bench.Run(ctx, o, benchService(cfg, log), args, stdout, stderr)
}

// benchService is the bench's view of flashsale: cfg's settings, a server
// started with them in this process, the stores of the one cfg names.
func benchService(cfg config, log *slog.Logger) bench.Service {
	return bench.Service{
		DatabaseURL: cfg.DatabaseURL, RedisURL: cfg.RedisURL, RedisPrefix: cfg.RedisPrefix,
		AdminToken: cfg.AdminToken, UserTokenSecret: cfg.UserTokenSecret,
		Settings: map[string]string{
			"db_max_conns":       strconv.Itoa(cfg.DBMaxConns),
			"apply_batch":        strconv.Itoa(cfg.ApplyBatch),
			"apply_workers":      strconv.Itoa(cfg.ApplyWorkers),
			"stream_ack_timeout": cfg.StreamAck.String(),
			"nats_sync_always":   strconv.FormatBool(cfg.NATSSyncAlways),
			"admission_ttl":      cfg.AdmissionTTL.String(),
			"challenge_work":     strconv.Itoa(cfg.ChallengeWork),
		},
		Start: func(ctx context.Context, in bench.Instance) (*bench.Server, error) {
			c := cfg
			c.PurchaseStrategy, c.DatabaseURL, c.RedisPrefix = in.Strategy, in.DatabaseURL, in.RedisPrefix
			c.AdminToken, c.UserTokenSecret = in.AdminToken, in.UserTokenSecret
			c.NATSURL, c.DataDir = "embedded", in.DataDir // a shared external stream would mix the runs
			a, err := start(ctx, c, log)
			if err != nil {
				return nil, err
			}
			return &bench.Server{Stores: a.stores(), Serve: a.serve}, nil
		},
		Open: func(ctx context.Context) (*bench.Stores, error) {
			a, err := openForCheck(ctx, cfg)
			if err != nil {
				return nil, err
			}
			st := a.stores()
			return &st, nil
		},
		EmptyCommand: []string{"bench", "-empty-server", "127.0.0.1:0"},
	}
}

// stores are a's stores as the bench's checks read them.
func (a *app) stores() bench.Stores {
	return bench.Stores{DB: a.store, Gate: a.gate, Redis: a.redis, Close: a.close}
}

package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/loadgen"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/strategy"
)

// benchOptions are the bench's own flags (the service's settings come from
// parseConfig: database, Redis, tokens, pool and batch sizes).
type benchOptions struct {
	strategies   string
	scenario     string
	mode         string
	buyers       int
	rate         float64
	maxInFlight  int
	duration     time.Duration
	warmup       time.Duration
	requests     int64
	stock        int64
	skus         int
	limit        int64
	target       string
	jsonOut      string
	htmlOut      string
	baselines    bool
	cpuprofile   string
	keep         bool
	drainTimeout time.Duration
	i7Units      int64
	quiet        bool
	machineNote  string

	paths         string // -paths: purchase,sold-out or scenario
	purchaseStock int64
	targetPID     int
	connections   int
	connHold      time.Duration
	connEvery     time.Duration
	emptyServer   string // -empty-server: serve the empty handler only
	emptyEach     bool
}

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
	var o benchOptions
	var benchFlags *flag.FlagSet
	cfg, err := parseConfig("bench", args, getenv, stderr, func(fs *flag.FlagSet) {
		benchFlags = fs
		fs.Usage = func() {
			fmt.Fprintln(fs.Output(), benchUsage)
			fs.PrintDefaults()
		}
		fs.StringVar(&o.strategies, "strategies", "", "comma-separated strategies to compare (default: all of "+strings.Join(strategy.Names(), ",")+"; with -target: pipeline, the one the target runs)")
		fs.StringVar(&o.scenario, "scenario", loadgen.Hot, "hot (one SKU, duplicate clicks), many (SKUs), storm (after sell-out) or mix (with pay and cancel)")
		fs.StringVar(&o.mode, "mode", string(loadgen.Closed), "closed (-buyers at once) or open (-rate per second, latency from the due time)")
		fs.IntVar(&o.buyers, "buyers", 1000, "closed loop: concurrent virtual buyers")
		fs.Float64Var(&o.rate, "rate", 2000, "open loop: requests per second")
		fs.IntVar(&o.maxInFlight, "max-in-flight", 4000, "open loop: most requests in flight (a due request waits beyond, and its wait counts)")
		fs.DurationVar(&o.duration, "duration", 5*time.Second, "time bound of each measured run (no request starts after it)")
		fs.DurationVar(&o.warmup, "warmup", time.Second, "load before each measured run, not measured (connections, pools, caches)")
		fs.Int64Var(&o.requests, "requests", 0, "count bound of each run (0: the duration only)")
		fs.Int64Var(&o.stock, "stock", 1000, "units on sale (scenario many: in total)")
		fs.IntVar(&o.skus, "skus", 50, "scenario many: number of SKUs")
		fs.Int64Var(&o.limit, "per-user-limit", 1, "per-user limit of every SKU")
		fs.StringVar(&o.target, "target", "", "URL of a running flashsale on this machine (loopback only); empty: start one per strategy in-process")
		fs.StringVar(&o.jsonOut, "json", "", "write the report as JSON to `FILE`")
		fs.StringVar(&o.htmlOut, "html", "", "write the report as an HTML page with charts to `FILE`")
		fs.BoolVar(&o.baselines, "baselines", true, "measure the empty-handler and Redis-gate baselines first")
		fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of each run to `PREFIX`-<strategy>.pprof, -<strategy>-<path>.pprof with -paths (go tool pprof)")
		fs.BoolVar(&o.keep, "keep", false, "keep the runs' databases and Redis keys (in-process mode)")
		fs.DurationVar(&o.drainTimeout, "drain-timeout", time.Minute, "how long to wait for the queue to drain after a run")
		fs.Int64Var(&o.i7Units, "i7-units", 200, "I7: at most this many remaining units are bought back by fresh buyers (the surplus is taken off the sale through the admin API first)")
		fs.BoolVar(&o.quiet, "quiet", false, "no live progress line")
		fs.StringVar(&o.machineNote, "machine-note", "", "a note on the machine for the report (e.g. \"shared with other jobs\")")
		fs.StringVar(&o.paths, "paths", "purchase,sold-out", "paths measured apart, each against the empty handler: purchase (every answer accepted), sold-out (every answer sold_out); \"scenario\": measure -scenario as a whole (the default when -scenario or -stock is given)")
		fs.Int64Var(&o.purchaseStock, "purchase-stock", 10_000_000, "units of the purchase path's sale: enough for every request of the run")
		fs.IntVar(&o.targetPID, "target-pid", 0, "with -target: the target's process id (default: the process listening on its port)")
		fs.IntVar(&o.connections, "connections", 0, "memory test: hold this many keep-alive connections to -target and report its VmRSS and VmHWM (no load runs)")
		fs.DurationVar(&o.connHold, "connections-hold", 10*time.Second, "memory test: how long the connections are held once all are open")
		fs.DurationVar(&o.connEvery, "connections-every", 5*time.Second, "memory test: each connection sends GET /healthz this often")
		fs.BoolVar(&o.emptyEach, "empty-each", false, "measure the empty handler again right before each path's run and compare the path with that one (on a machine whose load changes during the bench)")
		fs.StringVar(&o.emptyServer, "empty-server", "", "serve only the empty handler on `ADDR` until stopped (what the bench starts as its own process with -target)")
	})
	if err != nil {
		return err
	}
	if o.emptyServer != "" {
		return serveEmpty(ctx, o.emptyServer, stdout)
	}
	explicit := map[string]bool{}
	benchFlags.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if !explicit["paths"] && (explicit["scenario"] || explicit["stock"]) {
		o.paths = pathScenario
	}
	strategies, err := o.validate()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if getenv("FLASHSALE_LOG_LEVEL") == "" {
		cfg.LogLevel = "error" // the servers' warnings would garble the table
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	if o.target == "" {
		cfg.AdminToken = randomHex(16)
		if cfg.UserTokenSecret == "" {
			cfg.UserTokenSecret = randomHex(16)
		}
	} else if cfg.AdminToken == "" || cfg.UserTokenSecret == "" {
		return errors.New("bench: -target needs the target's -admin-token (to create the sales) and -user-token-secret (to sign buyers' tokens)")
	}

	b := &bench{o: o, cfg: cfg, log: log, stderr: stderr, paths: o.pathList()}
	if o.target != "" {
		if b.serverPID = o.targetPID; b.serverPID == 0 {
			if b.serverPID, err = loadgen.ListenerPID(o.target); err != nil {
				b.status("bench: the target's process: %v; its CPU and memory are not reported apart", err)
			}
		}
	}
	rep := &loadgen.Report{Setup: b.setup(args, strategies)}
	if o.connections > 0 {
		return b.memoryTest(ctx, rep, stdout)
	}
	var empty *loadgen.Result
	if o.baselines {
		if empty, err = b.emptyBaseline(ctx, rep); err != nil {
			return fmt.Errorf("bench: empty handler baseline: %w", err)
		}
		if err = b.gateBaseline(ctx, rep); err != nil {
			return fmt.Errorf("bench: redis gate baseline: %w", err)
		}
	}
	for _, name := range strategies {
		var res []*loadgen.StrategyResult
		var note string
		if o.target == "" {
			res, note, err = b.inProcess(ctx, name)
		} else {
			res, note, err = b.againstTarget(ctx, name)
		}
		if err != nil {
			return fmt.Errorf("bench: %s: %w", name, err)
		}
		if note != "" && !slices.Contains(rep.Setup.Notes, note) {
			rep.Setup.Notes = append(rep.Setup.Notes, note)
		}
		rep.Results = append(rep.Results, res...)
	}
	rep.SetHeadline()
	rep.WriteTable(stdout)
	if o.jsonOut != "" {
		if err := rep.WriteJSON(o.jsonOut); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		fmt.Fprintf(stdout, "JSON report: %s\n", o.jsonOut)
	}
	if o.htmlOut != "" {
		if err := rep.WriteHTML(o.htmlOut, empty); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		fmt.Fprintf(stdout, "HTML report: %s\n", o.htmlOut)
	}
	var bad []string
	for _, r := range rep.Results {
		if !r.InvariantsOK {
			bad = append(bad, r.Strategy)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("bench: invariants violated (oversold, lost, doubled or stranded stock) with %s", strings.Join(bad, ", "))
	}
	return nil
}

func (o *benchOptions) validate() ([]string, error) {
	switch {
	case o.duration <= 0 || o.duration > time.Hour:
		return nil, errors.New("-duration must be in (0, 1h]: every run is bounded in time")
	case o.warmup < 0 || o.warmup > 10*time.Minute:
		return nil, errors.New("-warmup must be in [0, 10m]")
	case o.requests < 0:
		return nil, errors.New("-requests must be 0 or more")
	case o.mode != string(loadgen.Closed) && o.mode != string(loadgen.Open):
		return nil, fmt.Errorf("-mode must be closed or open, got %q", o.mode)
	case o.buyers < 1 || o.buyers > 100000:
		return nil, errors.New("-buyers must be 1..100000")
	case o.mode == string(loadgen.Open) && !(o.rate > 0 && o.rate <= 1e6):
		return nil, errors.New("-rate must be in (0, 1e6]")
	case o.maxInFlight < 1 || o.maxInFlight > 100000:
		return nil, errors.New("-max-in-flight must be 1..100000")
	case o.stock < 1 || o.stock > sale.MaxStock:
		return nil, fmt.Errorf("-stock must be 1..%d", sale.MaxStock)
	case o.skus < 1 || o.skus > 10000:
		return nil, errors.New("-skus must be 1..10000")
	case o.limit < 1 || o.limit > sale.MaxPerUserLimit:
		return nil, fmt.Errorf("-per-user-limit must be 1..%d", sale.MaxPerUserLimit)
	case o.i7Units < 0:
		return nil, errors.New("-i7-units must be 0 or more")
	case o.purchaseStock < 1 || o.purchaseStock > sale.MaxStock:
		return nil, fmt.Errorf("-purchase-stock must be 1..%d", sale.MaxStock)
	case o.connections < 0 || o.connections > 100000:
		return nil, errors.New("-connections must be 0..100000")
	case o.connections > 0 && o.target == "":
		return nil, errors.New("-connections needs -target: the server's memory is measured in its own process, apart from the connections' client")
	case o.connections > 0 && (o.connHold <= 0 || o.connHold > time.Hour || o.connEvery <= 0):
		return nil, errors.New("-connections-hold must be in (0, 1h] and -connections-every positive")
	case o.targetPID < 0:
		return nil, errors.New("-target-pid must be a process id")
	}
	for _, p := range o.pathList() {
		if p != loadgen.Purchase && p != loadgen.SoldOut {
			return nil, fmt.Errorf("-paths: unknown path %q (purchase, sold-out, or scenario alone)", p)
		}
	}
	if _, err := loadgen.NewScenario(loadgen.ScenarioConfig{Name: o.scenario, Stock: o.stock, SKUs: o.skus, PerUserLimit: o.limit, RunID: "x"}); err != nil {
		return nil, err
	}
	if o.target != "" {
		if err := loadgen.CheckLoopback(o.target); err != nil {
			return nil, err
		}
	}
	// Every request in flight holds a client socket, and in-process a
	// server socket too; running out of descriptors would be measured as
	// transport errors.
	conns := o.buyers
	if o.mode == string(loadgen.Open) {
		conns = o.maxInFlight
	}
	if o.connections > 0 {
		conns = o.connections
	}
	need := conns + 512
	if o.target == "" {
		need += conns
	}
	if limit := loadgen.RaiseFileLimit(need); limit > 0 && need > limit {
		return nil, fmt.Errorf("%d connections need about %d file descriptors, the limit is %d: lower -buyers or -max-in-flight, or raise ulimit -n", conns, need, limit)
	}
	list := o.strategies
	if list == "" {
		list = strings.Join(strategy.Names(), ",")
		if o.target != "" {
			list = strategy.Pipeline
		}
	}
	var out []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if err := strategy.Valid(s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	if o.target != "" && len(out) != 1 {
		return nil, errors.New("-target runs one strategy: name the one the target is configured with (-strategies)")
	}
	return out, nil
}

type bench struct {
	o      benchOptions
	cfg    config
	log    *slog.Logger
	stderr io.Writer
	// paths are the paths measured apart (empty: the scenario as a whole).
	paths []string
	// serverPID is the target's process (0: in-process, or not found).
	serverPID int
	// emptyRPS and emptyP99Ms are the empty handler's figures, what the
	// paths are compared with.
	emptyRPS, emptyP99Ms float64
}

func (b *bench) genConfig(label string) loadgen.Config {
	c := loadgen.Config{Mode: loadgen.Mode(b.o.mode), Concurrency: b.o.buyers, Rate: b.o.rate, Duration: b.o.duration,
		Warmup: b.o.warmup, Requests: b.o.requests, ServerPID: b.serverPID}
	if c.Mode == loadgen.Open {
		c.Concurrency = b.o.maxInFlight
	}
	if !b.o.quiet {
		c.Progress = progressLine(b.stderr, label)
	}
	return c
}

func (b *bench) conns() int {
	if b.o.mode == string(loadgen.Open) {
		return b.o.maxInFlight
	}
	return b.o.buyers
}

func (b *bench) scenario() (*loadgen.Scenario, error) {
	return loadgen.NewScenario(loadgen.ScenarioConfig{Name: b.o.scenario, Stock: b.o.stock, SKUs: b.o.skus,
		PerUserLimit: b.o.limit, RunID: randomHex(4)})
}

// progressLine returns a generator progress callback printing one live line.
func progressLine(w io.Writer, label string) func(loadgen.Progress) {
	var lastDone int64
	var lastAt time.Duration
	return func(p loadgen.Progress) {
		rate := 0.0
		if dt := (p.Elapsed - lastAt).Seconds(); dt > 0 {
			rate = float64(p.Done-lastDone) / dt
		}
		lastDone, lastAt = p.Done, p.Elapsed
		if p.Elapsed < 0 {
			fmt.Fprintf(w, "\r%-16s warming up (%.1fs)%-80s", label, -p.Elapsed.Seconds(), "")
			return
		}
		fmt.Fprintf(w, "\r%-16s %5.1fs/%-4gs %9d answers %8.0f/s  accepted %-7d sold_out %-8d errors %-6d in flight %-6d",
			label, p.Elapsed.Seconds(), p.Duration.Seconds(), p.Done, rate, p.Codes["accepted"], p.Codes["sold_out"], p.Errors, p.InFlight)
		if p.Final {
			fmt.Fprintln(w)
		}
	}
}

func (b *bench) status(format string, args ...any) {
	if !b.o.quiet {
		fmt.Fprintf(b.stderr, format+"\n", args...)
	}
}

// emptyBaseline runs the scenario's requests against a handler that does
// nothing: the most this machine and generator can do.
//
// With -target the empty handler runs as a child process, as the target
// does, so that neither shares the generator's process (and its CPU is
// counted apart the same way).
func (b *bench) emptyBaseline(ctx context.Context, rep *loadgen.Report) (*loadgen.Result, error) {
	res, note, err := b.runEmpty(ctx, "empty handler")
	if err != nil {
		return nil, err
	}
	if note != "" {
		rep.Setup.Notes = append(rep.Setup.Notes, note)
	}
	rep.Baselines.EmptyHandlerRPS = round1(res.Throughput())
	rep.Baselines.EmptyHandlerP50Ms = round3(res.Percentile(50))
	rep.Baselines.EmptyHandlerP99Ms = round3(res.Percentile(99))
	b.emptyRPS, b.emptyP99Ms = rep.Baselines.EmptyHandlerRPS, rep.Baselines.EmptyHandlerP99Ms
	if c := loadgen.NewProcessCPU(res); c != nil && !c.SameProcess {
		rep.Baselines.EmptyHandlerCPUUsPerReq, rep.Baselines.EmptyGeneratorCPUUsPerReq = c.ServerUsPerReq, c.GeneratorUsPerReq
	}
	return res, nil
}

// runEmpty runs the load against a fresh empty handler: in its own
// process with -target (note says why not, if it could not be), else in
// this one.
func (b *bench) runEmpty(ctx context.Context, label string) (_ *loadgen.Result, note string, err error) {
	var (
		base string
		pid  int
		stop func()
	)
	if b.o.target != "" {
		if base, pid, stop, err = spawnEmpty(ctx); err != nil {
			note = fmt.Sprintf("the empty handler ran in the generator's process, not in its own as the target does (%v)", err)
			b.status("%-16s %s", label, note)
		}
	}
	if base == "" {
		if base, stop, err = loadgen.StartEmptyServer(); err != nil {
			return nil, "", err
		}
	}
	defer stop()
	cl, err := loadgen.NewClient(base, "", b.cfg.UserTokenSecret, b.conns())
	if err != nil {
		return nil, "", err
	}
	defer cl.Close()
	name := b.o.scenario
	if len(b.paths) > 0 {
		name = loadgen.Purchase // the same requests as the purchase path's
	}
	sc, err := loadgen.NewScenario(loadgen.ScenarioConfig{Name: name, Stock: b.o.stock, SKUs: b.o.skus, PerUserLimit: b.o.limit, RunID: randomHex(4)})
	if err != nil {
		return nil, "", err
	}
	cfg := b.genConfig(label)
	cfg.ServerPID = pid // 0: in this process
	res, err := loadgen.Run(ctx, cfg, sc.Op(cl))
	if err != nil {
		return nil, "", err
	}
	b.status("%-16s %.0f req/s, p50 %.2f ms, p99 %.2f ms", label, res.Throughput(), round3(res.Percentile(50)), round3(res.Percentile(99)))
	return res, note, nil
}

// gateBaseline measures the reserve script alone through rueidis.
func (b *bench) gateBaseline(ctx context.Context, rep *loadgen.Report) error {
	rc, err := newRedis(b.cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rc.Close()
	prefix := b.cfg.RedisPrefix + ":bench-gate-" + randomHex(4)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = loadgen.DeleteKeys(cctx, rc, prefix)
	}()
	conc := b.conns()
	b.status("%-16s %d goroutines for %v...", "redis gate", conc, b.o.duration)
	rps, err := loadgen.GateBaseline(ctx, rc, prefix, conc, b.o.duration, b.o.requests)
	if err != nil {
		return err
	}
	rep.Baselines.RedisGateRPS = round1(rps)
	b.status("%-16s %.0f reserves/s", "redis gate", rps)
	return nil
}

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }

// round3 returns d in milliseconds to the microsecond.
func round3(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func newRedis(redisURL string) (rueidis.Client, error) {
	opt, err := rueidis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	opt.DisableCache = true
	return rueidis.NewClient(opt)
}

// inProcess starts a flashsale with strategy name on a fresh database,
// Redis prefix and embedded JetStream, runs the scenario against it,
// checks, and removes what it made (unless -keep).
func (b *bench) inProcess(ctx context.Context, name string) (_ []*loadgen.StrategyResult, note string, err error) {
	c := b.cfg
	c.PurchaseStrategy = name
	dbName := "flashsale_bench_" + randomHex(6)
	if c.DatabaseURL, err = orderstore.WithDatabase(b.cfg.DatabaseURL, dbName); err != nil {
		return nil, "", err
	}
	c.RedisPrefix = b.cfg.RedisPrefix + ":bench-" + randomHex(4)
	c.NATSURL = "embedded" // a shared external stream would mix the runs
	if c.DataDir, err = os.MkdirTemp("", "flashsale-bench-*"); err != nil {
		return nil, "", err
	}
	b.status("%-16s starting (database %s, redis prefix %s)...", name, dbName, c.RedisPrefix)
	a, err := start(ctx, c, b.log)
	if err != nil {
		os.RemoveAll(c.DataDir)
		b.cleanup(ctx, c, dbName)
		return nil, "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.close()
		return nil, "", err
	}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- a.serve(sctx, ln) }()
	defer func() {
		stop()
		<-served
		os.RemoveAll(c.DataDir)
		if !b.o.keep {
			b.cleanup(ctx, c, dbName)
		}
	}()

	cl, err := loadgen.NewClient("http://"+ln.Addr().String(), c.AdminToken, c.UserTokenSecret, b.conns())
	if err != nil {
		return nil, "", err
	}
	defer cl.Close()
	chk := loadgen.Checker{DB: a.store, DrainTimeout: b.o.drainTimeout}
	if name == strategy.Pipeline {
		chk.Gate = a.gate
	}
	return b.measure(ctx, name, cl, chk, a.redis)
}

// againstTarget runs the scenario against the running flashsale at -target
// and checks its stores.
func (b *bench) againstTarget(ctx context.Context, name string) ([]*loadgen.StrategyResult, string, error) {
	a, err := openForCheck(ctx, b.cfg)
	if err != nil {
		return nil, "", fmt.Errorf("opening the target's stores for the checks: %w", err)
	}
	defer a.close()
	cl, err := loadgen.NewClient(b.o.target, b.cfg.AdminToken, b.cfg.UserTokenSecret, b.conns())
	if err != nil {
		return nil, "", err
	}
	defer cl.Close()
	chk := loadgen.Checker{DB: a.store, DrainTimeout: b.o.drainTimeout}
	if name == strategy.Pipeline {
		chk.Gate = a.gate
	}
	return b.measure(ctx, name, cl, chk, a.redis)
}

// measure sets the scenario up, runs it, drains and checks (or measures
// the paths apart, see measurePaths). rc reads the pipeline's backlog
// during the run.
func (b *bench) measure(ctx context.Context, name string, cl *loadgen.Client, chk loadgen.Checker, rc rueidis.Client) ([]*loadgen.StrategyResult, string, error) {
	if len(b.paths) > 0 {
		return b.measurePaths(ctx, name, cl, chk, rc)
	}
	sc, err := b.scenario()
	if err != nil {
		return nil, "", err
	}
	if err := sc.Setup(ctx, cl); err != nil {
		return nil, "", fmt.Errorf("setting the sale up: %w", err)
	}
	if err := chk.CheckStores(ctx, rc, sc.SKUs()); err != nil {
		return nil, "", err
	}
	stopProfile, err := b.profile(name)
	if err != nil {
		return nil, "", err
	}
	stopBacklog := func() []loadgen.BacklogPoint { return nil }
	if chk.Gate != nil {
		stopBacklog = loadgen.SampleBacklog(ctx, rc, chk.Gate, sc.SKUs(), 100*time.Millisecond)
	}
	run, err := loadgen.Run(ctx, b.genConfig(name), sc.Op(cl))
	backlog := stopBacklog()
	stopProfile()
	if err != nil {
		return nil, "", err
	}
	b.status("%-16s draining and checking I1-I7...", name)
	v, err := chk.Check(ctx, sc.Accepted())
	if err != nil {
		return nil, "", fmt.Errorf("checking: %w", err)
	}
	if err := chk.CheckI7(ctx, cl, sc, b.o.i7Units, v); err != nil {
		return nil, "", fmt.Errorf("checking I7: %w", err)
	}
	var accepted int64
	for _, ids := range sc.Accepted() {
		accepted += int64(len(ids))
	}
	res := loadgen.NewStrategyResult(name, run, v, accepted)
	res.Backlog = backlog
	verdict := "invariants hold"
	if !res.InvariantsOK {
		verdict = fmt.Sprintf("VIOLATED: %s", strings.Join(v.Violations, "; "))
	}
	b.status("%-16s %.0f req/s, p99 %.1f ms, drained in %.2fs, %s", name, res.ThroughputRPS, res.P99Ms, res.DrainSeconds, verdict)
	return []*loadgen.StrategyResult{res}, sc.Note, nil
}

// profile starts a CPU profile of the run if -cpuprofile is set.
func (b *bench) profile(name string) (stop func(), err error) {
	if b.o.cpuprofile == "" {
		return func() {}, nil
	}
	f, err := os.Create(b.o.cpuprofile + "-" + name + ".pprof")
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// cleanup drops the run's database and deletes its Redis keys.
func (b *bench) cleanup(ctx context.Context, c config, dbName string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := dropScratch(cctx, b.cfg.DatabaseURL, dbName); err != nil {
		fmt.Fprintf(b.stderr, "bench: dropping database %s: %v\n", dbName, err)
	}
	rc, err := newRedis(c.RedisURL)
	if err == nil {
		err = loadgen.DeleteKeys(cctx, rc, c.RedisPrefix)
		rc.Close()
	}
	if err != nil {
		fmt.Fprintf(b.stderr, "bench: deleting redis keys %s:*: %v\n", c.RedisPrefix, err)
	}
}

// dropScratch drops the scratch database name on the server of base.
func dropScratch(ctx context.Context, base, name string) error {
	u, err := orderstore.WithDatabase(base, name)
	if err != nil {
		return err
	}
	return orderstore.DropDatabase(ctx, u)
}

// setup describes the run for the report.
func (b *bench) setup(args, strategies []string) loadgen.Setup {
	o := b.o
	s := loadgen.Setup{
		Scenario: o.scenario, Paths: b.paths, Mode: loadgen.Mode(o.mode), Buyers: o.buyers, DurationS: o.duration.Seconds(), WarmupS: o.warmup.Seconds(),
		RequestLimit: o.requests, Stock: o.stock, SKUs: 1, PerUserLimit: o.limit, Strategies: strategies,
		Target:  "in-process (a fresh flashsale per strategy: own database, Redis prefix, embedded JetStream)",
		Started: time.Now().UTC(), Command: commandLine(redactArgs(args)),
		Machine: loadgen.Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), OS: runtime.GOOS, Arch: runtime.GOARCH,
			Go: runtime.Version(), CPUModel: cpuModel(), Note: o.machineNote},
		Server: map[string]string{
			"db_max_conns":       strconv.Itoa(b.cfg.DBMaxConns),
			"apply_batch":        strconv.Itoa(b.cfg.ApplyBatch),
			"apply_workers":      strconv.Itoa(b.cfg.ApplyWorkers),
			"stream_ack_timeout": b.cfg.StreamAck.String(),
			"nats_sync_always":   strconv.FormatBool(b.cfg.NATSSyncAlways),
		},
	}
	if o.mode == string(loadgen.Open) {
		s.Rate, s.Buyers = o.rate, o.maxInFlight
	}
	if o.scenario == loadgen.Many && len(b.paths) == 0 {
		s.SKUs = o.skus
	}
	if len(b.paths) > 0 {
		s.Scenario, s.PurchaseStock = strings.Join(b.paths, ","), o.purchaseStock
		s.SKUs = len(b.paths)
	}
	if o.target != "" {
		s.Target = o.target
		s.Server = nil
	}
	return s
}

// commandLine renders args as a shell command line of flashsale bench.
func commandLine(args []string) string {
	out := []string{"flashsale", "bench"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$&|;<>*?()[]{}`\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// redactArgs hides secrets in a command line: token and secret values,
// passwords in URLs.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	hideNext := false
	for i, a := range args {
		if hideNext {
			out[i], hideNext = "REDACTED", false
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		secret := strings.HasPrefix(a, "-") && (strings.Contains(name, "token") || strings.Contains(name, "secret"))
		switch {
		case secret && hasVal:
			out[i] = a[:len(a)-len(val)] + "REDACTED"
		case secret:
			out[i], hideNext = a, true
		default:
			out[i] = redactURL(a)
		}
	}
	return out
}

func redactURL(s string) string {
	prefix, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	userinfo, host, ok := strings.Cut(rest, "@")
	if !ok {
		return s
	}
	if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
		return prefix + "://" + user + ":REDACTED@" + host
	}
	return s
}

// cpuModel returns the CPU's model name on Linux ("" elsewhere).
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Package bench is the runner of `flashsale bench`: the purchase strategies
// compared under one load, each against the empty handler and the Redis gate
// alone, in this process or against a running flashsale, with the drain and
// the invariant checks after every run (the load, the checks and the report
// are loadgen's; cmd/flashsale parses the flags and starts the servers).
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/invariant"
	"github.com/flashsale/flashsale/internal/loadgen"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/strategy"
)

// Options are the bench's own settings (its flags); Validate says which
// values have a meaning.
type Options struct {
	Strategies   string // comma-separated; empty: every strategy (with Target: the pipeline)
	Scenario     string
	Mode         string // closed or open
	Buyers       int
	Rate         float64
	MaxInFlight  int
	Duration     time.Duration
	Warmup       time.Duration
	Requests     int64
	Stock        int64
	SKUs         int
	Limit        int64 // per user
	Target       string
	JSONOut      string
	HTMLOut      string
	Baselines    bool
	CPUProfile   string
	Keep         bool
	DrainTimeout time.Duration
	I7Units      int64
	Quiet        bool
	MachineNote  string

	Paths         string // purchase,sold-out or PathScenario
	PurchaseStock int64
	TargetPID     int
	Connections   int
	ConnHold      time.Duration
	ConnEvery     time.Duration
	EmptyEach     bool

	// Load from many processes or machines (loadgen/worker.go): the
	// workers' URLs, the token they were started with; Sources spreads
	// this process's connections over 127.0.0.1 to 127.0.0.Sources;
	// RemoteTarget accepts a -target that is not on this machine.
	Workers      []string
	WorkerToken  string
	Sources      int
	RemoteTarget bool

	// The opening scenario's (loadgen.OpeningConfig; Duration is its
	// patience: how long after the opening people wait at most).
	People   int
	Bots     int
	BotRate  float64
	NoReturn float64
	Early    time.Duration
}

// Service is the flashsale the bench measures: the settings it shares with
// the service, and how to start one or reach a running one's stores.
type Service struct {
	DatabaseURL, RedisURL, RedisPrefix string
	// AdminToken and UserTokenSecret are the target's (with -target); in
	// this process each run gets an admin token of its own, and a random
	// user-token secret if this one is empty.
	AdminToken, UserTokenSecret string
	// Settings are the server's settings the report names (in this process).
	Settings map[string]string
	// Start starts a flashsale in this process as c says.
	Start func(ctx context.Context, c Instance) (*Server, error)
	// Open opens the stores of the running target, for the checks.
	Open func(ctx context.Context) (*Stores, error)
	// EmptyCommand are the arguments that run this binary as the empty
	// handler alone (ServeEmpty), in a process of its own as the -target
	// is; with none it runs in this process.
	EmptyCommand []string
}

// Instance is the configuration of one flashsale the bench starts: the
// service's settings but these.
type Instance struct {
	Strategy                    string
	DatabaseURL                 string // a fresh database
	RedisPrefix                 string // a fresh prefix
	DataDir                     string // an embedded JetStream's store, fresh
	AdminToken, UserTokenSecret string
}

// Stores are what the checks read of a flashsale: its database, its gate
// and its Redis client. Close releases them.
type Stores struct {
	DB    invariant.DB
	Gate  *stockgate.Gate
	Redis rueidis.Client
	Close func()
}

// Server is a flashsale started in this process: Serve answers HTTP on ln
// until ctx ends, then shuts it down (Close is then not needed).
type Server struct {
	Stores
	Serve func(ctx context.Context, ln net.Listener) error
}

// Run runs the bench o describes against svc and prints the report to
// stdout (progress to stderr); args are the command line, redacted into the
// report. It fails on a violated invariant, after the report.
func Run(ctx context.Context, o Options, svc Service, args []string, stdout, stderr io.Writer) error {
	strategies, err := o.Validate()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if o.Target == "" {
		svc.AdminToken = randomHex(16)
		if svc.UserTokenSecret == "" {
			svc.UserTokenSecret = randomHex(16)
		}
	} else if svc.AdminToken == "" || svc.UserTokenSecret == "" {
		return errors.New("bench: -target needs the target's -admin-token (to create the sales) and -user-token-secret (to sign buyers' tokens)")
	}

	b := &bench{o: o, svc: svc, stderr: stderr, paths: o.pathList()}
	if o.Target != "" {
		if b.serverPID = o.TargetPID; b.serverPID == 0 {
			if b.serverPID, err = loadgen.ListenerPID(o.Target); err != nil {
				b.status("bench: the target's process: %v; its CPU and memory are not reported apart", err)
			}
		}
	}
	rep := &loadgen.Report{Setup: b.setup(args, strategies)}
	if o.Connections > 0 {
		return b.memoryTest(ctx, rep, stdout)
	}
	var empty *loadgen.Result
	if len(o.Workers) > 0 && o.Baselines {
		o.Baselines = false
		rep.Setup.Notes = append(rep.Setup.Notes, fmt.Sprintf("load from %d workers: no baselines (the empty handler would be measured from this machine alone)", len(o.Workers)))
	}
	if o.Scenario == loadgen.Opening && o.Baselines {
		o.Baselines = false
		rep.Setup.Notes = append(rep.Setup.Notes, "opening: no baselines (its requests are a visit, not one request; the server's CPU per admitted buyer is the figure)")
	}
	if o.Baselines {
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
		if o.Target == "" {
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
	if err := b.write(rep, empty, stdout); err != nil {
		return err
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

// write prints rep as a table to stdout and writes the JSON and HTML
// reports asked for; empty is the empty handler's run, for the page's charts.
func (b *bench) write(rep *loadgen.Report, empty *loadgen.Result, stdout io.Writer) error {
	rep.WriteTable(stdout)
	if b.o.JSONOut != "" {
		if err := rep.WriteJSON(b.o.JSONOut); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		fmt.Fprintf(stdout, "JSON report: %s\n", b.o.JSONOut)
	}
	if b.o.HTMLOut != "" {
		if err := rep.WriteHTML(b.o.HTMLOut, empty); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		fmt.Fprintf(stdout, "HTML report: %s\n", b.o.HTMLOut)
	}
	return nil
}

// Validate checks o and returns the strategies to run.
func (o *Options) Validate() ([]string, error) {
	switch {
	case o.Duration <= 0 || o.Duration > time.Hour:
		return nil, errors.New("-duration must be in (0, 1h]: every run is bounded in time")
	case o.Warmup < 0 || o.Warmup > 10*time.Minute:
		return nil, errors.New("-warmup must be in [0, 10m]")
	case o.Requests < 0:
		return nil, errors.New("-requests must be 0 or more")
	case o.Mode != string(loadgen.Closed) && o.Mode != string(loadgen.Open):
		return nil, fmt.Errorf("-mode must be closed or open, got %q", o.Mode)
	case o.Buyers < 1 || o.Buyers > 100000:
		return nil, errors.New("-buyers must be 1..100000")
	case o.Mode == string(loadgen.Open) && !(o.Rate > 0 && o.Rate <= 1e6):
		return nil, errors.New("-rate must be in (0, 1e6]")
	case o.MaxInFlight < 1 || o.MaxInFlight > 100000:
		return nil, errors.New("-max-in-flight must be 1..100000")
	case o.Stock < 1 || o.Stock > sale.MaxStock:
		return nil, fmt.Errorf("-stock must be 1..%d", sale.MaxStock)
	case o.SKUs < 1 || o.SKUs > 10000:
		return nil, errors.New("-skus must be 1..10000")
	case o.Limit < 1 || o.Limit > sale.MaxPerUserLimit:
		return nil, fmt.Errorf("-per-user-limit must be 1..%d", sale.MaxPerUserLimit)
	case o.I7Units < 0:
		return nil, errors.New("-i7-units must be 0 or more")
	case o.PurchaseStock < 1 || o.PurchaseStock > sale.MaxStock:
		return nil, fmt.Errorf("-purchase-stock must be 1..%d", sale.MaxStock)
	case o.Connections < 0 || o.Connections > 100000:
		return nil, errors.New("-connections must be 0..100000")
	case o.Connections > 0 && o.Target == "":
		return nil, errors.New("-connections needs -target: the server's memory is measured in its own process, apart from the connections' client")
	case o.Connections > 0 && (o.ConnHold <= 0 || o.ConnHold > time.Hour || o.ConnEvery <= 0):
		return nil, errors.New("-connections-hold must be in (0, 1h] and -connections-every positive")
	case o.TargetPID < 0:
		return nil, errors.New("-target-pid must be a process id")
	}
	for _, p := range o.pathList() {
		if p != loadgen.Purchase && p != loadgen.SoldOut {
			return nil, fmt.Errorf("-paths: unknown path %q (purchase, sold-out, or scenario alone)", p)
		}
	}
	if o.Scenario == loadgen.Opening {
		c := loadgen.OpeningConfig{People: o.People, Bots: o.Bots, BotRate: o.BotRate, NoReturn: o.NoReturn, Early: o.Early, Stock: o.Stock, Patience: o.Duration, RunID: "x"}
		if err := c.Validate(); err != nil {
			return nil, err
		}
		if len(o.pathList()) > 0 {
			return nil, errors.New("-scenario opening measures the scenario as a whole: no -paths")
		}
	} else if _, err := loadgen.NewScenario(loadgen.ScenarioConfig{Name: o.Scenario, Stock: o.Stock, SKUs: o.SKUs, PerUserLimit: o.Limit, RunID: "x"}); err != nil {
		return nil, err
	}
	if o.Target != "" {
		if err := loadgen.CheckTarget(o.Target, o.RemoteTarget); err != nil {
			if !o.RemoteTarget {
				err = fmt.Errorf("%w (a deployment of yours elsewhere: -remote-target)", err)
			}
			return nil, err
		}
	} else if o.RemoteTarget {
		return nil, errors.New("-remote-target needs -target")
	}
	if o.Sources < 0 || o.Sources > loadgen.MaxSources {
		return nil, fmt.Errorf("-sources must be 0..%d (127.0.0.1 to 127.0.0.N)", loadgen.MaxSources)
	}
	if len(o.Workers) > 0 {
		switch {
		case o.Target == "":
			return nil, errors.New("-workers needs -target: the workers send their load to a running flashsale")
		case o.WorkerToken == "":
			return nil, errors.New("-workers needs -worker-token, the token the workers were started with")
		case len(o.pathList()) > 0 || o.Scenario == loadgen.Opening:
			return nil, errors.New("-workers measures a scenario as a whole: give -scenario hot, many, storm, mix, purchase or sold-out (-paths scenario)")
		case o.Connections > 0:
			return nil, errors.New("-workers and -connections: the memory test holds its connections from this process (-sources spreads them)")
		case o.Mode == string(loadgen.Closed) && o.Buyers < len(o.Workers):
			return nil, fmt.Errorf("-buyers %d cannot be split between %d workers", o.Buyers, len(o.Workers))
		}
	}
	// Every request in flight holds a client socket, and in-process a
	// server socket too; running out of descriptors would be measured as
	// transport errors.
	conns := o.Buyers
	if o.Mode == string(loadgen.Open) {
		conns = o.MaxInFlight
	}
	if o.Connections > 0 {
		conns = o.Connections
	}
	need := conns + 512
	if o.Target == "" {
		need += conns
	}
	if limit := loadgen.RaiseFileLimit(need); limit > 0 && need > limit {
		return nil, fmt.Errorf("%d connections need about %d file descriptors, the limit is %d: lower -buyers or -max-in-flight, or raise ulimit -n", conns, need, limit)
	}
	list := o.Strategies
	if list == "" {
		list = strings.Join(strategy.Names(), ",")
		if o.Target != "" || o.Scenario == loadgen.Opening {
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
	if o.Target != "" && len(out) != 1 {
		return nil, errors.New("-target runs one strategy: name the one the target is configured with (-strategies)")
	}
	return out, nil
}

type bench struct {
	o      Options
	svc    Service
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
	c := loadgen.Config{Mode: loadgen.Mode(b.o.Mode), Concurrency: b.o.Buyers, Rate: b.o.Rate, Duration: b.o.Duration,
		Warmup: b.o.Warmup, Requests: b.o.Requests, ServerPID: b.serverPID}
	if c.Mode == loadgen.Open {
		c.Concurrency = b.o.MaxInFlight
	}
	if !b.o.Quiet {
		c.Progress = progressLine(b.stderr, label)
	}
	return c
}

func (b *bench) conns() int {
	if b.o.Mode == string(loadgen.Open) {
		return b.o.MaxInFlight
	}
	return b.o.Buyers
}

func (b *bench) scenario() (*loadgen.Scenario, error) {
	return loadgen.NewScenario(loadgen.ScenarioConfig{Name: b.o.Scenario, Stock: b.o.Stock, SKUs: b.o.SKUs,
		PerUserLimit: b.o.Limit, RunID: randomHex(4)})
}

// progressLine returns a generator progress callback printing one live line.
func progressLine(w io.Writer, label string) func(loadgen.Progress) {
	var lastDone int64
	var lastAt time.Duration
	// On a terminal the line is redrawn in place; elsewhere only the final
	// one is written, with no \r.
	cr := ""
	tty := loadgen.IsTerminal(w)
	if tty {
		cr = "\r"
	}
	return func(p loadgen.Progress) {
		if !tty && !p.Final {
			return
		}
		rate := 0.0
		if dt := (p.Elapsed - lastAt).Seconds(); dt > 0 {
			rate = float64(p.Done-lastDone) / dt
		}
		lastDone, lastAt = p.Done, p.Elapsed
		if p.Elapsed < 0 {
			fmt.Fprintf(w, cr+"%-16s warming up (%.1fs)%-80s", label, -p.Elapsed.Seconds(), "")
			return
		}
		fmt.Fprintf(w, cr+"%-16s %5.1fs/%-4gs %9d answers %8.0f/s  accepted %-7d sold_out %-8d errors %-6d in flight %-6d",
			label, p.Elapsed.Seconds(), p.Duration.Seconds(), p.Done, rate, p.Codes["accepted"], p.Codes["sold_out"], p.Errors, p.InFlight)
		if p.Final {
			fmt.Fprintln(w)
		}
	}
}

func (b *bench) status(format string, args ...any) {
	if !b.o.Quiet {
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
	if b.o.Target != "" {
		if base, pid, stop, err = spawnEmpty(ctx, b.svc.EmptyCommand); err != nil {
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
	cl, err := loadgen.NewClient(base, "", b.svc.UserTokenSecret, b.conns())
	if err != nil {
		return nil, "", err
	}
	defer cl.Close()
	name := b.o.Scenario
	if len(b.paths) > 0 {
		name = loadgen.Purchase // the same requests as the purchase path's
	}
	sc, err := loadgen.NewScenario(loadgen.ScenarioConfig{Name: name, Stock: b.o.Stock, SKUs: b.o.SKUs, PerUserLimit: b.o.Limit, RunID: randomHex(4)})
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
	rc, err := newRedis(b.svc.RedisURL)
	if err != nil {
		return err
	}
	defer rc.Close()
	prefix := b.svc.RedisPrefix + ":bench-gate-" + randomHex(4)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = loadgen.DeleteKeys(cctx, rc, prefix)
	}()
	conc := b.conns()
	b.status("%-16s %d goroutines for %v...", "redis gate", conc, b.o.Duration)
	rps, err := loadgen.GateBaseline(ctx, rc, prefix, conc, b.o.Duration, b.o.Requests)
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
	c := Instance{Strategy: name, AdminToken: b.svc.AdminToken, UserTokenSecret: b.svc.UserTokenSecret}
	dbName := "flashsale_bench_" + randomHex(6)
	if c.DatabaseURL, err = orderstore.WithDatabase(b.svc.DatabaseURL, dbName); err != nil {
		return nil, "", err
	}
	c.RedisPrefix = b.svc.RedisPrefix + ":bench-" + randomHex(4)
	if c.DataDir, err = os.MkdirTemp("", "flashsale-bench-*"); err != nil {
		return nil, "", err
	}
	b.status("%-16s starting (database %s, redis prefix %s)...", name, dbName, c.RedisPrefix)
	srv, err := b.svc.Start(ctx, c)
	if err != nil {
		os.RemoveAll(c.DataDir)
		b.cleanup(ctx, c.RedisPrefix, dbName)
		return nil, "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, "", err
	}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	defer func() {
		stop()
		<-served
		os.RemoveAll(c.DataDir)
		if !b.o.Keep {
			b.cleanup(ctx, c.RedisPrefix, dbName)
		}
	}()

	cl, err := loadgen.NewClient("http://"+ln.Addr().String(), c.AdminToken, c.UserTokenSecret, b.conns())
	if err != nil {
		return nil, "", err
	}
	defer cl.Close()
	return b.measure(ctx, name, cl, &srv.Stores)
}

// againstTarget runs the scenario against the running flashsale at -target
// and checks its stores.
func (b *bench) againstTarget(ctx context.Context, name string) ([]*loadgen.StrategyResult, string, error) {
	st, err := b.svc.Open(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("opening the target's stores for the checks: %w", err)
	}
	defer st.Close()
	cl, err := loadgen.NewClientWith(b.o.Target, b.svc.AdminToken, b.svc.UserTokenSecret, b.conns(),
		loadgen.ClientOptions{Remote: b.o.RemoteTarget, Sources: b.o.Sources})
	if err != nil {
		return nil, "", err
	}
	defer cl.Close()
	return b.measure(ctx, name, cl, st)
}

// measure sets the scenario up, runs it, drains and checks the stores st
// (or measures the paths apart, see measurePaths); st's Redis client reads
// the pipeline's backlog during the run.
func (b *bench) measure(ctx context.Context, name string, cl *loadgen.Client, st *Stores) ([]*loadgen.StrategyResult, string, error) {
	chk := loadgen.Checker{DB: st.DB, DrainTimeout: b.o.DrainTimeout}
	if name == strategy.Pipeline {
		chk.Gate = st.Gate
	}
	rc := st.Redis
	if b.o.Scenario == loadgen.Opening {
		return b.measureOpening(ctx, name, cl, st)
	}
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
	run, err := b.generate(ctx, name, sc, cl)
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
	if err := chk.CheckI7(ctx, cl, sc, b.o.I7Units, v); err != nil {
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

// generate runs the scenario's load: from this process, or split between
// the workers (-workers), whose accepted orders then join the scenario's
// for the checks.
func (b *bench) generate(ctx context.Context, name string, sc *loadgen.Scenario, cl *loadgen.Client) (*loadgen.Result, error) {
	cfg := b.genConfig(name)
	if len(b.o.Workers) == 0 {
		return loadgen.Run(ctx, cfg, sc.Op(cl))
	}
	co := loadgen.Coordinator{Workers: b.o.Workers, Token: b.o.WorkerToken, ServerPID: b.serverPID}
	b.status("%-16s %d workers: %s %s for %v", name, len(b.o.Workers), cfg.Mode, b.o.Scenario, cfg.Duration)
	res, accepted, parts, err := co.Run(ctx, loadgen.Work{Target: b.o.Target, UserSecret: b.svc.UserTokenSecret,
		Scenario: sc.Config(), Lifecycle: sc.Lifecycle(), Mode: cfg.Mode, Concurrency: cfg.Concurrency, Rate: cfg.Rate,
		Duration: cfg.Duration, Warmup: cfg.Warmup, Requests: cfg.Requests, Sources: b.o.Sources})
	for _, p := range parts {
		if p != nil {
			b.status("%-16s worker %s: %d answers, %d errors, started %v after the set time", name, p.Worker, p.Requests, p.Errors, p.StartLag.Round(time.Microsecond))
		}
	}
	if err != nil {
		return nil, err
	}
	sc.AddAccepted(accepted)
	return res, nil
}

// profile starts a CPU profile of the run if -cpuprofile is set.
func (b *bench) profile(name string) (stop func(), err error) {
	if b.o.CPUProfile == "" {
		return func() {}, nil
	}
	f, err := os.Create(b.o.CPUProfile + "-" + name + ".pprof")
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
func (b *bench) cleanup(ctx context.Context, prefix, dbName string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := dropScratch(cctx, b.svc.DatabaseURL, dbName); err != nil {
		fmt.Fprintf(b.stderr, "bench: dropping database %s: %v\n", dbName, err)
	}
	rc, err := newRedis(b.svc.RedisURL)
	if err == nil {
		err = loadgen.DeleteKeys(cctx, rc, prefix)
		rc.Close()
	}
	if err != nil {
		fmt.Fprintf(b.stderr, "bench: deleting redis keys %s:*: %v\n", prefix, err)
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

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Setup is how the bench was run, for the reader of a report.
type Setup struct {
	Scenario string `json:"scenario"`
	// Paths are the paths measured apart (purchase, sold-out); empty when
	// the run measured Scenario as a whole.
	Paths         []string `json:"paths,omitempty"`
	PurchaseStock int64    `json:"purchase_stock,omitempty"` // units of the purchase path's sale
	Mode          Mode     `json:"mode"`
	Buyers        int      `json:"buyers"`
	Rate          float64  `json:"rate,omitempty"`
	DurationS     float64  `json:"duration_s"`
	WarmupS       float64  `json:"warmup_s"`
	RequestLimit  int64    `json:"request_limit,omitempty"`
	Stock         int64    `json:"stock"`
	SKUs          int      `json:"skus"`
	PerUserLimit  int64    `json:"per_user_limit"`
	Strategies    []string `json:"strategies"`
	// Target is "in-process" (a fresh server per strategy) or the URL of a running one.
	Target string `json:"target"`
	// Workers are the load's workers (flashsale bench -worker), if it did
	// not come from this process; Sources its source addresses.
	Workers []string          `json:"workers,omitempty"`
	Sources int               `json:"sources,omitempty"`
	Server  map[string]string `json:"server,omitempty"`
	Machine Machine           `json:"machine"`
	Started time.Time         `json:"started_at"`
	Command string            `json:"command"`
	Notes   []string          `json:"notes,omitempty"`
}

// Machine is where the bench ran.
type Machine struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	Go         string `json:"go"`
	CPUModel   string `json:"cpu_model,omitempty"`
	Note       string `json:"note,omitempty"`
}

// Baselines are the limits the strategies are compared with.
type Baselines struct {
	// EmptyHandlerRPS: the same generator against a handler that does nothing.
	EmptyHandlerRPS float64 `json:"empty_handler_rps"`
	// RedisGateRPS: the gate script alone, many goroutines, the same client.
	RedisGateRPS float64 `json:"redis_gate_rps"`
	// The empty handler's latency, what the paths' p99 is compared with.
	EmptyHandlerP50Ms float64 `json:"empty_handler_p50_ms,omitempty"`
	EmptyHandlerP99Ms float64 `json:"empty_handler_p99_ms,omitempty"`
	// CPU per request of the empty handler's process and of the
	// generator's, when the handler ran in its own process (-target).
	EmptyHandlerCPUUsPerReq   float64 `json:"empty_handler_cpu_us_per_req,omitempty"`
	EmptyGeneratorCPUUsPerReq float64 `json:"empty_generator_cpu_us_per_req,omitempty"`
}

// PathFigures is what a run of one path of the purchase measured: the
// answers of the one kind the path gives, against the empty handler.
type PathFigures struct {
	Name string `json:"name"` // purchase or sold-out
	Code string `json:"code"` // the answer counted: accepted or sold_out
	// Answers counts the answers with Code and Other every other answer
	// (errors included: 0 when the path is what it says), both over the
	// whole measurement as the result's requests count it (every answer
	// after the warm-up, those after the time bound included): Answers +
	// Other = requests. RPS is the answers with Code within the measured
	// window per second of it.
	Answers int64   `json:"answers"`
	RPS     float64 `json:"rps"`
	Other   int64   `json:"other_answers"`
	// XEmpty is RPS over the empty handler's req/s, P99XEmpty the p99 over
	// the empty handler's p99 (0 without the baseline).
	XEmpty    float64 `json:"x_empty"`
	P99XEmpty float64 `json:"p99_x_empty"`
	// EmptyRPS and EmptyP99Ms are the empty handler's figures the ratios
	// use: the run's baseline, or with -empty-each the one measured right
	// before this path.
	EmptyRPS   float64 `json:"empty_rps"`
	EmptyP99Ms float64 `json:"empty_p99_ms"`
	// The apply backlog (reservations accepted by the gate, not yet decided
	// by the database; the outbox is part of it) when the last answer came,
	// the most during the run, and the time from the last answer until it
	// was zero. BacklogMeasured is false for the database strategies: they
	// commit before answering, there is no backlog.
	BacklogMeasured bool  `json:"backlog_measured"`
	BacklogAtEnd    int64 `json:"backlog_at_end"`
	OutboxAtEnd     int64 `json:"outbox_at_end"`
	BacklogMax      int64 `json:"backlog_max"`
	// BacklogGrowthPerS is how fast the backlog grew over the measured
	// window (least squares over the samples): ~0 when the consumer keeps
	// up, positive when it falls behind.
	BacklogGrowthPerS float64 `json:"backlog_growth_per_s"`
	DrainToZeroS      float64 `json:"drain_to_zero_s"`
	DrainedToZero     bool    `json:"drained_to_zero"`
}

// ProcessCPU is the processor time of the server and of the load
// generator over the measurement, in seconds and per answer.
type ProcessCPU struct {
	// SameProcess: the server ran in the bench's process (in-process
	// mode), so ServerS includes the generator and GeneratorS is 0.
	SameProcess bool    `json:"same_process"`
	ServerPID   int     `json:"server_pid,omitempty"`
	ServerS     float64 `json:"server_cpu_s"`
	GeneratorS  float64 `json:"generator_cpu_s"`
	// Microseconds of CPU per answer of the measurement.
	ServerUsPerReq    float64 `json:"server_cpu_us_per_req"`
	GeneratorUsPerReq float64 `json:"generator_cpu_us_per_req"`
	// The services' processes over the same window, from /proc: every
	// redis-server, the database server (every PostgreSQL backend,
	// mariadbd or mysqld) and an external nats-server (an embedded
	// JetStream is in the server's figure). On a shared machine they
	// include other clients of those servers.
	RedisS           float64 `json:"redis_cpu_s"`
	DatabaseS        float64 `json:"database_cpu_s"`
	NATSS            float64 `json:"nats_cpu_s"`
	RedisUsPerReq    float64 `json:"redis_cpu_us_per_req"`
	DatabaseUsPerReq float64 `json:"database_cpu_us_per_req"`
	NATSUsPerReq     float64 `json:"nats_cpu_us_per_req"`
	// SystemUsPerReq is the whole system's CPU per answer: the server,
	// Redis, the database and NATS, without the load generator. Only with
	// the server in its own process (-target): in-process, the server's
	// figure holds the generator too.
	SystemUsPerReq float64 `json:"system_cpu_us_per_req,omitempty"`
}

// NewProcessCPU returns the process figures of run, or nil when /proc
// was not read.
func NewProcessCPU(run *Result) *ProcessCPU {
	c := run.CPU
	if c.Machine == 0 || c.Span <= 0 {
		return nil
	}
	p := &ProcessCPU{SameProcess: c.ServerPID == 0, ServerPID: c.ServerPID}
	if p.SameProcess {
		p.ServerS = round(c.Seconds(c.Self), 3)
	} else {
		p.ServerS, p.GeneratorS = round(c.Seconds(c.Server), 3), round(c.Seconds(c.Self), 3)
	}
	p.RedisS, p.DatabaseS, p.NATSS = round(c.Seconds(c.Redis), 3), round(c.Seconds(c.Database), 3), round(c.Seconds(c.NATS), 3)
	if run.Requests > 0 {
		n := float64(run.Requests)
		p.ServerUsPerReq, p.GeneratorUsPerReq = round(p.ServerS*1e6/n, 1), round(p.GeneratorS*1e6/n, 1)
		p.RedisUsPerReq, p.DatabaseUsPerReq, p.NATSUsPerReq = round(p.RedisS*1e6/n, 1), round(p.DatabaseS*1e6/n, 1), round(p.NATSS*1e6/n, 1)
		if !p.SameProcess {
			p.SystemUsPerReq = round((p.ServerS+p.RedisS+p.DatabaseS+p.NATSS)*1e6/n, 1)
		}
	}
	return p
}

// Headline is the few figures a run is read by, for one strategy
// (pipeline if it ran): each path's answers per second and p99 as a ratio
// of the empty handler's in the same run, and whether the consumer kept up.
type Headline struct {
	Strategy          string  `json:"strategy"`
	EmptyHandlerRPS   float64 `json:"empty_handler_rps"`
	EmptyHandlerP99Ms float64 `json:"empty_handler_p99_ms"`
	PurchaseRPS       float64 `json:"purchase_rps,omitempty"`
	PurchaseXEmpty    float64 `json:"purchase_x_empty,omitempty"`
	PurchaseP99Ms     float64 `json:"purchase_p99_ms,omitempty"`
	PurchaseP99XEmpty float64 `json:"purchase_p99_x_empty,omitempty"`
	SoldOutRPS        float64 `json:"sold_out_rps,omitempty"`
	SoldOutXEmpty     float64 `json:"sold_out_x_empty,omitempty"`
	SoldOutP99Ms      float64 `json:"sold_out_p99_ms,omitempty"`
	SoldOutP99XEmpty  float64 `json:"sold_out_p99_x_empty,omitempty"`
	// The purchase path's backlog at the load's end and the time it took
	// to reach zero after it.
	BacklogAtEnd      int64   `json:"backlog_at_end"`
	BacklogGrowthPerS float64 `json:"backlog_growth_per_s"`
	DrainToZeroS      float64 `json:"drain_to_zero_s"`
	DrainedToZero     bool    `json:"drained_to_zero"`
	// CPU per purchase of the server's process and the generator's (only
	// when they are separate processes: -target).
	ServerCPUUsPerPurchase    float64 `json:"server_cpu_us_per_purchase,omitempty"`
	GeneratorCPUUsPerPurchase float64 `json:"generator_cpu_us_per_purchase,omitempty"`
	// The same per purchase for Redis, the database and an external
	// nats-server, and the whole system's (server + Redis + database +
	// NATS, no generator).
	RedisCPUUsPerPurchase    float64 `json:"redis_cpu_us_per_purchase,omitempty"`
	DatabaseCPUUsPerPurchase float64 `json:"database_cpu_us_per_purchase,omitempty"`
	NATSCPUUsPerPurchase     float64 `json:"nats_cpu_us_per_purchase,omitempty"`
	SystemCPUUsPerPurchase   float64 `json:"system_cpu_us_per_purchase,omitempty"`
	ServerCPUUsPerSoldOut    float64 `json:"server_cpu_us_per_sold_out,omitempty"`
	// The cost floor's ratios, over the empty handler's server CPU per
	// request in the same run: the server's CPU per purchase and per
	// sold-out answer, and the whole system's per purchase.
	ServerCPUPurchaseXEmpty float64 `json:"server_cpu_purchase_x_empty,omitempty"`
	ServerCPUSoldOutXEmpty  float64 `json:"server_cpu_sold_out_x_empty,omitempty"`
	SystemCPUPurchaseXEmpty float64 `json:"system_cpu_purchase_x_empty,omitempty"`

	purchase, soldOut bool // which paths ran
}

// StrategyResult is one strategy's run: the JSON fields of the report and,
// unexported to JSON, what the terminal and HTML reports also show.
type StrategyResult struct {
	Strategy      string  `json:"strategy"`
	Requests      int64   `json:"requests"` // answered after the warm-up (the generator's Result.Requests)
	ThroughputRPS float64 `json:"throughput_rps"`
	// Accepted counts the distinct orders the service accepted (202) over
	// the whole run, set-up and warm-up included: what the checks hold the
	// database to. Codes["accepted"] differs: it counts answers after the
	// warm-up only, and an idempotent retry answers accepted again with the
	// order it already has.
	Accepted     int64   `json:"accepted"`
	Sold         int64   `json:"sold"`
	Oversold     int64   `json:"oversold"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	P999Ms       float64 `json:"p999_ms"`
	Errors       int64   `json:"errors"`
	InvariantsOK bool    `json:"invariants_ok"`
	DrainSeconds float64 `json:"drain_seconds"`

	// Path is set when the run measured one path of the purchase
	// (-paths): what it counted and the consumer's backlog.
	Path *PathFigures `json:"path,omitempty"`
	// ProcessCPU is the server's and the generator's processor time.
	ProcessCPU *ProcessCPU `json:"process_cpu,omitempty"`
	// Opening is set by the opening scenario: people, bots and the room.
	Opening *OpeningFigures `json:"opening,omitempty"`

	// Backlog is the pipeline's in-flight reservations during the run (warm-up included).
	Backlog       []BacklogPoint   `json:"-"`
	Lost, Doubled int64            `json:"-"`
	I7Units       int64            `json:"-"`
	Codes         map[string]int64 `json:"-"` // answers after the warm-up, by code
	Violations    []string         `json:"-"`
	Run           *Result          `json:"-"`
}

// NewStrategyResult fills a result from a run and its verdict.
func NewStrategyResult(strategy string, run *Result, v *Verdict, accepted int64) *StrategyResult {
	r := &StrategyResult{
		Strategy: strategy, Requests: run.Requests, ThroughputRPS: round(run.Throughput(), 1), Accepted: accepted,
		P50Ms: round(durationMs(run.Percentile(50)), 3), P99Ms: round(durationMs(run.Percentile(99)), 3),
		P999Ms: round(durationMs(run.Percentile(99.9)), 3), Errors: run.Errors, Codes: run.Codes, Run: run,
		ProcessCPU: NewProcessCPU(run),
	}
	if v != nil {
		r.Sold, r.Oversold, r.Lost, r.Doubled, r.I7Units = v.Sold, v.Oversold, v.Lost, v.Doubled, v.I7Units
		r.InvariantsOK = v.OK()
		r.DrainSeconds = round(v.DrainTime.Seconds(), 3)
		r.Violations = v.Violations
	}
	return r
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// SetPath makes r the figures of path, counting the answers with code,
// against the empty handler's throughput and p99 (zero: not measured).
func (r *StrategyResult) SetPath(path, code string, emptyRPS, emptyP99Ms float64) {
	p := &PathFigures{Name: path, Code: code, EmptyRPS: emptyRPS, EmptyP99Ms: emptyP99Ms}
	if r.Run != nil {
		p.Answers = r.Run.Codes[code]
		p.RPS = round(r.Run.RateOf(code), 1)
		p.Other = r.Run.Requests - r.Run.Codes[code]
	}
	if emptyRPS > 0 {
		p.XEmpty = round(p.RPS/emptyRPS, 3)
	}
	if emptyP99Ms > 0 {
		p.P99XEmpty = round(r.P99Ms/emptyP99Ms, 3)
	}
	r.Path = p
}

// SetDrain records the backlog of the run: d from the load's end, the
// samples taken during it (r.Backlog), the measured window from warmup to
// warmup+duration of the sampling's clock.
func (r *StrategyResult) SetDrain(d DrainFigures, warmup, duration time.Duration) {
	if r.Path == nil {
		return
	}
	r.Path.BacklogGrowthPerS = round(BacklogSlope(r.Backlog, warmup, warmup+duration), 1)
	r.Path.BacklogMeasured = true
	r.Path.BacklogAtEnd, r.Path.OutboxAtEnd = d.AtEnd.InFlight, d.AtEnd.Outbox
	r.Path.BacklogMax = max(r.MaxBacklog().InFlight, d.AtEnd.InFlight)
	r.Path.DrainToZeroS, r.Path.DrainedToZero = round(d.ToZero.Seconds(), 3), d.Drained
}

// Label names the result in tables: the strategy, and the path if any.
func (r *StrategyResult) Label() string {
	if r.Path != nil {
		return r.Strategy + " " + r.Path.Name
	}
	return r.Strategy
}

// Report is a whole bench: its setup, the baselines and one result per
// strategy (per strategy and path with -paths), as written to JSON.
type Report struct {
	Setup     Setup             `json:"setup"`
	Baselines Baselines         `json:"baselines"`
	Results   []*StrategyResult `json:"results"`
	// Headline is set when paths were measured (SetHeadline).
	Headline *Headline `json:"headline,omitempty"`
	// Memory is the connection-holding test's (-connections).
	Memory *HoldResult `json:"memory,omitempty"`
}

// SetHeadline fills f.Headline from the path results of the pipeline, or
// of the first strategy that measured paths.
func (f *Report) SetHeadline() {
	var name string
	for _, r := range f.Results {
		if r.Path != nil && (name == "" || r.Strategy == "pipeline") {
			name = r.Strategy
		}
	}
	if name == "" {
		f.Headline = nil
		return
	}
	h := &Headline{Strategy: name, EmptyHandlerRPS: f.Baselines.EmptyHandlerRPS, EmptyHandlerP99Ms: f.Baselines.EmptyHandlerP99Ms}
	for _, r := range f.Results {
		if r.Strategy != name || r.Path == nil {
			continue
		}
		switch r.Path.Name {
		case "purchase":
			h.purchase = true
			h.PurchaseRPS, h.PurchaseXEmpty, h.PurchaseP99Ms, h.PurchaseP99XEmpty = r.Path.RPS, r.Path.XEmpty, r.P99Ms, r.Path.P99XEmpty
			h.BacklogAtEnd, h.DrainToZeroS, h.DrainedToZero = r.Path.BacklogAtEnd, r.Path.DrainToZeroS, r.Path.DrainedToZero
			h.BacklogGrowthPerS = r.Path.BacklogGrowthPerS
			if c := r.ProcessCPU; c != nil && !c.SameProcess && r.Path.Answers > 0 {
				// Per answer of the purchase path: a purchase each when other_answers is 0.
				h.ServerCPUUsPerPurchase, h.GeneratorCPUUsPerPurchase = c.ServerUsPerReq, c.GeneratorUsPerReq
				h.RedisCPUUsPerPurchase, h.DatabaseCPUUsPerPurchase, h.NATSCPUUsPerPurchase = c.RedisUsPerReq, c.DatabaseUsPerReq, c.NATSUsPerReq
				h.SystemCPUUsPerPurchase = c.SystemUsPerReq
			}
		case "sold-out":
			h.soldOut = true
			h.SoldOutRPS, h.SoldOutXEmpty, h.SoldOutP99Ms, h.SoldOutP99XEmpty = r.Path.RPS, r.Path.XEmpty, r.P99Ms, r.Path.P99XEmpty
			if c := r.ProcessCPU; c != nil && !c.SameProcess && r.Path.Answers > 0 {
				h.ServerCPUUsPerSoldOut = c.ServerUsPerReq
			}
		}
	}
	if e := f.Baselines.EmptyHandlerCPUUsPerReq; e > 0 {
		h.ServerCPUPurchaseXEmpty = ratioOf(h.ServerCPUUsPerPurchase, e)
		h.ServerCPUSoldOutXEmpty = ratioOf(h.ServerCPUUsPerSoldOut, e)
		h.SystemCPUPurchaseXEmpty = ratioOf(h.SystemCPUUsPerPurchase, e)
	}
	f.Headline = h
}

// OK reports whether every strategy passed its checks.
func (f *Report) OK() bool {
	for _, r := range f.Results {
		if !r.InvariantsOK {
			return false
		}
	}
	return true
}

// WriteJSON writes f to path, indented.
func (f *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteTable prints f as a table: the figures beside the correctness
// counts, throughput also as a ratio of the empty handler's; then the
// paths' figures and the headline, and the memory test.
func (f *Report) WriteTable(w io.Writer) {
	s := f.Setup
	if f.Memory != nil && len(f.Results) == 0 {
		fmt.Fprintf(w, "\nmemory test of %s; %d CPUs, %s\n", s.Target, s.Machine.CPUs, s.Machine.Go)
		f.Memory.WriteText(w)
		return
	}
	if len(s.Paths) > 0 {
		fmt.Fprintf(w, "\npaths %s (purchase: a sale of %d units, every request a new buyer; sold-out: a sale of %d units sold out first)",
			strings.Join(s.Paths, ", "), s.PurchaseStock, s.Stock)
	} else {
		fmt.Fprintf(w, "\nscenario %s", s.Scenario)
	}
	fmt.Fprintf(w, ", %s loop", s.Mode)
	if s.Mode == Open {
		fmt.Fprintf(w, " at %.0f req/s", s.Rate)
	} else {
		fmt.Fprintf(w, ", %d buyers", s.Buyers)
	}
	if len(s.Paths) > 0 {
		fmt.Fprintf(w, ", %.3gs per run after %.3gs warm-up, limit %d per user; %d CPUs, %s\n", s.DurationS, s.WarmupS, s.PerUserLimit, s.Machine.CPUs, s.Machine.Go)
	} else {
		fmt.Fprintf(w, ", %.3gs per strategy after %.3gs warm-up, stock %d over %d SKU(s), limit %d per user; %d CPUs\n",
			s.DurationS, s.WarmupS, s.Stock, s.SKUs, s.PerUserLimit, s.Machine.CPUs)
	}
	if len(s.Workers) > 0 {
		fmt.Fprintf(w, "load from %d workers (%s), split by buyers and rate, merged; the generator's CPU is theirs\n", len(s.Workers), strings.Join(s.Workers, ", "))
	}
	b := f.Baselines
	fmt.Fprintf(w, "baselines: empty handler %.0f req/s", b.EmptyHandlerRPS)
	if b.EmptyHandlerP99Ms > 0 {
		fmt.Fprintf(w, " (p50 %.2f ms, p99 %.2f ms)", b.EmptyHandlerP50Ms, b.EmptyHandlerP99Ms)
	}
	if b.EmptyHandlerCPUUsPerReq > 0 {
		fmt.Fprintf(w, " (in its own process: %.0f µs CPU per request, generator %.0f µs)", b.EmptyHandlerCPUUsPerReq, b.EmptyGeneratorCPUUsPerReq)
	}
	fmt.Fprintf(w, ", redis gate alone %.0f reserves/s\n\n", b.RedisGateRPS)
	if len(f.Results) > 0 {
		f.writeResults(w)
	}
	if len(s.Paths) > 0 {
		f.writePaths(w)
	}
	if f.Memory != nil {
		f.Memory.WriteText(w)
	}
	for _, r := range f.Results {
		if r.Opening != nil {
			r.Opening.WriteText(w, r.Label())
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func (f *Report) writeResults(w io.Writer) {
	b := f.Baselines
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\trequests\treq/s\tx empty\torders accepted\tsold\toversold\tlost\tdoubled\tp50 ms\tp99 ms\tp99.9 ms\terrors\tdrain s\tinvariants\tcpu self/redis/db/nats/other\t")
	for _, r := range f.Results {
		ratio := "-"
		if b.EmptyHandlerRPS > 0 {
			ratio = fmt.Sprintf("%.2f", r.ThroughputRPS/b.EmptyHandlerRPS)
		}
		ok := "ok"
		if !r.InvariantsOK {
			ok = "VIOLATED"
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%d\t%d\t%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%d\t%.2f\t%s\t%s\t\n",
			r.Label(), r.Requests, r.ThroughputRPS, ratio, r.Accepted, r.Sold, r.Oversold, r.Lost, r.Doubled,
			r.P50Ms, r.P99Ms, r.P999Ms, r.Errors, r.DrainSeconds, ok, r.CPU())
	}
	tw.Flush()
	for _, r := range f.Results {
		fmt.Fprintf(w, "  %s answers after the warm-up: %s (%d distinct orders accepted over the whole run)\n",
			r.Label(), codeList(r.Codes), r.Accepted)
		if len(r.Backlog) > 0 {
			most, last := r.MaxBacklog(), r.Backlog[len(r.Backlog)-1]
			fmt.Fprintf(w, "  %s backlog (accepted, not yet in the database): at most %d at %.1fs, %d at the end of the run\n",
				r.Label(), most.InFlight, most.At.Seconds(), last.InFlight)
		}
		for _, v := range r.Violations {
			fmt.Fprintf(w, "  %s VIOLATION: %s\n", r.Label(), v)
		}
	}
	for _, path := range f.pathNames() {
		pipe := f.find("pipeline", path)
		if pipe == nil {
			continue
		}
		var parts []string
		for _, r := range f.Results {
			if r != pipe && r.pathName() == path && r.ThroughputRPS > 0 {
				parts = append(parts, fmt.Sprintf("%.1fx %s", pipe.ThroughputRPS/r.ThroughputRPS, r.Strategy))
			}
		}
		if len(parts) > 0 {
			label := "pipeline throughput"
			if path != "" {
				label = "pipeline " + path + " throughput"
			}
			fmt.Fprintf(w, "%s: %s\n", label, strings.Join(parts, ", "))
		}
	}
}

// writePaths prints the paths' figures and the headline.
func (f *Report) writePaths(w io.Writer) {
	fmt.Fprintln(w, "\npaths: answers and other answers count every answer after the warm-up, as requests above; req/s counts only the path's answer (accepted, sold_out) in the measured window; x empty: over the empty handler's req/s and p99")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tpath\tcounted\tanswers\tother answers\treq/s\tx empty\tempty req/s\tp50 ms\tp99 ms\tp99 x empty\tbacklog at end\toutbox at end\tbacklog max\tgrowth/s\tto zero s\tserver cpu µs/req\tgenerator cpu µs/req\t")
	for _, r := range f.Results {
		p := r.Path
		if p == nil {
			continue
		}
		backlog := [5]string{"-", "-", "-", "-", "-"}
		if p.BacklogMeasured {
			backlog = [5]string{strconv.FormatInt(p.BacklogAtEnd, 10), strconv.FormatInt(p.OutboxAtEnd, 10), strconv.FormatInt(p.BacklogMax, 10),
				fmt.Sprintf("%.0f", p.BacklogGrowthPerS), fmt.Sprintf("%.3f", p.DrainToZeroS)}
			if !p.DrainedToZero {
				backlog[4] = "NOT DRAINED"
			}
		}
		srv, gen := "-", "-"
		if c := r.ProcessCPU; c != nil {
			srv = fmt.Sprintf("%.0f", c.ServerUsPerReq)
			if c.SameProcess {
				srv += " (with generator)"
			} else {
				gen = fmt.Sprintf("%.0f", c.GeneratorUsPerReq)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%.0f\t%s\t%.0f\t%.2f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Strategy, p.Name, p.Code, p.Answers, p.Other, p.RPS, ratioText(p.XEmpty), p.EmptyRPS, r.P50Ms, r.P99Ms, ratioText(p.P99XEmpty),
			backlog[0], backlog[1], backlog[2], backlog[3], backlog[4], srv, gen)
	}
	tw.Flush()
	if h := f.Headline; h != nil {
		fmt.Fprintf(w, "HEADLINE %s: %s\n", h.Strategy, h.Text())
	}
}

// Text is the headline in one line.
func (h *Headline) Text() string {
	var parts []string
	if h.purchase {
		parts = append(parts, fmt.Sprintf("purchase %.0f req/s = %sx empty handler, p99 %.1f ms = %sx", h.PurchaseRPS, ratioText(h.PurchaseXEmpty),
			h.PurchaseP99Ms, ratioText(h.PurchaseP99XEmpty)))
		drain := fmt.Sprintf("backlog %d at the load's end (growing %.0f/s while measured), zero %.2fs after", h.BacklogAtEnd, h.BacklogGrowthPerS, h.DrainToZeroS)
		if !h.DrainedToZero {
			drain = fmt.Sprintf("backlog %d at the load's end (growing %.0f/s while measured), NOT drained to zero", h.BacklogAtEnd, h.BacklogGrowthPerS)
		}
		parts = append(parts, drain)
	}
	if h.soldOut {
		parts = append(parts, fmt.Sprintf("sold-out %.0f req/s = %sx, p99 %.1f ms = %sx", h.SoldOutRPS, ratioText(h.SoldOutXEmpty),
			h.SoldOutP99Ms, ratioText(h.SoldOutP99XEmpty)))
	}
	if h.ServerCPUUsPerPurchase > 0 {
		parts = append(parts, fmt.Sprintf("CPU per purchase: server %.0f µs (%sx the empty handler's), redis %.0f µs, database %.0f µs, nats %.0f µs, whole system %.0f µs (%sx), generator %.0f µs",
			h.ServerCPUUsPerPurchase, ratioText(h.ServerCPUPurchaseXEmpty), h.RedisCPUUsPerPurchase, h.DatabaseCPUUsPerPurchase, h.NATSCPUUsPerPurchase,
			h.SystemCPUUsPerPurchase, ratioText(h.SystemCPUPurchaseXEmpty), h.GeneratorCPUUsPerPurchase))
	}
	if h.ServerCPUUsPerSoldOut > 0 {
		parts = append(parts, fmt.Sprintf("server CPU per sold-out answer %.0f µs (%sx)", h.ServerCPUUsPerSoldOut, ratioText(h.ServerCPUSoldOutXEmpty)))
	}
	return strings.Join(parts, "; ")
}

// WriteText prints the memory test's figures.
func (m *HoldResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "\nmemory: %d keep-alive connections asked, %d opened, %d held %.1fs with a request every %.3gs each (%d requests, %d errors)\n",
		m.Connections, m.Opened, m.Held, m.HoldS, m.EveryS, m.Requests, m.Errors)
	fmt.Fprintf(w, "MEMORY server pid %d: VmRSS %.1f MiB with the connections open (%.1f MiB before, %.1f KiB per connection), VmHWM %.1f MiB; open files limit: server %d, client %d\n",
		m.ServerPID, m.RSSMB, m.RSSBeforeMB, m.PerConnKB, m.HWMMB, m.ServerLimit, m.FileLimit)
	if m.Note != "" {
		fmt.Fprintf(w, "memory note: %s\n", m.Note)
	}
}

func ratioText(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

// MaxBacklog returns the sample with the largest backlog.
func (r *StrategyResult) MaxBacklog() BacklogPoint {
	var most BacklogPoint
	for _, p := range r.Backlog {
		if p.InFlight > most.InFlight {
			most = p
		}
	}
	return most
}

// CPU formats where the machine's processor time went during the run, in
// cores; with a server in its own process (-target), its share follows.
func (r *StrategyResult) CPU() string {
	if r.Run == nil || r.Run.CPU.Machine == 0 {
		return "-"
	}
	c := r.Run.CPU
	out := fmt.Sprintf("%.2f/%.2f/%.2f/%.2f/%.2f", c.Self, c.Redis, c.Database, c.NATS, c.Other())
	if c.ServerPID != 0 {
		out += fmt.Sprintf(" +server %.2f", c.Server)
	}
	return out
}

// find returns the result of strategy on path ("" for a scenario run).
func (f *Report) find(strategy, path string) *StrategyResult {
	for _, r := range f.Results {
		if r.Strategy == strategy && r.pathName() == path {
			return r
		}
	}
	return nil
}

func (r *StrategyResult) pathName() string {
	if r.Path == nil {
		return ""
	}
	return r.Path.Name
}

// pathNames returns the paths of the results in order ("" for scenario runs).
func (f *Report) pathNames() []string {
	var out []string
	for _, r := range f.Results {
		if !slices.Contains(out, r.pathName()) {
			out = append(out, r.pathName())
		}
	}
	return out
}

// codeList formats answer counts, most frequent first.
func codeList(codes map[string]int64) string {
	keys := slices.Collect(maps.Keys(codes))
	slices.SortFunc(keys, func(a, b string) int {
		if codes[a] != codes[b] {
			if codes[a] > codes[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, codes[k])
	}
	return strings.Join(parts, ", ")
}

// ratioOf returns x/of to three digits, 0 when either is not measured.
func ratioOf(x, of float64) float64 {
	if x <= 0 || of <= 0 {
		return 0
	}
	return round(x/of, 3)
}

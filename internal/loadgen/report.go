package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Setup is how the bench was run, for the reader of a report.
type Setup struct {
	Scenario     string   `json:"scenario"`
	Mode         Mode     `json:"mode"`
	Buyers       int      `json:"buyers"`
	Rate         float64  `json:"rate,omitempty"`
	DurationS    float64  `json:"duration_s"`
	WarmupS      float64  `json:"warmup_s"`
	RequestLimit int64    `json:"request_limit,omitempty"`
	Stock        int64    `json:"stock"`
	SKUs         int      `json:"skus"`
	PerUserLimit int64    `json:"per_user_limit"`
	Strategies   []string `json:"strategies"`
	// Target is "in-process" (a fresh server per strategy) or the URL of a running one.
	Target  string            `json:"target"`
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
}

// StrategyResult is one strategy's run: the JSON fields of the report and,
// unexported to JSON, what the terminal and HTML reports also show.
type StrategyResult struct {
	Strategy      string  `json:"strategy"`
	Requests      int64   `json:"requests"`
	ThroughputRPS float64 `json:"throughput_rps"`
	// Accepted counts the distinct orders the service accepted (202) over
	// the whole run, set-up and warm-up included: what the checks hold the
	// database to. Codes["accepted"] differs: it counts answers in the
	// measured window only, and an idempotent retry answers accepted again
	// with the order it already has.
	Accepted     int64   `json:"accepted"`
	Sold         int64   `json:"sold"`
	Oversold     int64   `json:"oversold"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	P999Ms       float64 `json:"p999_ms"`
	Errors       int64   `json:"errors"`
	InvariantsOK bool    `json:"invariants_ok"`
	DrainSeconds float64 `json:"drain_seconds"`

	// Backlog is the pipeline's in-flight reservations during the run (warm-up included).
	Backlog       []BacklogPoint   `json:"-"`
	Lost, Doubled int64            `json:"-"`
	I7Units       int64            `json:"-"`
	Codes         map[string]int64 `json:"-"` // answers in the measured window, by code
	Violations    []string         `json:"-"`
	Run           *Result          `json:"-"`
}

// NewStrategyResult fills a result from a run and its verdict.
func NewStrategyResult(strategy string, run *Result, v *Verdict, accepted int64) *StrategyResult {
	r := &StrategyResult{
		Strategy: strategy, Requests: run.Requests, ThroughputRPS: round(run.Throughput(), 1), Accepted: accepted,
		P50Ms: round(durationMs(run.Percentile(50)), 3), P99Ms: round(durationMs(run.Percentile(99)), 3),
		P999Ms: round(durationMs(run.Percentile(99.9)), 3), Errors: run.Errors, Codes: run.Codes, Run: run,
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

// Report is a whole bench: its setup, the baselines and one result per
// strategy, as written to JSON.
type Report struct {
	Setup     Setup             `json:"setup"`
	Baselines Baselines         `json:"baselines"`
	Results   []*StrategyResult `json:"results"`
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
// counts, throughput also as a ratio of the empty handler's.
func (f *Report) WriteTable(w io.Writer) {
	s := f.Setup
	fmt.Fprintf(w, "\nscenario %s, %s loop", s.Scenario, s.Mode)
	if s.Mode == Open {
		fmt.Fprintf(w, " at %.0f req/s", s.Rate)
	} else {
		fmt.Fprintf(w, ", %d buyers", s.Buyers)
	}
	fmt.Fprintf(w, ", %.3gs per strategy after %.3gs warm-up, stock %d over %d SKU(s), limit %d per user; %d CPUs\n",
		s.DurationS, s.WarmupS, s.Stock, s.SKUs, s.PerUserLimit, s.Machine.CPUs)
	b := f.Baselines
	fmt.Fprintf(w, "baselines: empty handler %.0f req/s, redis gate alone %.0f reserves/s\n\n", b.EmptyHandlerRPS, b.RedisGateRPS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\trequests\treq/s\tx empty\torders accepted\tsold\toversold\tlost\tdoubled\tp50 ms\tp99 ms\tp99.9 ms\terrors\tdrain s\tinvariants\tcpu self/redis/db/other\t")
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
			r.Strategy, r.Requests, r.ThroughputRPS, ratio, r.Accepted, r.Sold, r.Oversold, r.Lost, r.Doubled,
			r.P50Ms, r.P99Ms, r.P999Ms, r.Errors, r.DrainSeconds, ok, r.CPU())
	}
	tw.Flush()
	for _, r := range f.Results {
		fmt.Fprintf(w, "  %s answers in the measured window: %s (%d distinct orders accepted over the whole run)\n",
			r.Strategy, codeList(r.Codes), r.Accepted)
		if len(r.Backlog) > 0 {
			most, last := r.MaxBacklog(), r.Backlog[len(r.Backlog)-1]
			fmt.Fprintf(w, "  %s backlog (accepted, not yet in the database): at most %d at %.1fs, %d at the end of the run\n",
				r.Strategy, most.InFlight, most.At.Seconds(), last.InFlight)
		}
		for _, v := range r.Violations {
			fmt.Fprintf(w, "  %s VIOLATION: %s\n", r.Strategy, v)
		}
	}
	if pipe := f.find("pipeline"); pipe != nil {
		var parts []string
		for _, r := range f.Results {
			if r != pipe && r.ThroughputRPS > 0 {
				parts = append(parts, fmt.Sprintf("%.1fx %s", pipe.ThroughputRPS/r.ThroughputRPS, r.Strategy))
			}
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, "pipeline throughput: %s\n", strings.Join(parts, ", "))
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
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

// CPU formats where the machine's processor time went during the run, in cores.
func (r *StrategyResult) CPU() string {
	if r.Run == nil || r.Run.CPU.Machine == 0 {
		return "-"
	}
	c := r.Run.CPU
	return fmt.Sprintf("%.2f/%.2f/%.2f/%.2f", c.Self, c.Redis, c.Database, c.Other())
}

func (f *Report) find(strategy string) *StrategyResult {
	for _, r := range f.Results {
		if r.Strategy == strategy {
			return r
		}
	}
	return nil
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

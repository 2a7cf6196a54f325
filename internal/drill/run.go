package drill

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/loadgen"
)

// window is the resolution of the grading: an error share per second.
const window = time.Second

// Report is a drill's outcome.
type Report struct {
	Name     string           `json:"name"`
	Target   string           `json:"target"`
	Workers  []string         `json:"workers,omitempty"` // the load's workers, if it came from them
	Started  time.Time        `json:"started"`
	Phases   []PhaseResult    `json:"phases"`
	Faults   []FaultResult    `json:"faults"`
	Seconds  []Second         `json:"seconds"` // the whole timeline, a point per second
	Requests int64            `json:"requests"`
	Errors   int64            `json:"errors"`
	Codes    map[string]int64 `json:"codes"`
	// Invariants: I1-I7 read from the database and Redis after the drain.
	Invariants *loadgen.Verdict `json:"invariants"`
	Checks     []Check          `json:"checks"`
	Passed     bool             `json:"passed"`
}

// PhaseResult is one phase as measured.
type PhaseResult struct {
	Name       string           `json:"name"`
	Rate       float64          `json:"rate"`
	Start      Duration         `json:"start"` // from the drill's start
	For        Duration         `json:"for"`
	Requests   int64            `json:"requests"`
	Errors     int64            `json:"errors"`
	Throughput float64          `json:"throughput"` // answered without error per second
	P50Ms      float64          `json:"p50_ms"`
	P99Ms      float64          `json:"p99_ms"`
	MaxMs      float64          `json:"max_ms"`
	Codes      map[string]int64 `json:"codes"`
	// Disturbed: a fault was injected in it or its recovery reached it;
	// its p99 is not graded.
	Disturbed bool `json:"disturbed"`
}

// FaultResult is one fault as run.
type FaultResult struct {
	Name     string   `json:"name"`
	At       Duration `json:"at"`   // when it was due
	Took     Duration `json:"took"` // how long the command ran
	Exit     int      `json:"exit"` // its exit status (-1: did not run or was killed)
	Output   string   `json:"output,omitempty"`
	Error    string   `json:"error,omitempty"`
	Recovery Duration `json:"recovery"` // see recovery
	// Recovered is false when the drill ended with the error share still
	// above the budget.
	Recovered bool `json:"recovered"`
}

// Second is one second of the timeline.
type Second struct {
	At       int   `json:"at"` // its start, in seconds from the drill's start
	Answered int64 `json:"answered"`
	Errors   int64 `json:"errors"`
}

// Check is one pass criterion and what the drill showed.
type Check struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	OK   bool   `json:"ok"`
}

// Env is what a drill runs against.
type Env struct {
	Client  *loadgen.Client
	Checker loadgen.Checker
	Redis   rueidis.Client // the target's Redis (Checker.Gate's client)
	// RunID names the drill's sales and buyers (unique per run).
	RunID string
	// Workers, if set, send the phases' load (flashsale bench -worker on
	// each load machine), to Target with buyers' tokens signed with
	// UserSecret, each connection from one of Sources loopback addresses.
	Workers    *loadgen.Coordinator
	Target     string
	UserSecret string
	Sources    int
	// Progress, if set, gets a line at each phase and fault.
	Progress func(string)
}

// Run runs f against env: it creates the sale, runs the phases one after
// the other while the faults fire at their moments, waits for the faults'
// commands, drains and checks the invariants, and grades the run. An error
// is returned only when the drill could not run; a failed grade is a
// Report with Passed false.
func Run(ctx context.Context, f *File, env Env) (*Report, error) {
	say := env.Progress
	if say == nil {
		say = func(string) {}
	}
	sc, err := loadgen.NewScenario(loadgen.ScenarioConfig{Name: f.Scenario, Stock: f.Stock, SKUs: f.SKUs, PerUserLimit: f.PerUserLimit, RunID: env.RunID})
	if err != nil {
		return nil, err
	}
	if err := sc.Setup(ctx, env.Client); err != nil {
		return nil, fmt.Errorf("drill: creating the sale: %w", err)
	}
	// The stores given are the target's own (else every check would
	// read another deployment's).
	if err := env.Checker.CheckStores(ctx, env.Redis, sc.SKUs()); err != nil {
		return nil, err
	}
	rep := &Report{Name: f.Name, Target: env.Client.Base(), Started: time.Now().UTC(), Codes: map[string]int64{}}
	start := time.Now()
	if env.Workers != nil {
		// Every phase's part goes to the workers now, to start at its
		// moment: the first one too, once each worker has it.
		start = start.Add(3 * time.Second)
		rep.Workers = env.Workers.Workers
	}

	// Faults fire on their own clock, from the first phase's start.
	fctx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	rep.Faults = make([]FaultResult, len(f.Faults))
	var fw sync.WaitGroup
	for i, ft := range f.Faults {
		rep.Faults[i] = FaultResult{Name: ft.Name, At: ft.At, Exit: -1}
		fw.Go(func() {
			t := time.NewTimer(time.Until(start.Add(ft.At.D())))
			defer t.Stop()
			select {
			case <-fctx.Done():
				rep.Faults[i].Error = "the drill ended before it was due"
				return
			case <-t.C:
			}
			say(fmt.Sprintf("fault %s at %v: %s", ft.Name, time.Since(start).Round(time.Millisecond), ft.Run))
			rep.Faults[i] = runFault(fctx, ft)
		})
	}

	// Each phase starts at its moment on the drill's clock, as the faults
	// do: the requests a phase still has in flight at its end finish while
	// the next one runs, rather than pushing the rest of the timeline late.
	results := make([]*loadgen.Result, len(f.Phases))
	errs := make([]error, len(f.Phases))
	var pw sync.WaitGroup
	var off time.Duration
	var seq0 int64
	base := sc.Op(env.Client)
	for i, p := range f.Phases {
		at := off
		off += p.For.D()
		// Every phase numbers its requests from 0: each gets its own range
		// of the scenario's buyers (a multiple of its groups of 7, and of
		// the workers' blocks), so that a later phase's buyers are new
		// people, not the earlier ones clicking again.
		first := seq0
		seq0 += (int64(math.Ceil(p.Rate*p.For.D().Seconds()))/loadgen.WorkBlock + 2) * loadgen.WorkBlock
		op := func(ctx context.Context, seq int64) loadgen.Outcome { return base(ctx, first+seq) }
		if env.Workers != nil {
			pw.Go(func() {
				w := loadgen.Work{Target: env.Target, UserSecret: env.UserSecret, Scenario: sc.Config(), Lifecycle: sc.Lifecycle(),
					Mode: loadgen.Open, Rate: p.Rate, Duration: p.For.D(), Concurrency: f.MaxInFlight, SeqBase: first,
					Sources: env.Sources, StartAt: start.Add(at)}
				var accepted map[string][]string
				var parts []*loadgen.WorkResult
				results[i], accepted, parts, errs[i] = env.Workers.Run(ctx, w)
				for _, wr := range parts {
					if wr != nil {
						say(fmt.Sprintf("phase %s: worker %s answered %d, %d errors, started %v after its moment", p.Name, wr.Worker, wr.Requests, wr.Errors, wr.StartLag.Round(time.Microsecond)))
					}
				}
				sc.AddAccepted(accepted)
			})
			continue
		}
		pw.Go(func() {
			t := time.NewTimer(time.Until(start.Add(at)))
			defer t.Stop()
			select {
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			case <-t.C:
			}
			say(fmt.Sprintf("phase %s at %v: %g requests/s for %v", p.Name, time.Since(start).Round(time.Millisecond), p.Rate, p.For.D()))
			results[i], errs[i] = loadgen.Run(ctx, loadgen.Config{Mode: loadgen.Open, Rate: p.Rate, Duration: p.For.D(), Concurrency: f.MaxInFlight, Bucket: 100 * time.Millisecond}, op)
		})
	}
	pw.Wait()
	var timeline []loadgen.Point
	off = 0
	for i, p := range f.Phases {
		at := off
		off += p.For.D()
		res := results[i]
		if errs[i] != nil {
			return nil, fmt.Errorf("drill: phase %s: %w", p.Name, errs[i])
		}
		pr := PhaseResult{Name: p.Name, Rate: p.Rate, Start: Duration(at), For: p.For, Requests: res.Requests, Errors: res.Errors,
			Throughput: res.Throughput(), P50Ms: ms(res.Percentile(50)), P99Ms: ms(res.Percentile(99)), MaxMs: ms(time.Duration(res.Latency.Max()) * time.Microsecond), Codes: res.Codes}
		rep.Phases = append(rep.Phases, pr)
		rep.Requests += res.Requests
		rep.Errors += res.Errors
		for k, v := range res.Codes {
			rep.Codes[k] += v
		}
		for _, pt := range res.Timeline {
			pt.At += at
			timeline = append(timeline, pt)
		}
	}
	fw.Wait()
	stopFaults()
	rep.Seconds = seconds(timeline)

	say("draining and checking the invariants from the database and Redis")
	v, err := env.Checker.Check(ctx, sc.Accepted())
	if err != nil {
		return nil, fmt.Errorf("drill: checking the invariants: %w", err)
	}
	rep.Invariants = v
	grade(f, rep)
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runFault runs ft's command under its timeout.
func runFault(ctx context.Context, ft Fault) FaultResult {
	r := FaultResult{Name: ft.Name, At: ft.At, Exit: -1}
	ctx, cancel := context.WithTimeout(ctx, ft.Timeout.D())
	defer cancel()
	began := time.Now()
	cmd := exec.CommandContext(ctx, "sh", "-c", ft.Run)
	out, err := cmd.CombinedOutput()
	r.Took = Duration(time.Since(began))
	if len(out) > 2000 {
		out = out[len(out)-2000:]
	}
	r.Output = string(out)
	var ee *exec.ExitError
	switch {
	case err == nil:
		r.Exit = 0
	case ctx.Err() != nil:
		r.Error = fmt.Sprintf("killed after its timeout of %v", ft.Timeout.D())
	case errors.As(err, &ee):
		r.Exit = ee.ExitCode()
		r.Error = "exit status " + strconv.Itoa(r.Exit)
	default:
		r.Error = err.Error()
	}
	return r
}

// seconds sums the timeline's buckets into seconds from the start.
func seconds(pts []loadgen.Point) []Second {
	by := map[int]*Second{}
	last := 0
	for _, p := range pts {
		// A bucket's At is its end: it belongs to the second it ends in.
		s := int((p.At - time.Nanosecond) / window)
		if by[s] == nil {
			by[s] = &Second{At: s}
		}
		by[s].Answered += p.Completed
		by[s].Errors += p.Errors
		last = max(last, s)
	}
	out := make([]Second, 0, last+1)
	for s := 0; s <= last; s++ {
		if by[s] != nil {
			out = append(out, *by[s])
		} else {
			out = append(out, Second{At: s})
		}
	}
	return out
}

// recovery is how long after at the errors stayed above budget: from the
// fault to the end of the last second (before the next fault, if any)
// whose error share is above budget, 0 when none was. recovered is false
// when the last second of that stretch is still above it.
func recovery(secs []Second, at, next time.Duration, budget float64) (time.Duration, bool) {
	first := int(at / window)
	end := len(secs)
	if next > 0 {
		end = min(end, int(next/window))
	}
	lastBad := -1
	for s := first; s < end; s++ {
		if over(secs[s], budget) {
			lastBad = s
		}
	}
	if lastBad < 0 {
		return 0, true
	}
	return time.Duration(lastBad+1)*window - at, lastBad < end-1
}

func over(s Second, budget float64) bool {
	if s.Answered == 0 {
		return false // nothing answered: the open loop's rate is below one a second here
	}
	return float64(s.Errors)/float64(s.Answered) > budget
}

// grade fills rep.Checks and rep.Passed.
func grade(f *File, rep *Report) {
	budget := f.Pass.Budget()
	// Faults in the order they fired: each one's recovery is bounded by
	// the next one's moment.
	order := make([]int, len(rep.Faults))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return rep.Faults[order[a]].At < rep.Faults[order[b]].At })
	for k, i := range order {
		fr := &rep.Faults[i]
		var next time.Duration
		if k+1 < len(order) {
			next = rep.Faults[order[k+1]].At.D()
		}
		d, ok := recovery(rep.Seconds, fr.At.D(), next, budget)
		fr.Recovery, fr.Recovered = Duration(d), ok
		// Phases the fault and its recovery touched are not graded on p99.
		from, to := fr.At.D(), fr.At.D()+max(d, window)
		for j := range rep.Phases {
			p := &rep.Phases[j]
			if p.Start.D() < to && from < p.Start.D()+p.For.D() {
				p.Disturbed = true
			}
		}
	}
	add := func(name, want, got string, ok bool) {
		rep.Checks = append(rep.Checks, Check{Name: name, Want: want, Got: got, OK: ok})
	}
	share := 0.0
	if rep.Requests > 0 {
		share = float64(rep.Errors) / float64(rep.Requests)
	}
	add("error budget", fmt.Sprintf("<= %.2f%% of requests", 100*budget), fmt.Sprintf("%.3f%% (%d of %d)", 100*share, rep.Errors, rep.Requests), share <= budget)
	if f.Pass.P99 > 0 {
		for _, p := range rep.Phases {
			if p.Disturbed {
				continue
			}
			add("p99 of "+p.Name, "<= "+f.Pass.P99.D().String(), fmt.Sprintf("%.1fms", p.P99Ms), p.P99Ms <= ms(f.Pass.P99.D()))
		}
	}
	for _, fr := range rep.Faults {
		ran := fr.Exit == 0
		add("fault "+fr.Name+" ran", "exit 0", fmt.Sprintf("exit %d %s", fr.Exit, fr.Error), ran)
		if f.Pass.RecoverWithin > 0 {
			got := fr.Recovery.D().String()
			if !fr.Recovered {
				got = "not recovered by the end (" + got + ")"
			}
			add("recovery after "+fr.Name, "<= "+f.Pass.RecoverWithin.D().String(), got, fr.Recovered && fr.Recovery <= f.Pass.RecoverWithin)
		}
	}
	inv := "ok"
	if !rep.Invariants.OK() {
		inv = fmt.Sprintf("drained %v, oversold %d, lost %d, doubled %d; %v", rep.Invariants.Drained, rep.Invariants.Oversold, rep.Invariants.Lost, rep.Invariants.Doubled, rep.Invariants.Violations)
	}
	add("invariants (database and Redis)", "no violation", inv, rep.Invariants.OK())
	rep.Passed = true
	for _, c := range rep.Checks {
		rep.Passed = rep.Passed && c.OK
	}
}

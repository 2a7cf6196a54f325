// Package canary runs a canary trial: it raises the canary group's share of
// buyers in steps through HAProxy's runtime API, compares the canary group
// with the stable group over the same window at each step (errors, latency,
// shadow mismatches, dead letters, reconcile alerts) and checks the sales'
// invariants from the database, then promotes the canary or aborts the trial
// (share 0). The baseline is always the stable group measured at the same
// time, never a past run. docs/releasing.md describes the procedure.
package canary

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"
)

// Thresholds decide a step. A step fails when any is crossed.
type Thresholds struct {
	// MaxErrorRateDelta is how much the canary's share of 5xx answers (of
	// buyer API requests) may exceed the stable group's (0.01: one point).
	MaxErrorRateDelta float64 `json:"max_error_rate_delta"`
	// MaxP99Ratio is how many times the stable group's p99 latency of
	// POST /api/v1/orders the canary's may be, once above P99Floor.
	MaxP99Ratio float64       `json:"max_p99_ratio"`
	P99Floor    time.Duration `json:"p99_floor_ns"`
	// MaxShadowMismatches is the most shadow decisions of the canary group
	// that may differ from the live path's in a step.
	MaxShadowMismatches int64 `json:"max_shadow_mismatches"`
	// MaxDeadLetters is the most reservations that may be dead-lettered
	// in a step, by any instance: a dead letter is counted by the consumer
	// that gives up on it, which can be of either group whoever accepted
	// the purchase, so the two groups cannot be told apart here.
	MaxDeadLetters int64 `json:"max_dead_letters"`
	// MinRequests is the fewest buyer API requests the canary group must
	// serve in a step for the step to be judged (fewer: the step fails as
	// inconclusive, rather than promote on no evidence).
	MinRequests int64 `json:"min_requests"`
}

// DefaultThresholds are the flags' defaults.
var DefaultThresholds = Thresholds{MaxErrorRateDelta: 0.01, MaxP99Ratio: 2, P99Floor: 50 * time.Millisecond,
	MaxShadowMismatches: 0, MaxDeadLetters: 0, MinRequests: 50}

// Config is one trial.
type Config struct {
	Canary, Stable []string // the groups' instance base URLs (http://host:port)
	// Steps are the canary's shares of buyers in percent, in order; the
	// last one stays on promotion.
	Steps []int
	// StepDuration is how long each share is watched.
	StepDuration time.Duration
	Thresholds   Thresholds
	// SetShare sets the canary's share (HAProxy's runtime API: ShareSetter).
	SetShare func(ctx context.Context, percent int) error
	// Check, if set, checks the sales' invariants from the database at the
	// end of each step; it returns the violations found.
	Check func(ctx context.Context) ([]string, error)
	// State, if set, records the trial's state (for the dashboard).
	State func(ctx context.Context, s State) error
	// Progress, if set, is told each step's verdict as it is made.
	Progress func(StepReport)
	// Scrape reads one instance's metrics (default: GET <url>/metrics).
	Scrape func(ctx context.Context, url string) (Sample, error)
	// ShadowLag is how long after a step's window the canary's shadow
	// counts are read again (the shadow compares asynchronously, about a
	// second behind): default 2 s; negative: not at all.
	ShadowLag time.Duration
}

// State is the trial's state as the dashboard shows it.
type State struct {
	Share     int
	State     string // running, promoted, aborted
	Steps     []int
	Step      int
	Reason    string
	StartedAt time.Time
}

// GroupWindow is one group's figures over a step's window.
type GroupWindow struct {
	Instances      int      `json:"instances"`
	Requests       int64    `json:"requests"`
	Errors5xx      int64    `json:"errors_5xx"`
	ErrorRate      float64  `json:"error_rate"`
	Orders         int64    `json:"orders"` // POST /api/v1/orders answered
	P99ms          *float64 `json:"p99_ms"` // of POST /api/v1/orders; null without orders
	ShadowMatch    int64    `json:"shadow_match"`
	ShadowMismatch int64    `json:"shadow_mismatch"`
	ShadowDropped  int64    `json:"shadow_dropped"`
	ShadowSame     int64    `json:"shadow_same_script"`
	DeadLetters    int64    `json:"dead_letters"`
	ReconcileAlert int64    `json:"reconcile_alerts"`
	// Unreachable lists instances whose metrics could not be read;
	// Restarted those that restarted during the window (their counters
	// are read from zero).
	Unreachable []string `json:"unreachable,omitempty"`
	Restarted   []string `json:"restarted,omitempty"`
}

// StepReport is one step's measurements and verdict.
type StepReport struct {
	Share      int         `json:"share"`
	Started    time.Time   `json:"started_at"`
	Ended      time.Time   `json:"ended_at"`
	Canary     GroupWindow `json:"canary"`
	Stable     GroupWindow `json:"stable"`
	Violations []string    `json:"invariant_violations"`
	// Baseline says where the stable figures the canary was compared with
	// come from when not from this window (stable served too little in
	// it: at share 100 it serves no buyer).
	Baseline string   `json:"baseline,omitempty"`
	Passed   bool     `json:"passed"`
	Reasons  []string `json:"reasons,omitempty"`
}

// Report is a whole trial.
type Report struct {
	Outcome    string       `json:"outcome"` // promoted or aborted
	Reason     string       `json:"reason,omitempty"`
	FinalShare int          `json:"final_share"`
	Thresholds Thresholds   `json:"thresholds"`
	Steps      []StepReport `json:"steps"`
	Started    time.Time    `json:"started_at"`
	Ended      time.Time    `json:"ended_at"`
}

// Run runs the trial. It returns an error only when the trial could not be
// run or ended (the share could not be set, ctx ended): the share is then
// set to 0 if it can be, and the report says aborted. A failed step is not
// an error: the report's outcome is aborted.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Scrape == nil {
		cfg.Scrape = ScrapeHTTP
	}
	if cfg.ShadowLag == 0 {
		cfg.ShadowLag = 2 * time.Second
	}
	if len(cfg.Steps) == 0 || len(cfg.Canary) == 0 || len(cfg.Stable) == 0 {
		return Report{Outcome: "aborted", Reason: "a trial needs steps, canary and stable instances"}, errors.New("canary: a trial needs steps, canary and stable instances")
	}
	rep := Report{Thresholds: cfg.Thresholds, Started: time.Now().UTC()}
	state := State{Steps: cfg.Steps, StartedAt: rep.Started, State: "running"}
	record := func(ctx context.Context) {
		if cfg.State != nil {
			_ = cfg.State(ctx, state)
		}
	}
	abort := func(reason string, err error) (Report, error) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		rep.Outcome, rep.Reason, rep.Ended = "aborted", reason, time.Now().UTC()
		state.State, state.Reason, state.Share = "aborted", reason, 0
		if serr := cfg.SetShare(sctx, 0); serr != nil {
			rep.FinalShare = -1
			rep.Reason += fmt.Sprintf("; setting the share back to 0 failed: %v (set it by hand)", serr)
			state.Reason = rep.Reason
			if err == nil {
				err = serr
			}
		}
		record(sctx)
		return rep, err
	}
	// Mismatches the canary's shadow found before the trial (shadowing at
	// share 0, as docs/releasing.md suggests) are a verdict already.
	for u, smp := range scrapeAll(ctx, cfg.Scrape, cfg.Canary) {
		if smp.Err == nil && smp.ShadowMismatch > cfg.Thresholds.MaxShadowMismatches {
			return abort(fmt.Sprintf("before the trial: %s's shadow already counted %d decisions that differ from the live path's", u, smp.ShadowMismatch), nil)
		}
	}
	var baseline *GroupWindow // the last stable window with enough traffic
	for i, share := range cfg.Steps {
		state.Step, state.Share = i, share
		if err := cfg.SetShare(ctx, share); err != nil {
			return abort(fmt.Sprintf("setting the canary's share to %d%%: %v", share, err), err)
		}
		record(ctx)
		step, err := watch(ctx, cfg, share, baseline)
		if err != nil {
			return abort("the trial was stopped during the "+fmt.Sprint(share)+"% step", err)
		}
		if step.Stable.Requests >= cfg.Thresholds.MinRequests {
			b := step.Stable
			baseline = &b
		}
		rep.Steps = append(rep.Steps, step)
		if cfg.Progress != nil {
			cfg.Progress(step)
		}
		if !step.Passed {
			return abort(fmt.Sprintf("step %d%%: %s", share, strings.Join(step.Reasons, "; ")), nil)
		}
	}
	rep.Outcome, rep.Ended = "promoted", time.Now().UTC()
	if len(cfg.Steps) > 0 {
		rep.FinalShare = cfg.Steps[len(cfg.Steps)-1]
	}
	state.State = "promoted"
	record(ctx)
	return rep, nil
}

// watch measures one step: both groups' metrics at its start and end, the
// invariant check at its end, and the verdict.
func watch(ctx context.Context, cfg Config, share int, baseline *GroupWindow) (StepReport, error) {
	st := StepReport{Share: share, Started: time.Now().UTC()}
	c0, s0 := scrapeAll(ctx, cfg.Scrape, cfg.Canary), scrapeAll(ctx, cfg.Scrape, cfg.Stable)
	if err := sleep(ctx, cfg.StepDuration); err != nil {
		return st, err
	}
	c1, s1 := scrapeAll(ctx, cfg.Scrape, cfg.Canary), scrapeAll(ctx, cfg.Scrape, cfg.Stable)
	st.Ended = time.Now().UTC()
	if cfg.ShadowLag > 0 {
		// The shadow compares the window's last decisions a moment later.
		if err := sleep(ctx, cfg.ShadowLag); err != nil {
			return st, err
		}
		for u, late := range scrapeAll(ctx, cfg.Scrape, cfg.Canary) {
			if cur := c1[u]; late.Err == nil && cur.Err == nil && late.StartTime == cur.StartTime {
				cur.ShadowMatch, cur.ShadowMismatch, cur.ShadowDropped, cur.ShadowSame = late.ShadowMatch, late.ShadowMismatch, late.ShadowDropped, late.ShadowSame
				c1[u] = cur
			}
		}
	}
	st.Canary, st.Stable = window(c0, c1), window(s0, s1)
	if cfg.Check != nil {
		v, err := cfg.Check(ctx)
		if err != nil {
			v = append(v, "the invariant check could not run: "+err.Error())
		}
		st.Violations = v
	}
	if st.Violations == nil {
		st.Violations = []string{}
	}
	// The baseline: stable in this window, or, when stable served too
	// little in it (at share 100 it serves no buyer), its last window
	// that had traffic.
	base := &st.Stable
	if st.Stable.Requests < cfg.Thresholds.MinRequests {
		base = baseline
		if baseline != nil {
			st.Baseline = fmt.Sprintf("stable served %d buyer requests in this step: compared with its last step with traffic (%d requests)", st.Stable.Requests, baseline.Requests)
		} else {
			st.Baseline = fmt.Sprintf("stable served %d buyer requests and no earlier step had traffic: errors and latency not compared", st.Stable.Requests)
		}
	}
	st.Reasons = judge(cfg.Thresholds, st, base)
	st.Passed = len(st.Reasons) == 0
	return st, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// judge lists what fails a step; base is stable's figures to compare the
// canary's errors and latency with (nil: none).
func judge(th Thresholds, st StepReport, base *GroupWindow) []string {
	var why []string
	c, s := st.Canary, st.Stable
	if len(c.Unreachable) > 0 {
		why = append(why, "canary instances unreachable: "+strings.Join(c.Unreachable, ", "))
	}
	if len(c.Restarted) > 0 {
		why = append(why, "canary instances restarted during the step: "+strings.Join(c.Restarted, ", "))
	}
	if c.Requests < th.MinRequests {
		why = append(why, fmt.Sprintf("the canary served %d buyer requests, fewer than %d: too little traffic to judge", c.Requests, th.MinRequests))
	}
	if base != nil && c.ErrorRate > base.ErrorRate+th.MaxErrorRateDelta {
		why = append(why, fmt.Sprintf("5xx rate %.2f%% on the canary against %.2f%% on stable", 100*c.ErrorRate, 100*base.ErrorRate))
	}
	floor := float64(th.P99Floor) / float64(time.Millisecond)
	if base != nil && c.P99ms != nil && *c.P99ms > floor {
		if base.P99ms == nil || *c.P99ms > th.MaxP99Ratio**base.P99ms {
			sp := "no orders"
			if base.P99ms != nil {
				sp = fmt.Sprintf("%.1f ms", *base.P99ms)
			}
			why = append(why, fmt.Sprintf("p99 of orders %.1f ms on the canary against %s on stable", *c.P99ms, sp))
		}
	}
	if c.ShadowMismatch > th.MaxShadowMismatches {
		why = append(why, fmt.Sprintf("%d shadow decisions differ from the live path's", c.ShadowMismatch))
	}
	if n := c.DeadLetters + s.DeadLetters; n > th.MaxDeadLetters {
		why = append(why, fmt.Sprintf("%d reservations dead-lettered during the step (%d by canary consumers, %d by stable ones)", n, c.DeadLetters, s.DeadLetters))
	}
	if n := c.ReconcileAlert + s.ReconcileAlert; n > 0 {
		why = append(why, fmt.Sprintf("%d reconcile alerts (Redis and the database disagree beyond the threshold)", n))
	}
	if len(st.Violations) > 0 {
		why = append(why, "invariants violated: "+strings.Join(st.Violations, "; "))
	}
	return why
}

// scrapeAll reads every instance; an unreachable one is named in the
// sample's Err.
func scrapeAll(ctx context.Context, scrape func(context.Context, string) (Sample, error), urls []string) map[string]Sample {
	out := make(map[string]Sample, len(urls))
	for _, u := range urls {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := scrape(sctx, u)
		cancel()
		if err != nil {
			s = Sample{Err: err}
		}
		out[u] = s
	}
	return out
}

// window sums a group's differences between two readings. An instance that
// restarted in between (a counter went down) counts from zero.
func window(from, to map[string]Sample) GroupWindow {
	var w GroupWindow
	var buckets []Bucket
	keys := make([]string, 0, len(to))
	for u := range to {
		keys = append(keys, u)
	}
	slices.Sort(keys)
	for _, u := range keys {
		b, a := to[u], from[u]
		if b.Err != nil || a.Err != nil {
			w.Unreachable = append(w.Unreachable, u)
			continue
		}
		w.Instances++
		if b.StartTime != a.StartTime || b.Requests < a.Requests || b.Orders < a.Orders {
			// Restarted within the window: its counters began again.
			w.Restarted = append(w.Restarted, u)
			a = Sample{}
		}
		d := func(now, then int64) int64 { return max(now-then, 0) }
		w.Requests += d(b.Requests, a.Requests)
		w.Errors5xx += d(b.Errors5xx, a.Errors5xx)
		w.Orders += d(b.Orders, a.Orders)
		w.ShadowMatch += d(b.ShadowMatch, a.ShadowMatch)
		w.ShadowMismatch += d(b.ShadowMismatch, a.ShadowMismatch)
		w.ShadowDropped += d(b.ShadowDropped, a.ShadowDropped)
		w.ShadowSame += d(b.ShadowSame, a.ShadowSame)
		w.DeadLetters += d(b.DeadLetters, a.DeadLetters)
		w.ReconcileAlert += d(b.ReconcileAlerts, a.ReconcileAlerts)
		buckets = addBuckets(buckets, subBuckets(b.OrderBuckets, a.OrderBuckets))
	}
	if w.Requests > 0 {
		w.ErrorRate = float64(w.Errors5xx) / float64(w.Requests)
	}
	if p, ok := quantile(buckets, 0.99); ok {
		w.P99ms = &p
	}
	return w
}

// ShareSetter returns a SetShare that writes the share to HAProxy's map
// mapPath through the runtime API at addr (a unix socket path, or
// host:port for a TCP stats socket): no reload, buyers stay where they are
// unless the share moves past their place.
func ShareSetter(addr, mapPath string) func(ctx context.Context, percent int) error {
	return func(ctx context.Context, percent int) error {
		if percent < 0 || percent > 100 {
			return fmt.Errorf("share %d is not 0..100", percent)
		}
		return RuntimeCommand(ctx, addr, fmt.Sprintf("set map %s share %d", mapPath, percent))
	}
}

// RuntimeCommand sends one command to HAProxy's runtime API and fails on an
// answer that is not empty (a successful "set" answers nothing).
func RuntimeCommand(ctx context.Context, addr, cmd string) error {
	network := "unix"
	if _, _, err := net.SplitHostPort(addr); err == nil && !strings.Contains(addr, "/") {
		network = "tcp"
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("haproxy runtime API at %s: %w", addr, err)
	}
	defer c.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	_ = c.SetDeadline(deadline)
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return fmt.Errorf("haproxy runtime API at %s: %w", addr, err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("haproxy runtime API at %s: %w", addr, err)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		return fmt.Errorf("haproxy refused %q: %s", cmd, s)
	}
	return nil
}

// WriteText prints rep for a person.
func WriteText(w io.Writer, rep Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "canary trial %s", strings.ToUpper(rep.Outcome))
	if rep.Reason != "" {
		fmt.Fprintf(&b, ": %s", rep.Reason)
	}
	fmt.Fprintf(&b, "\nfinal share %d%%, %s from %s to %s\n\n", rep.FinalShare, rep.Ended.Sub(rep.Started).Round(time.Second),
		rep.Started.Format(time.RFC3339), rep.Ended.Format(time.RFC3339))
	fmt.Fprintf(&b, "%-6s %-7s %5s %9s %7s %9s %9s %8s %6s %7s  %s\n", "share", "group", "inst", "requests", "5xx %", "p99 ms", "mismatch", "dropped", "dlq", "alerts", "verdict")
	for _, s := range rep.Steps {
		verdict := "pass"
		if !s.Passed {
			verdict = "FAIL: " + strings.Join(s.Reasons, "; ")
		}
		for _, g := range []struct {
			name string
			w    GroupWindow
		}{{"canary", s.Canary}, {"stable", s.Stable}} {
			p99 := "-"
			if g.w.P99ms != nil {
				p99 = fmt.Sprintf("%.1f", *g.w.P99ms)
			}
			v := ""
			if g.name == "canary" {
				v = verdict
			}
			fmt.Fprintf(&b, "%-6s %-7s %5d %9d %7.2f %9s %9d %8d %6d %7d  %s\n", fmt.Sprintf("%d%%", s.Share), g.name, g.w.Instances, g.w.Requests,
				100*g.w.ErrorRate, p99, g.w.ShadowMismatch, g.w.ShadowDropped, g.w.DeadLetters, g.w.ReconcileAlert, v)
		}
		if s.Baseline != "" {
			fmt.Fprintf(&b, "       baseline: %s\n", s.Baseline)
		}
		if len(s.Violations) > 0 {
			fmt.Fprintf(&b, "       invariants: %s\n", strings.Join(s.Violations, "; "))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints rep as JSON.
func WriteJSON(w io.Writer, rep Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

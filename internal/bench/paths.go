package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/loadgen"
)

// PathScenario is the -paths value that measures -scenario as a whole.
const PathScenario = "scenario"

// pathList returns the paths of -paths (none for "scenario").
func (o *Options) pathList() []string {
	if strings.TrimSpace(o.Paths) == PathScenario {
		return nil
	}
	var out []string
	for _, p := range strings.Split(o.Paths, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// measurePaths measures each path of b.paths on its own sale of the same
// server: set up (the sold-out sale is sold out first), wait until nothing
// is in flight, run, read the apply backlog at the load's end and until it
// is zero, drain and check I1-I7. One result per path.
func (b *bench) measurePaths(ctx context.Context, name string, cl *loadgen.Client, chk loadgen.Checker, rc rueidis.Client) ([]*loadgen.StrategyResult, string, error) {
	var (
		out   []*loadgen.StrategyResult
		notes []string
		all   = map[string][]string{} // every path's accepted orders so far
	)
	for _, path := range b.paths {
		stock := b.o.Stock
		if path == loadgen.Purchase {
			stock = b.o.PurchaseStock
		}
		sc, err := loadgen.NewScenario(loadgen.ScenarioConfig{Name: path, Stock: stock, PerUserLimit: b.o.Limit, RunID: randomHex(4)})
		if err != nil {
			return nil, "", err
		}
		if err := sc.Setup(ctx, cl); err != nil {
			return nil, "", fmt.Errorf("%s: setting the sale up: %w", path, err)
		}
		if err := chk.CheckStores(ctx, rc, sc.SKUs()); err != nil {
			return nil, "", err
		}
		// The run starts on an idle server: the sell-out's orders and the
		// previous path's are in the database, the consumer has no work.
		maps.Copy(all, sc.Accepted())
		if _, ok, err := chk.Drain(ctx, all); err != nil || !ok {
			return nil, "", fmt.Errorf("%s: the server did not become idle before the run (drained %v, %v)", path, ok, err)
		}
		label := name + " " + path
		emptyRPS, emptyP99 := b.emptyRPS, b.emptyP99Ms
		if b.o.EmptyEach && b.o.Baselines {
			e, _, err := b.runEmpty(ctx, "empty, "+path)
			if err != nil {
				return nil, "", fmt.Errorf("%s: empty handler: %w", path, err)
			}
			emptyRPS, emptyP99 = round1(e.Throughput()), round3(e.Percentile(99))
		}
		stopProfile, err := b.profile(name + "-" + path)
		if err != nil {
			return nil, "", err
		}
		stopBacklog := func() []loadgen.BacklogPoint { return nil }
		if chk.Gate != nil {
			stopBacklog = loadgen.SampleBacklog(ctx, rc, chk.Gate, sc.SKUs(), 100*time.Millisecond)
		}
		run, err := loadgen.Run(ctx, b.genConfig(label), sc.Op(cl))
		backlog := stopBacklog()
		var drain loadgen.DrainFigures
		if err == nil && chk.Gate != nil {
			drain, err = loadgen.WaitBacklogZero(ctx, rc, chk.Gate, sc.SKUs(), b.o.DrainTimeout)
		}
		stopProfile()
		if err != nil {
			return nil, "", err
		}
		b.status("%-16s draining and checking I1-I7...", label)
		v, err := chk.Check(ctx, sc.Accepted())
		if err != nil {
			return nil, "", fmt.Errorf("%s: checking: %w", path, err)
		}
		if err := chk.CheckI7(ctx, cl, sc, b.o.I7Units, v); err != nil {
			return nil, "", fmt.Errorf("%s: checking I7: %w", path, err)
		}
		maps.Copy(all, sc.Accepted())
		var accepted int64
		for _, ids := range sc.Accepted() {
			accepted += int64(len(ids))
		}
		res := loadgen.NewStrategyResult(name, run, v, accepted)
		res.Backlog = backlog
		res.SetPath(path, sc.PathCode(), emptyRPS, emptyP99)
		if chk.Gate != nil {
			res.SetDrain(drain, b.o.Warmup, b.o.Duration)
		}
		if res.Sold > res.Accepted {
			// A 503 promises the purchase does not exist or could not be
			// checked; the buyer retries with the same key to learn which.
			notes = append(notes, fmt.Sprintf("%s %s: the database sold %d units more than the buyers saw accepted (answers: %s): purchases answered without a 202 that were applied",
				name, path, res.Sold-res.Accepted, codeSummary(run.Codes, res.Path.Code)))
		}
		if res.Path.Other > 0 {
			notes = append(notes, fmt.Sprintf("%s %s: %d answers were not %s (%s): not counted in its figure", name, path, res.Path.Other,
				res.Path.Code, codeSummary(run.Codes, res.Path.Code)))
		}
		verdict := "invariants hold"
		if !res.InvariantsOK {
			verdict = fmt.Sprintf("VIOLATED: %s", strings.Join(v.Violations, "; "))
		}
		b.status("%-16s %.0f %s/s (%s x empty), p99 %.1f ms, backlog %d at the end, zero after %.2fs, %s", label, res.Path.RPS, res.Path.Code,
			fmtRatio(res.Path.XEmpty), res.P99Ms, res.Path.BacklogAtEnd, res.Path.DrainToZeroS, verdict)
		out = append(out, res)
	}
	return out, strings.Join(notes, "; "), nil
}

// codeSummary lists the answers other than code.
func codeSummary(codes map[string]int64, code string) string {
	var parts []string
	for k, n := range codes {
		if k != code {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	return strings.Join(parts, ", ")
}

func fmtRatio(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

// memoryTest holds -connections keep-alive connections to the target and
// reports its memory; no load runs, no purchases (nothing to check).
func (b *bench) memoryTest(ctx context.Context, rep *loadgen.Report, stdout io.Writer) error {
	if b.serverPID == 0 {
		return fmt.Errorf("bench: -connections: the target's process is unknown (give -target-pid)")
	}
	b.status("%-16s opening %d keep-alive connections to %s (process %d)...", "memory", b.o.Connections, b.o.Target, b.serverPID)
	cfg := loadgen.HoldConfig{Base: b.o.Target, Conns: b.o.Connections, Hold: b.o.ConnHold, Every: b.o.ConnEvery, ServerPID: b.serverPID, Sources: b.o.Sources}
	if !b.o.Quiet && loadgen.IsTerminal(b.stderr) {
		cfg.Progress = func(opened, failed int64, holding bool) {
			state := "opening"
			if holding {
				state = "holding"
			}
			fmt.Fprintf(b.stderr, "\r%-16s %s: %d open, %d failed%-20s", "memory", state, opened, failed, "")
		}
	}
	m, err := loadgen.HoldConnections(ctx, cfg)
	if !b.o.Quiet {
		fmt.Fprintln(b.stderr)
	}
	if err != nil {
		return fmt.Errorf("bench: -connections: %w", err)
	}
	rep.Memory = m
	rep.Setup.Scenario, rep.Setup.Paths, rep.Setup.PurchaseStock = "connections", nil, 0
	rep.WriteTable(stdout)
	if b.o.JSONOut != "" {
		if err := rep.WriteJSON(b.o.JSONOut); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		fmt.Fprintf(stdout, "JSON report: %s\n", b.o.JSONOut)
	}
	if b.o.HTMLOut != "" {
		if err := rep.WriteHTML(b.o.HTMLOut, nil); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		fmt.Fprintf(stdout, "HTML report: %s\n", b.o.HTMLOut)
	}
	if m.Opened < int64(m.Connections) || m.Held < m.Opened {
		return fmt.Errorf("bench: -connections: %d of %d connections opened, %d held to the end", m.Opened, m.Connections, m.Held)
	}
	return nil
}

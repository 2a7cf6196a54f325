package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/flashsale/flashsale/internal/capacity"
)

// Measured on the 2-core development machine (docs/scaling.md says how):
// the defaults of `flashsale plan`.
const (
	measuredHandlerUS = 120 // a flashsale instance's CPU per purchase request
	measuredRedisUS   = 21  // the Redis primary's CPU per reserve.lua call (INFO cpu / calls)
	measuredNATSUS    = 26  // JetStream per message, BenchmarkPublish
	measuredDBUS      = 250 // PostgreSQL per order in a batch of 500, BenchmarkApplyBatch on a loaded machine (MariaDB: 111; both 40-65 quiet, docs/scaling.md)
)

// planBenchReport is the part of `flashsale bench -json` that plan reads.
type planBenchReport struct {
	Setup struct {
		Machine struct {
			CPUs int `json:"cpus"`
		} `json:"machine"`
	} `json:"setup"`
	Baselines struct {
		RedisGateRPS float64 `json:"redis_gate_rps"`
	} `json:"baselines"`
	Results []struct {
		Strategy      string  `json:"strategy"`
		ThroughputRPS float64 `json:"throughput_rps"`
	} `json:"results"`
}

// costsFromBench derives costs from a bench report: the handler's from the
// pipeline's throughput on the machine's cores (everything on the same
// cores: an upper bound), Redis' from the gate baseline (client and server
// on the same cores: an upper bound too). Costs the report lacks are left 0.
func costsFromBench(r planBenchReport) (capacity.Costs, error) {
	var c capacity.Costs
	if r.Baselines.RedisGateRPS > 0 {
		c.RedisUS = 1e6 / r.Baselines.RedisGateRPS
	}
	for _, res := range r.Results {
		if res.Strategy == "pipeline" && res.ThroughputRPS > 0 && r.Setup.Machine.CPUs > 0 {
			c.HandlerUS = float64(r.Setup.Machine.CPUs) * 1e6 / res.ThroughputRPS
		}
	}
	if c.RedisUS == 0 && c.HandlerUS == 0 {
		return c, errors.New("the report has neither baselines.redis_gate_rps nor a pipeline result with setup.machine.cpus")
	}
	return c, nil
}

func runPlan(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { commandUsage(fs, "plan") }
	var (
		l     capacity.Load
		c     capacity.Costs
		s     capacity.Sizing
		bench string
	)
	fs.Float64Var(&l.Rate, "rate", 1_010_000, "purchase attempts per second, every SKU")
	fs.Float64Var(&l.HotShare, "hot-share", 0.99, "share of the attempts on the one hot SKU (0..1)")
	fs.IntVar(&l.SKUs, "skus", 10_000, "other (normal) SKUs; their attempts are counted as sales")
	fs.Int64Var(&l.HotStock, "stock", 100_000, "units of the hot SKU")
	fs.Float64Var(&c.HandlerUS, "handler-us", measuredHandlerUS, "flashsale CPU µs per request")
	fs.Float64Var(&c.RedisUS, "redis-us", measuredRedisUS, "Redis primary CPU µs per reserve")
	fs.Float64Var(&c.NATSUS, "nats-us", measuredNATSUS, "JetStream µs per message")
	fs.Float64Var(&c.DBUS, "db-us", measuredDBUS, "database µs per order applied in a batch")
	fs.IntVar(&s.InstanceCores, "instance-cores", 2, "cores of one flashsale instance")
	fs.Float64Var(&s.Headroom, "headroom", 0.5, "target utilisation of every part, (0, 1]")
	fs.IntVar(&s.NATSReplicas, "nats-replicas", 3, "replicas of the streams (FLASHSALE_NATS_REPLICAS)")
	fs.IntVar(&s.Batch, "batch", 1000, "apply batch (FLASHSALE_APPLY_BATCH)")
	fs.StringVar(&bench, "from-bench", "", "take the handler and Redis costs from a `report.json` of flashsale bench -json (flags given explicitly win)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return noArguments(fs)
	}
	source := "measured defaults (docs/scaling.md)"
	if bench != "" {
		b, err := os.ReadFile(bench)
		if err != nil {
			return fmt.Errorf("plan: -from-bench: %w", err)
		}
		var r planBenchReport
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("plan: -from-bench %s: not a bench report: %w", bench, err)
		}
		bc, err := costsFromBench(r)
		if err != nil {
			return fmt.Errorf("plan: -from-bench %s: %w", bench, err)
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if bc.HandlerUS > 0 && !set["handler-us"] {
			c.HandlerUS = bc.HandlerUS
		}
		if bc.RedisUS > 0 && !set["redis-us"] {
			c.RedisUS = bc.RedisUS
		}
		source = "handler and Redis from " + bench + " (machine-wide per request: upper bounds), the rest measured defaults"
	}
	p, err := capacity.Make(l, c, s)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	fmt.Fprintln(stdout, "costs:", source)
	for _, line := range p.Lines(l, c, s) {
		fmt.Fprintln(stdout, line)
	}
	return nil
}

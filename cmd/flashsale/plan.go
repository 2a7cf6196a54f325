package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/flashsale/flashsale/internal/capacity"
)

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
	fs.Float64Var(&c.HandlerUS, "handler-us", capacity.Measured.HandlerUS, "flashsale CPU µs per request")
	fs.Float64Var(&c.RedisUS, "redis-us", capacity.Measured.RedisUS, "Redis primary CPU µs per reserve")
	fs.Float64Var(&c.NATSUS, "nats-us", capacity.Measured.NATSUS, "JetStream µs per message")
	fs.Float64Var(&c.DBUS, "db-us", capacity.Measured.DBUS, "database µs per order applied in a batch")
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
		bc, err := capacity.CostsFromBench(b)
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

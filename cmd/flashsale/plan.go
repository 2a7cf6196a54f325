package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/capacity"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
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
		fc    forecastFlags
		cc    clusterFlags
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
	fs.BoolVar(&fc.on, "forecast", false, "forecast the hot SKU's peak from the sale history (sale_history) and size for its P90 instead of -rate")
	fs.StringVar(&fc.sku, "sku", "", "with -forecast: the upcoming sale's SKU (named in the output)")
	fs.StringVar(&fc.like, "like", "", "with -forecast: only the recorded sales of this `SKU` are similar (default: sales whose stock is within 4x of -stock)")
	fs.StringVar(&fc.tag, "tag", "", "with -forecast: only the recorded sales with this SKU `tag` are similar (PUT /admin/v1/skus \"tag\")")
	fs.Int64Var(&fc.joins, "joins", 0, "with -forecast: buyers already in the upcoming sale's waiting room (scales the peak by joins when the history has them)")
	fs.StringVar(&fc.dbURL, "database-url", orDefault(getenv("FLASHSALE_DATABASE_URL"), defaultDatabaseURL), "with -forecast: the database `URL` holding sale_history ($FLASHSALE_DATABASE_URL)")
	fs.BoolVar(&cc.on, "check-cluster", false, "check that -sku's stock buckets sit on different Redis Cluster primaries (as evenly as the primaries allow), then exit; non-zero exit when they do not")
	fs.IntVar(&cc.buckets, "buckets", 0, "with -check-cluster: the sale's stock buckets (0: read from the gate in Redis)")
	fs.StringVar(&cc.redisURL, "redis-url", orDefault(getenv("FLASHSALE_REDIS_URL"), "redis://127.0.0.1:6379/0"), "with -check-cluster: the Redis `URL` (redis://n1?addr=n2&addr=n3 for a cluster) ($FLASHSALE_REDIS_URL)")
	fs.StringVar(&cc.prefix, "redis-prefix", orDefault(getenv("FLASHSALE_REDIS_PREFIX"), "fs"), "with -check-cluster: the gate's key prefix ($FLASHSALE_REDIS_PREFIX)")
	fs.BoolVar(&cc.reshard, "reshard", false, "print the exact redis-cli commands that move -sku's stock buckets' slots so that they sit on different primaries, then exit; refused inside the sale's window (see -reshard-margin)")
	fs.DurationVar(&cc.margin, "reshard-margin", 30*time.Minute, "with -reshard: how long before the sale's opening a reshard is still planned")
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
	if cc.on && cc.reshard {
		return fmt.Errorf("plan: give -check-cluster or -reshard, not both")
	}
	if cc.on {
		return checkCluster(ctx, cc, fc.sku, stdout)
	}
	if cc.reshard {
		return reshardPlan(ctx, cc, fc.sku, time.Now(), stdout)
	}
	if fc.on {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if set["rate"] {
			return fmt.Errorf("plan: -forecast sizes from the forecast's P90: give -rate or -forecast, not both")
		}
		f, u, err := forecast(ctx, fc, l.HotStock)
		if err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		for _, line := range f.Lines(u) {
			fmt.Fprintln(stdout, line)
		}
		if !(l.HotShare > 0) {
			return fmt.Errorf("plan: -forecast needs -hot-share above 0")
		}
		// The forecast is the hot SKU's attempts: the other SKUs keep
		// their share of the total.
		l.Rate = f.P90 / l.HotShare
		fmt.Fprintf(stdout, "sizing for the P90: %.0f attempts/s on %s (hot share %.2f)\n\n", f.P90, orDefault(fc.sku, "the hot SKU"), l.HotShare)
	} else if fc.sku != "" || fc.like != "" || fc.tag != "" || fc.joins != 0 {
		return fmt.Errorf("plan: -sku, -like, -tag and -joins go with -forecast")
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

// forecastFlags are plan's -forecast settings.
type forecastFlags struct {
	on                    bool
	sku, like, tag, dbURL string
	joins                 int64
}

// historyLimit bounds the sales a forecast reads: the newest.
const historyLimit = 1000

// forecast reads the sale history from the database and predicts the
// upcoming sale's peak (capacity.Predict).
func forecast(ctx context.Context, fc forecastFlags, stock int64) (capacity.Forecast, capacity.Upcoming, error) {
	u := capacity.Upcoming{Stock: stock, Like: fc.like, Tag: fc.tag, Joins: fc.joins}
	switch {
	case fc.sku != "" && !sale.ValidSKU(fc.sku):
		return capacity.Forecast{}, u, fmt.Errorf("-sku %q is not a SKU id", fc.sku)
	case fc.like != "" && !sale.ValidSKU(fc.like):
		return capacity.Forecast{}, u, fmt.Errorf("-like %q is not a SKU id", fc.like)
	case fc.like != "" && fc.tag != "":
		return capacity.Forecast{}, u, fmt.Errorf("give -like or -tag, not both")
	case !sale.ValidTag(fc.tag):
		return capacity.Forecast{}, u, fmt.Errorf("-tag %q is not a tag (1-64 of A-Z a-z 0-9 _ -)", fc.tag)
	case fc.joins < 0:
		return capacity.Forecast{}, u, fmt.Errorf("-joins must be 0 or more")
	}
	if err := checkDatabaseURL(fc.dbURL); err != nil {
		return capacity.Forecast{}, u, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := orderstore.Open(ctx, fc.dbURL, orderstore.Options{MaxConns: 2})
	if err != nil {
		return capacity.Forecast{}, u, err
	}
	defer st.Close()
	rows, err := st.SaleRecords(ctx, "", historyLimit)
	if err != nil {
		return capacity.Forecast{}, u, fmt.Errorf("%w (is the database migrated? flashsale migrate)", err)
	}
	past := make([]capacity.PastSale, len(rows))
	for i, r := range rows {
		past[i] = capacity.PastSale{SKU: r.SKU, Tag: r.Tag, StartsAt: r.StartsAt, Stock: r.Stock, PeakAttempts: r.PeakAttempts}
		if r.QueueJoins != nil {
			past[i].QueueJoins = *r.QueueJoins
		}
	}
	f, err := capacity.Predict(past, u)
	return f, u, err
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// clusterFlags are plan's -check-cluster settings.
type clusterFlags struct {
	on               bool
	buckets          int
	redisURL, prefix string
	reshard          bool
	margin           time.Duration
}

// check validates sku (missing: the error says needs) and -buckets.
func (cc clusterFlags) check(sku, needs string) error {
	if !sale.ValidSKU(sku) {
		return fmt.Errorf("plan: %s", needs)
	}
	if cc.buckets < 0 || cc.buckets > sale.MaxBuckets {
		return fmt.Errorf("plan: -buckets must be 0..%d", sale.MaxBuckets)
	}
	return nil
}

// layout returns sku's bucket count (-buckets, or read from the gate) and
// the cluster's slot map; errors name flag.
func (cc clusterFlags) layout(ctx context.Context, c rueidis.Client, sku, flag string) (int, []stockgate.SlotRange, error) {
	k := cc.buckets
	if k == 0 {
		var err error
		if k, err = stockgate.New(c, cc.prefix).Buckets(ctx, sku); err != nil {
			return 0, nil, fmt.Errorf("plan: %s: the buckets of %s: %w (or give -buckets)", flag, sku, err)
		}
	}
	slots, err := stockgate.ClusterSlots(ctx, c)
	if err != nil {
		return 0, nil, fmt.Errorf("plan: %s: %w (is %s a Redis Cluster?)", flag, err, hidePassword(cc.redisURL))
	}
	return k, slots, nil
}

// checkCluster prints where sku's stock buckets sit on the Redis Cluster
// and fails unless they are on different primaries (as evenly as the
// primaries allow when the buckets are more).
func checkCluster(ctx context.Context, cc clusterFlags, sku string, stdout io.Writer) error {
	if err := cc.check(sku, "-check-cluster needs -sku, the sale to check"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := stockgate.Dial(cc.redisURL)
	if err != nil {
		return fmt.Errorf("plan: -check-cluster: %w", err)
	}
	defer c.Close()
	k, slots, err := cc.layout(ctx, c, sku, "-check-cluster")
	if err != nil {
		return err
	}
	pc := stockgate.CheckPlacement(slots, sku, k)
	fmt.Fprintf(stdout, "cluster: %s; %s of %s, at most %d on each\n", count(pc.Primaries, "primary", "primaries"),
		count(k, "stock bucket", "stock buckets"), sku, pc.Allowed)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tSLOT\tPRIMARY")
	for _, p := range pc.Placements {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", p.Bucket, p.Slot, orDefault(p.Primary, "(no primary)"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if pc.OK() {
		fmt.Fprintln(stdout, "ok: the buckets sit on different primaries")
		return nil
	}
	primaries := slices.Sorted(maps.Keys(pc.Crowded))
	var parts []string
	for _, p := range primaries {
		parts = append(parts, fmt.Sprintf("%s holds %s", orDefault(p, "no primary"), strings.Join(pc.Crowded[p], ", ")))
	}
	return fmt.Errorf("plan: -check-cluster: the buckets of %s are not spread: %s (move their slots: docs/scaling.md)", sku, strings.Join(parts, "; "))
}

func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// reshardPlan prints the slot moves, as redis-cli commands, that put sku's
// stock buckets on different primaries (stockgate.PlanMoves). It refuses
// while the sale is open or opens within cc.margin: a slot being moved
// answers the sale's scripts TRYAGAIN, each a buyer's retry.
func reshardPlan(ctx context.Context, cc clusterFlags, sku string, now time.Time, stdout io.Writer) error {
	if err := cc.check(sku, "-reshard needs -sku, the sale to spread"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := stockgate.Dial(cc.redisURL)
	if err != nil {
		return fmt.Errorf("plan: -reshard: %w", err)
	}
	defer c.Close()
	g := stockgate.New(c, cc.prefix)
	// The sale's window as the gate holds it (absent: not loaded here).
	w, err := c.Do(ctx, c.B().Hmget().Key(g.KeysOf(sku).Meta).Field("starts", "ends", "epoch").Build()).ToArray()
	if err != nil {
		return fmt.Errorf("plan: -reshard: the window of %s: %w", sku, err)
	}
	if _, lerr := w[2].ToString(); lerr == nil {
		starts, _ := w[0].AsInt64()
		ends, _ := w[1].AsInt64()
		opens, closes := time.UnixMilli(starts), time.UnixMilli(ends)
		if now.After(opens.Add(-cc.margin)) && (ends == 0 || now.Before(closes)) {
			when := "is open"
			if starts > 0 && now.Before(opens) {
				when = fmt.Sprintf("opens at %s, within -reshard-margin %s", opens.UTC().Format(time.RFC3339), cc.margin)
			}
			return fmt.Errorf("plan: -reshard: the sale %s %s: move its slots before (or after) its window, not in it", sku, when)
		}
	}
	k, slots, err := cc.layout(ctx, c, sku, "-reshard")
	if err != nil {
		return err
	}
	moves, err := stockgate.PlanMoves(slots, sku, k)
	if err != nil {
		return fmt.Errorf("plan: -reshard: %w", err)
	}
	if len(moves) == 0 {
		fmt.Fprintf(stdout, "ok: the %s of %s already sit on different primaries: nothing to move\n", count(k, "stock bucket", "stock buckets"), sku)
		return nil
	}
	primaries := stockgate.Primaries(slots)
	fmt.Fprintf(stdout, "# reshard plan for %s (%s over %s): %s\n", sku, count(k, "stock bucket", "stock buckets"),
		count(len(primaries), "primary", "primaries"), count(len(moves), "slot move", "slot moves"))
	fmt.Fprintln(stdout, "# with a password: export REDISCLI_AUTH=... and add AUTH <password> to MIGRATE")
	fmt.Fprintln(stdout, "set -e")
	for _, m := range moves {
		fmt.Fprintf(stdout, "\n# slot %d (%s): %s -> %s\n", m.Slot, strings.Join(m.Buckets, ", "), m.From, m.To)
		for _, line := range m.Commands(primaries) {
			fmt.Fprintln(stdout, line)
		}
	}
	fmt.Fprintf(stdout, "\n# then: flashsale plan -check-cluster -sku %s\n", sku)
	return nil
}

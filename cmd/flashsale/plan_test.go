package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

func runPlanArgs(args ...string) (string, string, error) {
	var out, errb bytes.Buffer
	err := run(context.Background(), append([]string{"plan"}, args...), func(string) string { return "" }, &out, &errb)
	return out.String(), errb.String(), err
}

func TestPlanCommand(t *testing.T) {
	t.Parallel()
	out, _, err := runPlanArgs()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"stock buckets", "primaries", "instances", "nats: 3 nodes", "appliers", "database:"} {
		if !strings.Contains(out, want) {
			t.Errorf("default plan lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runPlanArgs("-rate", "100000", "-hot-share", "0.5", "-redis-us", "10", "-headroom", "1")
	if err != nil {
		t.Fatal(err)
	}
	// 50,000 reserves/s x 10 µs = 0.5 threads at 100%: 1 bucket.
	if !strings.Contains(out, "-> 1 stock bucket (") {
		t.Errorf("plan from flags:\n%s", out)
	}

	dir := t.TempDir()
	report := filepath.Join(dir, "report.json")
	if err := os.WriteFile(report, []byte(`{"setup":{"machine":{"cpus":2}},"baselines":{"redis_gate_rps":50000},"results":[{"strategy":"pipeline","throughput_rps":10000}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err = runPlanArgs("-from-bench", report)
	if err != nil {
		t.Fatal(err)
	}
	// 2 cores / 10,000 per s = 200 µs; 1 / 50,000 = 20 µs.
	if !strings.Contains(out, "handler 200.0 µs/request, Redis 20.0 µs/reserve") {
		t.Errorf("costs from the bench report:\n%s", out)
	}
	out, _, err = runPlanArgs("-from-bench", report, "-redis-us", "5")
	if err != nil || !strings.Contains(out, "Redis 5.0 µs/reserve") {
		t.Errorf("an explicit -redis-us must win over the report: %v\n%s", err, out)
	}
}

func TestPlanBadFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.json")
	empty := filepath.Join(dir, "empty.json")
	_ = os.WriteFile(garbage, []byte("not json"), 0o644)
	_ = os.WriteFile(empty, []byte(`{"results":[]}`), 0o644)
	for _, tc := range []struct {
		args []string
		want string // in the error or on stderr
	}{
		{[]string{"-rate", "0"}, "rate must be above 0"},
		{[]string{"-rate", "abc"}, `-rate: "abc" is not a number`},
		{[]string{"-hot-share", "2"}, "hot-share must be in 0..1"},
		{[]string{"-headroom", "0"}, "headroom must be in (0, 1]"},
		{[]string{"-db-us", "0"}, "must be above 0"},
		{[]string{"-nats-replicas", "9"}, "nats-replicas must be 1..5"},
		{[]string{"-from-bench", filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{"-from-bench", garbage}, "not a bench report"},
		{[]string{"-from-bench", empty}, "neither baselines.redis_gate_rps"},
		{[]string{"extra"}, `plan takes no arguments, got ["extra"]`},
	} {
		_, stderr, err := runPlanArgs(tc.args...)
		if err == nil {
			t.Errorf("%v: no error", tc.args)
			continue
		}
		if !strings.Contains(err.Error()+stderr, tc.want) {
			t.Errorf("%v: %v %s; want %q", tc.args, err, stderr, tc.want)
		}
	}
}

// TestPlanForecast: plan -forecast on a seeded sale_history prints the
// forecast (ratios 2 and 8 per unit: P50 4 x stock) and sizes for its P90;
// with nothing similar it refuses, saying why.
func TestPlanForecast(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testenv.Database(t)
	st, err := orderstore.Open(ctx, url, orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)
	for i, peak := range []int64{2000, 8000} {
		r := orderstore.SaleRecord{SKU: fmt.Sprintf("past%d", i), Tag: "phones", StartsAt: day.AddDate(0, 0, i), EndsAt: day.AddDate(0, 0, i).Add(time.Hour),
			RecordedAt: day, Stock: 1000, Seconds: 10, Attempts: peak * 3, PeakAttempts: peak, SellOut: -1, P99: -1}
		if _, err := st.PutSaleRecord(ctx, r, false); err != nil {
			t.Fatal(err)
		}
	}
	out, _, err := runPlanArgs("-forecast", "-sku", "next", "-stock", "2000", "-hot-share", "1", "-skus", "0", "-database-url", url)
	if err != nil {
		t.Fatal(err)
	}
	p90 := 8000 * math.Exp(3.078*math.Sqrt2*math.Ln2*math.Sqrt(1.5))
	for _, want := range []string{
		"forecast: peak 8000 attempts/s (P50), " + fmt.Sprintf("%.0f", p90) + " (P90), from 2 similar sales and stock 2000",
		"similar: past1@2026-11-12 (stock 1000, peak 8000/s: 8), past0@2026-11-11 (stock 1000, peak 2000/s: 2)",
		fmt.Sprintf("sizing for the P90: %.0f attempts/s on next", p90),
		fmt.Sprintf("load: %.0f attempts/s: %.0f on the hot SKU (stock 2000", p90, p90),
		"stock buckets", "consumers:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runPlanArgs("-forecast", "-stock", "2000", "-like", "past0", "-database-url", url)
	if err != nil || !strings.Contains(out, "forecast: peak 4000 attempts/s (P50), 8000 (P90), from 1 similar sale") {
		t.Errorf("-like past0: %v\n%s", err, out)
	}
	out, _, err = runPlanArgs("-forecast", "-stock", "1", "-tag", "phones", "-database-url", url)
	if err != nil || !strings.Contains(out, "forecast: peak 4 attempts/s (P50)") {
		t.Errorf("-tag phones: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-forecast", "-stock", "1000000"}, "no recorded sale with a stock within 4x of 1000000 (2 recorded sales in all)"},
		{[]string{"-forecast", "-like", "gone"}, `no recorded sale of SKU "gone"`},
		{[]string{"-forecast", "-tag", "shoes"}, `no recorded sale tagged "shoes"`},
		{[]string{"-forecast", "-tag", "phones", "-like", "past0"}, "give -like or -tag, not both"},
		{[]string{"-forecast", "-rate", "5"}, "give -rate or -forecast, not both"},
		{[]string{"-like", "past0"}, "go with -forecast"},
		{[]string{"-tag", "phones"}, "go with -forecast"},
		{[]string{"-forecast", "-sku", "bad!id"}, "is not a SKU id"},
	} {
		_, _, err := runPlanArgs(append(tc.args, "-database-url", url)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestPlanCheckCluster: on a fresh three-primary cluster, three and six
// buckets of a sale sit one and two per primary.
func TestPlanCheckCluster(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t)
	for _, k := range []string{"3", "6"} {
		out, _, err := runPlanArgs("-check-cluster", "-sku", "hot", "-buckets", k, "-redis-url", rc.URL)
		if err != nil || !strings.Contains(out, "cluster: 3 primaries; "+k+" stock buckets of hot") || !strings.Contains(out, "ok: the buckets sit on different primaries") {
			t.Errorf("-buckets %s: %v\n%s", k, err, out)
		}
	}
	if _, _, err := runPlanArgs("-check-cluster", "-redis-url", rc.URL); err == nil || !strings.Contains(err.Error(), "needs -sku") {
		t.Errorf("without -sku: %v", err)
	}

	// -reshard: nothing to move on a fresh cluster; crowded, the printed
	// script run as printed spreads the buckets again; refused while the
	// sale is open.
	if out, _, err := runPlanArgs("-reshard", "-sku", "hot", "-buckets", "3", "-redis-url", rc.URL); err != nil || !strings.Contains(out, "nothing to move") {
		t.Errorf("-reshard on a spread sale: %v\n%s", err, out)
	}
	ctx := context.Background()
	c, err := stockgate.Dial(rc.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slots, err := stockgate.ClusterSlots(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, r := range slots {
		ids[r.Primary] = r.ID
	}
	pc := stockgate.CheckPlacement(slots, "hot", 3)
	p0, p1 := pc.Placements[0], pc.Placements[1]
	crowd := stockgate.Move{Slot: p1.Slot, From: p1.Primary, FromID: ids[p1.Primary], To: p0.Primary, ToID: ids[p0.Primary]}
	if out, err := exec.Command("bash", "-c", "set -e\n"+strings.Join(crowd.Commands(stockgate.Primaries(slots)), "\n")).CombinedOutput(); err != nil {
		t.Fatalf("crowding: %v\n%s", err, out)
	}
	settled := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			_, _, err := runPlanArgs("-check-cluster", "-sku", "hot", "-buckets", "3", "-redis-url", rc.URL)
			if (err == nil) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("-check-cluster: %v, want ok=%v", err, want)
			}
		}
	}
	settled(false)
	script, _, err := runPlanArgs("-reshard", "-sku", "hot", "-buckets", "3", "-redis-url", rc.URL)
	if err != nil || !strings.Contains(script, "# reshard plan for hot (3 stock buckets over 3 primaries): 1 slot move") {
		t.Fatalf("-reshard on a crowded sale: %v\n%s", err, script)
	}
	if out, err := exec.Command("bash", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("running the plan: %v\n%s\n%s", err, script, out)
	}
	settled(true)

	g := stockgate.New(c, "fs")
	now := time.Now()
	if err := c.Do(ctx, c.B().Hset().Key(g.KeysOf("live").Meta).FieldValue().FieldValue("starts", strconv.FormatInt(now.Add(-time.Minute).UnixMilli(), 10)).
		FieldValue("ends", strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10)).FieldValue("epoch", "e1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runPlanArgs("-reshard", "-sku", "live", "-buckets", "3", "-redis-url", rc.URL); err == nil || !strings.Contains(err.Error(), "the sale live is open") {
		t.Errorf("-reshard inside the window: %v", err)
	}
	if _, _, err := runPlanArgs("-reshard", "-check-cluster", "-sku", "hot", "-redis-url", rc.URL); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("-reshard with -check-cluster: %v", err)
	}
}

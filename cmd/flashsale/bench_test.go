package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// benchReport is the JSON report as a reader sees it.
type benchReport struct {
	Setup     map[string]any     `json:"setup"`
	Baselines map[string]float64 `json:"baselines"`
	Results   []map[string]any   `json:"results"`
}

// runBenchCmd runs `flashsale bench args...` against the test services and
// returns the parsed JSON report, the terminal output and run's error.
func runBenchCmd(t *testing.T, args ...string) (benchReport, string, error) {
	t.Helper()
	redisURL, prefix := testenv.Redis(t)
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "report.json")
	full := append([]string{"bench", "-quiet", "-warmup", "200ms", "-json", jsonPath, "-html", filepath.Join(dir, "report.html"),
		"-database-url", testenv.Database(t), "-redis-url", redisURL, "-redis-prefix", prefix}, args...)
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	err := run(ctx, full, func(string) string { return "" }, &out, &errOut)
	t.Logf("flashsale %s: %v in %v\n%s%s", strings.Join(full, " "), err, time.Since(start).Round(time.Millisecond), out.String(), errOut.String())
	var rep benchReport
	if b, rerr := os.ReadFile(jsonPath); rerr == nil {
		if jerr := json.Unmarshal(b, &rep); jerr != nil {
			t.Fatalf("report.json: %v", jerr)
		}
	}
	return rep, out.String(), err
}

// resultKeys are exactly the fields of a result in the JSON report.
var resultKeys = []string{"accepted", "drain_seconds", "errors", "invariants_ok", "oversold", "p50_ms", "p999_ms", "p99_ms",
	"requests", "sold", "strategy", "throughput_rps"}

func checkReportShape(t *testing.T, rep benchReport, strategies ...string) {
	t.Helper()
	if rep.Setup == nil {
		t.Fatal("no setup in the report")
	}
	if len(rep.Baselines) != 2 || rep.Baselines["empty_handler_rps"] <= 0 || rep.Baselines["redis_gate_rps"] <= 0 {
		t.Errorf("baselines %v: want empty_handler_rps and redis_gate_rps, both measured", rep.Baselines)
	}
	if len(rep.Results) != len(strategies) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(strategies))
	}
	for i, r := range rep.Results {
		var keys []string
		for k := range r {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, resultKeys) {
			t.Errorf("result %d has keys %v, want exactly %v", i, keys, resultKeys)
		}
		if r["strategy"] != strategies[i] {
			t.Errorf("result %d is %v, want %s", i, r["strategy"], strategies[i])
		}
	}
}

// TestBenchEndToEnd: the hot scenario against a fresh in-process flashsale
// per strategy; everything sold exactly once, and the report says so.
func TestBenchEndToEnd(t *testing.T) {
	slowEndToEnd(t)
	rep, out, err := runBenchCmd(t, "-strategies", "pipeline,db-conditional", "-scenario", "hot",
		"-buyers", "24", "-duration", "1s", "-stock", "60")
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	checkReportShape(t, rep, "pipeline", "db-conditional")
	for _, r := range rep.Results {
		if r["invariants_ok"] != true || r["oversold"].(float64) != 0 {
			t.Errorf("%v: invariants_ok %v, oversold %v", r["strategy"], r["invariants_ok"], r["oversold"])
		}
		// 24 buyers for a second against 60 units: sold out, once each.
		if r["sold"].(float64) != 60 || r["accepted"].(float64) != 60 {
			t.Errorf("%v: sold %v, accepted %v; want 60, 60", r["strategy"], r["sold"], r["accepted"])
		}
		if r["requests"].(float64) < 100 || r["throughput_rps"].(float64) <= 0 || r["p99_ms"].(float64) <= 0 {
			t.Errorf("%v: requests %v, throughput %v, p99 %v", r["strategy"], r["requests"], r["throughput_rps"], r["p99_ms"])
		}
	}
	for _, want := range []string{"pipeline", "db-conditional", "empty handler", "oversold", "sold_out"} {
		if !strings.Contains(out, want) {
			t.Errorf("terminal report lacks %q", want)
		}
	}
}

// TestBenchOtherStrategies: the remaining strategies on many SKUs, open loop.
func TestBenchOtherStrategies(t *testing.T) {
	slowEndToEnd(t)
	rep, _, err := runBenchCmd(t, "-strategies", "db-pessimistic,db-optimistic,redis-lock", "-scenario", "many",
		"-mode", "open", "-rate", "300", "-max-in-flight", "200", "-duration", "700ms", "-stock", "40", "-skus", "4", "-per-user-limit", "2", "-baselines=false")
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r["invariants_ok"] != true || r["sold"].(float64) != r["accepted"].(float64) || r["sold"].(float64) == 0 {
			t.Errorf("%v: invariants_ok %v, sold %v, accepted %v", r["strategy"], r["invariants_ok"], r["sold"], r["accepted"])
		}
	}
	if rep.Baselines["empty_handler_rps"] != 0 {
		t.Errorf("baselines measured with -baselines=false: %v", rep.Baselines)
	}
}

// TestBenchTarget drives an already running flashsale (pay and cancel
// included) and checks its stores.
func TestBenchTarget(t *testing.T) {
	h := newHarness(t, testConfig(t, "embedded"))
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "r.json")
	args := []string{"bench", "-quiet", "-warmup", "0s", "-json", jsonPath, "-target", h.srvURL, "-baselines=false",
		"-admin-token", testAdmin, "-user-token-secret", testSecret,
		"-database-url", h.cfg.DatabaseURL, "-redis-url", h.cfg.RedisURL, "-redis-prefix", h.cfg.RedisPrefix,
		"-scenario", "mix", "-buyers", "16", "-duration", "1s", "-stock", "80"}
	var out bytes.Buffer
	err := run(context.Background(), args, func(string) string { return "" }, &out, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep benchReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || rep.Results[0]["strategy"] != "pipeline" || rep.Results[0]["invariants_ok"] != true {
		t.Errorf("results %v", rep.Results)
	}
	if strings.Contains(string(b), testSecret) || strings.Contains(string(b), testAdmin) {
		t.Error("the report holds a secret")
	}
}

func TestBenchRefuses(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"-target", "http://example.com:8080"}, "loopback"},
		{[]string{"-target", "http://10.1.2.3:8080"}, "loopback"},
		{[]string{"-target", "http://localhost.example.com"}, "loopback"},
		{[]string{"-target", "https://127.0.0.1:8443"}, "http://"},
		{[]string{"-duration", "0s"}, "bounded in time"},
		{[]string{"-scenario", "stampede"}, "unknown scenario"},
		{[]string{"-strategies", "pipeline,db-magic"}, "unknown purchase strategy"},
		{[]string{"-target", "http://127.0.0.1:1", "-strategies", "pipeline,db-conditional"}, "one strategy"},
		{[]string{"-mode", "open", "-rate", "0"}, "-rate"},
	}
	for _, c := range cases {
		args := append([]string{"bench", "-admin-token", "a", "-user-token-secret", "s"}, c.args...)
		err := run(context.Background(), args, func(string) string { return "" }, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want one mentioning %q", c.args, err, c.want)
		}
	}
}

func TestBenchRedactsSecrets(t *testing.T) {
	got := strings.Join(redactArgs([]string{"-admin-token", "tok", "-user-token-secret=sec", "-database-url",
		"postgres://u:pw@127.0.0.1/db", "-buyers", "10"}), " ")
	for _, secret := range []string{"tok", "sec", "pw"} {
		if strings.Contains(got, " "+secret) || strings.Contains(got, "="+secret) || strings.Contains(got, ":"+secret+"@") {
			t.Errorf("%q still shows %q", got, secret)
		}
	}
	if !strings.Contains(got, "-buyers 10") || !strings.Contains(got, "postgres://u:REDACTED@127.0.0.1/db") {
		t.Errorf("redacted too much: %q", got)
	}
	if got, want := commandLine([]string{"-machine-note", "2 cores, it's shared", "-buyers", "10"}),
		`flashsale bench -machine-note '2 cores, it'\''s shared' -buyers 10`; got != want {
		t.Errorf("commandLine = %s, want %s", got, want)
	}
}

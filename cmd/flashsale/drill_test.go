package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/drill"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestDrillEndToEnd runs flashsale drill against a running instance (its
// own Redis, so that the fault touches no other test): three phases, a
// spike among them, and a fault (Redis stalls for half a second) in the
// spike, with the user's default settings. The drill's mechanics are tested
// here, its grading with exact figures in internal/drill: the criteria are
// ones a starved machine meets. Recovery is measured and reported, not
// graded: with the other tests of the package beside it under -race, the
// breaker can open on gate timeouts alone, and its half-open probe's
// rebuild of Redis (every purchase answered busy meanwhile, by design) took
// longer than the cool-down (12 s of 600 busy answers in one run here). The
// drill passes, its report (text, JSON, HTML) holds the phases, the fault as
// run and its recovery, and the invariants read from the database and
// Redis. A second drill whose p99 criterion no server can meet fails, and
// says which check.
func TestDrillEndToEnd(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	rs := testenv.StartRedis(t)
	cfg := testConfig(t, "embedded", "FLASHSALE_REDIS_URL", rs.URL)
	h := newHarness(t, cfg)
	dir := t.TempDir()
	host, port, _ := strings.Cut(rs.Addr, ":")
	file := filepath.Join(dir, "drill.json")
	if err := os.WriteFile(file, []byte(`{
		"name": "spike with a stall",
		"stock": 100000,
		"phases": [
			{"name": "steady", "rate": 100, "for": "2s"},
			{"name": "spike", "rate": 400, "for": "2s"},
			{"name": "cool-down", "rate": 50, "for": "12s"}
		],
		"faults": [{"name": "redis stalls", "at": "2500ms", "run": "redis-cli -h `+host+` -p `+port+` CLIENT PAUSE 500 ALL"}],
		"pass": {"p99": "30s", "error_budget": 0.99}
	}`), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"FLASHSALE_DATABASE_URL": cfg.DatabaseURL, "FLASHSALE_REDIS_URL": cfg.RedisURL, "FLASHSALE_REDIS_PREFIX": cfg.RedisPrefix,
		"FLASHSALE_ADMIN_TOKEN": testAdmin, "FLASHSALE_USER_TOKEN_SECRET": testSecret,
	}
	getenv := func(k string) string { return env[k] }
	jsonOut, htmlOut := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"drill", file, "-target", h.srvURL, "-json", jsonOut, "-html", htmlOut}, getenv, &out, &errOut)
	if err != nil {
		t.Fatalf("drill: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	t.Logf("report:\n%s", out.String())
	raw, err := os.ReadFile(jsonOut)
	if err != nil {
		t.Fatal(err)
	}
	var rep drill.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Passed || len(rep.Phases) != 3 || len(rep.Faults) != 1 || rep.Requests < 1000 {
		t.Fatalf("report: passed %v, %d phases, %d faults, %d requests", rep.Passed, len(rep.Phases), len(rep.Faults), rep.Requests)
	}
	// Each phase's buyers are new people: with a limit of 1, the only
	// limit_reached answers are the scenario's second purchases (1 request
	// in 7), never a later phase's buyers meeting an earlier phase's.
	if lr := rep.Codes["limit_reached"]; lr > rep.Requests/7+3 {
		t.Errorf("%d limit_reached of %d requests: later phases reused earlier buyers", lr, rep.Requests)
	}
	for i, want := range []time.Duration{0, 2 * time.Second, 4 * time.Second} {
		if rep.Phases[i].Start.D() != want {
			t.Errorf("phase %s starts at %v, want %v (the drill's clock)", rep.Phases[i].Name, rep.Phases[i].Start.D(), want)
		}
	}
	if f := rep.Faults[0]; f.Exit != 0 || !strings.Contains(f.Output, "OK") || f.At.D() != 2500*time.Millisecond {
		t.Errorf("the fault as run: %+v", f)
	}
	if !strings.Contains(out.String(), "recovery") {
		t.Errorf("the text report has no recovery column:\n%s", out.String())
	}
	if !rep.Phases[1].Disturbed || rep.Phases[0].Disturbed {
		t.Errorf("phases touched by the fault: %+v", rep.Phases)
	}
	if rep.Invariants == nil || !rep.Invariants.OK() || rep.Invariants.Sold == 0 {
		t.Errorf("invariants: %+v", rep.Invariants)
	}
	if page, err := os.ReadFile(htmlOut); err != nil || !bytes.Contains(page, []byte("<svg")) || !bytes.Contains(page, []byte("redis stalls")) {
		t.Errorf("html report: %v", err)
	}

	// A criterion that fails fails the drill.
	strict := filepath.Join(dir, "strict.json")
	if err := os.WriteFile(strict, []byte(`{"phases":[{"name":"only","rate":50,"for":"1s"}],"pass":{"p99":"1us"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = run(context.Background(), []string{"drill", "-target", h.srvURL, "-quiet", strict}, getenv, &out, &errOut)
	if !errors.Is(err, errDrillFailed) || !strings.Contains(out.String(), "p99 of only") || !strings.Contains(out.String(), "FAILED") {
		t.Fatalf("a drill whose p99 cannot be met: %v\n%s", err, out.String())
	}

	// The load from two workers (flashsale bench -worker), each phase's
	// rate split between them: every request is sent once, later phases'
	// buyers are new, and the invariants hold. Mechanics only: up to 99%
	// of errors passes (a CI run whose other lane ran the cluster drill saw
	// a p50 of 2.8 s at 100 requests/s, the breaker open, 52% errors).
	const token = "drill-worker-token-0123"
	w1, w2 := startBenchWorker(t, "127.0.0.1:0", token), startBenchWorker(t, "127.0.0.1:0", token)
	split := filepath.Join(dir, "split.json")
	if err := os.WriteFile(split, []byte(`{"stock":100000,"phases":[{"name":"a","rate":100,"for":"1s"},{"name":"b","rate":200,"for":"1s"}],"pass":{"error_budget":0.99}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	err = run(context.Background(), []string{"drill", "-target", h.srvURL, "-workers", w1 + "," + w2, "-worker-token", token,
		"-sources", "2", "-json", jsonOut, split}, getenv, &out, &errOut)
	t.Logf("report from workers:\n%s%s", out.String(), errOut.String())
	if err != nil {
		t.Fatalf("drill from workers: %v", err)
	}
	raw, err = os.ReadFile(jsonOut)
	if err != nil {
		t.Fatal(err)
	}
	rep = drill.Report{}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Passed || len(rep.Workers) != 2 || rep.Requests != 300 {
		t.Fatalf("drill from workers: passed %v, workers %v, %d requests (want 100 + 200)", rep.Passed, rep.Workers, rep.Requests)
	}
	if lr := rep.Codes["limit_reached"]; lr > rep.Requests/7+3 {
		t.Errorf("%d limit_reached of %d requests: the workers or the phases shared buyers", lr, rep.Requests)
	}
	if rep.Invariants == nil || !rep.Invariants.OK() || rep.Invariants.Sold == 0 {
		t.Errorf("invariants: %+v", rep.Invariants)
	}
}

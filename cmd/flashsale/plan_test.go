package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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

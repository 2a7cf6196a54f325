package drill

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/loadgen"
)

func TestParse(t *testing.T) {
	f, err := Parse(strings.NewReader(`{"name":"d","phases":[{"name":"ramp","rate":100,"for":"10s"},{"name":"spike","rate":2000,"for":"5s"}],
		"faults":[{"name":"kill","at":"12s","run":"true"}],"pass":{"p99":"250ms","error_budget":0.02,"recover_within":"10s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Scenario != "hot" || f.Stock != 1_000_000 || f.PerUserLimit != 1 || f.MaxInFlight != 4000 || f.Faults[0].Timeout.D() != time.Minute {
		t.Errorf("defaults: %+v", f)
	}
	if f.Length() != 15*time.Second || f.Pass.Budget() != 0.02 || f.Pass.P99.D() != 250*time.Millisecond {
		t.Errorf("parsed: %+v", f)
	}
	if f, _ := Parse(strings.NewReader(`{"phases":[{"name":"a","rate":1,"for":"1s"}]}`)); f.Pass.Budget() != 0.01 {
		t.Errorf("default budget %v", f.Pass.Budget())
	}
	for _, tc := range []struct{ file, want string }{
		{`{"phases":[]}`, "at least one phase"},
		{`{"phases":[{"name":"a","rate":0,"for":"1s"}]}`, "rate must be in (0, 1e7]"},
		{`{"phases":[{"name":"a","rate":1,"for":"10ms"}]}`, "for must be at least 1s"},
		{`{"phases":[{"name":"a","rate":1,"for":"ten"}]}`, `duration "ten"`},
		{`{"phases":[{"name":"a","rate":1,"for":"1s"},{"name":"a","rate":1,"for":"1s"}]}`, `"a" is used twice`},
		{`{"phases":[{"name":"a","rate":1,"for":"5s"}],"faults":[{"name":"f","at":"5s","run":"true"}]}`, "outside the drill's 5s"},
		{`{"phases":[{"name":"a","rate":1,"for":"5s"}],"faults":[{"name":"f","at":"1s","run":" "}]}`, "a shell command is needed"},
		{`{"phases":[{"name":"a","rate":1,"for":"5s"}],"pass":{"error_budget":1}}`, "error_budget must be in [0, 1)"},
		{`{"phases":[{"name":"a","rate":1,"for":"5s"}],"scenario":"storm"}`, `scenario "storm"`},
		{`{"phases":[{"name":"a","rate":1,"for":"5s"}],"colour":1}`, `unknown field "colour"`},
		{`{"phases":[{"name":"a","rate":1,"for":"5s"}]} {}`, "more than one JSON value"},
	} {
		if _, err := Parse(strings.NewReader(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.file, err, tc.want)
		}
	}
}

func TestSecondsAndRecovery(t *testing.T) {
	var pts []loadgen.Point
	// 10 seconds at 100 answers a second; seconds 3 and 4 have 50 errors.
	for i := 1; i <= 100; i++ {
		p := loadgen.Point{At: time.Duration(i) * 100 * time.Millisecond, Completed: 10}
		if s := (i - 1) / 10; s == 3 || s == 4 {
			p.Errors = 5
		}
		pts = append(pts, p)
	}
	secs := seconds(pts)
	if len(secs) != 10 || secs[0].Answered != 100 || secs[3].Errors != 50 || secs[5].Errors != 0 {
		t.Fatalf("seconds: %+v", secs)
	}
	if d, ok := recovery(secs, 2500*time.Millisecond, 0, 0.01); d != 2500*time.Millisecond || !ok {
		t.Errorf("recovery %v %v, want 2.5s (to the end of second 4)", d, ok)
	}
	if d, ok := recovery(secs, 6*time.Second, 0, 0.01); d != 0 || !ok {
		t.Errorf("a fault with no effect: %v %v, want 0", d, ok)
	}
	if d, ok := recovery(secs, 2*time.Second, 0, 0.6); d != 0 || !ok {
		t.Errorf("errors within a generous budget: %v %v, want 0", d, ok)
	}
	// Still failing at the drill's last second: not recovered.
	secs[9].Errors = 100
	if _, ok := recovery(secs, 7*time.Second, 0, 0.01); ok {
		t.Error("errors in the last second: recovered")
	}
	// The next fault bounds the stretch.
	if d, ok := recovery(secs, 2*time.Second, 8*time.Second, 0.01); d != 3*time.Second || !ok {
		t.Errorf("bounded by the next fault: %v %v, want 3s", d, ok)
	}
}

func TestGrade(t *testing.T) {
	f, err := Parse(strings.NewReader(`{"phases":[{"name":"a","rate":100,"for":"4s"},{"name":"b","rate":100,"for":"4s"}],
		"faults":[{"name":"f","at":"5s","run":"true"}],"pass":{"p99":"100ms","error_budget":0.05,"recover_within":"2s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{
		Phases: []PhaseResult{
			{Name: "a", Start: 0, For: Duration(4 * time.Second), P99Ms: 20},
			{Name: "b", Start: Duration(4 * time.Second), For: Duration(4 * time.Second), P99Ms: 900},
		},
		Faults:     []FaultResult{{Name: "f", At: Duration(5 * time.Second), Exit: 0}},
		Requests:   800,
		Errors:     30,
		Invariants: &loadgen.Verdict{Drained: true},
	}
	for s := range 8 {
		sec := Second{At: s, Answered: 100}
		if s == 5 || s == 6 {
			sec.Errors = 15
		}
		rep.Seconds = append(rep.Seconds, sec)
	}
	grade(f, rep)
	if !rep.Passed {
		t.Fatalf("failed: %+v", rep.Checks)
	}
	if !rep.Phases[1].Disturbed || rep.Phases[0].Disturbed {
		t.Errorf("disturbed: %+v", rep.Phases)
	}
	if rep.Faults[0].Recovery.D() != 2*time.Second {
		t.Errorf("recovery %v, want 2s", rep.Faults[0].Recovery.D())
	}
	// Each criterion fails the drill on its own.
	for name, spoil := range map[string]func(*Report){
		"budget":     func(r *Report) { r.Errors = 100 },
		"p99":        func(r *Report) { r.Phases[0].P99Ms = 101 },
		"recovery":   func(r *Report) { r.Seconds[7].Errors = 50 },
		"fault exit": func(r *Report) { r.Faults[0].Exit = 1 },
		"invariants": func(r *Report) { r.Invariants = &loadgen.Verdict{Drained: true, Oversold: 1} },
	} {
		r := *rep
		r.Phases = append([]PhaseResult(nil), rep.Phases...)
		r.Faults = append([]FaultResult(nil), rep.Faults...)
		r.Seconds = append([]Second(nil), rep.Seconds...)
		r.Checks = nil
		for i := range r.Phases {
			r.Phases[i].Disturbed = false
		}
		spoil(&r)
		grade(f, &r)
		if r.Passed {
			t.Errorf("%s spoiled: passed: %+v", name, r.Checks)
		}
	}
	var b strings.Builder
	if err := rep.WriteHTML(&b); err != nil || !strings.Contains(b.String(), "<svg") || !strings.Contains(b.String(), "passed") {
		t.Errorf("html: %v", err)
	}
}

// TestShippedDrills: every drill in deploy/drills parses, and the cluster
// drills' faults name only the variables docs/drills.md tells an operator
// to export.
func TestShippedDrills(t *testing.T) {
	files, err := filepath.Glob("../../deploy/drills/*.json")
	if err != nil || len(files) < 3 {
		t.Fatalf("shipped drills %v: %v", files, err)
	}
	vars := regexp.MustCompile(`\$\{?([A-Z_]+)`)
	known := map[string]bool{"FLASHSALE_DRILL_REDIS_PRIMARY_PID": true, "FLASHSALE_DRILL_NATS_LEADER_PID": true, "FLASHSALE_DRILL_INSTANCE_PID": true}
	for _, name := range files {
		fh, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := Parse(fh)
		fh.Close()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, ft := range f.Faults {
			for _, m := range vars.FindAllStringSubmatch(ft.Run, -1) {
				if !known[m[1]] {
					t.Errorf("%s: fault %s reads $%s, which docs/drills.md does not name", name, ft.Name, m[1])
				}
			}
		}
	}
}

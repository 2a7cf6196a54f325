package loadgen

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func fakeRun(latencies ...time.Duration) *Result {
	r := &Result{Mode: Closed, Latency: NewHistogram(), Service: NewHistogram(), Window: time.Second, Elapsed: time.Second,
		Codes: map[string]int64{"accepted": int64(len(latencies))}}
	for i, d := range latencies {
		_ = r.Latency.RecordValue(d.Microseconds())
		r.Timeline = append(r.Timeline, Point{At: time.Duration(i+1) * 100 * time.Millisecond, Completed: 10})
	}
	r.Requests, r.InWindow = int64(len(latencies)), int64(len(latencies))
	r.WindowCodes = map[string]int64{"accepted": int64(len(latencies))}
	return r
}

func fakeReport() *Report {
	v := &Verdict{Drained: true, DrainTime: 1500 * time.Millisecond, Sold: 100}
	bad := &Verdict{Drained: true, Sold: 101, Oversold: 1, Violations: []string{"I1: oversold <by> 1"}}
	return &Report{
		Setup:     Setup{Scenario: Hot, Mode: Closed, Buyers: 10, DurationS: 1, Stock: 100, SKUs: 1, PerUserLimit: 1, Command: "flashsale bench"},
		Baselines: Baselines{EmptyHandlerRPS: 1000, RedisGateRPS: 2000},
		Results: []*StrategyResult{
			NewStrategyResult("pipeline", fakeRun(time.Millisecond, 2*time.Millisecond, 40*time.Millisecond), v, 100),
			NewStrategyResult("db-conditional", fakeRun(time.Second, 1100*time.Millisecond), bad, 101),
		},
	}
}

func TestLoadgenReportJSONShape(t *testing.T) {
	rep := fakeReport()
	path := filepath.Join(t.TempDir(), "r.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if keys := sortedKeys(got); !slices.Equal(keys, []string{"baselines", "results", "setup"}) {
		t.Errorf("top-level keys %v", keys)
	}
	var base map[string]float64
	_ = json.Unmarshal(got["baselines"], &base)
	if len(base) != 2 || base["empty_handler_rps"] != 1000 || base["redis_gate_rps"] != 2000 {
		t.Errorf("baselines %v", base)
	}
	var results []map[string]any
	_ = json.Unmarshal(got["results"], &results)
	want := []string{"accepted", "drain_seconds", "errors", "invariants_ok", "oversold", "p50_ms", "p999_ms", "p99_ms",
		"requests", "sold", "strategy", "throughput_rps"}
	for _, r := range results {
		if keys := sortedKeys(r); !slices.Equal(keys, want) {
			t.Errorf("result keys %v, want %v", keys, want)
		}
	}
	if results[0]["invariants_ok"] != true || results[1]["invariants_ok"] != false || results[1]["oversold"].(float64) != 1 {
		t.Errorf("results %v", results)
	}
	if results[0]["drain_seconds"].(float64) != 1.5 || results[0]["p50_ms"].(float64) != 2 {
		t.Errorf("pipeline %v", results[0])
	}
	if rep.OK() {
		t.Error("a report with a violation is OK")
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}

func TestLoadgenReportTableAndHTML(t *testing.T) {
	rep := fakeReport()
	var tbl bytes.Buffer
	rep.WriteTable(&tbl)
	for _, want := range []string{"pipeline", "db-conditional", "VIOLATED", "I1: oversold <by> 1", "1.5x db-conditional", "empty handler 1000"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
	var page bytes.Buffer
	if err := rep.renderHTML(&page, fakeRun(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	if n := strings.Count(html, "<svg"); n != 2+2*len(rep.Results) {
		t.Errorf("%d charts, want %d", n, 2+2*len(rep.Results))
	}
	for _, bad := range []string{"<script", "src=", "https://", "I1: oversold <by> 1"} {
		if strings.Contains(html, bad) {
			t.Errorf("page contains %q (external resource, script or unescaped text)", bad)
		}
	}
	for _, want := range []string{"empty handler", "I1: oversold &lt;by&gt; 1", "polyline", "<rect"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

// TestLoadgenReportAcceptedCounts: the two "accepted" figures are labelled
// for what they count: distinct orders over the whole run (the column, the
// checks' figure) and answers after the warm-up (retries included).
func TestLoadgenReportAcceptedCounts(t *testing.T) {
	rep := fakeReport()
	rep.Results[0].Codes = map[string]int64{"accepted": 120, "limit_reached": 7} // 20 idempotent retries answered accepted
	var tbl bytes.Buffer
	rep.WriteTable(&tbl)
	for _, want := range []string{"orders accepted", "pipeline answers after the warm-up: accepted 120, limit_reached 7 (100 distinct orders accepted over the whole run)"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
	var page bytes.Buffer
	if err := rep.renderHTML(&page, nil); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	for _, want := range []string{"<th>orders accepted</th>", "<td>100</td><td>100</td>", // orders accepted, sold
		"answers after the warm-up: accepted 120, limit_reached 7 (100 distinct orders accepted over the whole run)",
		"orders accepted: distinct orders the service accepted (202) over the whole run"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(html, "<th>accepted</th>") || strings.Contains(html, "answers: ") {
		t.Error("the page still has an unqualified accepted count")
	}
}

var (
	svgFrame = regexp.MustCompile(`<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)" fill="#fcfcfc"`)
	svgBar   = regexp.MustCompile(`<rect x="[\d.]+" y="(-?[\d.]+)" width="[\d.]+" height="(-?[\d.]+)" fill="[^"]+" opacity="0.8"><title>(\d+) requests</title>`)
	svgYTick = regexp.MustCompile(`<text x="[\d.]+" y="[\d.]+" text-anchor="end">([\d.e+]+)</text>`)
)

// TestLoadgenHistogramFits: every bar of a latency histogram lies inside
// the chart, the tallest below its top, and the count axis is labelled up
// to at least the tallest bar.
func TestLoadgenHistogramFits(t *testing.T) {
	for _, tc := range []struct {
		name string
		lat  []time.Duration
	}{
		{"peaked", append(slices.Repeat([]time.Duration{5 * time.Millisecond}, 4217), time.Millisecond, 2*time.Millisecond, 80*time.Millisecond)},
		{"round count", slices.Repeat([]time.Duration{3 * time.Millisecond}, 1000)},
		{"one request", []time.Duration{time.Millisecond}},
		{"spread", []time.Duration{100 * time.Microsecond, time.Millisecond, time.Millisecond, 10 * time.Millisecond, time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svg := histogramChart(chartRun{name: "x", color: "#1f77b4", run: fakeRun(tc.lat...)})
			fr := svgFrame.FindStringSubmatch(svg)
			if fr == nil {
				t.Fatalf("no frame in %s", svg)
			}
			top, height := atof(t, fr[1]), atof(t, fr[2])
			bars := svgBar.FindAllStringSubmatch(svg, -1)
			if len(bars) == 0 {
				t.Fatalf("no bars in %s", svg)
			}
			var total, tallest int64
			for _, b := range bars {
				y, h, n := atof(t, b[1]), atof(t, b[2]), int64(atof(t, b[3]))
				total += n
				tallest = max(tallest, n)
				if y < top || h < 0 || y+h > top+height+0.05 {
					t.Errorf("bar of %d requests at y %.1f height %.1f leaves the chart (top %.1f, height %.1f)", n, y, h, top, height)
				}
				if n == tallest && y <= top {
					t.Errorf("the tallest bar (%d requests) touches the top of the chart (y %.1f)", n, y)
				}
			}
			if total != int64(len(tc.lat)) {
				t.Errorf("bars hold %d requests, want %d", total, len(tc.lat))
			}
			var axisMax float64
			for _, m := range svgYTick.FindAllStringSubmatch(svg, -1) {
				axisMax = max(axisMax, atof(t, m[1]))
			}
			if axisMax < float64(tallest) {
				t.Errorf("the count axis ends at %g, below the tallest bar's %d", axisMax, tallest)
			}
		})
	}
}

func atof(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

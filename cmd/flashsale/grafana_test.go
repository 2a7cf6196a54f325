package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/flashsale/flashsale/internal/dashboard"
	"github.com/flashsale/flashsale/internal/metrics"
)

// exportedSeries returns every flashsale_* series name the binary exports:
// the families of internal/metrics (each recorded once, since a vector
// without children is not gathered) and the descriptors of the state
// collector, histograms with their _bucket, _sum and _count series.
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New()
	m.Purchase("accepted")
	m.HTTP("POST /api/v1/orders", 202, time.Millisecond)
	m.Batch(1, 1, 0, 0, time.Millisecond, nil)
	m.Batch(1, 0, 0, 0, time.Millisecond, errors.New("failed"))
	m.DeadLettered()
	m.BreakerState("closed")
	m.Drift("sku", 0)
	m.ReconcileAlert()
	m.Gate(time.Millisecond)
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		n := f.GetName()
		names[n] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		}
	}
	ch := make(chan *prometheus.Desc)
	go func() { new(dashboard.Live).Collector().Describe(ch); close(ch) }()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		sm := fq.FindStringSubmatch(d.String())
		if sm == nil {
			t.Fatalf("no fqName in %s", d)
		}
		names[sm[1]] = true
	}
	// The parsing above must see both sources.
	for _, must := range []string{"flashsale_purchases_total", "flashsale_gate_duration_seconds_bucket", "flashsale_stock_units", "flashsale_inflight_oldest_age_seconds"} {
		if !names[must] {
			t.Fatalf("%s missing from the exported names %v", must, names)
		}
	}
	return names
}

type grafanaPanel struct {
	Type       string                `json:"type"`
	Title      string                `json:"title"`
	Datasource *struct{ UID string } `json:"datasource"`
	Targets    []struct {
		Expr       string                `json:"expr"`
		Datasource *struct{ UID string } `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

// checkPromQL has promtool parse every query, Grafana's variables replaced
// by values: each becomes a recording rule of a rules file.
func checkPromQL(t *testing.T, exprs []string) {
	t.Helper()
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__range", "1h", "$sku", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, err := json.Marshal(vars.Replace(e)) // a JSON string is a YAML string
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: scripts/ensure-services.sh installs it")
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("a dashboard query is not valid PromQL: %v\n%s", err, out)
	}
}

// TestGrafanaDashboard checks deploy/grafana/flashsale.json: valid JSON, a
// Prometheus datasource variable every panel and query uses, a title on
// every panel, queries promtool parses, and no query naming a flashsale_* series the binary does not
// export (a renamed metric would leave a chart empty without a word).
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../deploy/grafana/flashsale.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title      string `json:"title"`
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []grafanaPanel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("not valid JSON: %v", err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: want both", d.Title, d.UID)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Error("no Prometheus datasource variable named datasource")
	}

	exported := exportedSeries(t)
	metric := regexp.MustCompile(`\bflashsale_[a-zA-Z0-9_]+`)
	used := map[string]bool{}
	var exprs []string
	var panels []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			panels = append(panels, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(panels) < 10 {
		t.Fatalf("%d panels, want the dashboard", len(panels))
	}
	for _, p := range panels {
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("panel of type %s has no title", p.Type)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Datasource == nil || q.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: a query's datasource %+v, want ${datasource}", p.Title, q.Datasource)
			}
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("panel %q: empty query", p.Title)
			}
			exprs = append(exprs, q.Expr)
			for _, n := range metric.FindAllString(q.Expr, -1) {
				used[n] = true
				if !exported[n] {
					t.Errorf("panel %q queries %s, which flashsale does not export", p.Title, n)
				}
			}
		}
	}
	// The board covers what an operator watches during a sale.
	for _, n := range []string{
		"flashsale_stock_units", "flashsale_in_flight_units", "flashsale_inflight_oldest_age_seconds",
		"flashsale_gate_duration_seconds_bucket", "flashsale_purchases_total",
		"flashsale_queue_pending_messages", "flashsale_dead_letters_pending", "flashsale_dead_letters_total",
		"flashsale_breaker_state", "flashsale_breaker_transitions_total", "flashsale_reconcile_drift_units",
		"flashsale_reconcile_alerts_total", "flashsale_http_request_duration_seconds_bucket", "flashsale_db_pool_connections",
	} {
		if !used[n] {
			t.Errorf("no panel shows %s", n)
		}
	}
	checkPromQL(t, exprs)

	var all []string
	for n := range used {
		all = append(all, n)
	}
	sort.Strings(all)
	t.Logf("series used: %s", strings.Join(all, " "))
}

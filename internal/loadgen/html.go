package loadgen

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"os"
	"strings"
	"time"
)

// The HTML report is one self-contained file: inline SVG charts drawn here,
// no script, no CDN, so it opens offline and can be committed.

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// chartRun is one line of a chart.
type chartRun struct {
	name  string
	color string
	dash  bool
	run   *Result
}

// WriteHTML writes the report as an HTML page with charts of the latency
// distribution and the throughput over time, overall and per strategy.
// empty, if not nil, is the empty handler's run, drawn dashed for reference.
func (f *Report) WriteHTML(path string, empty *Result) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f.renderHTML(out, empty); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (f *Report) renderHTML(w io.Writer, empty *Result) error {
	var runs []chartRun
	for i, r := range f.Results {
		if r.Run != nil {
			runs = append(runs, chartRun{name: r.Label(), color: palette[i%len(palette)], run: r.Run})
		}
	}
	all := runs
	if empty != nil {
		all = append(append([]chartRun{}, runs...), chartRun{name: "empty handler", color: "#777", dash: true, run: empty})
	}
	type panel struct {
		Name                    string
		Latency, Throughput     template.HTML
		Codes                   string
		Violations              []string
		OK                      bool
		P50, P99, P999, RPS     float64
		Requests, Errors, Drain any
		Orders                  int64
	}
	var panels []panel
	for i, r := range f.Results {
		if r.Run == nil {
			continue
		}
		c := chartRun{name: r.Label(), color: palette[i%len(palette)], run: r.Run}
		panels = append(panels, panel{
			Name: r.Label(), Latency: template.HTML(histogramChart(c)), Throughput: template.HTML(throughputChart([]chartRun{c}, 460, 220)),
			Codes: codeList(r.Codes), Violations: r.Violations, OK: r.InvariantsOK,
			P50: r.P50Ms, P99: r.P99Ms, P999: r.P999Ms, RPS: r.ThroughputRPS, Requests: r.Requests, Errors: r.Errors, Drain: r.DrainSeconds,
			Orders: r.Accepted,
		})
	}
	data := struct {
		R                       *Report
		Percentiles, Throughput template.HTML
		Panels                  []panel
		Backlog                 template.HTML
		Generated               string
	}{
		R: f, Percentiles: template.HTML(percentileChart(all)), Throughput: template.HTML(throughputChart(all, 960, 320)),
		Panels: panels, Generated: time.Now().UTC().Format(time.RFC3339),
	}
	var backlogs []series
	for i, r := range f.Results {
		if len(r.Backlog) == 0 {
			continue
		}
		sr := series{name: r.Label(), color: palette[i%len(palette)]}
		for _, p := range r.Backlog {
			sr.pts = append(sr.pts, [2]float64{p.At.Seconds(), float64(p.InFlight)})
		}
		backlogs = append(backlogs, sr)
	}
	if len(backlogs) > 0 {
		data.Backlog = template.HTML(lineChart("pipeline backlog", backlogs, "time since the warm-up started", "reservations in flight", 960, 260))
	}
	return pageTmpl.Execute(w, data)
}

var pageTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"ratio": func(a, b float64) string {
		if b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", a/b)
	},
	"f0":     func(x float64) string { return fmt.Sprintf("%.0f", x) },
	"ratio2": ratioText,
	"f1":     func(x float64) string { return fmt.Sprintf("%.1f", x) },
	"f2":     func(x float64) string { return fmt.Sprintf("%.2f", x) },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>flashsale bench: {{if .R.Setup.Paths}}purchase and sold-out paths{{else}}{{.R.Setup.Scenario}}{{end}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1000px;color:#222;padding:0 12px}
.wide{overflow-x:auto}.results{font-size:12.5px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}h3{font-size:15px;margin:0 0 6px}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}.bad{color:#b00;font-weight:600}.ok{color:#080}
.setup td{text-align:left}.panels{display:flex;flex-wrap:wrap;gap:16px}.panel{border:1px solid #ddd;border-radius:6px;padding:10px;width:468px}
.small{color:#666;font-size:12px}svg text{font:11px system-ui,sans-serif;fill:#333}
</style></head><body>
<h1>flashsale bench: {{if .R.Setup.Paths}}the purchase and sold-out paths{{else}}scenario {{.R.Setup.Scenario}}{{end}}</h1>
<div class="small">{{.R.Setup.Started.Format "2006-01-02 15:04:05 MST"}} &middot; report generated {{.Generated}}</div>
{{with .R.Headline}}<h2>Headline: {{.Strategy}}</h2>
<table class="headline">
<tr><th>figure</th><th>value</th><th>as a ratio of the empty handler in this run</th></tr>
<tr><td>empty handler</td><td>{{f0 .EmptyHandlerRPS}} req/s, p99 {{f2 .EmptyHandlerP99Ms}} ms</td><td>1</td></tr>
{{if .PurchaseRPS}}<tr><td>purchase path (accepted answers only)</td><td>{{f0 .PurchaseRPS}} req/s, p99 {{f2 .PurchaseP99Ms}} ms</td><td><b>{{ratio2 .PurchaseXEmpty}}x</b> throughput, <b>{{ratio2 .PurchaseP99XEmpty}}x</b> p99</td></tr>
<tr><td>apply backlog at the load's end</td><td>{{.BacklogAtEnd}} reservations (growing {{f0 .BacklogGrowthPerS}}/s while measured), {{if .DrainedToZero}}zero {{f2 .DrainToZeroS}} s after{{else}}<span class="bad">not drained to zero</span>{{end}}</td><td></td></tr>{{end}}
{{if .SoldOutRPS}}<tr><td>sold-out path (sold_out answers only)</td><td>{{f0 .SoldOutRPS}} req/s, p99 {{f2 .SoldOutP99Ms}} ms</td><td><b>{{ratio2 .SoldOutXEmpty}}x</b> throughput, <b>{{ratio2 .SoldOutP99XEmpty}}x</b> p99</td></tr>{{end}}
{{if .ServerCPUUsPerPurchase}}<tr><td>server CPU per purchase</td><td>{{f0 .ServerCPUUsPerPurchase}} µs (generator process {{f0 .GeneratorCPUUsPerPurchase}} µs)</td><td>{{if .ServerCPUPurchaseXEmpty}}<b>{{ratio2 .ServerCPUPurchaseXEmpty}}x</b> the empty handler's server CPU per request{{end}}</td></tr>
<tr><td>whole system CPU per purchase</td><td>{{f0 .SystemCPUUsPerPurchase}} µs: server {{f0 .ServerCPUUsPerPurchase}}, redis {{f0 .RedisCPUUsPerPurchase}}, database {{f0 .DatabaseCPUUsPerPurchase}}, nats {{f0 .NATSCPUUsPerPurchase}}</td><td>{{if .SystemCPUPurchaseXEmpty}}<b>{{ratio2 .SystemCPUPurchaseXEmpty}}x</b>{{end}}</td></tr>{{end}}
{{if .ServerCPUUsPerSoldOut}}<tr><td>server CPU per sold-out answer</td><td>{{f0 .ServerCPUUsPerSoldOut}} µs</td><td>{{if .ServerCPUSoldOutXEmpty}}<b>{{ratio2 .ServerCPUSoldOutXEmpty}}x</b>{{end}}</td></tr>{{end}}
</table>{{end}}
{{with .R.Memory}}<h2>Memory: {{.Opened}} keep-alive connections</h2>
<p>Server process {{.ServerPID}}: VmRSS <b>{{f1 .RSSMB}} MiB</b> with the connections open ({{f1 .RSSBeforeMB}} MiB before, {{f1 .PerConnKB}} KiB per connection), VmHWM {{f1 .HWMMB}} MiB.
{{.Connections}} asked, {{.Held}} held for {{f1 .HoldS}} s with a request every {{.EveryS}} s each ({{.Requests}} requests, {{.Errors}} errors).
Open files limit: server {{.ServerLimit}}, client {{.FileLimit}}.{{with .Note}} {{.}}{{end}}</p>{{end}}
<h2>Setup</h2>
<table class="setup">
<tr><td>command</td><td><code>{{.R.Setup.Command}}</code></td></tr>
<tr><td>load</td><td>{{.R.Setup.Mode}} loop{{if eq .R.Setup.Mode "open"}} at {{f0 .R.Setup.Rate}} req/s{{else}}, {{.R.Setup.Buyers}} concurrent buyers{{end}}, {{.R.Setup.DurationS}} s measured per {{if .R.Setup.Paths}}path and {{end}}strategy after {{.R.Setup.WarmupS}} s of warm-up{{if .R.Setup.RequestLimit}}, at most {{.R.Setup.RequestLimit}} requests{{end}}</td></tr>
{{if .R.Setup.Paths}}<tr><td>sales</td><td>purchase path: {{.R.Setup.PurchaseStock}} units, every request a new buyer; sold-out path: {{.R.Setup.Stock}} units sold out before the run; {{.R.Setup.PerUserLimit}} per user</td></tr>
{{else}}<tr><td>sale</td><td>{{.R.Setup.Stock}} units over {{.R.Setup.SKUs}} SKU(s), {{.R.Setup.PerUserLimit}} per user</td></tr>{{end}}
<tr><td>target</td><td>{{.R.Setup.Target}}</td></tr>
<tr><td>machine</td><td>{{.R.Setup.Machine.CPUs}} CPUs{{with .R.Setup.Machine.CPUModel}} ({{.}}){{end}}, {{.R.Setup.Machine.OS}}/{{.R.Setup.Machine.Arch}}, {{.R.Setup.Machine.Go}}{{with .R.Setup.Machine.Note}}; {{.}}{{end}}</td></tr>
{{range $k, $v := .R.Setup.Server}}<tr><td>{{$k}}</td><td>{{$v}}</td></tr>
{{end}}</table>
{{if .R.Results}}<h2>Results</h2>
<p>Baselines in the same run: empty handler <b>{{f0 .R.Baselines.EmptyHandlerRPS}}</b> req/s{{if .R.Baselines.EmptyHandlerP99Ms}} (p50 {{f2 .R.Baselines.EmptyHandlerP50Ms}} ms, p99 {{f2 .R.Baselines.EmptyHandlerP99Ms}} ms){{end}} (same generator, a handler that does nothing);
Redis gate alone <b>{{f0 .R.Baselines.RedisGateRPS}}</b> reserves/s (reserve script, many goroutines, same client).</p>
<div class="wide"><table class="results">
<tr><th>strategy</th><th>requests</th><th>req/s</th><th>x empty</th><th>orders accepted</th><th>sold</th><th>oversold</th><th>lost</th><th>doubled</th><th>p50 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>errors</th><th>drain s</th><th>invariants</th><th>CPU cores: self/redis/db/nats/other</th></tr>
{{range .R.Results}}<tr><td>{{.Label}}</td><td>{{.Requests}}</td><td>{{f0 .ThroughputRPS}}</td><td>{{ratio .ThroughputRPS $.R.Baselines.EmptyHandlerRPS}}</td>
<td>{{.Accepted}}</td><td>{{.Sold}}</td><td{{if .Oversold}} class="bad"{{end}}>{{.Oversold}}</td><td{{if .Lost}} class="bad"{{end}}>{{.Lost}}</td><td{{if .Doubled}} class="bad"{{end}}>{{.Doubled}}</td>
<td>{{f2 .P50Ms}}</td><td>{{f2 .P99Ms}}</td><td>{{f2 .P999Ms}}</td><td>{{.Errors}}</td><td>{{.DrainSeconds}}</td>
<td>{{if .InvariantsOK}}<span class="ok">I1-I7 hold</span>{{else}}<span class="bad">VIOLATED</span>{{end}}</td><td>{{.CPU}}</td></tr>
{{end}}</table></div>
<p class="small">orders accepted: distinct orders the service accepted (202) over the whole run, set-up and warm-up included: what the
checks hold the database to, so it equals sold when nothing is lost. The answers under each strategy below count the measured window only,
by answer, and an idempotent retry (the same buyer and key again) answers accepted with the order it already has: that count is not a number of orders.
req/s: answers without error per second of the run's duration (sold-out and limit refusals are answers; 5xx, 503 busy and
transport failures are errors). Latency from the send (closed loop) or from the due time (open loop). Checks read the database and Redis
directly after the queue drained: I1-I6 per SKU, then I7 (fresh buyers buy exactly what the database says remains).
CPU: cores busy on average while measuring, from /proc: this process (generator and in-process server), redis-server, the database server (postgres, mariadbd or mysqld), an external nats-server, the rest of the machine.</p>
{{if .R.Setup.Paths}}<h2>Paths</h2>
<div class="wide"><table class="results">
<tr><th>strategy</th><th>path</th><th>counted</th><th>answers</th><th>other answers</th><th>req/s</th><th>x empty</th><th>empty req/s</th><th>p50 ms</th><th>p99 ms</th><th>p99 x empty</th><th>backlog at end</th><th>outbox at end</th><th>backlog max</th><th>growth /s</th><th>to zero s</th><th>server CPU µs/req</th><th>generator CPU µs/req</th></tr>
{{range .R.Results}}{{if .Path}}<tr><td>{{.Strategy}}</td><td>{{.Path.Name}}</td><td>{{.Path.Code}}</td><td>{{.Path.Answers}}</td><td{{if .Path.Other}} class="bad"{{end}}>{{.Path.Other}}</td><td>{{f0 .Path.RPS}}</td><td>{{ratio2 .Path.XEmpty}}</td><td>{{f0 .Path.EmptyRPS}}</td>
<td>{{f2 .P50Ms}}</td><td>{{f2 .P99Ms}}</td><td>{{ratio2 .Path.P99XEmpty}}</td>
{{if .Path.BacklogMeasured}}<td>{{.Path.BacklogAtEnd}}</td><td>{{.Path.OutboxAtEnd}}</td><td>{{.Path.BacklogMax}}</td><td>{{f0 .Path.BacklogGrowthPerS}}</td><td>{{if .Path.DrainedToZero}}{{.Path.DrainToZeroS}}{{else}}<span class="bad">not drained</span>{{end}}</td>{{else}}<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td>{{end}}
{{with .ProcessCPU}}<td>{{f0 .ServerUsPerReq}}{{if .SameProcess}} (with the generator){{end}}</td><td>{{if .SameProcess}}-{{else}}{{f0 .GeneratorUsPerReq}}{{end}}</td>{{else}}<td>-</td><td>-</td>{{end}}</tr>
{{end}}{{end}}</table></div>
<p class="small">purchase: a sale with stock for every request, each request a new buyer's first click, so every answer should be accepted;
sold-out: a sale sold out before the run, every answer should be sold_out. answers and other answers count every answer after the warm-up, as the requests above do (other answers:
everything else, errors included); req/s counts only that answer in the measured window; x empty: over the empty handler's req/s and p99 in this run. Backlog: reservations accepted by the gate and
not yet decided by the database (the outbox is part of it) when the last answer came, the most sampled, and the time from the last answer until it was zero
(none for the database strategies: they commit before answering). CPU per request from /proc/&lt;pid&gt;/stat: with -target the server's
process and the generator's apart; in-process they are one process.</p>{{end}}
{{range .R.Setup.Notes}}<p class="small">Note: {{.}}</p>{{end}}
<h2>Latency distribution</h2>
{{.Percentiles}}
<h2>Throughput over time</h2>
{{.Throughput}}
{{if .Backlog}}<h2>Pipeline backlog</h2>
<p class="small">Reservations accepted by the Redis gate and not yet decided by the database, sampled every 100 ms from the start
of the warm-up: bounded when the consumer keeps up with the gate.</p>
{{.Backlog}}{{end}}
<h2>Per strategy</h2>
<div class="panels">
{{range .Panels}}<div class="panel"><h3>{{.Name}} {{if .OK}}<span class="ok small">invariants hold</span>{{else}}<span class="bad small">VIOLATED</span>{{end}}</h3>
<div class="small">{{.Requests}} requests, {{f0 .RPS}} req/s, p50 {{f2 .P50}} ms, p99 {{f2 .P99}} ms, p99.9 {{f2 .P999}} ms, {{.Errors}} errors, drained in {{.Drain}} s</div>
{{.Latency}}{{.Throughput}}
<div class="small">answers after the warm-up: {{.Codes}} ({{.Orders}} distinct orders accepted over the whole run)</div>
{{range .Violations}}<div class="bad small">{{.}}</div>{{end}}
</div>
{{end}}</div>{{end}}
</body></html>
`))

// chart geometry
type frame struct {
	w, h                     float64
	left, right, top, bottom float64
}

func (f frame) pw() float64 { return f.w - f.left - f.right }
func (f frame) ph() float64 { return f.h - f.top - f.bottom }

type tick struct {
	at    float64 // in axis units (already transformed for log axes)
	label string
}

func svgOpen(b *strings.Builder, fr frame, title string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img"><title>%s</title>`,
		fr.w, fr.h, fr.w, fr.h, html.EscapeString(title))
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fcfcfc" stroke="#ccc"/>`, fr.left, fr.top, fr.pw(), fr.ph())
}

// axes draws grid lines and tick labels; x and y map axis units to pixels.
func axes(b *strings.Builder, fr frame, xt, yt []tick, x, y func(float64) float64, xlabel, ylabel string) {
	for _, t := range xt {
		px := x(t.at)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`, px, fr.top, px, fr.top+fr.ph())
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, px, fr.top+fr.ph()+14, html.EscapeString(t.label))
	}
	for _, t := range yt {
		py := y(t.at)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`, fr.left, py, fr.left+fr.pw(), py)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, fr.left-4, py+4, html.EscapeString(t.label))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, fr.left+fr.pw()/2, fr.h-4, html.EscapeString(xlabel))
	fmt.Fprintf(b, `<text transform="translate(12 %.1f) rotate(-90)" text-anchor="middle">%s</text>`, fr.top+fr.ph()/2, html.EscapeString(ylabel))
}

func polyline(b *strings.Builder, pts [][2]float64, color string, dash bool) {
	if len(pts) == 0 {
		return
	}
	var sb strings.Builder
	for i, p := range pts {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%.1f,%.1f", p[0], p[1])
	}
	d := ""
	if dash {
		d = ` stroke-dasharray="5 4"`
	}
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>`, color, d, sb.String())
}

func legend(b *strings.Builder, fr frame, runs []chartRun) {
	for i, r := range runs {
		x, y := fr.left+8, fr.top+14+float64(i)*15
		d := ""
		if r.dash {
			d = ` stroke-dasharray="5 4"`
		}
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`, x, y-4, x+18, y-4, r.color, d)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f">%s</text>`, x+22, y, html.EscapeString(r.name))
	}
}

// logTicks returns powers of ten (and their 2x, 5x when the range is
// short) covering [lo, hi] (values, not logs), labelled with format.
func logTicks(lo, hi float64, format func(float64) string) []tick {
	var out []tick
	span := math.Log10(hi) - math.Log10(lo)
	mult := []float64{1}
	if span < 3 {
		mult = []float64{1, 2, 5}
	}
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range mult {
			v := m * math.Pow(10, e)
			if v >= lo*0.999 && v <= hi*1.001 {
				out = append(out, tick{at: math.Log10(v), label: format(v)})
			}
		}
	}
	return out
}

func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%gms", v)
	}
	return fmt.Sprintf("%gµs", v*1000)
}

// percentileChart draws latency against percentile, the tail stretched:
// x = log10(1 / (1 - p)), so 90, 99, 99.9 ... are evenly spaced.
func percentileChart(runs []chartRun) string {
	fr := frame{w: 960, h: 360, left: 64, right: 16, top: 12, bottom: 36}
	const maxNines = 5.0 // 99.999
	px := func(p float64) float64 {
		if p >= 100 {
			return maxNines
		}
		return min(math.Log10(100/(100-p)), maxNines)
	}
	lo, hi := math.Inf(1), 0.0
	curves := make([][]CurvePoint, len(runs))
	for i, r := range runs {
		curves[i] = PercentileCurve(r.run.Latency)
		for _, c := range curves[i] {
			v := max(durationMs(c.Value), 0.001)
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	var b strings.Builder
	svgOpen(&b, fr, "latency by percentile")
	if hi == 0 {
		b.WriteString(`</svg>`)
		return b.String()
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	x := func(u float64) float64 { return fr.left + u/maxNines*fr.pw() }
	y := func(u float64) float64 {
		return fr.top + fr.ph() - (u-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*fr.ph()
	}
	var xt []tick
	for _, p := range []float64{0, 90, 99, 99.9, 99.99, 99.999} {
		xt = append(xt, tick{at: px(p), label: fmt.Sprintf("p%g", p)})
	}
	axes(&b, fr, xt, logTicks(lo, hi, msLabel), x, y, "percentile (tail stretched)", "latency")
	for i, r := range runs {
		var pts [][2]float64
		for _, c := range curves[i] {
			pts = append(pts, [2]float64{x(px(c.Percentile)), y(math.Log10(max(durationMs(c.Value), 0.001)))})
		}
		polyline(&b, pts, r.color, r.dash)
	}
	legend(&b, fr, runs)
	b.WriteString(`</svg>`)
	return b.String()
}

// throughputChart draws answers per second over the run, per timeline bucket.
func throughputChart(runs []chartRun, w, h float64) string {
	fr := frame{w: w, h: h, left: 64, right: 16, top: 12, bottom: 36}
	var tmax, ymax float64
	for _, r := range runs {
		if len(r.run.Timeline) > 0 {
			tmax = max(tmax, r.run.Timeline[len(r.run.Timeline)-1].At.Seconds())
		}
		for _, p := range rates(r.run) {
			ymax = max(ymax, p[1])
		}
	}
	var b strings.Builder
	svgOpen(&b, fr, "throughput over time")
	if tmax == 0 || ymax == 0 {
		b.WriteString(`</svg>`)
		return b.String()
	}
	ystep := niceStep(ymax / 5)
	ymax = math.Ceil(ymax/ystep) * ystep
	xstep := niceStep(tmax / 8)
	x := func(s float64) float64 { return fr.left + s/tmax*fr.pw() }
	y := func(v float64) float64 { return fr.top + fr.ph() - v/ymax*fr.ph() }
	var xt, yt []tick
	for s := 0.0; s <= tmax+1e-9; s += xstep {
		xt = append(xt, tick{at: s, label: fmt.Sprintf("%gs", s)})
	}
	for v := 0.0; v <= ymax+1e-9; v += ystep {
		yt = append(yt, tick{at: v, label: fmt.Sprintf("%g", v)})
	}
	axes(&b, fr, xt, yt, x, y, "time since start", "answers/s")
	for _, r := range runs {
		var pts [][2]float64
		for _, p := range rates(r.run) {
			pts = append(pts, [2]float64{x(p[0]), y(p[1])})
		}
		polyline(&b, pts, r.color, r.dash)
	}
	legend(&b, fr, runs)
	b.WriteString(`</svg>`)
	return b.String()
}

// rates returns (bucket end s, answers/s) for each timeline bucket.
func rates(r *Result) [][2]float64 {
	var out [][2]float64
	var prev time.Duration
	for _, p := range r.Timeline {
		width := (p.At - prev).Seconds()
		prev = p.At
		out = append(out, [2]float64{p.At.Seconds(), float64(p.Completed) / width})
	}
	return out
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= raw {
			return m * e
		}
	}
	return 10 * e
}

// histogramHeadroom keeps the tallest histogram bar this far (as a ratio)
// below the top of the chart.
const histogramHeadroom = 1.05

// histogramChart draws how many requests took how long: 30 bars of equal
// width on a logarithmic latency axis spanning the run's fastest to slowest.
func histogramChart(r chartRun) string {
	fr := frame{w: 460, h: 200, left: 56, right: 10, top: 10, bottom: 34}
	h := r.run.Latency
	var b strings.Builder
	svgOpen(&b, fr, "latency histogram of "+r.name)
	if h.TotalCount() == 0 {
		b.WriteString(`</svg>`)
		return b.String()
	}
	const nb = 30
	lo := math.Log10(float64(max(h.Min(), 1))) - 0.01
	hi := math.Log10(float64(max(h.Max(), 2))) + 0.01
	hi = max(hi, lo+0.1) // at least a quarter of a decade wide
	counts := make([]int64, nb)
	for _, bar := range h.Distribution() {
		if bar.Count == 0 {
			continue
		}
		mid := float64(bar.From+bar.To) / 2
		i := int((math.Log10(max(mid, 1)) - lo) / (hi - lo) * nb)
		counts[min(max(i, 0), nb-1)] += bar.Count
	}
	var cmax int64
	for _, c := range counts {
		cmax = max(cmax, c)
	}
	// The count axis ends at the first round value above the tallest bar
	// (with a little headroom), so that bar is drawn whole below a label.
	step := max(niceStep(float64(cmax)/4), 1) // whole requests
	ymax := math.Ceil(float64(cmax)*histogramHeadroom/step) * step
	// microseconds on a log axis, labelled in ms
	x := func(u float64) float64 { return fr.left + (u-lo)/(hi-lo)*fr.pw() }
	y := func(v float64) float64 { return fr.top + fr.ph() - v/ymax*fr.ph() }
	xt := latencyTicks(math.Pow(10, lo), math.Pow(10, hi))
	var yt []tick
	for v := 0.0; v <= ymax+1e-9; v += step {
		yt = append(yt, tick{at: v, label: fmt.Sprintf("%g", v)})
	}
	axes(&b, fr, xt, yt, x, y, "latency", "requests")
	w := (hi - lo) / nb
	for i, c := range counts {
		if c == 0 {
			continue
		}
		x0, x1 := x(lo+float64(i)*w), x(lo+float64(i+1)*w)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" opacity="0.8"><title>%d requests</title></rect>`,
			x0+0.5, y(float64(c)), max(x1-x0-1, 1), fr.top+fr.ph()-y(float64(c)), r.color, c)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// latencyTicks labels a latency axis of microseconds (log scale) from lo to
// hi: powers of ten and their 2x, 5x over a wide range, evenly spaced
// round values over a narrow one.
func latencyTicks(lo, hi float64) []tick {
	label := func(us float64) string { return msLabel(us / 1000) }
	if math.Log10(hi)-math.Log10(lo) >= 0.7 {
		return logTicks(lo, hi, label)
	}
	step := niceStep((hi - lo) / 4)
	var out []tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		out = append(out, tick{at: math.Log10(v), label: label(v)})
	}
	return out
}

// series is one line of lineChart: (x, y) in data units.
type series struct {
	name, color string
	pts         [][2]float64
}

// lineChart draws series on linear axes starting at zero.
func lineChart(title string, ss []series, xlabel, ylabel string, w, h float64) string {
	fr := frame{w: w, h: h, left: 64, right: 16, top: 12, bottom: 36}
	var xmax, ymax float64
	for _, s := range ss {
		for _, p := range s.pts {
			xmax, ymax = max(xmax, p[0]), max(ymax, p[1])
		}
	}
	var b strings.Builder
	svgOpen(&b, fr, title)
	if xmax == 0 {
		b.WriteString(`</svg>`)
		return b.String()
	}
	ymax = max(ymax, 1)
	ystep := niceStep(ymax / 5)
	ymax = math.Ceil(ymax/ystep) * ystep
	xstep := niceStep(xmax / 8)
	x := func(v float64) float64 { return fr.left + v/xmax*fr.pw() }
	y := func(v float64) float64 { return fr.top + fr.ph() - v/ymax*fr.ph() }
	var xt, yt []tick
	for v := 0.0; v <= xmax+1e-9; v += xstep {
		xt = append(xt, tick{at: v, label: fmt.Sprintf("%gs", v)})
	}
	for v := 0.0; v <= ymax+1e-9; v += ystep {
		yt = append(yt, tick{at: v, label: fmt.Sprintf("%g", v)})
	}
	axes(&b, fr, xt, yt, x, y, xlabel, ylabel)
	var runs []chartRun
	for _, s := range ss {
		var pts [][2]float64
		for _, p := range s.pts {
			pts = append(pts, [2]float64{x(p[0]), y(p[1])})
		}
		polyline(&b, pts, s.color, false)
		runs = append(runs, chartRun{name: s.name, color: s.color})
	}
	legend(&b, fr, runs)
	b.WriteString(`</svg>`)
	return b.String()
}

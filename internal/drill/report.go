package drill

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText writes the report as tables: the phases, the faults, the
// checks and the verdict.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "drill %s against %s, %s\n\n", orDash(r.Name), r.Target, r.Started.Format("2006-01-02 15:04:05 UTC"))
	fmt.Fprintln(tw, "phase\tstart\tfor\trate/s\tanswered\terrors\tok/s\tp50 ms\tp99 ms\tmax ms\t")
	for _, p := range r.Phases {
		mark := ""
		if p.Disturbed {
			mark = " (fault)"
		}
		fmt.Fprintf(tw, "%s%s\t%v\t%v\t%g\t%d\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t\n", p.Name, mark, p.Start.D().Round(100e6), p.For.D(), p.Rate,
			p.Requests, p.Errors, p.Throughput, p.P50Ms, p.P99Ms, p.MaxMs)
	}
	if len(r.Faults) > 0 {
		fmt.Fprintln(tw, "\nfault\tat\ttook\texit\trecovery\t")
		for _, f := range r.Faults {
			rec := f.Recovery.D().String()
			if !f.Recovered {
				rec = "not by the end"
			}
			fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%s\t\n", f.Name, f.At.D(), f.Took.D().Round(1e6), f.Exit, rec)
		}
	}
	fmt.Fprintln(tw, "\ncheck\twant\tgot\t\t")
	for _, c := range r.Checks {
		ok := "ok"
		if !c.OK {
			ok = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", c.Name, c.Want, c.Got, ok)
	}
	verdict := "PASSED"
	if !r.Passed {
		verdict = "FAILED"
	}
	fmt.Fprintf(tw, "\n%s: %d requests, %d errors, answers %v\n", verdict, r.Requests, r.Errors, r.Codes)
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteHTML writes the report as a page: the answers and errors per second
// with the faults marked, and the tables of WriteText.
func (r *Report) WriteHTML(w io.Writer) error {
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		return err
	}
	return page.Execute(w, map[string]any{"R": r, "Text": text.String(), "Plot": plot(r)})
}

// plot draws the timeline as an SVG: answered per second (a line), errors
// per second (bars), each fault a vertical line with its name.
func plot(r *Report) template.HTML {
	const wd, ht, pad = 900.0, 260.0, 40.0
	n := max(len(r.Seconds), 1)
	var top int64 = 1
	for _, s := range r.Seconds {
		top = max(top, s.Answered)
	}
	x := func(sec float64) float64 { return pad + (wd-2*pad)*sec/float64(n) }
	y := func(v int64) float64 { return ht - pad - (ht-2*pad)*float64(v)/float64(top) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %g %g" role="img" aria-label="answers and errors per second">`, wd, ht)
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#888"/>`, pad, ht-pad, wd-pad, ht-pad)
	fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="11">%d/s</text>`, 2.0, pad, top)
	for _, s := range r.Seconds {
		if s.Errors > 0 {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#d33"><title>%ds: %d errors</title></rect>`,
				x(float64(s.At)), y(s.Errors), x(1)-pad, ht-pad-y(s.Errors), s.At, s.Errors)
		}
	}
	var pts []string
	for _, s := range r.Seconds {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(s.At)+0.5), y(s.Answered)))
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#27c" stroke-width="2" points="%s"/>`, strings.Join(pts, " "))
	for _, f := range r.Faults {
		fx := x(f.At.D().Seconds())
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#a0a" stroke-dasharray="4 3"/>`, fx, pad/2, fx, ht-pad)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" font-size="11" fill="#a0a">%s</text>`, fx+3, pad/2+10, template.HTMLEscapeString(f.Name))
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="11">0s</text><text x="%g" y="%g" font-size="11" text-anchor="end">%ds</text>`, pad, ht-pad+14, wd-pad, ht-pad+14, n)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

var page = template.Must(template.New("drill").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>flashsale drill {{.R.Name}}</title>
<style>body{font-family:system-ui,sans-serif;margin:1rem;max-width:960px}svg{width:100%;height:auto}
pre{overflow-x:auto;background:#f6f6f6;padding:.5rem}.pass{color:#080}.fail{color:#c00}</style></head>
<body><h1>Drill {{.R.Name}}: {{if .R.Passed}}<span class="pass">passed</span>{{else}}<span class="fail">failed</span>{{end}}</h1>
<p>Against {{.R.Target}}, {{.R.Started.Format "2006-01-02 15:04:05 UTC"}}. Blue: answers per second; red: errors per second; dashed: faults.</p>
{{.Plot}}
<pre>{{.Text}}</pre>
</body></html>
`))

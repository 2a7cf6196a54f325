package bench

import (
	"bufio"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/loadgen"
)

// setup describes the run for the report.
func (b *bench) setup(args, strategies []string) loadgen.Setup {
	o := b.o
	s := loadgen.Setup{
		Scenario: o.Scenario, Paths: b.paths, Mode: loadgen.Mode(o.Mode), Buyers: o.Buyers, DurationS: o.Duration.Seconds(), WarmupS: o.Warmup.Seconds(),
		RequestLimit: o.Requests, Stock: o.Stock, SKUs: 1, PerUserLimit: o.Limit, Strategies: strategies,
		Target:  "in-process (a fresh flashsale per strategy: own database, Redis prefix, embedded JetStream)",
		Started: time.Now().UTC(), Command: commandLine(redactArgs(args)),
		Machine: loadgen.Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), OS: runtime.GOOS, Arch: runtime.GOARCH,
			Go: runtime.Version(), CPUModel: cpuModel(), Note: o.MachineNote},
		Server: b.svc.Settings,
	}
	if o.Mode == string(loadgen.Open) {
		s.Rate, s.Buyers = o.Rate, o.MaxInFlight
	}
	if o.Scenario == loadgen.Many && len(b.paths) == 0 {
		s.SKUs = o.SKUs
	}
	if len(b.paths) > 0 {
		s.Scenario, s.PurchaseStock = strings.Join(b.paths, ","), o.PurchaseStock
		s.SKUs = len(b.paths)
	}
	if o.Target != "" {
		s.Target = o.Target
		s.Server = nil
	}
	s.Workers, s.Sources = o.Workers, o.Sources
	return s
}

// commandLine renders args as a shell command line of flashsale bench.
func commandLine(args []string) string {
	out := []string{"flashsale", "bench"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$&|;<>*?()[]{}`\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// redactArgs hides secrets in a command line: token and secret values,
// passwords in URLs.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	hideNext := false
	for i, a := range args {
		if hideNext {
			out[i], hideNext = "REDACTED", false
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		secret := strings.HasPrefix(a, "-") && (strings.Contains(name, "token") || strings.Contains(name, "secret"))
		switch {
		case secret && hasVal:
			out[i] = a[:len(a)-len(val)] + "REDACTED"
		case secret:
			out[i], hideNext = a, true
		default:
			out[i] = redactURL(a)
		}
	}
	return out
}

func redactURL(s string) string {
	prefix, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	userinfo, host, ok := strings.Cut(rest, "@")
	if !ok {
		return s
	}
	if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
		return prefix + "://" + user + ":REDACTED@" + host
	}
	return s
}

// cpuModel returns the CPU's model name on Linux ("" elsewhere).
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/canary"
	"github.com/flashsale/flashsale/internal/fleet"
	"github.com/flashsale/flashsale/internal/invariant"
)

// canaryFlags are the settings flashsale canary takes from the service's
// configuration: where the sales' database and Redis are (the invariant
// check, the trial's state for the dashboard).
var canaryFlags = []string{"database-url", "redis-url", "redis-prefix"}

// runCanary runs a canary trial (internal/canary) and prints its report.
func runCanary(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		canaryURLs, stableURLs, steps, socket, mapPath string
		stepDur                                        time.Duration
		asJSON                                         bool
		th                                             = canary.DefaultThresholds
	)
	cfg, err := parseConfig("canary", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&canaryURLs, "canary", "", "comma-separated base `URLs` of the canary group's instances (http://host:port; required)")
		fs.StringVar(&stableURLs, "stable", "", "comma-separated base `URLs` of the stable group's instances (required)")
		fs.StringVar(&steps, "steps", "5,25,50,100", "the canary's shares of buyers, in percent, one step each")
		fs.DurationVar(&stepDur, "step-duration", 2*time.Minute, "how long each share is watched")
		fs.StringVar(&socket, "haproxy-socket", "/var/run/haproxy/admin.sock", "HAProxy's runtime API: a unix socket path or host:port")
		fs.StringVar(&mapPath, "haproxy-map", "/usr/local/etc/haproxy/canary.map", "the canary map HAProxy's configuration reads the share from")
		fs.Float64Var(&th.MaxErrorRateDelta, "max-error-rate-delta", th.MaxErrorRateDelta, "how much the canary's 5xx share of buyer requests may exceed stable's (0.01: one point)")
		fs.Float64Var(&th.MaxP99Ratio, "max-p99-ratio", th.MaxP99Ratio, "how many times stable's p99 of POST /api/v1/orders the canary's may be")
		fs.DurationVar(&th.P99Floor, "p99-floor", th.P99Floor, "a canary p99 at or below this always passes (sub-floor differences are noise)")
		fs.Int64Var(&th.MaxShadowMismatches, "max-shadow-mismatches", th.MaxShadowMismatches, "shadow decisions of the canary that may differ from the live path's in a step")
		fs.Int64Var(&th.MaxDeadLetters, "max-dead-letters", th.MaxDeadLetters, "reservations that may be dead-lettered in a step, by any instance (consumers of both groups share the stream)")
		fs.Int64Var(&th.MinRequests, "min-requests", th.MinRequests, "fewest buyer requests the canary must serve in a step to be judged")
		fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	})
	if err != nil {
		return err
	}
	c, err := checkCanaryArgs(canaryURLs, stableURLs, steps, stepDur, th)
	if err != nil {
		return err
	}
	if socket == "" || mapPath == "" {
		return errors.New("-haproxy-socket and -haproxy-map are required: the share is set through HAProxy's runtime API")
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	a, err := openForCheck(octx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer a.close()
	c.SetShare = canary.ShareSetter(socket, mapPath)
	c.State = recordTrial(fleet.New(a.redis, cfg.RedisPrefix))
	c.Check = func(ctx context.Context) ([]string, error) { return checkSales(ctx, a) }
	if !asJSON {
		c.Progress = func(s canary.StepReport) {
			verdict := "pass"
			if !s.Passed {
				verdict = "FAIL: " + strings.Join(s.Reasons, "; ")
			}
			fmt.Fprintf(stderr, "canary: step %d%%: %d canary / %d stable requests: %s\n", s.Share, s.Canary.Requests, s.Stable.Requests, verdict)
		}
	}
	rep, runErr := canary.Run(ctx, c)
	if asJSON {
		err = canary.WriteJSON(stdout, rep)
	} else {
		err = canary.WriteText(stdout, rep)
	}
	if runErr != nil {
		return runErr
	}
	if err != nil {
		return err
	}
	if rep.Outcome != "promoted" {
		return errCanaryAborted
	}
	return nil
}

// recordTrial returns a canary.Config.State that writes the trial's state
// where the dashboard reads it.
func recordTrial(reg *fleet.Registry) func(context.Context, canary.State) error {
	return func(ctx context.Context, s canary.State) error {
		return reg.SetCanary(ctx, fleet.Canary{Share: s.Share, State: s.State, Steps: s.Steps, Step: s.Step, Reason: s.Reason,
			StartedAt: s.StartedAt, UpdatedAt: time.Now().UTC()})
	}
}

// errCanaryAborted: the report is printed; the exit status says aborted.
var errCanaryAborted = errors.New("canary trial aborted (the report above says why); the canary's share is 0")

// checkCanaryArgs checks the trial's flags and returns its configuration.
func checkCanaryArgs(canaryURLs, stableURLs, steps string, stepDur time.Duration, th canary.Thresholds) (canary.Config, error) {
	var c canary.Config
	var err error
	if c.Canary, err = baseURLs("canary", canaryURLs); err != nil {
		return c, err
	}
	if c.Stable, err = baseURLs("stable", stableURLs); err != nil {
		return c, err
	}
	prev := 0
	for _, s := range strings.Split(steps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 100 || n <= prev {
			return c, fmt.Errorf("-steps: %q: want rising percentages 1..100 separated by commas, such as 5,25,50,100", steps)
		}
		c.Steps, prev = append(c.Steps, n), n
	}
	if stepDur < time.Second {
		return c, fmt.Errorf("-step-duration must be at least 1s, got %s", stepDur)
	}
	if th.MaxErrorRateDelta < 0 || th.MaxP99Ratio < 1 || th.MaxShadowMismatches < 0 || th.MaxDeadLetters < 0 || th.MinRequests < 0 || th.P99Floor < 0 {
		return c, errors.New("thresholds: -max-error-rate-delta, -p99-floor, -max-shadow-mismatches, -max-dead-letters and -min-requests must be 0 or more, -max-p99-ratio 1 or more")
	}
	c.StepDuration, c.Thresholds = stepDur, th
	return c, nil
}

// baseURLs parses a comma-separated list of http(s) base URLs.
func baseURLs(flagName, list string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("-%s: %q is not a base URL such as http://10.0.0.5:8080", flagName, s)
		}
		out = append(out, strings.TrimSuffix(s, "/"))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-%s is required: the %s group's instances, such as http://10.0.0.5:8080", flagName, flagName)
	}
	return out, nil
}

// checkSales checks the invariants of every sale that has not ended, from
// the database (and Redis' in-flight reservations), while it sells.
func checkSales(ctx context.Context, a *app) ([]string, error) {
	skus, err := a.store.SKUs(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	now := time.Now()
	for _, s := range skus {
		if !s.EndsAt.IsZero() && !now.Before(s.EndsAt) {
			continue
		}
		r, err := invariant.Check(ctx, a.store, a.gate, s.ID, nil, false)
		if err != nil {
			return out, err
		}
		for _, v := range r.Violations {
			out = append(out, s.ID+": "+v)
		}
	}
	return out, nil
}

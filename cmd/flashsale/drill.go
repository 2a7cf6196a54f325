package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/drill"
	"github.com/flashsale/flashsale/internal/loadgen"
)

const drillUsage = `flashsale drill [flags] FILE: a drill against a running flashsale.

FILE (JSON) gives the load phases (each an open-loop rate for a time), the
faults (shell commands run at named moments, e.g. killing a Redis primary)
and the pass criteria (p99 of the phases no fault touched, an error
budget, the recovery time after each fault). After the phases it waits for
the sale to drain and checks the invariants from the database and Redis
(give the target's -database-url, -redis-url and -redis-prefix, and its
-admin-token and -user-token-secret). It prints a report, and exits
non-zero when a criterion failed. docs/drills.md describes the file.

Flags:`

// drillFlags are the service flags the drill reads: where the target's
// stores are, and its tokens.
var drillFlags = []string{"database-url", "redis-url", "redis-prefix", "admin-token", "user-token-secret", "log-level", "log-format"}

// errDrillFailed is returned when the drill ran and a criterion failed.
var errDrillFailed = errors.New("drill failed: see the checks above")

func runDrill(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var target, jsonOut, htmlOut, workers, workerToken string
	var conns, sources int
	var quiet, remote bool
	// The file may come first: flashsale drill FILE -target ...
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		args = append(append([]string(nil), args[1:]...), args[0])
	}
	cfg, err := parseConfig("drill", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.Usage = func() {
			fmt.Fprintln(fs.Output(), drillUsage)
			fs.PrintDefaults()
		}
		fs.StringVar(&target, "target", "", "base `URL` of the deployment to drill (its load balancer or an instance; required)")
		fs.StringVar(&jsonOut, "json", "", "write the report as JSON to `FILE`")
		fs.StringVar(&htmlOut, "html", "", "write the report as an HTML page with a plot to `FILE`")
		fs.IntVar(&conns, "connections", 512, "most keep-alive connections to the target")
		fs.BoolVar(&quiet, "quiet", false, "no progress lines")
		fs.BoolVar(&remote, "remote-target", false, "accept a -target that is not on this machine (a deployment of yours)")
		fs.StringVar(&workers, "workers", "", "comma-separated `URLS` of load workers (flashsale bench -worker on each load machine): each phase's rate is split between them, each part started at the phase's moment")
		fs.StringVar(&workerToken, "worker-token", "", "the token the workers were started with (env FLASHSALE_WORKER_TOKEN)")
		fs.IntVar(&sources, "sources", 0, "spread the connections to a loopback target over the source addresses 127.0.0.1 to 127.0.0.`N` (the workers' too)")
	})
	if err != nil {
		return err
	}
	if len(cfg.Args) != 1 {
		return errors.New("drill: give the drill file: flashsale drill [flags] FILE (flashsale drill -h)")
	}
	if target == "" {
		return errors.New("drill: -target is required: the base URL of the deployment to drill")
	}
	if cfg.AdminToken == "" || cfg.UserTokenSecret == "" {
		return errors.New("drill: the target's admin token and user token secret are required (-admin-token, -user-token-secret or FLASHSALE_ADMIN_TOKEN, FLASHSALE_USER_TOKEN_SECRET): the drill creates its sale and signs its buyers' tokens")
	}
	fh, err := os.Open(cfg.Args[0])
	if err != nil {
		return fmt.Errorf("drill: %w", err)
	}
	f, err := drill.Parse(fh)
	fh.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.Args[0], err)
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	a, err := openForCheck(octx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer a.close()
	target = strings.TrimRight(target, "/")
	if workerToken == "" {
		workerToken = getenv("FLASHSALE_WORKER_TOKEN")
	}
	var co *loadgen.Coordinator
	if workers != "" {
		list, err := loadgen.ParseWorkers(workers)
		if err != nil {
			return fmt.Errorf("drill: %w", err)
		}
		if workerToken == "" {
			return errors.New("drill: -workers needs -worker-token (or FLASHSALE_WORKER_TOKEN), the token the workers were started with")
		}
		co = &loadgen.Coordinator{Workers: list, Token: workerToken}
	}
	cl, err := loadgen.NewClientWith(target, cfg.AdminToken, cfg.UserTokenSecret, conns, loadgen.ClientOptions{Remote: remote, Sources: sources})
	if err != nil {
		if !remote {
			err = fmt.Errorf("drill: %w (a deployment of yours elsewhere: -remote-target)", err)
		}
		return err
	}
	defer cl.Close()
	var mu sync.Mutex
	progress := func(s string) {
		if quiet {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stderr, "drill: %s\n", s)
	}
	env := drill.Env{Client: cl, Checker: loadgen.Checker{DB: a.store, Gate: a.gate, DrainTimeout: 2 * time.Minute},
		Redis: a.redis, RunID: fmt.Sprintf("d%x", time.Now().UnixNano()&0xffffffffff), Progress: progress,
		Workers: co, Target: target, UserSecret: cfg.UserTokenSecret, Sources: sources}
	progress(fmt.Sprintf("%s: %d phases over %v, %d faults, against %s", cfg.Args[0], len(f.Phases), f.Length(), len(f.Faults), target))
	rep, err := drill.Run(ctx, f, env)
	if err != nil {
		return err
	}
	if err := rep.WriteText(stdout); err != nil {
		return err
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer) error
	}{{jsonOut, rep.WriteJSON}, {htmlOut, rep.WriteHTML}} {
		if out.path == "" {
			continue
		}
		if err := writeFile(out.path, out.write); err != nil {
			return err
		}
	}
	if !rep.Passed {
		return errDrillFailed
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Command flashsale is the flash-sale inventory service: serve, migrate,
// demo, token, version and the other subcommands (see `flashsale help`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "flashsale:", err)
		}
		os.Exit(1)
	}
}

// errUsage is a usage error already explained on stderr (exit status 1).
var errUsage = errors.New("usage")

// parseFlags parses args into fs. -h prints fs.Usage and returns
// flag.ErrHelp (run turns it into success); a bad flag prints one line
// saying what is wrong, in the words of the environment variables'
// messages, and where the flags are listed, and returns errUsage. The
// whole help is printed only when asked for.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out, help := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = help
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		help()
		return flag.ErrHelp
	}
	fmt.Fprintf(out, "flashsale %s: %s\nRun 'flashsale %s -h' for its flags.\n", fs.Name(), flagErrorText(fs, err), fs.Name())
	return errUsage
}

// badFlagValue is how the flag package reports a value its flag refuses.
var badFlagValue = regexp.MustCompile(`^invalid (?:boolean )?value "((?:[^"\\]|\\.)*)" for (?:flag )?-([^:]+): (.*)$`)

// flagErrorText rewords the flag package's error: a value of the wrong kind
// reads as the environment's message does (-apply-batch: "x" is not a
// whole number); a custom flag's own reason is kept.
func flagErrorText(fs *flag.FlagSet, err error) string {
	m := badFlagValue.FindStringSubmatch(err.Error())
	if m == nil {
		return err.Error()
	}
	value, name, reason := m[1], m[2], m[3]
	if v, uerr := strconv.Unquote(`"` + value + `"`); uerr == nil {
		value = v
	}
	if f := fs.Lookup(name); f != nil && (reason == "parse error" || reason == "value out of range") {
		if g, ok := f.Value.(flag.Getter); ok {
			switch g.Get().(type) {
			case int, int64, uint, uint64:
				reason = "is not a whole number"
				if strings.HasSuffix(m[3], "out of range") {
					reason = "is out of range"
				}
			case float64:
				reason = "is not a number"
			case bool:
				reason = "is not true or false"
			case time.Duration:
				reason = "is not a duration (e.g. 90s, 15m)"
			}
			return fmt.Sprintf("-%s: %q %s", name, value, reason)
		}
	}
	return fmt.Sprintf("-%s: %q: %s", name, value, reason)
}

// noArguments is the error of a subcommand that takes no arguments and was
// given some.
func noArguments(fs *flag.FlagSet) error {
	return fmt.Errorf("%s takes no arguments, got %q (flags go before them: flashsale %s -h lists them)", fs.Name(), fs.Args(), fs.Name())
}

// commandUsage is the -h text of a subcommand: what it does and its flags.
func commandUsage(fs *flag.FlagSet, name string) {
	w := fs.Output()
	fmt.Fprintf(w, "Usage: flashsale %s [flags]\n", name)
	for _, c := range commands() {
		if c.name == name {
			fmt.Fprintf(w, "\n%s\n", c.summary)
		}
	}
	fmt.Fprintln(w, "\nFlags (each falls back to the environment variable it names):")
	fs.PrintDefaults()
}

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the service: HTTP API, relay, consumer (all configuration by flags or FLASHSALE_* variables)", runServe},
		{"migrate", "apply database migrations and exit", runMigrate},
		{"demo", "run the service with a sale in progress: creates a SKU, sends buyers, checks the result", runDemo},
		{"bench", "load test: strategies compared under the same scenario, with baselines, drain and invariant checks", runBench},
		{"reconcile", "run one reconcile pass (Redis vs database) on a running instance and print the report", runReconcile},
		{"dlq", "list, replay or discard dead letters through a running instance's admin API", runDLQ},
		{"drill", "run a drill against a running deployment: load phases, faults at named moments, graded against the file's pass criteria and the invariants", runDrill},
		{"canary", "run a canary trial: raise the canary group's share of buyers in steps (HAProxy runtime API), compare it with the stable group, promote or abort", runCanary},
		{"plan", "size a deployment (Redis primaries and stock buckets, instances, NATS, consumers, database) from a load and measured costs", runPlan},
		{"token", "print a user token (JWT, HS256) signed with FLASHSALE_USER_TOKEN_SECRET", runToken},
		{"version", "print the build: module version, VCS commit, Go version", runVersion},
		{"help", "list the subcommands", nil},
	}
}

// run is the whole program, with its environment passed in (tests call it).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		if len(args) == 0 {
			return errUsage
		}
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] && c.run != nil {
			err := c.run(ctx, args[1:], getenv, stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				return nil // -h: the help was asked for and printed
			}
			return err
		}
	}
	fmt.Fprintf(stderr, "flashsale: unknown subcommand %q\n\n", args[0])
	usage(stderr)
	return errUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "flashsale: a flash-sale inventory service (Redis gate -> NATS JetStream -> PostgreSQL or MySQL/MariaDB)")
	fmt.Fprintln(w, "\nUsage: flashsale <subcommand> [flags]   (flashsale <subcommand> -h for its flags)")
	fmt.Fprintln(w, "\nSubcommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/httpapi"
)

// helpFlags runs `flashsale <cmd> -h` in-process and returns the flag names
// its help lists, and the whole help text.
func helpFlags(t *testing.T, env map[string]string, cmd ...string) ([]string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append(cmd, "-h"), func(k string) string { return env[k] }, &stdout, &stderr)
	if err != nil {
		t.Fatalf("flashsale %v -h: %v (want success)\n%s", cmd, err, stderr.String())
	}
	text := stdout.String() + stderr.String()
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(text, -1) {
		names = append(names, m[1])
	}
	sort.Strings(names)
	return names, text
}

// TestSubcommandFlags: a subcommand that uses a few settings lists only
// those; serve and demo (which run the service) list every one.
func TestSubcommandFlags(t *testing.T) {
	t.Parallel()
	for cmd, want := range map[string][]string{
		"token":     {"ttl", "user", "user-token-secret"},
		"migrate":   {"database-url", "log-format", "log-level"},
		"reconcile": {"admin-token", "json", "url"},
		"dlq":       {"admin-token", "json", "url"},
		"version":   nil,
	} {
		if got, _ := helpFlags(t, nil, cmd); !slices.Equal(got, want) {
			t.Errorf("flashsale %s -h lists %v, want %v", cmd, got, want)
		}
	}
	serve, _ := helpFlags(t, nil, "serve")
	for _, f := range []string{"http-addr", "database-url", "breaker-window", "rate-limit-user", "payment-secret"} {
		if !slices.Contains(serve, f) {
			t.Errorf("serve -h lacks -%s: %v", f, serve)
		}
	}
	demo, _ := helpFlags(t, nil, "demo")
	for _, f := range append(serve, "buyers", "stock", "concurrency", "exit") {
		if !slices.Contains(demo, f) {
			t.Errorf("demo -h lacks -%s", f)
		}
	}
}

// TestSubcommandSettingsFromEnv: a setting a subcommand does not list as a
// flag still comes from its environment variable (token signs with it).
func TestSubcommandSettingsFromEnv(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	env := map[string]string{"FLASHSALE_USER_TOKEN_SECRET": "env-secret"}
	if err := run(context.Background(), []string{"token", "-user", "bob"}, func(k string) string { return env[k] }, &out, &out); err != nil {
		t.Fatal(err)
	}
	if user, err := httpapi.NewUserAuth("env-secret").Verify(strings.TrimSpace(out.String())); err != nil || user != "bob" {
		t.Fatalf("token from $FLASHSALE_USER_TOKEN_SECRET: user %q, %v", user, err)
	}
	out.Reset()
	err := run(context.Background(), []string{"token", "-user", "bob", "-breaker-window", "1s"}, func(string) string { return "" }, &out, &out)
	if !errors.Is(err, errUsage) {
		t.Errorf("token -breaker-window: %v, want a usage error (token has no such flag)", err)
	}
}

// TestHelpHidesSecrets: with every secret setting in the environment, no
// subcommand's -h prints one (secrets say whether they are set; URLs show
// xxxxx for their password).
func TestHelpHidesSecrets(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"FLASHSALE_ADMIN_TOKEN":       "adm-s3cr3t1",
		"FLASHSALE_USER_TOKEN_SECRET": "uts-s3cr3t2",
		"FLASHSALE_PAYMENT_SECRET":    "pay-s3cr3t3",
		"FLASHSALE_DATABASE_URL":      "postgres://flash:dbpw-s3cr3t4@127.0.0.1:5432/flashsale?sslmode=disable",
		"FLASHSALE_REDIS_URL":         "redis://:rpw-s3cr3t5@127.0.0.1:6379/0",
		"FLASHSALE_ALERT_WEBHOOK_URL": "https://hooks.example/services/hook-s3cr3t6",
		"FLASHSALE_NATS_URL":          "nats://u:npw-s3cr3t7@127.0.0.1:4222",
	}
	for _, cmd := range []string{"serve", "demo", "bench", "migrate", "token", "reconcile", "dlq"} {
		_, text := helpFlags(t, env, cmd)
		if strings.Contains(text, "s3cr3t") {
			t.Errorf("flashsale %s -h prints a secret:\n%s", cmd, text)
		}
		if cmd == "serve" {
			for _, want := range []string{"postgres://flash:xxxxx@127.0.0.1:5432", "($FLASHSALE_ADMIN_TOKEN: set, not shown)", "redis://:xxxxx@127.0.0.1:6379/0"} {
				if !strings.Contains(text, want) {
					t.Errorf("serve -h lacks %q:\n%s", want, text)
				}
			}
		}
	}
	for in, want := range map[string]string{
		"mysql://root:pw@127.0.0.1:3306/db":            "mysql://root:xxxxx@127.0.0.1:3306/db",
		"mysql://root@127.0.0.1:3306/db":               "mysql://root@127.0.0.1:3306/db",
		"host=h user=u password=pw dbname=d":           "host=h user=u password=xxxxx dbname=d",
		"host=h password='p w' dbname=d":               "host=h password=xxxxx dbname=d",
		"root:pw@tcp(127.0.0.1:3306)/db":               "root:xxxxx@tcp(127.0.0.1:3306)/db",
		"embedded":                                     "embedded",
		"postgres://postgres@127.0.0.1:5432/flashsale": "postgres://postgres@127.0.0.1:5432/flashsale",
	} {
		if got := hidePassword(in); got != want {
			t.Errorf("hidePassword(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestExitCodes: the built binary exits 0 for -h, --help and version, 1 for
// a bad flag or an unknown subcommand.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"serve", "-h"}, 0},
		{[]string{"token", "--help"}, 0},
		{[]string{"dlq", "-h"}, 0},
		{[]string{"reconcile", "-help"}, 0},
		{[]string{"version"}, 0},
		{[]string{"-h"}, 0},
		{[]string{"migrate", "-no-such-flag"}, 1},
		{[]string{"no-such-command"}, 1},
		{nil, 1},
	} {
		cmd := exec.Command(bin, c.args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code {
			t.Errorf("flashsale %v: exit %d, want %d\n%s", c.args, code, c.code, out)
		}
	}
}

// TestVersion: `flashsale version` names the module version, the commit
// and the Go version ("devel"/"unknown" for a build without VCS stamping).
func TestVersion(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(binary(t), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^flashsale \S+\ncommit \S+( \(modified\))?\ngo1\.\S+\n$`)
	if !re.Match(out) {
		t.Errorf("flashsale version printed %q, want %s", out, re)
	}
}

// TestBuildInfoMetric: /metrics carries flashsale_build_info with the
// running build's labels.
func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded"))
	body := h.do(http.MethodGet, "/metrics", "").Raw
	if v := metricValue(body, "flashsale_build_info", `goversion="`+runtime.Version()+`"`); v != 1 {
		t.Errorf("flashsale_build_info{goversion=%q} = %v, want 1\n", runtime.Version(), v)
	}
	if !regexp.MustCompile(`(?m)^flashsale_build_info\{commit="[^"]+",goversion="[^"]+",version="[^"]+"\} 1$`).MatchString(body) {
		t.Errorf("flashsale_build_info lacks a label: %s", regexp.MustCompile(`(?m)^flashsale_build_info.*$`).FindString(body))
	}
}

package main

import (
	"os/exec"
	"strings"
	"testing"
)

// ensureServicesPlan sources scripts/ensure-services.sh with its ensure_*
// steps replaced by stubs that only print their names, runs main with args
// and returns the steps it took.
func ensureServicesPlan(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	script := `source ../../scripts/ensure-services.sh
for f in ensure_tools ensure_postgres ensure_redis ensure_mariadb; do eval "$f() { echo $f; }"; done
main "$@" 2>/dev/null`
	cmd := exec.Command("bash", append([]string{"-c", script, "ensure-services"}, args...)...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	out, err := cmd.Output()
	return strings.Join(strings.Fields(string(out)), " "), err
}

// TestEnsureServicesModes: make run (--run) ensures only what running needs,
// PostgreSQL and Redis, and neither when the environment points flashsale at
// its own; the default (make test, CI) ensures everything the tests use.
func TestEnsureServicesModes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, nil, "ensure_tools ensure_postgres ensure_redis ensure_mariadb"},
		{[]string{"ENSURE_MARIADB=0"}, nil, "ensure_tools ensure_postgres ensure_redis"},
		{nil, []string{"--run"}, "ensure_postgres ensure_redis"},
		{[]string{"FLASHSALE_DATABASE_URL=mysql://root@127.0.0.1:3306/shop"}, []string{"--run"}, "ensure_redis"},
		{[]string{"FLASHSALE_REDIS_URL=redis://cache:6379/0"}, []string{"--run"}, "ensure_postgres"},
	} {
		got, err := ensureServicesPlan(t, c.env, c.args...)
		if err != nil || got != c.want {
			t.Errorf("env %v, ensure-services.sh %v: ran %q (%v), want %q", c.env, c.args, got, err, c.want)
		}
	}
	if got, err := ensureServicesPlan(t, nil, "--bogus"); err == nil || got != "" {
		t.Errorf("ensure-services.sh --bogus: ran %q (%v), want an error and nothing run", got, err)
	}
}

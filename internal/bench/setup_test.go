package bench

import (
	"strings"
	"testing"
)

// TestRedactsSecrets: the command line in the report shows no token,
// secret or password.
func TestRedactsSecrets(t *testing.T) {
	got := strings.Join(redactArgs([]string{"-admin-token", "tok", "-user-token-secret=sec", "-database-url",
		"postgres://u:pw@127.0.0.1/db", "-buyers", "10"}), " ")
	for _, secret := range []string{"tok", "sec", "pw"} {
		if strings.Contains(got, " "+secret) || strings.Contains(got, "="+secret) || strings.Contains(got, ":"+secret+"@") {
			t.Errorf("%q still shows %q", got, secret)
		}
	}
	if !strings.Contains(got, "-buyers 10") || !strings.Contains(got, "postgres://u:REDACTED@127.0.0.1/db") {
		t.Errorf("redacted too much: %q", got)
	}
	if got, want := commandLine([]string{"-machine-note", "2 cores, it's shared", "-buyers", "10"}),
		`flashsale bench -machine-note '2 cores, it'\''s shared' -buyers 10`; got != want {
		t.Errorf("commandLine = %s, want %s", got, want)
	}
}

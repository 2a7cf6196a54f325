package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/httpapi"
)

// runCLI runs flashsale in-process with env and returns what it printed on
// stderr (plus the error's text, as main prints it) and the error.
func runCLI(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, func(k string) string { return env[k] }, &stdout, &stderr)
	text := stderr.String()
	if err != nil && !errors.Is(err, errUsage) {
		text += "flashsale: " + err.Error() + "\n"
	}
	return text, err
}

// TestBadFlagSaysOneThing: a bad flag value prints one line in the words
// of the environment variable's message and where the flags are, not the
// whole help.
func TestBadFlagSaysOneThing(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"serve", "-apply-batch", "x"}, nil, `flashsale serve: -apply-batch: "x" is not a whole number`},
		{[]string{"serve"}, map[string]string{"FLASHSALE_APPLY_BATCH": "x"}, `flashsale: $FLASHSALE_APPLY_BATCH: "x" is not a whole number`},
		{[]string{"serve", "-drain-delay", "5"}, nil, `flashsale serve: -drain-delay: "5" is not a duration (e.g. 90s, 15m)`},
		{[]string{"serve"}, map[string]string{"FLASHSALE_DRAIN_DELAY": "5"}, `flashsale: $FLASHSALE_DRAIN_DELAY: "5" is not a duration (e.g. 90s, 15m)`},
		{[]string{"serve", "-nats-sync-always=maybe"}, nil, `flashsale serve: -nats-sync-always: "maybe" is not true or false`},
		{[]string{"serve", "-breaker-ratio", "half"}, nil, `flashsale serve: -breaker-ratio: "half" is not a number`},
		{[]string{"token", "-ttl", "1 hour"}, nil, `flashsale token: -ttl: "1 hour" is not a duration (e.g. 90s, 15m)`},
		{[]string{"migrate", "-zork"}, nil, `flashsale migrate: flag provided but not defined: -zork`},
		{[]string{"plan", "-rate", "lots"}, nil, `flashsale plan: -rate: "lots" is not a number`},
	} {
		text, err := runCLI(t, c.env, c.args...)
		if err == nil {
			t.Errorf("%v: no error", c.args)
			continue
		}
		if !strings.Contains(text, c.want) {
			t.Errorf("%v: printed\n%s\nwant %q", c.args, text, c.want)
		}
		if strings.Contains(text, "Usage:") || strings.Count(text, "\n") > 2 {
			t.Errorf("%v: printed more than the error and a pointer to -h:\n%s", c.args, text)
		}
		if errors.Is(err, errUsage) && !strings.Contains(text, "-h' for its flags") {
			t.Errorf("%v: no pointer to -h:\n%s", c.args, text)
		}
	}
}

// TestBadArgumentsSayWhy: subcommands given arguments they do not take, or
// a setting they refuse, say why in one line (no help dump).
func TestBadArgumentsSayWhy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"version", "x"}, `version takes no arguments, got ["x"]`},
		{[]string{"plan", "x"}, `plan takes no arguments, got ["x"]`},
		{[]string{"reconcile", "now"}, `reconcile takes no arguments`},
		{[]string{"dlq"}, "dlq needs an action: list, replay SEQ or discard SEQ"},
		{[]string{"dlq", "bogus"}, `unknown action "bogus": want list, replay SEQ or discard SEQ`},
		{[]string{"dlq", "replay"}, "dlq replay needs one SEQ"},
		{[]string{"dlq", "list", "x"}, "dlq list takes no arguments"},
		{[]string{"dlq", "replay", "abc"}, `SEQ must be a dead letter's sequence number (see dlq list), got "abc"`},
		{[]string{"serve", "-log-level", "loud", "-user-token-secret", "s", "-database-url", "x"}, `log-level: "loud" is not a level: debug, info, warn or error`},
		{[]string{"serve", "-redis-timeout", "0s", "-user-token-secret", "s", "-database-url", "x"}, "redis-timeout must be positive, got 0s"},
		{[]string{"serve", "-redis-timeout", "-1s", "-user-token-secret", "s", "-database-url", "x"}, "redis-timeout must be positive, got -1s"},
		{[]string{"serve", "-order-schema", "3", "-user-token-secret", "s", "-database-url", "x"}, "order-schema must be 1 or 2, got 3"},
		{[]string{"token", "-user", "u", "-user-token-secret", "s", "-ttl", "-1h"}, "-ttl must be positive"},
		{[]string{"token", "-user", "u", "-user-token-secret", "s", "-ttl", "0s"}, "-ttl must be positive"},
	} {
		text, err := runCLI(t, nil, c.args...)
		if err == nil || !strings.Contains(text, c.want) {
			t.Errorf("%v: %v, printed\n%s\nwant %q", c.args, err, text, c.want)
		}
		if strings.Contains(text, "Usage:") {
			t.Errorf("%v: printed the help:\n%s", c.args, text)
		}
	}
}

// TestAdminCommandsNeedTheToken: reconcile and dlq without an admin token
// say so and send nothing.
func TestAdminCommandsNeedTheToken(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer srv.Close()
	for _, args := range [][]string{{"reconcile"}, {"dlq", "list"}, {"dlq", "replay", "3"}} {
		text, err := runCLI(t, map[string]string{"FLASHSALE_URL": srv.URL}, args...)
		if err == nil || !strings.Contains(text, "set FLASHSALE_ADMIN_TOKEN (or -admin-token)") {
			t.Errorf("%v without a token: %v\n%s", args, err, text)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("%d requests sent without a token, want 0", n)
	}
	// Nothing listening: what to check, no Go error text.
	text, err := runCLI(t, map[string]string{"FLASHSALE_URL": "http://127.0.0.1:1", "FLASHSALE_ADMIN_TOKEN": "t"}, "reconcile")
	if err == nil || !strings.Contains(text, "cannot reach flashsale at http://127.0.0.1:1") || strings.Contains(text, "dial tcp") {
		t.Errorf("reconcile with nothing listening: %v\n%s", err, text)
	}
}

// TestStartErrorsSayWhatToCheck: the errors a first start meets (a wrong
// database URL, nothing listening, a refused user) name the setting to
// check, show no password and no Go package.
func TestStartErrorsSayWhatToCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url  string
		want string
	}{
		{"x", "is not a database URL; use postgres://"},
		{"mysqll://root:pw@h/db", `"mysqll://root:xxxxx@h/db": unknown scheme "mysqll"; use postgres://`},
		{"postgres://bob:pw@127.0.0.1:1/db", "the database at 127.0.0.1:1: nothing answers there; is it running, and does -database-url name it?"},
		{"mysql://bob:pw@127.0.0.1:1/db", "the database at 127.0.0.1:1: nothing answers there"},
	} {
		err := checkDatabaseURL(c.url)
		if err == nil {
			_, err = openForCheck(context.Background(), config{DatabaseURL: c.url, DBMaxConns: 1, RedisURL: "redis://127.0.0.1:1"})
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("database %q: %v, want %q", c.url, err, c.want)
			continue
		}
		for _, bad := range []string{":pw@", "orderstore", "pgconn", "dial tcp"} {
			if strings.Contains(err.Error(), bad) {
				t.Errorf("database %q: %q shows %q", c.url, err, bad)
			}
		}
	}
	for in, want := range map[string]string{
		"nats://s3cr3t@127.0.0.1:4222":                  "nats://xxxxx@127.0.0.1:4222",
		"nats://u:s3cr3t@127.0.0.1:4222":                "nats://u:xxxxx@127.0.0.1:4222",
		"nats://s3cr3t@n1:4222,nats://u:s3cr3t@n2:4222": "nats://xxxxx@n1:4222,nats://u:xxxxx@n2:4222",
		"nats://127.0.0.1:4222":                         "nats://127.0.0.1:4222",
		"tls://s3cr3t@nats.example:4222":                "tls://xxxxx@nats.example:4222",
		"postgres://postgres@127.0.0.1:5432/flashsale":  "postgres://postgres@127.0.0.1:5432/flashsale",
	} {
		if got := hidePassword(in); got != want {
			t.Errorf("hidePassword(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRedisVersionCheck: versions before 7.0 (no SET ... NX GET) are
// refused.
func TestRedisVersionCheck(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{"7.0.0": true, "7.2.4": true, "8.0.1": true, "10.0": true, "6.2.14": false, "6.0": false, "": false, "x.y": false} {
		if got := redisVersionAtLeast(v, minRedis); got != want {
			t.Errorf("redisVersionAtLeast(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestHeaderLimit: the real server takes a request whose line and headers
// fit in 16 KiB and answers a larger one (20,000 bytes of headers, which
// net/http's own limit lets through) 431 in JSON with its code, closing
// the connection.
func TestHeaderLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- h.a.serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-served
	})
	for _, c := range []struct {
		size   int
		status int
		code   string
	}{
		{15 << 10, http.StatusOK, ""},
		{20000, http.StatusRequestHeaderFieldsTooLarge, "header_too_large"},
		{60 << 10, http.StatusRequestHeaderFieldsTooLarge, "header_too_large"},
	} {
		req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Big", strings.Repeat("a", c.size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%d bytes of headers: %v", c.size, err)
		}
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.status || body.Error.Code != c.code {
			t.Errorf("%d bytes of headers: %d %q (%v), want %d %q", c.size, resp.StatusCode, body.Error.Code, err, c.status, c.code)
		}
		if c.code != "" && resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Errorf("%d bytes of headers: Content-Type %q", c.size, resp.Header.Get("Content-Type"))
		}
	}
}

// TestUnauthorizedSaysWhy: a 401 carries WWW-Authenticate (RFC 6750): no
// error for a request without a token, invalid_token "expired" for a
// correctly signed token past its exp, invalid_token "not valid" for
// anything else (a forged or garbled token learns nothing more).
func TestUnauthorizedSaysWhy(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded"))
	expired, err := httpapi.Sign(testSecret, "eve", -time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := httpapi.Sign("another-secret", "eve", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expiredForged, err := httpapi.Sign("another-secret", "eve", -time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, auth, want, message string
	}{
		{"no token", "", `Bearer realm="flashsale"`, "Authentication is missing or not valid."},
		{"expired", "Bearer " + expired, `Bearer realm="flashsale", error="invalid_token", error_description="The token has expired"`, "The token has expired; get a new one."},
		{"forged", "Bearer " + forged, `Bearer realm="flashsale", error="invalid_token", error_description="The token is not valid"`, "Authentication is missing or not valid."},
		{"expired and forged", "Bearer " + expiredForged, `Bearer realm="flashsale", error="invalid_token", error_description="The token is not valid"`, "Authentication is missing or not valid."},
		{"garbled", "Bearer abc.def", `Bearer realm="flashsale", error="invalid_token", error_description="The token is not valid"`, "Authentication is missing or not valid."},
	} {
		req, err := http.NewRequest(http.MethodGet, h.srvURL+"/api/v1/orders/01a2350c-bf2f-8794-be0b-45ca3da0b019", nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || body.Error.Code != "unauthenticated" || body.Error.Message != c.message {
			t.Errorf("%s: %d %+v, want 401 unauthenticated %q", c.name, resp.StatusCode, body.Error, c.message)
		}
		if got := resp.Header.Get("WWW-Authenticate"); got != c.want {
			t.Errorf("%s: WWW-Authenticate %q, want %q", c.name, got, c.want)
		}
	}
}

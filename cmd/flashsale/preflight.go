package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"
)

// The messages of this file are for whoever starts flashsale: what is
// wrong in their terms and what to check, never a Go package's name or a
// password.

// databaseSchemes is what -database-url accepts, for the messages.
const databaseSchemes = "postgres://user:password@host:5432/db, postgresql://..., mysql://user:password@host:3306/db, mariadb://..., or a PostgreSQL keyword/value string (host=... dbname=...)"

// checkDatabaseURL refuses a database URL no driver takes, before anything
// connects.
func checkDatabaseURL(s string) error {
	if scheme, _, ok := strings.Cut(s, "://"); ok {
		switch strings.ToLower(scheme) {
		case "postgres", "postgresql", "mysql", "mariadb":
			return nil
		}
		return fmt.Errorf("database-url: %q: unknown scheme %q; use %s", hidePassword(s), scheme, databaseSchemes)
	}
	if strings.Contains(s, "=") {
		return nil // a PostgreSQL keyword/value string
	}
	return fmt.Errorf("database-url: %q is not a database URL; use %s", hidePassword(s), databaseSchemes)
}

// urlHost is the host:port of a URL for a message ("" when it has none).
func urlHost(s string) string {
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		return u.Host
	}
	return ""
}

// connectError rewords an error of connecting to a service (what: "the
// database", "Redis", "NATS"; setting: the flag that names it) as what to
// check. The original goes to the debug log by the caller.
func connectError(what, setting, target string, err error) error {
	at := what
	if target != "" {
		at = what + " at " + target
	}
	var pg *pgconn.PgError
	var my *mysql.MySQLError
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.As(err, &pg):
		return fmt.Errorf("%s refused: %s (SQLSTATE %s); check the user, password and database name in -%s", at, pg.Message, pg.Code, setting)
	case errors.As(err, &my):
		return fmt.Errorf("%s refused: %s (error %d); check the user, password and database name in -%s", at, my.Message, my.Number, setting)
	case errors.As(err, &dns):
		return fmt.Errorf("%s: host %q not found; check the host name in -%s", at, dns.Name, setting)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, nats.ErrNoServers):
		return fmt.Errorf("%s: nothing answers there; is it running, and does -%s name it?", at, setting)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%s: no answer in time; is it running and reachable, and does -%s name it?", at, setting)
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired):
		return fmt.Errorf("%s refused the credentials; check the user, password or token in -%s", at, setting)
	}
	return fmt.Errorf("%s: %s; check -%s", at, innermost(err), setting)
}

// innermost is the text of the deepest error of a chain, which names the
// cause without the wrapping layers' package prefixes.
func innermost(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return strings.TrimPrefix(err.Error(), "redis: ")
		}
		err = next
	}
}

// minRedis is the oldest Redis the gate's scripts run on: SET ... NX GET
// (7.0) in the reservation script.
var minRedis = [2]int{7, 0}

// checkRedisVersion refuses a Redis older than minRedis, whose scripts
// would fail on the first purchase.
func checkRedisVersion(ctx context.Context, c rueidis.Client, target string) error {
	info, err := c.Do(ctx, c.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return connectError("Redis", "redis-url", target, err)
	}
	v := ""
	for _, line := range strings.Split(info, "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			v = s
		}
	}
	if !redisVersionAtLeast(v, minRedis) {
		return fmt.Errorf("the Redis at %s is version %s; flashsale needs Redis %d.%d or newer (its scripts use SET ... NX GET)", target, or(v, "unknown"), minRedis[0], minRedis[1])
	}
	return nil
}

// redisVersionAtLeast reports whether the version v ("7.2.4") is at least
// want (major, minor). An unparsable version is refused.
func redisVersionAtLeast(v string, want [2]int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > want[0] || major == want[0] && minor >= want[1]
}

package testenv

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultPostgresURL is the server Postgres uses when FLASHSALE_TEST_DATABASE_URL is unset.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Postgres creates a fresh, empty database on the test server and returns its
// URL: the base URL from FLASHSALE_TEST_DATABASE_URL (default
// DefaultPostgresURL) with the database name replaced by a random
// "flashsale_t_..." one. The database is dropped, with any connections still
// open on it, when the test ends. An unreachable server makes the test skip
// (or fail, see Required).
func Postgres(t testing.TB) string {
	t.Helper()
	base := getenv("FLASHSALE_TEST_DATABASE_URL", DefaultPostgresURL)
	sweepOnce.Do(func() { sweepStale(t, base, time.Now()) })
	name := databaseName(time.Now())
	dbURL, err := withDatabase(base, name)
	if err != nil {
		t.Fatalf("testenv: FLASHSALE_TEST_DATABASE_URL: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		Unavailable(t, "postgres", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		Unavailable(t, "postgres", fmt.Errorf("create database %s: %w", name, err))
	}

	t.Cleanup(func() { dropOrLeave(t, base, name, dropWait) })
	return dbURL
}

// dropWait bounds a test database's drop at the end of its test.
const dropWait = 30 * time.Second

// staleAfter is the age past which a left test database is swept: longer
// than any test binary runs (CI's bound is 90 minutes), so a database a
// test still uses is never one.
const staleAfter = 3 * time.Hour

// databaseName is a new test database's name: "flashsale_t_", the creation
// time in Unix seconds, '_' and 8 random hex digits, so that a sweep can
// tell a left database's age.
func databaseName(now time.Time) string {
	return fmt.Sprintf("flashsale_t_%d_%s", now.Unix(), RandomName("")[:8])
}

// dropOrLeave drops the database name, with any connections still open on
// it, within wait. DROP DATABASE asks for a checkpoint of the whole server
// and waits for it: under the writes of many tests at once that wait is set
// by them and the disk, not by this test (a CI run saw 30 s). A drop that
// does not finish in time is logged and left to the next run's sweep
// (sweepStale): the test's result does not hang on the server's fsyncs.
func dropOrLeave(t testing.TB, base, name string, wait time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := dropDatabase(ctx, base, name); err != nil {
		t.Logf("testenv: database %s not dropped within %v, left for a later sweep: %v", name, wait, err)
	}
}

func dropDatabase(ctx context.Context, base, name string) error {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	// FORCE: a test that leaked a pool must not leak its database too.
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

var sweepOnce sync.Once

// sweepStale drops the test databases older than staleAfter (by the time
// in their names): those a drop left behind, or a test binary killed
// before its cleanups. It logs what it cannot do and never fails a test.
func sweepStale(t testing.TB, base string, now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return // the test's own connect reports it
	}
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'flashsale\_t\_%'`)
	var names []string
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	conn.Close(context.Background())
	if err != nil {
		t.Logf("testenv: sweep of old test databases: %v", err)
		return
	}
	for _, n := range names {
		if created, ok := createdAt(n); ok && now.Sub(created) > staleAfter {
			if err := dropDatabase(ctx, base, n); err != nil {
				t.Logf("testenv: sweep: drop %s: %v", n, err)
			}
		}
	}
}

// createdAt reads the creation time in a name databaseName made.
func createdAt(name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, "flashsale_t_")
	if !ok {
		return time.Time{}, false
	}
	secs, _, ok := strings.Cut(rest, "_")
	n, err := strconv.ParseInt(secs, 10, 64)
	if !ok || err != nil {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// withDatabase returns the connection string base with its database replaced
// by name. base is a postgres:// URL or a keyword/value DSN.
func withDatabase(base, name string) (string, error) {
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		if err != nil {
			return "", err
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	// In a keyword/value DSN the last occurrence of a keyword wins.
	return strings.TrimSpace(base) + " dbname=" + name, nil
}

package testenv

import (
	"context"
	"fmt"
	"net/url"
	"strings"
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
	name := RandomName("flashsale_t_")
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

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		// FORCE: a test that leaked a pool must not leak its database too.
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	return dbURL
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

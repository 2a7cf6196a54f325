//go:build unix

package testenv_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale/internal/testenv"
)

func pgConnect(ctx context.Context, t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func pgExec(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// pgDown wants the server behind url gone: conn (connected before) fails,
// and so does a new connection.
func pgDown(ctx context.Context, t *testing.T, conn *pgx.Conn, url string) {
	t.Helper()
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("query on an old connection succeeded on a stopped server")
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if c, err := pgx.Connect(cctx, url); err == nil {
		c.Close(ctx)
		t.Error("connected to a stopped server")
	}
}

func kept(ctx context.Context, t *testing.T, url string) []string {
	t.Helper()
	conn := pgConnect(ctx, t, url)
	rows, err := conn.Query(ctx, "SELECT v FROM kept ORDER BY v")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

func TestStartPostgresStopKillStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	s := testenv.StartPostgres(t)
	url := s.URL("postgres")
	if want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port); url != want {
		t.Errorf("URL = %s, want %s", url, want)
	}
	conn := pgConnect(ctx, t, url)
	pgExec(ctx, t, conn, "CREATE TABLE kept (v text)")
	pgExec(ctx, t, conn, "INSERT INTO kept VALUES ('1 before stop')")

	s.StopImmediate()
	pgDown(ctx, t, conn, url)
	s.StopImmediate() // stopping twice is harmless

	port := s.Port
	s.Start()
	if s.Port != port {
		t.Fatalf("Port after Start = %d, want %d", s.Port, port)
	}
	conn = pgConnect(ctx, t, url)
	pgExec(ctx, t, conn, "INSERT INTO kept VALUES ('2 before kill')")
	// A backend busy in a query is killed too.
	busy := pgConnect(ctx, t, url)
	busyErr := make(chan error, 1)
	go func() {
		_, err := busy.Exec(ctx, "SELECT pg_sleep(60)")
		busyErr <- err
	}()

	s.Kill()
	pgDown(ctx, t, conn, url)
	select {
	case err := <-busyErr:
		if err == nil {
			t.Error("pg_sleep(60) succeeded on a killed server")
		}
	case <-time.After(5 * time.Second):
		t.Error("query in progress still running 5s after Kill")
	}
	s.Kill() // killing twice is harmless

	s.Start()
	s.Start() // starting a running server does nothing
	want := []string{"1 before stop", "2 before kill"}
	if diff := cmp.Diff(want, kept(ctx, t, url)); diff != "" {
		t.Errorf("rows after kill and start (-want +got):\n%s", diff)
	}
}

// TestPostgresBehindProxy is the shape of a fault test: a client that
// honours its context survives a hung database, and a cut one.
func TestPostgresBehindProxy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	s := testenv.StartPostgres(t)
	p := testenv.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", s.Port))
	url := strings.Replace(s.URL("postgres"), fmt.Sprintf("127.0.0.1:%d", s.Port), p.Addr(), 1)
	conn := pgConnect(ctx, t, url)
	pgExec(ctx, t, conn, "SELECT 1")

	p.Blackhole()
	qctx, qcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := conn.Exec(qctx, "SELECT 1")
	qcancel()
	if err == nil {
		t.Fatal("query through a blackholed proxy succeeded")
	}
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	c, err := pgx.Connect(cctx, url)
	ccancel()
	if err == nil {
		c.Close(ctx)
		t.Fatal("connected through a blackholed proxy")
	}

	p.Restore()
	conn = pgConnect(ctx, t, url)
	pgExec(ctx, t, conn, "SELECT 1")

	p.Cut()
	start := time.Now()
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("query through a cut proxy succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("query through a cut proxy took %v to fail", d)
	}
}

//go:build unix

package testenv

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// recorder is a testing.TB that records Logf and Errorf instead of
// reporting them: dropOrLeave's verdict is what is tested.
type recorder struct {
	testing.TB
	mu           sync.Mutex
	logs, errors []string
}

func (r *recorder) Logf(f string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(f, a...))
}

func (r *recorder) Errorf(f string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(f, a...))
}

// TestDropWaitingForCheckpointLeavesDatabase reproduces the end of a test
// failing on its own database's drop (a CI run: "drop database ...:
// timeout: context deadline exceeded"): DROP DATABASE waits for a
// checkpoint of the whole server, and while the checkpointer cannot finish
// (here stopped; in CI busy with every other test's writes) the drop
// waits. The drop's bound now ends in a log line and a database left to
// the sweep, which drops it once the server can.
func TestDropWaitingForCheckpointLeavesDatabase(t *testing.T) {
	srv := StartPostgres(t)
	base := srv.URL("postgres")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	created := time.Now()
	name := databaseName(created)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	if got, ok := createdAt(name); !ok || got.Unix() != created.Unix() {
		t.Fatalf("createdAt(%s) = %v, %v", name, got, ok)
	}

	cp := checkpointerPID(t, srv)
	if err := syscall.Kill(cp, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	resume := func() {
		if stopped {
			_ = syscall.Kill(cp, syscall.SIGCONT)
			stopped = false
		}
	}
	defer resume()
	rec := &recorder{TB: t}
	began := time.Now()
	dropOrLeave(rec, base, name, 2*time.Second)
	if len(rec.errors) != 0 || len(rec.logs) != 1 || !strings.Contains(rec.logs[0], "left for a later sweep") {
		t.Fatalf("a drop held up by the checkpointer: errors %q, logs %q; want one log line and no error", rec.errors, rec.logs)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Fatalf("the drop's bound of 2s took %v", d)
	}
	resume()

	// (The drop itself goes on in the server once the checkpointer runs.)

	// The sweep drops a test database older than staleAfter, by the time
	// in its name, and leaves a younger one and other databases.
	now := time.Now()
	old, young := databaseName(now.Add(-staleAfter-time.Minute)), databaseName(now.Add(-time.Minute))
	for _, n := range []string{old, young, "flashsale_other"} {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+n); err != nil {
			t.Fatal(err)
		}
	}
	sweepStale(rec, base, now)
	if databaseExists(t, conn, old) || !databaseExists(t, conn, young) || !databaseExists(t, conn, "flashsale_other") {
		t.Fatalf("after the sweep: old %v, young %v, other %v; want false, true, true (logs %q)",
			databaseExists(t, conn, old), databaseExists(t, conn, young), databaseExists(t, conn, "flashsale_other"), rec.logs)
	}
}

func databaseExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// checkpointerPID finds the server's checkpointer among the postmaster's children.
func checkpointerPID(t *testing.T, srv *PostgresServer) int {
	t.Helper()
	srv.mu.Lock()
	pm := srv.proc.Pid
	srv.mu.Unlock()
	for _, c := range childPIDs(pm) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(c) + "/cmdline")
		if err == nil && strings.Contains(string(b), "checkpointer") {
			return c
		}
	}
	t.Fatal("no checkpointer among the postmaster's children")
	return 0
}

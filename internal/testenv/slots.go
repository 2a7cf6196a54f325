//go:build unix

package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// LimitConnections sets the private server's max_connections to n: on
// PostgreSQL with ALTER SYSTEM and a restart (so call it before starting
// what uses the server), on MariaDB at once (SET GLOBAL).
func LimitConnections(t testing.TB, s DatabaseServer, n int) {
	t.Helper()
	db := openAdmin(t, s)
	ctx := context.Background()
	if _, ok := s.(*MariaDBServer); ok {
		if _, err := db.ExecContext(ctx, fmt.Sprintf("SET GLOBAL max_connections = %d", n)); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		db.Close()
		return
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("ALTER SYSTEM SET max_connections = %d", n)); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	db.Close()
	s.StopImmediate()
	s.Start()
}

// openAdmin opens a client pool of the server (no database selected on
// MariaDB, database postgres on PostgreSQL).
func openAdmin(t testing.TB, s DatabaseServer) *sql.DB {
	t.Helper()
	if _, ok := s.(*MariaDBServer); ok {
		u, err := url.Parse(s.URL(""))
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		db, err := adminMySQL(u)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		return db
	}
	cfg, err := pgx.ParseConfig(s.URL("postgres"))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return stdlib.OpenDB(*cfg)
}

// SlotHog holds every connection slot of a private database server, as a
// runaway client does: see HoldConnections.
type SlotHog struct {
	db    *sql.DB
	conns []*sql.Conn
	mine  []int64 // their server-side ids
	maria bool
}

// HoldConnections takes every connection slot of the private server s: it
// opens connections until the server refuses one, ends every other
// client's session (they come back and find no slot), and repeats until it
// alone holds connections. It fails the test if that takes over 20 s.
// Release (also on Cleanup) gives the slots back.
func HoldConnections(t testing.TB, s DatabaseServer) *SlotHog {
	t.Helper()
	return HoldConnectionsPaused(t, s, func() {}, func() {})
}

// HoldConnectionsPaused is HoldConnections with the server's other clients
// paused (pause, then resume once the hog alone holds every slot): a client
// that reconnects at once, or several of them, can otherwise take each slot
// its ended session frees before the hog does, for as long as they like.
// Tests whose clients are processes of their own pause them (SIGSTOP).
func HoldConnectionsPaused(t testing.TB, s DatabaseServer, pause, resume func()) *SlotHog {
	t.Helper()
	pause()
	defer resume()
	_, maria := s.(*MariaDBServer)
	h := &SlotHog{db: openAdmin(t, s), maria: maria}
	t.Cleanup(h.Release)
	ctx := context.Background()
	// Every slot: a superuser (the hog) may take PostgreSQL's reserved
	// ones, and MariaDB keeps one more for a SUPER account. A session that
	// was ended leaves the session lists before its slot is free, so the
	// hog is done when it holds this many, not when it sees no one else.
	q := "SELECT current_setting('max_connections')::int"
	if maria {
		q = "SELECT @@max_connections + 1"
	}
	var slots int
	if err := h.db.QueryRowContext(ctx, q).Scan(&slots); err != nil {
		t.Fatalf("testenv: max_connections: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		full := h.grab(ctx)
		others, err := h.others(ctx)
		if err != nil {
			t.Fatalf("testenv: listing sessions: %v", err)
		}
		if full && len(others) == 0 && len(h.conns) >= slots {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: still %d other sessions after 20s (holding %d of %d slots, full %v)", len(others), len(h.conns), slots, full)
		}
		if len(others) == 0 {
			// Slots of ended sessions not yet free: take them as they are.
			time.Sleep(10 * time.Millisecond)
		}
		for _, id := range others {
			q := fmt.Sprintf("SELECT pg_terminate_backend(%d)", id)
			if maria {
				q = fmt.Sprintf("KILL %d", id)
			}
			_, _ = h.conns[0].ExecContext(ctx, q) // gone already: fine
		}
	}
}

// Held is the number of connections the hog holds.
func (h *SlotHog) Held() int { return len(h.conns) }

// grab opens connections until the server refuses one (true) or an attempt
// fails otherwise (false).
func (h *SlotHog) grab(ctx context.Context) bool {
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := h.db.Conn(cctx)
		if err == nil {
			q := "SELECT pg_backend_pid()"
			if h.maria {
				q = "SELECT CONNECTION_ID()"
			}
			var id int64
			if err = c.QueryRowContext(cctx, q).Scan(&id); err == nil {
				h.conns = append(h.conns, c)
				h.mine = append(h.mine, id)
				cancel()
				continue
			}
			c.Close()
		}
		cancel()
		msg := err.Error()
		return strings.Contains(msg, "too many clients") || strings.Contains(msg, "Too many connections") ||
			strings.Contains(msg, "53300") || strings.Contains(msg, "1040")
	}
}

// others lists the server-side ids of every other client session.
func (h *SlotHog) others(ctx context.Context) ([]int64, error) {
	if len(h.conns) == 0 {
		return nil, fmt.Errorf("no connection of our own")
	}
	q := "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
	if h.maria {
		q = "SELECT id FROM information_schema.processlist WHERE command <> 'Daemon' AND user <> 'system user'"
	}
	rows, err := h.conns[0].QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	mine := map[int64]bool{}
	for _, id := range h.mine {
		mine[id] = true
	}
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		if !mine[id] {
			out = append(out, id)
		}
	}
	return out, rows.Err()
}

// Release closes the hog's connections. Calling it again does nothing.
func (h *SlotHog) Release() {
	for _, c := range h.conns {
		_ = c.Close()
	}
	h.conns, h.mine = nil, nil
	if h.db != nil {
		_ = h.db.Close()
		h.db = nil
	}
}

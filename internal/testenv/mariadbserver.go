//go:build unix

package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// MariaDBServer is a private MariaDB (or MySQL) server started by
// StartMariaDB, for tests that crash or restart the database. The API
// mirrors PostgresServer, so a fault test can run on either dialect through
// DatabaseServer.
type MariaDBServer struct {
	Port int // on 127.0.0.1; the same after Start

	t    testing.TB
	root string // private temporary directory: data, socket, log
	log  string

	mu   sync.Mutex
	proc *os.Process
	done chan struct{}
}

// StartMariaDB creates a new data directory with mariadb-install-db in a
// private temporary directory (root without a password), starts mariadbd on
// a free loopback port and waits until it accepts connections. On Cleanup the
// server is killed and the directory removed. Missing binaries make the test
// Unavailable.
func StartMariaDB(t testing.TB) *MariaDBServer {
	t.Helper()
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		Unavailable(t, "mariadb binaries", err)
	}
	if _, err := os.Stat(mariadbd()); err != nil {
		Unavailable(t, "mariadb binaries", err)
	}
	root, err := os.MkdirTemp("", "flashsale-mariadb-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s := &MariaDBServer{t: t, root: root, log: filepath.Join(root, "mariadb.log")}
	t.Cleanup(func() {
		s.StopImmediate()
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("testenv: removing the mariadb directory: %v", err)
		}
	})
	cmd := exec.Command(install, "--no-defaults", "--datadir="+filepath.Join(root, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db", "--user="+currentUser())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: %s: %v\n%s", cmd, err, out)
	}
	for attempt := 1; ; attempt++ {
		if s.Port, err = FreePort(); err != nil {
			t.Fatalf("testenv: finding a free port for mariadb: %v", err)
		}
		if err = s.start(); err == nil {
			return s
		}
		if attempt == 3 || !strings.Contains(s.logTail(), "already in use") {
			t.Fatalf("testenv: %v\n%s", err, s.logTail())
		}
	}
}

func mariadbd() string {
	if p, err := exec.LookPath("mariadbd"); err == nil {
		return p
	}
	return "/usr/sbin/mariadbd"
}

func currentUser() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	return os.Getenv("USER")
}

// URL returns the mysql:// URL of database db as root (created by Open
// when missing).
func (s *MariaDBServer) URL(db string) string {
	return fmt.Sprintf("mysql://root@127.0.0.1:%d/%s", s.Port, db)
}

// StopImmediate crashes the server (SIGKILL: nothing is flushed; the next
// Start runs InnoDB crash recovery) and waits until it has exited. Stopping
// a stopped server does nothing.
func (s *MariaDBServer) StopImmediate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(syscall.SIGKILL)
	<-s.done
	s.proc = nil
}

// Start starts the stopped server again on the same port (fails the test
// if it does not come up).
func (s *MariaDBServer) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("testenv: restarting mariadb: %v\n%s", err, s.logTail())
	}
}

func (s *MariaDBServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return nil
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(mariadbd(), "--no-defaults",
		"--datadir="+filepath.Join(s.root, "data"),
		"--socket="+filepath.Join(s.root, "sock"),
		"--pid-file="+filepath.Join(s.root, "pid"),
		fmt.Sprintf("--port=%d", s.Port), "--bind-address=127.0.0.1",
		"--user="+currentUser(), "--skip-log-bin", "--innodb-buffer-pool-size=64M",
		"--innodb-flush-log-at-trx-commit=2", "--skip-name-resolve")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = parentDeathSignal()
	// See RedisServer.start: Pdeathsig fires when the forking thread exits
	// (and the runtime ends a thread whose locked goroutine returns), so the
	// fork happens on a locked thread kept until the child is reaped.
	startc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			startc <- err
			return
		}
		startc <- nil
		_ = cmd.Wait()
		close(done)
	}()
	if err := <-startc; err != nil {
		return err
	}
	s.proc = cmd.Process
	s.done = done
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := s.ping(); err == nil {
			return nil
		}
		select {
		case <-done:
			s.proc = nil
			return fmt.Errorf("mariadbd exited while starting")
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = s.proc.Signal(syscall.SIGKILL)
			<-done
			s.proc = nil
			return fmt.Errorf("mariadbd did not accept connections within 60s")
		}
	}
}

func (s *MariaDBServer) ping() error {
	u, err := url.Parse(s.URL(""))
	if err != nil {
		return err
	}
	db, err := adminMySQL(u)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

func (s *MariaDBServer) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// DatabaseServer is a private database server a test may crash and restart:
// PostgresServer or MariaDBServer.
type DatabaseServer interface {
	URL(db string) string
	StopImmediate()
	Start()
}

// StartDatabase starts a private server of the dialect under test (see Dialect).
func StartDatabase(t testing.TB) DatabaseServer {
	t.Helper()
	if Dialect() == "mysql" {
		return StartMariaDB(t)
	}
	return StartPostgres(t)
}

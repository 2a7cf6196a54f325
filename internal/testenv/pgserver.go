//go:build unix

package testenv

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresServer is a private PostgreSQL cluster started by StartPostgres,
// for tests that stop, crash or restart the database. Its methods are safe
// for concurrent use; Start, which fails the test, belongs on the test
// goroutine.
type PostgresServer struct {
	Port    int    // on 127.0.0.1; the same after Start
	DataDir string // the cluster, kept across stops and kills

	t    testing.TB
	bin  string              // directory holding initdb and postgres
	root string              // private temporary directory: DataDir, the log
	log  string              // the server's stderr, across restarts
	cred *syscall.Credential // nil: run as ourselves

	mu   sync.Mutex
	proc *os.Process   // the postmaster; nil while stopped
	done chan struct{} // closed once proc has exited and been reaped
}

// StartPostgres creates a new cluster with initdb (trust authentication,
// superuser postgres, UTF8, no fsync) in a private temporary directory,
// starts it on a free loopback port and waits until it accepts connections.
// On Cleanup the server is stopped and the directory removed.
//
// The binaries are the newest /usr/lib/postgresql/*/bin (Debian), else
// initdb and postgres from $PATH; none makes the test Unavailable. As root
// the server runs as the OS user postgres, since it refuses to run as root.
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	bin, err := postgresBinDir()
	if err != nil {
		Unavailable(t, "postgres binaries", err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = postgresCredential(); err != nil {
			Unavailable(t, "postgres binaries", fmt.Errorf("running as root: %w", err))
		}
	}

	// Not t.TempDir: its parents are private to root, and the server may
	// run as another user.
	root, err := os.MkdirTemp("", "flashsale-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s := &PostgresServer{
		DataDir: filepath.Join(root, "data"),
		t:       t,
		bin:     bin,
		root:    root,
		log:     filepath.Join(root, "postgres.log"),
		cred:    cred,
	}
	t.Cleanup(func() {
		s.StopImmediate()
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("testenv: removing the postgres directory: %v", err)
		}
	})
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}

	initdb := exec.Command(filepath.Join(bin, "initdb"),
		"-D", s.DataDir, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions")
	initdb.Dir = root
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testenv: %s: %v\n%s", initdb, err, out)
	}

	// Another process may take the free port between our probe and the
	// server's bind; try a few ports before giving up.
	for attempt := 1; ; attempt++ {
		if s.Port, err = FreePort(); err != nil {
			t.Fatalf("testenv: finding a free port for postgres: %v", err)
		}
		err = s.start()
		if err == nil {
			return s
		}
		if attempt == 3 || !strings.Contains(s.logTail(), "Address already in use") {
			t.Fatalf("testenv: %v\n%s", err, s.logTail())
		}
	}
}

// URL returns the connection URL of database db as the superuser postgres:
// postgres://postgres@127.0.0.1:Port/db?sslmode=disable. Only the database
// postgres (besides the templates) exists in a new cluster.
func (s *PostgresServer) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, url.PathEscape(db))
}

// StopImmediate shuts the server down as pg_ctl stop -m immediate does
// (SIGQUIT to the postmaster): every connection is dropped at once, nothing
// is checkpointed, and the next Start runs crash recovery. It returns once
// the server and all its processes have exited. Stopping a stopped server
// does nothing.
func (s *PostgresServer) StopImmediate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(syscall.SIGQUIT)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		// The postmaster itself gives its children 5s before SIGKILL.
		s.killLocked()
	}
	s.proc, s.done = nil, nil
}

// Kill crashes the server: SIGKILL to the postmaster and, so that nothing
// lingers on, to every process it has started. Connections are reset and
// the next Start runs crash recovery; committed transactions survive (fsync
// is off, but the OS keeps what was written). It returns once the processes
// have exited. Killing a stopped server does nothing.
//
// Without /proc (not Linux) only the postmaster is killed; its backends
// exit when they notice, and Start may fail while they are still running.
func (s *PostgresServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	s.killLocked()
	s.proc, s.done = nil, nil
}

func (s *PostgresServer) killLocked() {
	pid := s.proc.Pid
	// Backends call setsid, so they are not in the postmaster's process
	// group: find them by parent, with the postmaster stopped so that it
	// forks no new one meanwhile. While it is stopped it reaps none of them
	// either, so their pids cannot be reused before we signal them.
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	children := childPIDs(pid)
	for _, c := range children {
		_ = syscall.Kill(-c, syscall.SIGKILL) // anything a backend started
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-s.done
	// Orphans are reaped by init, or never (some containers): wait until
	// they are gone or zombies, which no longer hold the shared memory.
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range children {
		for processAlive(c) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Start starts a stopped or killed server again on the same port and data
// directory and waits until it accepts connections, after crash recovery if
// it was not shut down cleanly. Starting a running server does nothing. A
// server that does not come back fails the test given to StartPostgres.
func (s *PostgresServer) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("testenv: restarting postgres: %v\n%s", err, s.logTail())
	}
}

func (s *PostgresServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		select {
		case <-s.done: // died on its own: start it again
			s.proc, s.done = nil, nil
		default:
			return nil
		}
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy

	args := []string{
		"-D", s.DataDir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port=" + strconv.Itoa(s.Port),
		// TCP only: a socket path under a long $TMPDIR may be too long.
		"-c", "unix_socket_directories=",
		"-c", "fsync=off",
		// synchronous_commit stays on: a killed server must keep every
		// commit it acknowledged.
	}
	type started struct {
		proc *os.Process
		err  error
	}
	startc := make(chan started, 1)
	done := make(chan struct{})
	go func() {
		// See RedisServer.start: Pdeathsig fires when the forking thread
		// exits, so this goroutine keeps it locked until the child is reaped.
		runtime.LockOSThread()
		cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...)
		cmd.Dir = s.root
		cmd.Stdout = logf
		cmd.Stderr = logf
		cmd.SysProcAttr = parentDeathSignal()
		cmd.SysProcAttr.Credential = s.cred
		if err := cmd.Start(); err != nil {
			startc <- started{err: err}
			return
		}
		startc <- started{proc: cmd.Process}
		_ = cmd.Wait()
		close(done)
	}()
	st := <-startc
	if st.err != nil {
		return fmt.Errorf("starting postgres: %w", st.err)
	}
	s.proc, s.done = st.proc, done

	deadline := time.Now().Add(60 * time.Second) // crash recovery included
	for {
		err := s.ping()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			s.proc, s.done = nil, nil
			return fmt.Errorf("postgres on port %d exited during startup", s.Port)
		default:
		}
		if time.Now().After(deadline) {
			s.killLocked()
			s.proc, s.done = nil, nil
			return fmt.Errorf("postgres on port %d not accepting connections within 60s: %v", s.Port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping connects and checks that the server answering is ours: if ours
// failed to bind, another may hold the port.
func (s *PostgresServer) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return err
	}
	if dir != s.DataDir {
		return fmt.Errorf("port %d is taken by another server (data directory %s)", s.Port, dir)
	}
	return nil
}

// logTail returns the last lines the server printed.
func (s *PostgresServer) logTail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "postgres log (" + s.log + "):\n" + strings.Join(lines, "\n")
}

// postgresBinDir returns the directory holding initdb and postgres.
func postgresBinDir() (string, error) {
	has := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first: "15" before "9.6".
	version := func(dir string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, nil
		}
	}
	if initdb, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(initdb)) {
		return filepath.Dir(initdb), nil
	}
	return "", errors.New("no initdb and postgres in /usr/lib/postgresql/*/bin or $PATH")
}

// postgresCredential returns the identity of the OS user postgres, with no
// supplementary groups.
func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("uid of user postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("gid of user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// childPIDs returns the processes whose parent is pid, from /proc; none
// where there is no /proc.
func childPIDs(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(c); ok && ppid == pid {
			pids = append(pids, c)
		}
	}
	return pids
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

// procStat reads the state and parent of pid from /proc/pid/stat.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) state ppid ...", where comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err == nil
}

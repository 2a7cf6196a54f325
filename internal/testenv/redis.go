package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// Redis returns the URL of the shared test Redis (FLASHSALE_TEST_REDIS_URL,
// default redis://127.0.0.1:6379/0) and a key prefix unique to this test.
//
// The test must put every key it creates under prefix + ":" (for example
// prefix+":stock:{sku1}"): on Cleanup those keys are deleted with SCAN, and
// only those, because the Redis is shared with other tests and other people.
// It never runs FLUSHALL or FLUSHDB.
//
// A Redis that does not answer PING makes the test Unavailable.
func Redis(t testing.TB) (url, prefix string) {
	t.Helper()
	url = getenv("FLASHSALE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
	opt, err := redisOptions(url)
	if err != nil {
		t.Fatalf("FLASHSALE_TEST_REDIS_URL=%q: %v", url, err)
	}

	// The check's client is closed at once, so that a test which checks for
	// leaked goroutines does not see ours; Cleanup dials again.
	client, err := rueidis.NewClient(opt)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = client.Do(ctx, client.B().Ping().Build()).Error()
		cancel()
		client.Close()
	}
	if err != nil {
		Unavailable(t, "redis", fmt.Errorf("PING %s: %w", url, err))
	}

	prefix = RandomName("t")
	t.Cleanup(func() {
		if err := deleteKeys(opt, prefix); err != nil {
			t.Errorf("testenv: deleting Redis keys %s:* on %s: %v", prefix, url, err)
		}
	})
	return url, prefix
}

// RedisClient returns a client of the Redis at url (from Redis or a
// RedisServer), without client-side caching, closed at Cleanup.
func RedisClient(t testing.TB, url string) rueidis.Client {
	t.Helper()
	opt, err := redisOptions(url)
	if err != nil {
		t.Fatalf("testenv: redis url %q: %v", url, err)
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("testenv: redis client: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func redisOptions(url string) (rueidis.ClientOption, error) {
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return opt, err
	}
	// Client-side caching would add CLIENT TRACKING traffic for nothing here.
	opt.DisableCache = true
	// On a cluster, see a promoted replica within a second (as serve does).
	opt.ClusterOption.ShardsRefreshInterval = time.Second
	opt.Dialer.Timeout = 5 * time.Second
	return opt, nil
}

// deleteKeys deletes the key prefix and every key matching prefix:*.
func deleteKeys(opt rueidis.ClientOption, prefix string) error {
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := client.Do(ctx, client.B().Del().Key(prefix).Build()).Error(); err != nil {
		return err
	}
	nodes := map[string]rueidis.Client{"": client}
	if client.Mode() == rueidis.ClientModeCluster {
		nodes = client.Nodes() // a keyless SCAN reaches one node only
	}
	match := globEscape(prefix) + ":*"
	for _, node := range nodes {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(match).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return err
			}
			// Deleting keys SCAN has already returned is safe: SCAN still
			// returns every key that exists for the whole iteration. One
			// key per UNLINK: keys of several slots in one are CROSSSLOT.
			cmds := make(rueidis.Commands, len(e.Elements))
			for i, k := range e.Elements {
				cmds[i] = client.B().Unlink().Key(k).Build()
			}
			for _, r := range client.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil {
					return err
				}
			}
			if e.Cursor == 0 {
				break
			}
			cursor = e.Cursor
		}
	}
	return nil
}

// globEscape quotes the characters SCAN MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// RedisServer is a private redis-server process started by StartRedis, for
// tests that kill, restart or reconfigure Redis. Its methods are safe for
// concurrent use.
type RedisServer struct {
	Addr string // host:port, always 127.0.0.1
	URL  string // redis://Addr/0

	t    testing.TB
	bin  string
	args []string // the full command line after bin
	dir  string
	log  string // the server's stdout and stderr, across restarts

	mu   sync.Mutex
	proc *os.Process
	done chan struct{} // closed once proc has exited and been reaped
}

// StartRedis starts a private redis-server on a free loopback port, with
// nothing saved to disk unless args say so, and waits until it answers PING.
// args are added after the defaults and win over them, e.g. StartRedis(t,
// "--appendonly", "yes"). The server is killed on Cleanup.
//
// No redis-server binary makes the test Unavailable; one that does not start
// fails the test.
func StartRedis(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server", err)
	}
	dir := t.TempDir()
	s := &RedisServer{
		t:   t,
		bin: bin,
		dir: dir,
		log: filepath.Join(dir, "redis-server.log"),
	}
	t.Cleanup(s.Kill)

	// Another process may take the free port between our probe and the
	// server's bind; try a few ports before giving up.
	free := FreePort
	if slices.Contains(args, "--cluster-enabled") {
		free = FreeClusterPort // and its bus port, +10000
	}
	for attempt := 1; ; attempt++ {
		port, err := free()
		if err != nil {
			t.Fatalf("testenv: finding a free port for redis-server: %v", err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.URL = "redis://" + s.Addr + "/0"
		s.args = append([]string{
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--save", "",
			"--appendonly", "no",
			"--dir", dir,
		}, args...)
		err = s.start()
		if err == nil {
			return s
		}
		if attempt == 3 || !strings.Contains(s.logTail(), "Address already in use") {
			t.Fatalf("testenv: %v\n%s", err, s.logTail())
		}
	}
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it to
// exit. Data not yet written to its AOF is lost. Killing a stopped server
// does nothing.
func (s *RedisServer) Kill() { s.stop(syscall.SIGKILL) }

// Pause freezes the server with SIGSTOP: connections stay open and nothing
// answers, as a hung Redis (a long fork, swapping, a stalled VM) does. Resume
// or Kill ends it. Pausing a stopped server does nothing.
func (s *RedisServer) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused server run again (SIGCONT).
func (s *RedisServer) Resume() { s.signal(syscall.SIGCONT) }

func (s *RedisServer) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		_ = s.proc.Signal(sig)
	}
}

// Stop shuts the server down with SIGTERM, which makes it flush its AOF
// (and write an RDB snapshot if save points are configured), and waits for
// it to exit. Stopping a stopped server does nothing.
func (s *RedisServer) Stop() { s.stop(syscall.SIGTERM) }

// Restart starts the server again on the same port with the same arguments
// and directory, so it reloads whatever it persisted there, and waits until
// it answers PING (it answers LOADING while it reads its files). A running
// server is killed first. A server that does not come back fails the test.
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		s.t.Fatalf("testenv: restarting redis-server: %v\n%s", err, s.logTail())
	}
}

func (s *RedisServer) stop(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(sig) // fails only if it has already exited
	<-s.done
	s.proc, s.done = nil, nil
}

func (s *RedisServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("redis-server already running")
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy

	type started struct {
		proc *os.Process
		err  error
	}
	startc := make(chan started, 1)
	done := make(chan struct{})
	go func() {
		// On Linux the child gets SIGKILL if the test binary dies (a -timeout
		// panic skips Cleanup) so no orphan keeps its port. Pdeathsig fires
		// when the forking *thread* exits, so this goroutine keeps the thread
		// locked until the child is reaped, and never unlocks it.
		runtime.LockOSThread()
		cmd := exec.Command(s.bin, s.args...)
		cmd.Dir = s.dir
		cmd.Stdout = logf
		cmd.Stderr = logf
		cmd.SysProcAttr = parentDeathSignal()
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
		return fmt.Errorf("starting %s: %w", s.bin, st.err)
	}

	deadline := time.Now().Add(15 * time.Second)
	for {
		err := redisPing(s.Addr)
		if err == nil {
			// If our server failed to bind, the answer may come from
			// whoever took the port: make sure it is ours.
			pid, err := redisPID(s.Addr)
			if err == nil && pid != st.proc.Pid {
				err = fmt.Errorf("port taken by another redis-server (pid %d)", pid)
			}
			if err != nil {
				_ = st.proc.Kill()
				<-done
				return fmt.Errorf("redis-server on %s: %w", s.Addr, err)
			}
			s.proc, s.done = st.proc, done
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited during startup", s.Addr)
		default:
		}
		if time.Now().After(deadline) {
			_ = st.proc.Kill()
			<-done
			return fmt.Errorf("redis-server on %s did not answer PING within 15s: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logTail returns the last lines the server printed.
func (s *RedisServer) logTail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "redis-server log (" + s.log + "):\n" + strings.Join(lines, "\n")
}

// redisPing sends one PING in RESP and wants +PONG; a server still loading
// its data answers -LOADING, which is not ready yet.
func redisPing(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// redisPID asks the server at addr for its process id (INFO server).
func redisPID(addr string) (int, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(conn)
	header, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(header), "$"))
	if err != nil || !strings.HasPrefix(header, "$") {
		return 0, fmt.Errorf("INFO answered %q", header)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

// parentDeathSignal asks the kernel to SIGKILL the child when its parent
// dies. The field exists only on some systems (Linux, FreeBSD), hence
// reflection rather than one file per GOOS.
func parentDeathSignal() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{}
	if f := reflect.ValueOf(attr).Elem().FieldByName("Pdeathsig"); f.IsValid() && f.CanSet() {
		f.Set(reflect.ValueOf(syscall.SIGKILL).Convert(f.Type()))
	}
	return attr
}

// Package chaos is the fault suite: it runs the real flashsale binary, a
// private redis-server, nats-server and database server as processes on
// loopback ports, drives a recorded history of purchases from concurrent
// buyers who retry unknown outcomes under one Idempotency-Key, injects one
// fault per scenario (kill, SIGSTOP, an empty store, connection resets),
// heals, and checks the invariants from the database and Redis directly.
// docs/faults.md lists the scenarios and how to run them.
package chaos

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// Binaries are the programs a scenario runs, built once per test binary.
type Binaries struct {
	Flashsale string
	NATS      string // nats-server, from the module go.mod pins
}

var (
	buildOnce sync.Once
	bins      Binaries
	buildErr  error
)

// Build builds flashsale into a temporary directory, once, and nats-server
// (testenv.NATSServerBinary).
func Build(t testing.TB) Binaries {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "flashsale-chaos-")
		if err != nil {
			buildErr = err
			return
		}
		bins.Flashsale = filepath.Join(dir, "flashsale")
		if b, err := exec.Command("go", "build", "-o", bins.Flashsale, "github.com/flashsale/flashsale/cmd/flashsale").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build flashsale: %v\n%s", err, b)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	b := bins
	b.NATS = testenv.NATSServerBinary(t)
	return b
}

// Proc is a child process a scenario can kill, freeze and restart. Its
// output (stdout and stderr, across restarts) is kept for Fired and Log.
type Proc struct {
	Name string
	bin  string
	args []string
	env  []string

	out  *syncBuffer
	mu   sync.Mutex
	pid  int
	done chan struct{}
	code int // exit status of the last run once done is closed (-1: by a signal)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StartProc starts bin with args and env (added to the test's environment)
// and kills it on Cleanup. It does not wait for readiness.
func StartProc(t testing.TB, name, bin string, args []string, env map[string]string) *Proc {
	t.Helper()
	p := &Proc{Name: name, bin: bin, args: args, env: os.Environ(), out: &syncBuffer{}}
	for k, v := range env {
		p.env = append(p.env, k+"="+v)
	}
	t.Cleanup(p.Kill)
	if err := p.start(); err != nil {
		t.Fatalf("chaos: starting %s: %v", name, err)
	}
	return p
}

func (p *Proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s already running", p.Name)
		}
	}
	type started struct {
		pid int
		err error
	}
	startc := make(chan started, 1)
	done := make(chan struct{})
	go func() {
		// Pdeathsig fires when the forking thread exits: keep it locked
		// until the child is reaped, so an aborted test leaves no orphan.
		runtime.LockOSThread()
		cmd := exec.Command(p.bin, p.args...)
		cmd.Env = p.env
		cmd.Stdout, cmd.Stderr = p.out, p.out
		cmd.SysProcAttr = parentDeathSignal()
		if err := cmd.Start(); err != nil {
			startc <- started{err: err}
			return
		}
		startc <- started{pid: cmd.Process.Pid}
		_ = cmd.Wait()
		p.mu.Lock()
		p.code = cmd.ProcessState.ExitCode()
		p.mu.Unlock()
		// The child is reaped: give the thread back rather than let the
		// runtime end it, which would kill children other code forked
		// from it without a locked thread.
		runtime.UnlockOSThread()
		close(done)
	}()
	st := <-startc
	if st.err != nil {
		return st.err
	}
	p.pid, p.done = st.pid, done
	return nil
}

// Restart starts the process again with the same command line; a running
// one is killed first.
func (p *Proc) Restart(t testing.TB) {
	t.Helper()
	p.Kill()
	if err := p.start(); err != nil {
		t.Fatalf("chaos: restarting %s: %v", p.Name, err)
	}
}

// SetEnv changes one variable for the next Restart ("" removes it).
func (p *Proc) SetEnv(key, value string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.env[:0:0]
	for _, kv := range p.env {
		if !strings.HasPrefix(kv, key+"=") {
			kept = append(kept, kv)
		}
	}
	if value != "" {
		kept = append(kept, key+"="+value)
	}
	p.env = kept
}

func (p *Proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	pid, done := p.pid, p.done
	p.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	default:
		_ = syscall.Kill(pid, sig)
	}
}

// Kill sends SIGKILL (after SIGCONT, in case it is frozen) and waits until
// the process is gone.
func (p *Proc) Kill() {
	p.signal(syscall.SIGKILL)
	p.signal(syscall.SIGCONT)
	if d := p.doneChan(); d != nil {
		<-d
	}
}

// PID returns the process id of the last start.
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// Term asks the process to stop (SIGTERM) and returns at once: Exited and
// ExitCode tell when and how it ended.
func (p *Proc) Term() { p.signal(syscall.SIGTERM) }

// ExitCode returns the exit status of the last run (-1 if a signal ended it,
// or if it has not ended).
func (p *Proc) ExitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return -1
	}
	select {
	case <-p.done:
		return p.code
	default:
		return -1
	}
}

// Freeze stops the process (SIGSTOP): its sockets stay open, nothing answers.
func (p *Proc) Freeze() { p.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen process (SIGCONT).
func (p *Proc) Thaw() { p.signal(syscall.SIGCONT) }

func (p *Proc) doneChan() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Exited reports whether the process has ended, waiting up to within.
func (p *Proc) Exited(within time.Duration) bool {
	d := p.doneChan()
	if d == nil {
		return true
	}
	select {
	case <-d:
		return true
	case <-time.After(within):
		return false
	}
}

// Log returns what the process printed so far, across restarts.
func (p *Proc) Log() string { return p.out.String() }

// Fired reports whether failpoint name fired in this process (the failpoint
// package prints "failpoint <name> fired").
func (p *Proc) Fired(name string) bool {
	return strings.Contains(p.Log(), "failpoint "+name+" fired")
}

// FreeAddr returns a loopback host:port that was free a moment ago, below
// the ephemeral ports (testenv.FreePort): a process restarted on it finds
// it free again.
func FreeAddr(t testing.TB) string {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// WaitReady polls url+"/readyz" until it answers 200, the process exits or
// within passes.
func WaitReady(p *Proc, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.Exited(0) {
			return fmt.Errorf("%s exited during start:\n%s", p.Name, tail(p.Log(), 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v:\n%s", p.Name, within, tail(p.Log(), 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// parentDeathSignal asks the kernel to SIGKILL the child when its parent
// thread dies (Linux, FreeBSD; reflection keeps one file for every GOOS).
func parentDeathSignal() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{}
	if f := reflect.ValueOf(attr).Elem().FieldByName("Pdeathsig"); f.IsValid() && f.CanSet() {
		f.Set(reflect.ValueOf(syscall.SIGKILL).Convert(f.Type()))
	}
	return attr
}

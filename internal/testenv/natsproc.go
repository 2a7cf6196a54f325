package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

var (
	natsBinOnce sync.Once
	natsBin     string
	natsBinErr  error
)

// NATSServerBinary returns the path of a nats-server binary of the version
// go.mod pins, built from the module cache into a temporary directory once
// per test binary.
func NATSServerBinary(t testing.TB) string {
	t.Helper()
	natsBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "testenv-nats-server-")
		if err != nil {
			natsBinErr = err
			return
		}
		natsBin = filepath.Join(dir, "nats-server")
		if out, err := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
			natsBinErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsBinErr != nil {
		t.Fatalf("testenv: %v", natsBinErr)
	}
	return natsBin
}

// NATSProcess starts nats-server (NATSServerBinary) with JetStream as a process of its
// own on a free loopback port, storing under a t.TempDir, waits until it
// accepts clients and returns its client URL. It is killed on Cleanup.
//
// For tests that drive the broker's API concurrently: the race detector
// watches every goroutine of the test binary, an in-process server's
// included, and nats-server's JetStream API has races of its own (a stream
// update concurrent with a consumer create on that stream) that are the
// broker's, not the code under test's.
func NATSProcess(t testing.TB) (url string) {
	t.Helper()
	bin := NATSServerBinary(t)
	port, err := FreePort()
	if err != nil {
		t.Fatalf("testenv: finding a free port for nats-server: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	logf := filepath.Join(t.TempDir(), "nats-server.log")
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir(), "-l", logf)
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: starting nats-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			if b, _ := os.ReadFile(logf); containsReady(b) {
				return "nats://" + addr
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf)
			t.Fatalf("testenv: nats-server on %s not ready within 15s: %v\n%s", addr, err, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func containsReady(log []byte) bool { return bytes.Contains(log, []byte("Server is ready")) }

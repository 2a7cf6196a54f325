package chaos

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Redis is a private redis-server that keeps nothing on disk: a kill or
// restart loses every key, as the Redis the service is deployed with may.
type Redis struct {
	*Proc
	Addr string
	URL  string
}

// StartRedis starts a private redis-server on a free loopback port and waits
// until it answers PING.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("chaos: redis-server: %v", err)
	}
	addr := FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	r := &Redis{Addr: addr, URL: "redis://" + addr + "/0"}
	r.Proc = StartProc(t, "redis-server", bin,
		[]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir()}, nil)
	r.waitUp(t)
	return r
}

// Restart starts Redis again, empty, on the same port.
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	r.Proc.Restart(t)
	r.waitUp(t)
}

func (r *Redis) waitUp(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		line, err := request(r.Addr, "*1\r\n$4\r\nPING\r\n")
		if err == nil && line == "+PONG" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("chaos: redis-server on %s not up: %v %q\n%s", r.Addr, err, line, r.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// NATS is a nats-server with JetStream storing under Dir.
type NATS struct {
	*Proc
	Addr string
	URL  string
	Dir  string
}

// StartNATS starts nats-server (bin, see Build) with JetStream on a free
// loopback port, storing under a fresh directory, and waits for it.
func StartNATS(t testing.TB, bin string) *NATS {
	t.Helper()
	addr := FreeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	n := &NATS{Addr: addr, URL: "nats://" + addr, Dir: t.TempDir()}
	n.Proc = StartProc(t, "nats-server", bin, []string{"-a", host, "-p", port, "-js", "-sd", n.Dir}, nil)
	n.waitUp(t)
	return n
}

// Restart starts the server again on the same port and store.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	n.Proc.Restart(t)
	n.waitUp(t)
}

func (n *NATS) waitUp(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		line, err := request(n.Addr, "")
		if err == nil && strings.HasPrefix(line, "INFO ") && strings.Contains(n.Log(), "Server is ready") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("chaos: nats-server on %s not up: %v\n%s", n.Addr, err, n.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// request sends msg (if any) to addr and returns the first line answered.
func request(addr, msg string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if msg != "" {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// Service is one flashsale serve process.
type Service struct {
	*Proc
	URL string
	Env map[string]string
}

// StartService starts flashsale serve with env (FLASHSALE_HTTP_ADDR is set
// to a free port when missing) and waits until /readyz answers 200.
func StartService(t testing.TB, bin string, env map[string]string) *Service {
	t.Helper()
	s, err := LaunchService(t, bin, env, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// LaunchService is StartService returning the error of a process that
// exits or is not ready within the bound (the process is left as it is).
func LaunchService(t testing.TB, bin string, env map[string]string, within time.Duration) (*Service, error) {
	t.Helper()
	if env["FLASHSALE_HTTP_ADDR"] == "" {
		env["FLASHSALE_HTTP_ADDR"] = FreeAddr(t)
	}
	s := &Service{URL: "http://" + env["FLASHSALE_HTTP_ADDR"], Env: env}
	s.Proc = StartProc(t, "flashsale", bin, []string{"serve"}, env)
	return s, WaitReady(s.Proc, s.URL, within)
}

// Restart starts the service again with its environment as SetEnv left it.
func (s *Service) Restart(t testing.TB) {
	t.Helper()
	s.Proc.Restart(t)
	if err := WaitReady(s.Proc, s.URL, 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

// ExitedWith reports whether the process has ended within d and, if so, its
// output: a refusal to start is read from it.
func (s *Service) ExitedWith(d time.Duration) (bool, string) {
	if !s.Exited(d) {
		return false, ""
	}
	return true, fmt.Sprint(tail(s.Log(), 10))
}

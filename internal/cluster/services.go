package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/chaos"
	"github.com/flashsale/flashsale/internal/testenv"
)

// freePort returns a port free on host a moment ago.
func freePort(t testing.TB, host string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// RedisCluster is six redis-server processes (nothing kept on disk) formed
// into three primaries with a replica each by redis-cli --cluster create;
// node timeout 2 s, so a replica takes over a dead primary within seconds.
type RedisCluster struct {
	Nodes []*chaos.Proc
	Addrs []string // Nodes[i] listens on Addrs[i]
	URL   string   // rueidis' cluster form: redis://n1?addr=n2&addr=...
}

// StartRedisCluster starts the cluster on host (an address of this
// machine) and waits until every node reports cluster_state:ok.
func StartRedisCluster(t testing.TB, host string) *RedisCluster {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("cluster: redis-server: %v", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("cluster: redis-cli: %v", err)
	}
	c := &RedisCluster{}
	for i := 0; i < 6; i++ {
		// Below the ephemeral range with its bus port (+10000): a port on
		// the ephemeral range's top has no bus port (Redis refuses ports
		// above 55535 in cluster mode), and a bus port in it can be taken
		// by the local end of any connection.
		port, err := testenv.FreeClusterPort()
		if err != nil {
			t.Fatal(err)
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		dir := t.TempDir()
		p := chaos.StartProc(t, fmt.Sprintf("redis-%d", i+1), bin, []string{
			"--port", strconv.Itoa(port), "--bind", host, "--save", "", "--appendonly", "no", "--dir", dir,
			"--protected-mode", "no", "--cluster-announce-ip", host, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--cluster-config-file", "nodes.conf",
			"--repl-diskless-sync-delay", "0", // a replica's first sync at once, not after 5 s
		}, nil)
		c.Nodes, c.Addrs = append(c.Nodes, p), append(c.Addrs, addr)
	}
	for _, a := range c.Addrs {
		waitCmd(t, cli, a, "PONG", 15*time.Second, "PING")
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	cctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(cctx, cli, append(args, "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput(); err != nil {
		t.Fatalf("cluster: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.URL = "redis://" + c.Addrs[0] + "?addr=" + strings.Join(c.Addrs[1:], "&addr=")
	if err := c.WaitOK(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// WaitOK waits until every running node reports cluster_state:ok and three
// primaries.
func (c *RedisCluster) WaitOK(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := c.ok()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster not ok after %v: %w", within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *RedisCluster) ok() error {
	for i, a := range c.Addrs {
		if c.Nodes[i].Exited(0) {
			continue
		}
		info, err := redisCmd(a, "CLUSTER", "INFO")
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state not ok", a)
		}
		if n := len(c.primaries(a)); n != 3 {
			return fmt.Errorf("%s sees %d primaries", a, n)
		}
		// A replica that has not finished its first sync has no data to
		// take over with and never stands for election: a primary killed
		// before then stays dead (seen: "no failover after 30s").
		repl, err := redisCmd(a, "INFO", "replication")
		if err != nil {
			return err
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("%s: replica not in sync with its primary yet", a)
		}
	}
	return nil
}

// WaitPromoted waits until dead (a killed primary) is no longer a primary
// and the cluster is ok again: its replica took over.
func (c *RedisCluster) WaitPromoted(dead string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := c.ok()
		if err == nil && slices.Contains(c.Primaries(), dead) {
			err = fmt.Errorf("%s still a primary", dead)
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster: no failover after %v: %w", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Primaries returns the addresses of the primaries serving slots, as the
// first running node sees them.
func (c *RedisCluster) Primaries() []string {
	for i, a := range c.Addrs {
		if !c.Nodes[i].Exited(0) {
			if p := c.primaries(a); len(p) > 0 {
				return p
			}
		}
	}
	return nil
}

func (c *RedisCluster) primaries(addr string) []string {
	out, err := redisCmd(addr, "CLUSTER", "NODES")
	if err != nil {
		return nil
	}
	var ps []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		a, _, _ := strings.Cut(f[1], "@")
		ps = append(ps, a)
	}
	return ps
}

// PrimaryOf returns the primary that serves key's slot.
func (c *RedisCluster) PrimaryOf(t testing.TB, key string) string {
	t.Helper()
	slot, err := redisCmd(c.Primaries()[0], "CLUSTER", "KEYSLOT", key)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := strconv.Atoi(strings.TrimSpace(slot))
	out, err := redisCmd(c.Primaries()[0], "CLUSTER", "NODES")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, found := strings.Cut(r, "-")
			if !found {
				hi = lo
			}
			l, _ := strconv.Atoi(lo)
			h, _ := strconv.Atoi(hi)
			if s >= l && s <= h {
				a, _, _ := strings.Cut(f[1], "@")
				return a
			}
		}
	}
	t.Fatalf("cluster: no primary serves slot %d", s)
	return ""
}

// Node returns the process listening on addr.
func (c *RedisCluster) Node(addr string) *chaos.Proc {
	for i, a := range c.Addrs {
		if a == addr {
			return c.Nodes[i]
		}
	}
	return nil
}

// redisCmd runs one command with redis-cli and returns its output.
func redisCmd(addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("redis-cli %s %v: %v: %s", addr, args, err, out)
	}
	return string(out), nil
}

func waitCmd(t testing.TB, cli, addr, want string, within time.Duration, args ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, err := redisCmd(addr, args...)
		if err == nil && strings.Contains(out, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster: %s %v: %q %v", addr, args, out, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// NATSCluster is three nats-server processes with JetStream, joined by
// routes.
type NATSCluster struct {
	Nodes []*chaos.Proc
	Addrs []string // client addresses
	Names []string // server names (a stream's leader is named by them)
	URL   string   // nats://a,nats://b,nats://c
}

// StartNATSCluster starts three nodes on host and waits until JetStream has
// a meta leader (each node's /healthz answers ok).
func StartNATSCluster(t testing.TB, bin, host string) *NATSCluster {
	t.Helper()
	name := testenv.RandomName("flashsale-")
	var routes, mons []string
	var cports []int
	n := &NATSCluster{}
	for i := 0; i < 3; i++ {
		cp := freePort(t, host)
		cports = append(cports, cp)
		routes = append(routes, fmt.Sprintf("nats://%s", net.JoinHostPort(host, strconv.Itoa(cp))))
	}
	var urls []string
	for i := 0; i < 3; i++ {
		port, mon := freePort(t, host), freePort(t, host)
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		sname := fmt.Sprintf("%s-n%d", name, i+1)
		p := chaos.StartProc(t, "nats-"+strconv.Itoa(i+1), bin, []string{
			"-a", host, "-p", strconv.Itoa(port), "-m", strconv.Itoa(mon), "-n", sname,
			"-js", "-sd", t.TempDir(), "--cluster_name", name,
			"--cluster", fmt.Sprintf("nats://%s", net.JoinHostPort(host, strconv.Itoa(cports[i]))),
			"--routes", strings.Join(routes, ","),
		}, nil)
		n.Nodes, n.Addrs, n.Names = append(n.Nodes, p), append(n.Addrs, addr), append(n.Names, sname)
		mons = append(mons, net.JoinHostPort(host, strconv.Itoa(mon)))
		urls = append(urls, "nats://"+addr)
	}
	n.URL = strings.Join(urls, ",")
	for i, m := range mons {
		if err := waitHealthz(m, 30*time.Second); err != nil {
			t.Fatalf("cluster: nats node %d: %v\n%s", i+1, err, n.Nodes[i].Log())
		}
	}
	return n
}

// waitHealthz polls a nats-server's /healthz (JetStream current) until ok.
func waitHealthz(mon string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", mon, time.Second)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.0\r\n\r\n")
			b, _ := io.ReadAll(c)
			c.Close()
			if strings.HasPrefix(string(b), "HTTP/1.0 200") || strings.HasPrefix(string(b), "HTTP/1.1 200") {
				return nil
			}
			err = fmt.Errorf("%.120s", b)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("healthz %s after %v: %v", mon, within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Forward listens on host and copies every connection to target: a way for
// a process in another network namespace to reach a service bound to
// loopback. Closed on Cleanup.
func Forward(t testing.TB, host, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

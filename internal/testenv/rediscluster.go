package testenv

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// RedisCluster is a private Redis Cluster started by StartRedisCluster:
// three primaries, each with one replica, on private redis-servers.
type RedisCluster struct {
	// Nodes are the six servers in the order they were started. Which of
	// them is a primary changes with failovers: ask Primaries and ReplicaOf.
	Nodes []*RedisServer
	// URL names every node in rueidis' cluster form,
	// redis://n1?addr=n2&addr=n3..., as FLASHSALE_REDIS_URL takes it.
	URL string

	t testing.TB
}

// StartRedisCluster starts six redis-servers with --cluster-enabled yes on
// free loopback ports (nothing saved to disk unless args say so; args are
// given to every node, after the defaults) and forms a cluster of three
// primaries and three replicas with redis-cli --cluster create
// --cluster-replicas 1. It returns when every node reports cluster_state:ok
// and every replica has finished its first sync. The servers are killed on
// Cleanup.
//
// The node timeout is 2 s (--cluster-node-timeout 2000), so a killed primary
// is replaced by its replica within a few seconds.
//
// No redis-server or redis-cli binary makes the test Unavailable.
func StartRedisCluster(t testing.TB, args ...string) *RedisCluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Unavailable(t, "redis-cli", err)
	}
	c := &RedisCluster{t: t}
	nodeArgs := append([]string{"--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
		"--cluster-config-file", "nodes.conf"}, args...)
	addrs := make([]string, 0, 6)
	for range 6 {
		s := StartRedis(t, nodeArgs...)
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	c.URL = "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")

	create := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "1", "--cluster-yes")...)
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK()
	return c
}

// WaitOK waits until every running node reports cluster_state:ok, agrees on
// three primaries covering every slot, and every replica's link to its
// primary is up. It fails the test after 30 s.
func (c *RedisCluster) WaitOK() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.ok()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("testenv: redis cluster not ok after 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *RedisCluster) ok() error {
	var view string
	for _, s := range c.Nodes {
		if !s.running() {
			continue
		}
		info, err := command(s.Addr, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: %w", s.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state not ok", s.Addr)
		}
		nodes, err := c.nodes(s.Addr)
		if err != nil {
			return err
		}
		// Every node's view of who is primary must be the same.
		var masters []string
		for _, n := range nodes {
			if n.primary && !n.failed {
				masters = append(masters, n.addr)
			}
		}
		if len(masters) != 3 {
			return fmt.Errorf("%s sees %d primaries", s.Addr, len(masters))
		}
		v := strings.Join(masters, ",")
		if view == "" {
			view = v
		} else if v != view {
			return fmt.Errorf("nodes disagree on the primaries: %s vs %s", view, v)
		}
		repl, err := command(s.Addr, "INFO", "replication")
		if err != nil {
			return err
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("replica %s: link to its primary not up", s.Addr)
		}
	}
	return nil
}

// Primaries returns the addresses of the current primaries, sorted, as the
// first running node sees them.
func (c *RedisCluster) Primaries() []string {
	c.t.Helper()
	nodes := c.view()
	var out []string
	for _, n := range nodes {
		if n.primary && !n.failed {
			out = append(out, n.addr)
		}
	}
	return out
}

// ReplicaOf returns the address of a replica of the primary at addr.
func (c *RedisCluster) ReplicaOf(addr string) string {
	c.t.Helper()
	nodes := c.view()
	var id string
	for _, n := range nodes {
		if n.addr == addr {
			id = n.id
		}
	}
	for _, n := range nodes {
		if n.master == id && id != "" && !n.failed {
			return n.addr
		}
	}
	c.t.Fatalf("testenv: no replica of %s", addr)
	return ""
}

// Node returns the server listening on addr.
func (c *RedisCluster) Node(addr string) *RedisServer {
	c.t.Helper()
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	c.t.Fatalf("testenv: no cluster node %s", addr)
	return nil
}

// Failover promotes the replica at addr with CLUSTER FAILOVER mode ("" for a
// coordinated failover, "FORCE" or "TAKEOVER", which do not wait for the
// primary and so may lose its last writes) and waits until the cluster is ok
// with addr a primary.
func (c *RedisCluster) Failover(addr, mode string) {
	c.t.Helper()
	args := []string{"CLUSTER", "FAILOVER"}
	if mode != "" {
		args = append(args, mode)
	}
	if _, err := command(addr, args...); err != nil {
		c.t.Fatalf("testenv: %s on %s: %v", strings.Join(args, " "), addr, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if slices.Contains(c.Primaries(), addr) && c.ok() == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("testenv: %s did not become a primary within 30s", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Client returns a cluster client of every node, without client-side
// caching, closed at Cleanup.
func (c *RedisCluster) Client() rueidis.Client {
	c.t.Helper()
	return RedisClient(c.t, c.URL)
}

type clusterNode struct {
	id, addr, master string
	primary, failed  bool
}

func (c *RedisCluster) view() []clusterNode {
	c.t.Helper()
	for _, s := range c.Nodes {
		if !s.running() {
			continue
		}
		nodes, err := c.nodes(s.Addr)
		if err == nil {
			return nodes
		}
	}
	c.t.Fatalf("testenv: no cluster node answers CLUSTER NODES")
	return nil
}

// nodes parses CLUSTER NODES as the node at addr sees it, sorted by address.
func (c *RedisCluster) nodes(addr string) ([]clusterNode, error) {
	out, err := command(addr, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	var nodes []clusterNode
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		a, _, _ := strings.Cut(f[1], "@")
		flags := f[2]
		nodes = append(nodes, clusterNode{
			id:      f[0],
			addr:    a,
			master:  f[3],
			primary: strings.Contains(flags, "master"),
			failed:  strings.Contains(flags, "fail") && !strings.Contains(flags, "fail?") || strings.Contains(flags, "noaddr"),
		})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].addr < nodes[j].addr })
	return nodes, nil
}

// running reports whether the server's process is up.
func (s *RedisServer) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// command sends one command in RESP to addr and returns a bulk or simple
// string reply; an error reply is an error.
func command(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	header, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	header = strings.TrimRight(header, "\r\n")
	switch {
	case strings.HasPrefix(header, "+"):
		return header[1:], nil
	case strings.HasPrefix(header, "-"):
		return "", fmt.Errorf("%s", header[1:])
	case strings.HasPrefix(header, "$"):
		n, err := strconv.Atoi(header[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("reply %q", header)
		}
		body := make([]byte, n+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return "", err
		}
		return string(body[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", header)
}

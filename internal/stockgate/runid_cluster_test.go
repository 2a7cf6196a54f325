package stockgate_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// startCluster starts a Redis Cluster of three primaries (no replicas) on
// private redis-servers: slots split in three, nodes introduced by MEET.
func startCluster(t *testing.T) []*testenv.RedisServer {
	t.Helper()
	ctx := context.Background()
	var nodes []*testenv.RedisServer
	for range 3 {
		nodes = append(nodes, testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000"))
	}
	single := func(s *testenv.RedisServer) rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	first := single(nodes[0])
	for i, s := range nodes {
		c := single(s)
		lo, hi := i*16384/3, (i+1)*16384/3-1
		if err := c.Do(ctx, c.B().ClusterAddslotsrange().StartSlotEndSlot().StartSlotEndSlot(int64(lo), int64(hi)).Build()).Error(); err != nil {
			t.Fatalf("addslotsrange on %s: %v", s.Addr, err)
		}
		if i > 0 {
			host, port, _ := strings.Cut(s.Addr, ":")
			p, _ := strconv.ParseInt(port, 10, 64)
			if err := first.Do(ctx, first.B().ClusterMeet().Ip(host).Port(p).Build()).Error(); err != nil {
				t.Fatalf("meet %s: %v", s.Addr, err)
			}
		}
	}
	waitClusterOK(t, nodes)
	return nodes
}

func waitClusterOK(t *testing.T, nodes []*testenv.RedisServer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range nodes {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		for {
			info, err := c.Do(context.Background(), c.B().ClusterInfo().Build()).ToString()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s: %v %s", s.Addr, err, info)
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Close()
	}
}

// TestRunIDCluster: on a Redis Cluster the run id the restart monitor
// compares is stable while no node restarts (INFO alone goes to an
// arbitrary node, whose run id differs from the last one's: every check
// looked like a restart and rebuilt every sale), and changes when one does.
func TestRunIDCluster(t *testing.T) {
	nodes := startCluster(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{nodes[0].Addr, nodes[1].Addr, nodes[2].Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode %v, want cluster", c.Mode())
	}
	g := stockgate.New(c, "fs")
	ctx := context.Background()
	first, err := g.RunID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		got, err := g.RunID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got != first {
			t.Fatalf("call %d: run id %q, first %q: changed with no restart", i, got, first)
		}
	}

	nodes[1].Restart()
	waitClusterOK(t, nodes)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := g.RunID(ctx)
		if err == nil && got != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run id %q (%v) after a node restarted, want a change from %q", got, err, first)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPingCluster: readiness PINGs every primary of a Redis Cluster, so a
// dead primary (its SKUs can sell nothing) is seen whichever node a keyless
// PING would have reached, and its promoted replica is ready again.
func TestPingCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	rc := testenv.StartRedisCluster(t)
	g := stockgate.New(rc.Client(), "fs")
	ctx := context.Background()
	if err := g.Ping(ctx); err != nil {
		t.Fatalf("healthy cluster: %v", err)
	}
	prim, err := g.Primaries(ctx)
	if err != nil || len(prim) != 3 {
		t.Fatalf("primaries %v, %v; want 3", prim, err)
	}
	p := rc.Primaries()[1]
	rep := rc.ReplicaOf(p)
	rc.Node(p).Kill()
	for i := range 10 {
		if err := g.Ping(ctx); err == nil {
			t.Fatalf("ping %d with primary %s dead: nil error", i, p)
		}
	}
	rc.WaitOK()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := g.Ping(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s promoted, ping still fails: %v", rep, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRunIDClusterHostnames: a cluster that announces hostnames
// (cluster-preferred-endpoint-type hostname, as deploy/compose/cluster.yaml
// does) is known to the client by hostname:port while CLUSTER NODES leads
// with ip:port: readiness and the run id still find every primary.
func TestRunIDClusterHostnames(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	rc := testenv.StartRedisCluster(t, "--cluster-announce-hostname", "localhost", "--cluster-preferred-endpoint-type", "hostname")
	g := stockgate.New(rc.Client(), "fs")
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	var first string
	for {
		var err error
		if first, err = g.RunID(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run id: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(first, "localhost:") || strings.Count(first, "=") != 3 {
		t.Fatalf("run id %q: want 3 primaries by hostname", first)
	}
	if err := g.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if again, err := g.RunID(ctx); err != nil || again != first {
		t.Fatalf("run id changed with nothing happening: %q %v, first %q", again, err, first)
	}
}

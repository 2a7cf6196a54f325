package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a JetStream cluster of in-process nats-servers started by
// StartNATSCluster.
type NATSCluster struct {
	// Servers are the nodes; each can be shut down and restarted on its own
	// (same ports, same store).
	Servers []*NATSServer
	// URL lists every node's client URL, comma-separated, as nats.Connect
	// and FLASHSALE_NATS_URL take it.
	URL string
}

// StartNATSCluster starts n in-process nats-servers with JetStream, joined
// by routes into one cluster (a random cluster name), each storing under its
// own t.TempDir, and waits until they elected a JetStream meta leader. They
// are shut down on Cleanup. n must be at least 3 for a stream of 3 replicas
// to survive the loss of one node.
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("testenv: StartNATSCluster(%d)", n)
	}
	name := RandomName("testenv-cluster-")
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range n {
		p, err := FreePort()
		if err != nil {
			t.Fatalf("testenv: free port for a nats route: %v", err)
		}
		ports[i] = p
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	c := &NATSCluster{}
	urls := make([]string, n)
	for i := range n {
		s := &NATSServer{
			StoreDir:    t.TempDir(),
			t:           t,
			name:        fmt.Sprintf("%s-n%d", name, i+1),
			port:        -1,
			cluster:     name,
			clusterPort: ports[i],
			routes:      strings.Join(routes, ","),
		}
		t.Cleanup(s.Shutdown)
		s.start()
		c.Servers = append(c.Servers, s)
		urls[i] = s.URL
	}
	c.URL = strings.Join(urls, ",")
	c.WaitReady()
	return c
}

// WaitReady waits until every running node is routed to the others, a
// JetStream meta leader is elected and it can place a replica on every
// running node. It fails the test after 30 s.
func (c *NATSCluster) WaitReady() {
	t := c.Servers[0].t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		up, leader, routed, placeable := 0, false, true, 0
		for _, s := range c.Servers {
			s.mu.Lock()
			srv := s.srv
			s.mu.Unlock()
			if srv == nil {
				continue
			}
			up++
			if srv.JetStreamIsLeader() {
				leader = true
				// The peers the leader has heard statistics from: only
				// those can take a replica. A stream created before every
				// running node is among them fails with "no suitable peers
				// for placement, peer offline".
				placeable = len(srv.JetStreamClusterPeers())
			}
			if srv.NumRoutes() == 0 && len(c.Servers) > 1 {
				routed = false
			}
		}
		ready := leader && routed && placeable >= up
		if ready {
			for _, s := range c.Servers {
				s.mu.Lock()
				srv := s.srv
				s.mu.Unlock()
				if srv != nil && !srv.JetStreamIsCurrent() {
					ready = false
				}
			}
		}
		if ready && up > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: nats cluster not ready within 30s (%d up, leader %v, routed %v, %d placeable)", up, leader, routed, placeable)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitCurrent waits until each named stream, and every consumer of it, has
// a leader and every replica caught up, so that shutting one node down
// leaves a current copy (a stream whose replicas were just raised copies
// its messages to the new peers first). It fails the test after 30 s.
func (c *NATSCluster) WaitCurrent(streams ...string) {
	t := c.Servers[0].t
	t.Helper()
	conn, err := nats.Connect(c.URL)
	if err != nil {
		t.Fatalf("testenv: nats cluster: %v", err)
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	current := func(ci *jetstream.ClusterInfo) bool {
		if ci == nil || ci.Leader == "" {
			return false
		}
		for _, r := range ci.Replicas {
			if !r.Current {
				return false
			}
		}
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range streams {
		for {
			ok := false
			if st, err := js.Stream(ctx, name); err == nil {
				if info, err := st.Info(ctx); err == nil && current(info.Cluster) {
					ok = true
					for names := st.ListConsumers(ctx); ok; {
						ci, more := <-names.Info()
						if !more {
							break
						}
						ok = current(ci.Cluster)
					}
				}
			}
			if ok {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("testenv: stream %s or its consumers not current within 30s", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

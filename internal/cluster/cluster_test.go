package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/chaos"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/testenv"
)

const (
	// hotBuckets is the hot SKU's stock bucket count: one bucket per
	// Redis primary, so its gate calls land on all three.
	hotBuckets = 3
	// natsReplicas is the order streams' replica count the instances ask
	// for (FLASHSALE_NATS_REPLICAS; a build without the setting ignores it
	// and creates one replica).
	natsReplicas = 3
)

// clusterMode reads FLASHSALE_CLUSTER: "short" (make test-cluster-short,
// part of make test) or "full" (make test-cluster): longer phases, more
// buyers. Unset: the test skips.
func clusterMode(t *testing.T) (full bool) {
	switch m := os.Getenv("FLASHSALE_CLUSTER"); m {
	case "":
		t.Skip("the cluster test runs when FLASHSALE_CLUSTER is short or full (make test-cluster-short, make test-cluster)")
	case "short":
		return false
	case "full":
		return true
	default:
		t.Fatalf("FLASHSALE_CLUSTER=%q: want short or full", m)
	}
	return false
}

// row is one fault's line of the table.
type row struct {
	fault    string
	detected time.Duration // the fault handled: replica promoted, node back, instance out of HAProxy
	selling  time.Duration // from the fault until every SKU sells again through the balancer
	idle     time.Duration // from the buyers' stop until idle with every invariant holding
	accepted int
	failures []string
	viol     []string
	note     string
}

// TestCluster: a sale of a hot SKU and normal ones through HAProxy in front
// of three instances, on a Redis Cluster of three primaries with a replica
// each and a three-node JetStream cluster; one fault per phase (a Redis
// primary killed, a NATS node killed, an instance killed, an instance cut off
// from Redis), the invariants checked from the database after each.
func TestCluster(t *testing.T) {
	full := clusterMode(t)
	phase := 3 * time.Second // sale before the fault, and after it heals
	faultFor := 6 * time.Second
	hotRate, normRate := 40, 6
	if full {
		phase, faultFor, hotRate, normRate = 10*time.Second, 15*time.Second, 100, 15
	}
	bins := chaos.Build(t)
	ns := NewNetNS(t)
	redis := StartRedisCluster(t, ns.RedisIP)
	nc := StartNATSCluster(t, bins.NATS, ns.HostIP)
	dbURL := testenv.Database(t)
	nsDB := viaForward(t, dbURL, ns.HostIP)

	env := baseEnv(t, dbURL, redis.URL, nc.URL)
	env["FLASHSALE_NATS_REPLICAS"] = strconv.Itoa(natsReplicas)
	env["FLASHSALE_ACK_WAIT"] = "3s"
	env["FLASHSALE_APPLY_BACKOFF"] = "200ms"
	env["FLASHSALE_INFLIGHT_REPUBLISH_AFTER"] = "3s"
	const nsPort = "18080"
	svcs := make([]*chaos.Service, 3)
	svcs[0] = chaos.StartService(t, bins.Flashsale, copyEnv(env))
	svcs[1] = chaos.StartService(t, bins.Flashsale, copyEnv(env))
	// The third runs in the namespace: its database through a forwarder,
	// Redis and NATS at their own addresses (reachable from the namespace).
	e3 := copyEnv(env, "FLASHSALE_HTTP_ADDR", net.JoinHostPort(ns.NSIP, nsPort), "FLASHSALE_DATABASE_URL", nsDB)
	bin, args := ns.Command(bins.Flashsale, "serve")
	svcs[2] = &chaos.Service{Proc: chaos.StartProc(t, "flashsale-3", bin, args, e3), URL: "http://" + e3["FLASHSALE_HTTP_ADDR"], Env: e3}
	if err := chaos.WaitReady(svcs[2].Proc, svcs[2].URL, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	lb := StartHAProxy(t, []string{svcs[0].Env["FLASHSALE_HTTP_ADDR"], svcs[1].Env["FLASHSALE_HTTP_ADDR"], e3["FLASHSALE_HTTP_ADDR"]})
	for i := range svcs {
		if _, err := lb.WaitState(serverName(i), "UP", 15*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	c := chaos.NewClient(lb.URL, userSecret, adminToken, 5*time.Second)
	// The hot SKU and four normal ones never sell out; the small one does,
	// under the faults (checked at the end: I7).
	const small = "n5"
	skus := []string{"hot", "n1", "n2", "n3", "n4", small}
	for _, sku := range skus {
		stock := 100000
		if sku == small {
			stock = 150
		}
		body := fmt.Sprintf(`{"stock":%d,"per_user_limit":1}`, stock)
		if sku == "hot" && hotBuckets > 1 {
			body = fmt.Sprintf(`{"stock":%d,"per_user_limit":1,"buckets":%d}`, stock, hotBuckets)
		}
		r := c.Do(ctx, http.MethodPut, "/admin/v1/skus/"+sku, body, "Authorization: Bearer "+adminToken)
		if r.Status != http.StatusCreated && r.Status != http.StatusOK {
			t.Fatalf("put %s: %d %s %v", sku, r.Status, r.Raw, r.Err)
		}
	}
	ck := chaos.NewChecker(t, dbURL, redis.URL, "cl")
	t.Logf("up: Redis Cluster %v, NATS %v, instances behind %s", redis.Addrs, nc.Addrs, lb.URL)
	var rows []*row

	// run is one phase: the sale starts, fault injects (and returns what
	// it measured), heal undoes it, the sale goes on, stops, and the
	// invariants are checked.
	n := 0
	run := func(name string, fault func(r *row), heal func(r *row)) {
		n++
		r := &row{fault: name}
		rows = append(rows, r)
		var loads []chaos.Load
		for _, sku := range skus {
			l := chaos.Load{SKU: sku, Buyers: 1 << 30, Workers: 3, Rate: normRate, Tries: 8, For: 10 * time.Minute, Users: fmt.Sprintf("p%d%s", n, sku)}
			if sku == "hot" {
				l.Workers, l.Rate = 16, hotRate
			}
			loads = append(loads, l)
		}
		sale := StartSale(c, loads)
		time.Sleep(phase)
		t.Logf("%s: injecting", name)
		at := time.Now()
		fault(r)
		t.Logf("%s: handled after %v: %s", name, r.detected, r.note)
		r.selling = waitSelling(ctx, c, skus, fmt.Sprintf("probe%d", n), 20*time.Second)
		t.Logf("%s: every SKU sells again %v after the fault", name, r.selling)
		if rest := faultFor - time.Since(at); rest > 0 {
			time.Sleep(rest)
		}
		if heal != nil {
			heal(r)
		}
		time.Sleep(phase)
		sale.Stop()
		t.Logf("%s: healed, buyers stopped: %s", name, sale.Summary())
		stopped := time.Now()
		r.failures = sale.Failures()
		r.accepted = sale.Accepted()
		_, r.viol = Verify(ctx, ck, sale, 20*time.Second, false)
		r.idle = time.Since(stopped)
		for _, v := range r.viol {
			t.Errorf("%s: %s", name, v)
		}
		if r.accepted == 0 {
			t.Errorf("%s: nothing was bought: the phase proves nothing", name)
		}
	}

	var killedRedis string
	run("redis_primary_killed", func(r *row) {
		killedRedis = redis.PrimaryOf(t, "{hot}")
		at := time.Now()
		redis.Node(killedRedis).Kill()
		r.note = fmt.Sprintf("primary of {hot} (%s) killed, its replica promoted", killedRedis)
		if err := redis.WaitPromoted(killedRedis, 30*time.Second); err != nil {
			t.Error(err)
			for i, n := range redis.Nodes {
				l := n.Log()
				t.Logf("%s log (last 3000 bytes):\n%s", redis.Addrs[i], l[max(0, len(l)-3000):])
			}
			r.note = fmt.Sprintf("primary of {hot} (%s) killed; cluster not ok within 30s", killedRedis)
		}
		r.detected = time.Since(at)
	}, func(r *row) {
		redis.Node(killedRedis).Restart(t) // rejoins as a replica of the new primary
		_ = redis.WaitOK(30 * time.Second)
	})

	var killedNATS int
	run("nats_node_killed", func(r *row) {
		killedNATS = streamLeader(t, nc)
		at := time.Now()
		nc.Nodes[killedNATS].Kill()
		r.detected = waitStreamLeader(t, nc, killedNATS, 15*time.Second)
		if r.detected < 0 {
			r.note = fmt.Sprintf("leader of %s (%s) killed; no other leader within 15s", orderqueue.StreamName, nc.Names[killedNATS])
			r.detected = time.Since(at)
		} else {
			r.note = fmt.Sprintf("leader of %s (%s) killed, another elected", orderqueue.StreamName, nc.Names[killedNATS])
		}
	}, func(r *row) {
		nc.Nodes[killedNATS].Restart(t)
	})

	run("instance_killed", func(r *row) {
		at := time.Now()
		svcs[0].Kill()
		if _, err := lb.WaitState(serverName(0), "DOWN", 15*time.Second); err != nil {
			t.Error(err)
		}
		r.detected = time.Since(at)
		r.note = "flashsale-1 SIGKILLed; HAProxy marks it DOWN"
	}, func(r *row) {
		svcs[0].Restart(t)
		_, _ = lb.WaitState(serverName(0), "UP", 20*time.Second)
	})

	run("instance_partitioned", func(r *row) {
		at := time.Now()
		ns.CutRedis(t)
		r.detected = breakerOpen(svcs[2], 30*time.Second)
		if r.detected < 0 {
			r.detected = time.Since(at)
			r.note = "flashsale-3 cut off from Redis; its breaker never opened"
		} else {
			r.note = "flashsale-3 cut off from Redis; breaker open, database fallback sells"
		}
	}, func(r *row) {
		ns.HealRedis(t)
	})

	// Last, after every fault: fresh buyers get exactly what is left of the
	// small SKU (sold out under the faults), then sold_out (I7).
	final := &Sale{Client: c, Loads: []chaos.Load{{SKU: small}}, Hist: map[string]*chaos.History{small: {}}}
	_, viol := Verify(ctx, ck, final, 60*time.Second, true)
	for _, v := range viol {
		t.Errorf("after the faults: %s", v)
	}

	// Then the shipped cluster drill, on the same topology: a ramp, a
	// spike, a hold with faults, graded by its own criteria.
	clusterDrill(t, bins.Flashsale, lb, svcs[1], redis, nc, dbURL, full)

	var b strings.Builder
	fmt.Fprintf(&b, "\n%-22s %9s %9s %9s %8s  %-40s %s\n", "fault", "detected", "selling", "idle", "accepted", "buyers saw (5xx, no answer)", "notes")
	for _, r := range rows {
		fs := strings.Join(r.failures, "; ")
		if fs == "" {
			fs = "none"
		}
		selling := "never"
		if r.selling >= 0 {
			selling = r.selling.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "%-22s %9s %9s %9s %8d  %-40s %s\n", r.fault, r.detected.Round(100*time.Millisecond), selling,
			r.idle.Round(100*time.Millisecond), r.accepted, fs, r.note)
		for _, v := range r.viol {
			fmt.Fprintf(&b, "%-22s   - %s\n", "", v)
		}
	}
	t.Log(b.String())
	if path := os.Getenv("FLASHSALE_CLUSTER_REPORT"); path != "" {
		_ = os.WriteFile(path, []byte(b.String()), 0o644)
	}
}

// viaForward returns dbURL with its host:port replaced by a forwarder on
// host (for the instance in the namespace).
func viaForward(t *testing.T, dbURL, host string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = Forward(t, host, u.Host)
	return u.String()
}

// waitSelling returns how long until a fresh buyer's purchase on every SKU
// is answered through the balancer: 202, or 409 sold_out (each SKU probed
// until it is); -1 if not within. The probes are not in any history: their
// orders are checked by I1-I6 as every order is, not by I4.
func waitSelling(ctx context.Context, c *chaos.Client, skus []string, user string, within time.Duration) time.Duration {
	start := time.Now()
	left := map[string]bool{}
	for _, s := range skus {
		left[s] = true
	}
	for i := 0; len(left) > 0 && time.Since(start) < within; i++ {
		for s := range left {
			u := fmt.Sprintf("%s-%d", user, i)
			if r := c.Buy(ctx, u, s, 1, u+"-"+s); r.Status == http.StatusAccepted || r.Code() == "sold_out" {
				delete(left, s)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		return -1
	}
	return time.Since(start)
}

// streamLeader returns the index of the node leading the order stream.
func streamLeader(t *testing.T, nc *NATSCluster) int {
	t.Helper()
	conn, err := nats.Connect(nc.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, orderqueue.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster != nil {
		t.Logf("%s: %d replicas, leader %s", orderqueue.StreamName, info.Config.Replicas, info.Cluster.Leader)
		for i, n := range nc.Names {
			if n == info.Cluster.Leader {
				return i
			}
		}
	}
	t.Fatalf("no leader for %s: %+v", orderqueue.StreamName, info.Cluster)
	return 0
}

// waitStreamLeader waits until the order stream answers with a leader other
// than node old; -1 if not within.
func waitStreamLeader(t *testing.T, nc *NATSCluster, old int, within time.Duration) time.Duration {
	start := time.Now()
	conn, err := nats.Connect(nc.URL, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	for time.Since(start) < within {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := js.Stream(ctx, orderqueue.StreamName)
		if err == nil {
			info, err := s.Info(ctx)
			if err == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != nc.Names[old] {
				cancel()
				return time.Since(start)
			}
		}
		cancel()
		time.Sleep(100 * time.Millisecond)
	}
	return -1
}

// breakerOpen waits until s logs its breaker opening; -1 if not within.
func breakerOpen(s *chaos.Service, within time.Duration) time.Duration {
	start := time.Now()
	seen := strings.Count(s.Log(), "to=open")
	for time.Since(start) < within {
		if strings.Count(s.Log(), "to=open") > seen {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1
}

package cluster

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/flashsale/flashsale/internal/chaos"
	"github.com/flashsale/flashsale/internal/drill"
)

// clusterDrill runs the shipped cluster drill through the balancer against
// the topology TestCluster built (deploy/drills/cluster.json with
// FLASHSALE_CLUSTER=full, cluster-short.json in make test): its faults are
// shell commands on process ids the file reads from the environment (a
// Redis primary, the order stream's leader, an instance), as an operator
// exports them for a deployment of their own. The drill must pass: every
// fault run, its criteria met, and I1-I7 read from the database and Redis.
func clusterDrill(t *testing.T, bin string, lb *HAProxy, inst *chaos.Service, redis *RedisCluster, nc *NATSCluster, dbURL string, full bool) {
	t.Helper()
	file := "../../deploy/drills/cluster-short.json"
	if full {
		file = "../../deploy/drills/cluster.json"
	}
	primary := redis.Node(redis.Primaries()[0])
	leader := nc.Nodes[streamLeader(t, nc)]
	out := filepath.Join(t.TempDir(), "drill.json")
	cmd := exec.Command(bin, "drill", "-target", lb.URL, "-json", out,
		"-database-url", dbURL, "-redis-url", redis.URL, "-redis-prefix", "cl",
		"-admin-token", adminToken, "-user-token-secret", userSecret, file)
	cmd.Env = append(os.Environ(),
		"FLASHSALE_DRILL_REDIS_PRIMARY_PID="+strconv.Itoa(primary.PID()),
		"FLASHSALE_DRILL_NATS_LEADER_PID="+strconv.Itoa(leader.PID()),
		"FLASHSALE_DRILL_INSTANCE_PID="+strconv.Itoa(inst.PID()))
	text, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", filepath.Base(file), text)
	// Whatever the drill did, the topology is whole again for what follows.
	defer func() {
		inst.Thaw()
		if primary.Exited(0) {
			primary.Restart(t)
		}
		if leader.Exited(0) {
			leader.Restart(t)
		}
	}()
	if err != nil {
		t.Fatalf("the cluster drill failed: %v", err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep drill.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Passed || rep.Invariants == nil || !rep.Invariants.OK() || rep.Invariants.Sold == 0 {
		t.Fatalf("the cluster drill's report: passed %v, invariants %+v", rep.Passed, rep.Invariants)
	}
	for _, f := range rep.Faults {
		if f.Exit != 0 {
			t.Errorf("fault %s exited %d: %s %s", f.Name, f.Exit, f.Output, f.Error)
		}
	}
}

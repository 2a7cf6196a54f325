package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/chaos"
	"github.com/flashsale/flashsale/internal/testenv"
)

// upgradeMode reads FLASHSALE_UPGRADE: "short" (two instances, a few
// hundred buyers per step; CI) or "full" (make test-upgrade: three
// instances, more buyers). Unset: the test skips.
func upgradeMode(t *testing.T) (full bool) {
	switch m := os.Getenv("FLASHSALE_UPGRADE"); m {
	case "":
		t.Skip("the upgrade test runs when FLASHSALE_UPGRADE is short or full (make test-upgrade)")
	case "short":
		return false
	case "full":
		return true
	default:
		t.Fatalf("FLASHSALE_UPGRADE=%q: want short or full", m)
	}
	return false
}

// repoRoot is the top of the git checkout the test runs in.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse --show-toplevel: %v (the upgrade test needs a git checkout)", err)
	}
	return strings.TrimSpace(string(out))
}

// previousRelease reads release/previous (or FLASHSALE_UPGRADE_FROM, a
// commit or tag, when set) and builds that commit of flashsale from git: a
// detached worktree in a temporary directory, removed after the build.
func previousRelease(t *testing.T) (commit, bin string) {
	t.Helper()
	root := repoRoot(t)
	commit = os.Getenv("FLASHSALE_UPGRADE_FROM")
	if commit == "" {
		b, err := os.ReadFile(filepath.Join(root, "release", "previous"))
		if err != nil {
			t.Fatalf("release/previous: %v", err)
		}
		commit = strings.TrimSpace(string(b))
	}
	if commit == "" {
		t.Fatal("release/previous is empty")
	}
	dir, err := os.MkdirTemp("", "flashsale-previous-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The worktree's name (its base name) is unique: two upgrade tests at
	// once (make test runs one per database) must not race for one name.
	src := filepath.Join(dir, "src-"+filepath.Base(dir))
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	git("worktree", "add", "--detach", src, commit)
	defer git("worktree", "remove", "--force", src)
	bin = filepath.Join(dir, "flashsale-previous")
	// -trimpath: the build does not depend on the temporary directory, so
	// the Go build cache serves the next run.
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/flashsale")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", commit, err, out)
	}
	return commit, bin
}

// TestUpgrade: the previous release (release/previous, built from git) and
// this tree serve one sale together on one database, one Redis prefix and
// one JetStream, behind the shipped HAProxy configuration. The instances
// start on the previous release, are upgraded one by one, then rolled back
// one by one, with buyers buying through the balancer during every step.
// After each step the buyers stop and I1-I11 are checked from the database
// and Redis for every SKU sold so far (the step's own SKUs and the earlier
// ones, whose reservations may have been applied by the other version); at
// the end fresh buyers take exactly what is left. Both run with their
// defaults: this tree publishes order-schema 2 while every instance in the
// fleet reads it, and the previous release (07132d2 on) reads it, so this
// tree's instances must publish version 2 at every step. This tree's
// instances have sold-out leases turned on, and must never use them beside
// the previous release (whose reserves do not honour a lease).
func TestUpgrade(t *testing.T) {
	full := upgradeMode(t)
	// rate: new buyers of the hot SKU per second (the normal SKU gets a
	// third); the stock outlasts a step, so reservations flow through the
	// stream while the versions change.
	n, rate := 2, 30
	if full {
		n, rate = 3, 100
	}
	commit, prevBin := previousRelease(t)
	bins := chaos.Build(t)
	newBin := bins.Flashsale
	redis := chaos.StartRedis(t)
	nats := chaos.StartNATS(t, bins.NATS)
	dbURL := testenv.Database(t)
	env := baseEnv(t, dbURL, redis.URL, nats.URL)
	// Every instance starts on the previous release.
	svcs := startInstances(t, prevBin, n, func(int) map[string]string { return copyEnv(env) })
	version := make([]string, n)
	var addrs []string
	for i, s := range svcs {
		addrs = append(addrs, s.Env["FLASHSALE_HTTP_ADDR"])
		version[i] = "previous"
	}
	// The shipped configuration names three servers: a shorter run leaves
	// the rest on free ports nobody listens on (DOWN, never sent traffic).
	for len(addrs) < 3 {
		addrs = append(addrs, chaos.FreeAddr(t))
	}
	lb := StartHAProxy(t, addrs)
	for i := range svcs {
		if _, err := lb.WaitState(serverName(i), "UP", 15*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	c := chaos.NewClient(lb.URL, userSecret, adminToken, 10*time.Second)
	ck := chaos.NewChecker(t, dbURL, redis.URL, "cl")

	// replace stops instance i (SIGTERM; HAProxy takes it out) and starts
	// bin in its place on the same address.
	replace := func(i int, bin, name string) {
		t.Helper()
		s := svcs[i]
		unknownVersions(t, s, fmt.Sprintf("%s (%s) before it stopped", serverName(i), version[i]))
		s.Term()
		if _, err := lb.WaitState(serverName(i), "DOWN", 15*time.Second); err != nil {
			t.Fatal(err)
		}
		if !s.Exited(30 * time.Second) {
			t.Fatalf("%s (%s) still running 30s after SIGTERM", serverName(i), version[i])
		}
		if code := s.ExitCode(); code != 0 {
			t.Fatalf("%s (%s) exited %d after SIGTERM:\n%s", serverName(i), version[i], code, s.Log())
		}
		// Its drain, after the counter was read: the log covers its life.
		if strings.Contains(s.Log(), "schema version this release does not know") {
			t.Errorf("%s (%s) met a message of a schema version it does not read:\n%s", serverName(i), version[i], s.Log())
		}
		env := copyEnv(s.Env)
		// This tree's instances have sold-out leases turned on, as by an
		// operator who did not wait for the previous release to be gone:
		// the fleet gate must keep them off beside it (checked below).
		delete(env, "FLASHSALE_SOLD_OUT_LEASE")
		if name == "new" {
			env["FLASHSALE_SOLD_OUT_LEASE"] = "1s"
		}
		svcs[i] = chaos.StartService(t, bin, env)
		version[i] = name
		if _, err := lb.WaitState(serverName(i), "UP", 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	type step struct {
		name string
		i    int
		bin  string
		ver  string
	}
	var steps []step
	for i := range n {
		steps = append(steps, step{fmt.Sprintf("upgrade %s", serverName(i)), i, newBin, "new"})
	}
	for i := range n {
		steps = append(steps, step{fmt.Sprintf("roll back %s", serverName(i)), i, prevBin, "previous"})
	}
	var sales []*Sale
	allNew := false // every instance ran this tree at some step
	for k, st := range steps {
		hot, norm := fmt.Sprintf("hot%d", k), fmt.Sprintf("n%d", k)
		for sku, stock := range map[string]int{hot: 12 * rate, norm: 4 * rate} {
			if err := c.PutSKU(ctx, sku, stock, 1); err != nil {
				t.Fatal(err)
			}
		}
		sale := StartSale(c, []chaos.Load{
			{SKU: hot, Buyers: 100000, Workers: 8, Rate: rate, Tries: 6, For: 2 * time.Minute, Users: fmt.Sprintf("h%d", k)},
			{SKU: norm, Buyers: 100000, Workers: 2, Rate: max(rate/3, 1), Tries: 6, For: 2 * time.Minute, Users: fmt.Sprintf("a%d", k)},
		})
		sales = append(sales, sale)
		time.Sleep(time.Second)
		start := time.Now()
		replace(st.i, st.bin, st.ver)
		took := time.Since(start)
		time.Sleep(time.Second) // buyers meet the replaced instance too
		// Both versions default to a 3 s ack wait and hand back the
		// messages they hold when they stop; the 60 s bound below is for a
		// loaded machine (and for a previous release named by
		// FLASHSALE_UPGRADE_FROM with another ack wait).
		sale.Stop()
		for _, f := range sale.Failures() {
			t.Errorf("%s: buyer saw: %s", st.name, f)
		}
		if sale.Accepted() == 0 {
			t.Errorf("%s: nothing was bought: the step proves nothing", st.name)
		}
		// I1-I11 for every SKU sold so far, without the fresh buyers.
		var viol []string
		var idle time.Duration
		for _, s := range sales {
			d, v := Verify(ctx, ck, s, 60*time.Second, false)
			idle = max(idle, d)
			viol = append(viol, v...)
		}
		for _, v := range viol {
			t.Errorf("%s (instances %v): %s", st.name, version, v)
		}
		if len(viol) > 0 {
			// For the cause: what each instance logged (warnings and
			// errors) and the sale's audit trail. A unit stranded out of
			// Redis (I3, Redis below the database) was seen here once.
			for i, s := range svcs {
				l := s.Log()
				t.Logf("%s (%s) log, last 4000 bytes:\n%s", serverName(i), version[i], l[max(0, len(l)-4000):])
			}
			for _, s := range sales {
				for _, l := range s.Loads {
					if es, err := ck.Store.Audit(ctx, l.SKU, 0, 10000); err == nil {
						var redisRows []string
						for _, e := range es {
							if e.Store == "redis" {
								redisRows = append(redisRows, fmt.Sprintf("%+d %s %s", e.Delta, e.Reason, e.OrderID))
							}
						}
						t.Logf("%s: %d audit rows, redis ones: %v", l.SKU, len(es), redisRows)
					}
				}
			}
		}
		// Order-schema 2 beside the real previous release: every instance
		// of either reads version 2 and says so in the fleet registry, so
		// this tree's instances publish it at every step (within a check,
		// 2 s, of their start; 10 s allowed here), and the consumers of
		// both versions apply what they publish (the invariants above).
		for i, s := range svcs {
			// No instance of either met a message it could not read (the
			// previous release's consumer leaves such a message on the
			// stream and counts it).
			unknownVersions(t, s, fmt.Sprintf("%s: %s (%s)", st.name, serverName(i), version[i]))
			if version[i] != "new" {
				continue
			}
			if got, err := waitSchema(s.URL, 2, 10*time.Second); err != nil || got != 2 {
				t.Errorf("%s: %s (instances %v) publishes schema %d, want 2: %v", st.name, serverName(i), version, got, err)
			}
			// Sold-out leases stay off beside an instance of the previous
			// release (whose reserves ignore a lease): off from the start
			// while the upgrade goes on (nothing answered from a lease),
			// and off again within a few checks of a rolled-back
			// instance's first beat. Once every instance is new they may
			// come on after the 60 s hold, which a slow step can outlast.
			if !slices.Contains(version, "previous") {
				allNew = true
				continue
			}
			if v, err := waitMetric(s.URL, "flashsale_sold_out_lease_seconds", 0, 10*time.Second); err != nil || v != 0 {
				t.Errorf("%s: %s (instances %v): flashsale_sold_out_lease_seconds %v beside the previous release, want 0: %v", st.name, serverName(i), version, v, err)
			}
			if !allNew {
				if v, err := metricRetried(s.URL, "flashsale_sold_out_from_lease_total"); err != nil || v != 0 {
					t.Errorf("%s: %s (instances %v): flashsale_sold_out_from_lease_total %v before every instance was new, want 0: %v", st.name, serverName(i), version, v, err)
				}
			}
		}
		t.Logf("%s: instances %v; replaced in %v; outcomes %s; idle with the invariants holding after %v",
			st.name, version, took.Round(100*time.Millisecond), sale.Summary(), idle.Round(100*time.Millisecond))
	}
	// The end: fresh buyers take exactly what is left of every SKU (I7).
	for _, s := range sales {
		_, v := Verify(ctx, ck, s, 60*time.Second, true)
		for _, x := range v {
			t.Errorf("at the end: %s", x)
		}
	}
	t.Logf("previous release %s and this tree: %d instances upgraded one by one and rolled back, %d steps", commit, n, len(steps))
}

// waitSchema waits up to d for the instance at base to report want in
// flashsale_order_schema_published, and returns the last value read.
func waitSchema(base string, want int, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	got, err := -1, error(nil)
	for {
		got, err = schemaPublished(base)
		if (err == nil && got == want) || time.Now().After(deadline) {
			return got, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var metricsClient = &http.Client{Timeout: 2 * time.Second}

func schemaPublished(base string) (int, error) {
	v, err := metric(base, "flashsale_order_schema_published")
	return int(v), err
}

// unknownVersions fails the test if the instance counted a stream message
// of a schema version it does not read (the previous release's consumer
// leaves such a message on the stream and counts it). The read is tried
// again for up to 10 s on a loaded machine.
func unknownVersions(t *testing.T, s *chaos.Service, who string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var n float64
		if n, err = metric(s.URL, "flashsale_messages_unknown_version_total"); err == nil {
			if n != 0 {
				t.Errorf("%s met %v messages of a schema version it does not read", who, n)
			}
			return
		}
	}
	t.Errorf("%s: reading flashsale_messages_unknown_version_total: %v", who, err)
}

// waitMetric waits up to d for the instance at base to report want in
// metric name, and returns the last value read.
func waitMetric(base, name string, want float64, d time.Duration) (float64, error) {
	deadline := time.Now().Add(d)
	for {
		v, err := metric(base, name)
		if (err == nil && v == want) || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// metricRetried is metric, tried again for up to 10 s while the read
// fails (a loaded machine).
func metricRetried(base, name string) (float64, error) {
	v, err := metric(base, name)
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); v, err = metric(base, name) {
		time.Sleep(200 * time.Millisecond)
	}
	return v, err
}

// metric reads the value of an unlabelled metric from the instance's
// /metrics.
func metric(base, name string) (float64, error) {
	resp, err := metricsClient.Get(strings.TrimSuffix(base, "/") + "/metrics")
	if err != nil {
		return -1, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return -1, fmt.Errorf("no %s in /metrics", name)
}

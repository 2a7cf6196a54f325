package stockgate_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// scriptRecorder is a client that notes every script it runs and every
// CROSSSLOT answer.
type scriptRecorder struct {
	rueidis.Client
	mu    sync.Mutex
	shas  map[string]bool
	cross []string
}

func (r *scriptRecorder) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	args := slices.Clone(cmd.Commands()) // the command is recycled by Do
	res := r.Client.Do(ctx, cmd)
	r.note(args, res)
	return res
}

// DoMulti notes the scripts sent at once (the relay's and the consumer's
// calls for several SKUs) as Do does.
func (r *scriptRecorder) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	args := make([][]string, len(cmds))
	for i, c := range cmds {
		args[i] = slices.Clone(c.Commands())
	}
	rs := r.Client.DoMulti(ctx, cmds...)
	for i, res := range rs {
		r.note(args[i], res)
	}
	return rs
}

func (r *scriptRecorder) note(args []string, res rueidis.RedisResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch strings.ToUpper(args[0]) {
	case "EVALSHA", "EVALSHA_RO":
		r.shas[args[1]] = true
	case "EVAL", "EVAL_RO":
		sum := sha1.Sum([]byte(args[1]))
		r.shas[hex.EncodeToString(sum[:])] = true
	}
	if err := res.Error(); err != nil && strings.Contains(err.Error(), "CROSSSLOT") {
		r.cross = append(r.cross, strings.Join(args, " "))
	}
}

// TestScriptsOneSlot runs every Lua script of the gate on a real Redis
// Cluster, for SKUs on different primaries: a script whose KEYS do not
// share one hash tag is answered CROSSSLOT. The count of scripts run is
// checked against the scripts the package declares, so a new script that
// this test does not run fails it.
func TestScriptsOneSlot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	rc := testenv.StartRedisCluster(t)
	rec := &scriptRecorder{Client: rc.Client(), shas: map[string]bool{}}
	g := stockgate.New(rec, "fs")
	// A transfer's halves wait for a replica of their primary. The cluster
	// is up as soon as every node says cluster_state:ok, but a new replica
	// takes a write stream only from its first ACK (once a second), and on
	// a busy machine later: with the default wait, a credit could be left
	// unacknowledged, its entry open and its units read twice (seen once:
	// 2 available after the transfer, want 1). Waiting longer exercises the
	// same path and completes the transfer.
	g.SetTransferWait(5 * time.Second)
	ctx := context.Background()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for _, sku := range []string{"a", "b", "c", "d"} {
		ok, err := g.LockSKU(ctx, sku, "tok", time.Minute)
		if err != nil || !ok {
			t.Fatalf("lock %s: %v %v", sku, ok, err)
		}
		_, err = g.Seed(ctx, sku, stockgate.Config{PerUserLimit: 5, Lock: "tok"}, 20, nil, nil, nil, nil, "e1")
		must("seed", err)
		must("unlock", g.UnlockSKU(ctx, sku, "tok"))
		must("register", g.Register(ctx, sku))
		r1, r2 := res(sku, "u1", 1), res(sku, "u2", 2)
		_, err = g.Reserve(ctx, r1)
		must("reserve", err)
		lim := stockgate.Rate{PerSecond: 100, Burst: 100}
		_, err = g.ReserveLimited(ctx, r2, stockgate.Limits{SKU: lim, User: lim, IP: lim, IPKey: "10.0.0.1"})
		must("reserve limited", err)
		// A shadow: its lease, the journal the reserve writes under it, its run.
		sh, stop := runShadow(t, g, sku, stockgate.ShadowConfig{Instance: "slots", Script: equivalent})
		_, err = g.Reserve(ctx, res(sku, "u3", 1))
		must("reserve under a shadow", err)
		for deadline := time.Now().Add(10 * time.Second); sh.Stats().Match != 1; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("shadow on a cluster: %+v", sh.Stats())
			}
		}
		stop()
		must("unqueue", g.Unqueue(ctx, sku, r1.OrderID))
		_, _, err = g.IndexInFlight(ctx, sku, 0, 100)
		must("index", err)
		_, err = g.Stuck(ctx, sku, time.Now().Add(time.Hour), 0, 100)
		must("stuck", err)
		_, _, err = g.OldestInFlight(ctx, sku)
		must("oldest", err)
		_, err = g.Finalize(ctx, sku, []stockgate.Outcome{{OrderID: r1.OrderID}, {OrderID: r2.OrderID, Refused: true}})
		must("finalize", err)
		_, err = g.TakeSoldLease(ctx, sku, time.Second, 100)
		must("sold-out lease", err)
		f, err := g.ReadInFlight(ctx, sku)
		must("read in flight", err)
		_, err = g.Resync(ctx, sku, stockgate.Config{PerUserLimit: 5}, f, 19, nil, nil)
		must("resync", err)
		_, err = g.Adjust(ctx, sku, stockgate.Config{PerUserLimit: 5}, 3)
		must("adjust", err)
		_, err = g.Restore(ctx, sku, []stockgate.Release{{OrderID: "rel-" + sku, User: "u1", Quantity: 1}})
		must("restore", err)
		must("fence", g.Fence(ctx, sku))
		_, err = g.Expire(ctx, sku, time.Now(), time.Hour)
		must("expire", err)
	}
	// A sold-out sale's lease counts once a replica of its primary holds it.
	_, err := g.Seed(ctx, "z", stockgate.Config{PerUserLimit: 1}, 0, nil, nil, nil, nil, "e1")
	must("seed sold out", err)
	if l, err := g.TakeSoldLease(ctx, "z", 10*time.Second, 100); err != nil || !l.Granted {
		t.Fatalf("sold-out lease on a cluster with replicas: %+v, %v", l, err)
	}
	runBucketScripts(t, g, "x")
	ok, err := g.Acquire(ctx, "reconciler", "me", time.Minute)
	if err != nil || !ok {
		t.Fatalf("lease: %v %v", ok, err)
	}
	must("release lease", g.Release(ctx, "reconciler", "me"))
	_, err = g.ClaimPrefix(ctx, "owner")
	must("claim prefix", err)
	_, err = g.SwapRunID(ctx, "x")
	must("swap run id", err)
	_, err = g.ClaimDatabase(ctx, "id", "postgres 1/db")
	must("claim prefix database", err)
	_, _, err = g.MarkRunID(ctx, "y", "me", time.Minute)
	must("mark run id", err)
	_, _, err = g.ClaimRebuild(ctx, "me", time.Minute)
	must("claim rebuild", err)
	must("end rebuild", g.EndRebuild(ctx, "y", "me", true))
	_, _, err = g.Unsent(ctx, "a", "u1", "no-such-order")
	must("unsent", err)

	if len(rec.cross) > 0 {
		t.Fatalf("CROSSSLOT answers:\n%s", strings.Join(rec.cross, "\n"))
	}
	declared := 0
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		declared += strings.Count(string(b), "rueidis.NewLuaScript")
	}
	if len(rec.shas) != declared {
		t.Fatalf("ran %d distinct scripts, the package declares %d (rueidis.NewLuaScript*): run the new ones here", len(rec.shas), declared)
	}
}

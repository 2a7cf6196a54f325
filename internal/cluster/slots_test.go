package cluster

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/chaos"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestDatabaseSlotsBehindHAProxy: three instances behind HAProxy (the shipped
// configuration) on a private database whose connection slots another
// client takes, all of them, for longer than HAProxy needs to take an
// instance out (inter 1s x fall 2). Purchases still go through Redis, so
// every instance stays UP and buyers through the balancer get 202s; once
// the slots are free every accepted purchase becomes one order. Before,
// /readyz answered 503 on every instance at once and HAProxy emptied its
// pool while purchases were accepted.
func TestDatabaseSlotsBehindHAProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("three instances behind HAProxy with the database's slots exhausted (about 20 s)")
	}
	bins := chaos.Build(t)
	redis := chaos.StartRedis(t)
	nats := chaos.StartNATS(t, bins.NATS)
	db := testenv.StartDatabase(t)
	testenv.LimitConnections(t, db, 40)
	dbURL := db.URL("flashsale")
	env := baseEnv(t, dbURL, redis.URL, nats.URL)
	svcs := startInstances(t, bins.Flashsale, 3, func(int) map[string]string { return copyEnv(env) })
	var addrs []string
	for _, s := range svcs {
		addrs = append(addrs, s.Env["FLASHSALE_HTTP_ADDR"])
	}
	lb := StartHAProxy(t, addrs)
	for i := range svcs {
		if _, err := lb.WaitState(serverName(i), "UP", 15*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	c := chaos.NewClient(lb.URL, userSecret, adminToken, 10*time.Second)
	hold := &sync.RWMutex{}
	c.Hold = hold
	if err := c.PutSKU(ctx, "s", 5000, 1); err != nil {
		t.Fatal(err)
	}
	sale := StartSale(c, []chaos.Load{{SKU: "s", Buyers: 100000, Workers: 4, Rate: 40, Tries: 6, For: time.Minute, Users: "s"}})
	time.Sleep(time.Second)

	// The instances are paused while the hog takes the slots, so that none
	// of them reconnects into a slot the hog just freed; HAProxy may count a
	// failed check meanwhile, so it is given the instances back (UP) first.
	// The buyers are held back meanwhile, and the pause waits for their
	// requests in flight: a request a stopped process holds past its 5 s
	// deadline is answered 503 once it runs again (a CI run: 2 of 341),
	// which is the stop's doing, not the slots'.
	hog := testenv.HoldConnectionsPaused(t, db,
		func() {
			hold.Lock()
			for _, s := range svcs {
				s.Freeze()
			}
		},
		func() {
			for _, s := range svcs {
				s.Thaw()
			}
			hold.Unlock()
		})
	t.Logf("another client holds all %d connection slots", hog.Held())
	for i := range svcs {
		if _, err := lb.WaitState(serverName(i), "UP", 15*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	before := sale.Accepted()
	// Each instance's /readyz says why it is degraded; HAProxy keeps both.
	for i, s := range svcs {
		url := "http://" + s.Env["FLASHSALE_HTTP_ADDR"] + "/readyz"
		deadline := time.Now().Add(10 * time.Second)
		for {
			r := (&chaos.Client{URL: url, HC: http.DefaultClient}).Do(ctx, http.MethodGet, "", "")
			if r.Status == http.StatusOK && strings.Contains(r.Raw, "connection slots exhausted") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s /readyz: %d %s %v", serverName(i), r.Status, r.Raw, r.Err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		st, err := lb.States()
		if err != nil {
			t.Fatal(err)
		}
		for i := range svcs {
			if !strings.HasPrefix(st[serverName(i)], "UP") {
				t.Fatalf("HAProxy took %s out (%q) while the database's slots were exhausted and purchases still worked", serverName(i), st[serverName(i)])
			}
		}
	}
	during := sale.Accepted() - before
	if during == 0 {
		t.Fatal("no purchase accepted through the balancer while the slots were exhausted")
	}
	hog.Release()
	time.Sleep(time.Second)
	sale.Stop()
	t.Logf("%d accepted while the slots were exhausted; outcomes: %s", during, sale.Summary())
	for _, f := range sale.Failures() {
		t.Errorf("buyer saw: %s", f)
	}
	ck := chaos.NewChecker(t, dbURL, redis.URL, "cl")
	took, viol := Verify(ctx, ck, sale, 60*time.Second, false)
	for _, v := range viol {
		t.Error(v)
	}
	t.Logf("idle with the invariants holding %v after the sale", took.Round(100*time.Millisecond))
}

package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/flashsale/flashsale/internal/failpoint"
)

// TestKillWithBacklogLosesStore: reservations reached the stream but not
// the database (the consumer hangs before its commit), or were committed and
// not yet closed in Redis (it dies after its commit, before its ack); the
// process is killed and its embedded JetStream store is lost (an ephemeral
// disk, an OS crash before the store's fsync). After a restart on an empty
// store every accepted reservation ends as exactly one order, republished
// from Redis; a committed one is recognised by the database and closed.
func TestKillWithBacklogLosesStore(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	for _, tc := range []struct{ name, failpoint string }{
		{"before commit", failpoint.ConsumerBeforeCommit + "=hang"},
		{"after commit before ack", failpoint.ConsumerAfterCommitBeforeAck + "=exit"},
	} {
		t.Run(tc.name, func(t *testing.T) { killWithBacklogLosesStore(t, tc.failpoint) })
	}
}

func killWithBacklogLosesStore(t *testing.T, fp string) {
	env := procEnv(t)
	dataDir := t.TempDir()
	env["FLASHSALE_NATS_URL"] = "embedded"
	env["FLASHSALE_DATA_DIR"] = dataDir
	env["FLASHSALE_INFLIGHT_REPUBLISH_AFTER"] = "2s"
	env["FLASHSALE_FAILPOINTS"] = fp
	name, _, _ := strings.Cut(fp, "=")
	p := startProc(t, env)
	h := procClient(t, p.url)
	h.mustPutSKU("q", 40, 1)
	var accepted []string
	cut := -1
	for i := 0; i < 30; i++ {
		r := h.buy(fmt.Sprintf("u%d", i), "q", 1, fmt.Sprintf("key-%d", i))
		if r.Status == 0 { // the process died under this request: outcome unknown
			cut = i
			break
		}
		if r.Status != http.StatusAccepted {
			t.Fatalf("buy: %d %s", r.Status, r.Raw)
		}
		accepted = append(accepted, r.str("order_id"))
	}
	chk := newChecker(t, env)
	deadline := time.Now().Add(20 * time.Second)
	// Wait until the failpoint fired and the stream holds every reservation,
	// or the process is gone (an exit leaves what it had not published in
	// the outbox, for the restarted process).
	exited := func() bool {
		select {
		case <-p.done:
			return true
		default:
			return false
		}
	}
	for !strings.Contains(p.log(), "failpoint "+name+" fired") || (chk.check("q", accepted, false).Outbox != 0 && !exited()) {
		if time.Now().After(deadline) {
			t.Fatalf("failpoint not fired or reservations still in the outbox after 20s; log:\n%s", p.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.kill()
	before := chk.check("q", accepted, false)
	// The kill leaves every accepted reservation in flight in Redis. Before
	// the commit it leaves them uncommitted too; after the commit, the
	// consumer may have committed every one accepted so far (on a busy
	// machine the buyer is slow and each batch holds one reservation).
	uncommitted := name != failpoint.ConsumerBeforeCommit || before.Orders < int64(len(accepted))
	if before.InFlight < int64(len(accepted)) || !uncommitted {
		t.Fatalf("before restart: %d orders, %d in flight for %d accepted", before.Orders, before.InFlight, len(accepted))
	}
	if err := os.RemoveAll(dataDir); err != nil { // the store is lost
		t.Fatal(err)
	}

	delete(env, "FLASHSALE_FAILPOINTS")
	p = startProc(t, env)
	if cut >= 0 { // the client retries with its key and gets the order, if any
		r := procClient(t, p.url).buy(fmt.Sprintf("u%d", cut), "q", 1, fmt.Sprintf("key-%d", cut))
		if !purchaseAccepted(r) {
			t.Fatalf("retry of the cut-off request: %d %s", r.Status, r.Raw)
		}
		accepted = append(accepted, r.str("order_id"))
	}
	rep := chk.settle("q", accepted, 45*time.Second)
	n := int64(len(accepted))
	if rep.Orders != n || rep.LiveOrders != n || rep.DBStock != 40-n || rep.RedisAvailable != 40-n {
		t.Fatalf("after restart: %+v", rep)
	}
	t.Logf("%d accepted, %d orders committed before the kill, all %d orders after", n, before.Orders, rep.Orders)
}

// natsOn runs an in-process nats-server on a fixed loopback port, so the
// test can replace it by another one (an empty store, no JetStream) that
// clients reconnect to.
type natsOn struct {
	t    *testing.T
	port int
	srv  *server.Server
}

func newNATSOn(t *testing.T) *natsOn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	n := &natsOn{t: t, port: port}
	t.Cleanup(n.stop)
	return n
}

func (n *natsOn) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// start starts a server with a new, empty store (JetStream on) or without JetStream.
func (n *natsOn) start(jetstream bool) {
	n.t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: n.port, JetStream: jetstream, NoLog: true, NoSigs: true}
	if jetstream {
		opts.StoreDir = n.t.TempDir()
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		n.t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		n.t.Fatal("nats-server not ready")
	}
	n.srv = srv
}

func (n *natsOn) stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// TestBrokerRestartedEmpty: the external broker is replaced while
// flashsale runs, first by one without JetStream, then by one with an empty
// store. /readyz answers 503 while the streams are missing, the streams are
// re-created without a restart of flashsale, and every purchase lands:
// those applied before, those that waited in the outbox, those after.
func TestBrokerRestartedEmpty(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	ns := newNATSOn(t)
	ns.start(true)
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_NATS_URL", ns.url(), "FLASHSALE_INFLIGHT_REPUBLISH_AFTER", "2s"))
	h.mustPutSKU("b", 50, 1)
	var accepted []string
	buy := func(from, to int) {
		for i := from; i < to; i++ {
			r := h.buy(fmt.Sprintf("u%d", i), "b", 1, fmt.Sprintf("key-%d", i))
			if r.Status != http.StatusAccepted {
				t.Fatalf("buy %d: %d %s", i, r.Status, r.Raw)
			}
			accepted = append(accepted, r.str("order_id"))
		}
	}
	buy(0, 10)
	settle(t, h.a, "b", accepted, 30*time.Second)

	ns.stop()
	buy(10, 20) // wait in the outbox
	ns.start(false)
	// Degraded, not unready: every instance shares the broker, and the
	// outbox holds what is bought meanwhile.
	waitReady(t, h, http.StatusOK, `"jetstream-streams":"unavailable"`, 20*time.Second)
	ns.stop()
	ns.start(true)
	waitReady(t, h, http.StatusOK, `"status":"ok"`, 20*time.Second)
	if h.a.queue.Recreated() == 0 {
		t.Fatal("ready again, but the streams were not re-created")
	}
	buy(20, 30)
	rep := settle(t, h.a, "b", accepted, 45*time.Second)
	if rep.Orders != 30 || rep.LiveOrders != 30 || rep.DBStock != 20 || rep.RedisAvailable != 20 {
		t.Fatalf("after the broker came back empty: %+v", rep)
	}
}

// waitReady polls /readyz until it answers status (and, if reason is set,
// names it in the body).
func waitReady(t *testing.T, h *harness, status int, reason string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last reply
	for time.Now().Before(deadline) {
		last = h.do(http.MethodGet, "/readyz", "")
		if last.Status == status && strings.Contains(last.Raw, reason) {
			t.Logf("/readyz %d %s", last.Status, last.Raw)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("/readyz did not answer %d (%q) within %v; last: %d %s", status, reason, within, last.Status, last.Raw)
}

// TestRetentionShorterThanOutage: the order stream's retention is one
// second and the consumer cannot commit for several: nothing accepted is
// removed from the stream (the republisher is held off, so the stream alone
// must deliver them after the restart).
func TestRetentionShorterThanOutage(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	env := procEnv(t)
	env["FLASHSALE_STREAM_RETENTION"] = "1s"
	env["FLASHSALE_INFLIGHT_REPUBLISH_AFTER"] = "10m"
	env["FLASHSALE_FAILPOINTS"] = failpoint.ConsumerBeforeCommit + "=hang"
	p := startProc(t, env)
	h := procClient(t, p.url)
	h.mustPutSKU("t", 30, 1)
	var accepted []string
	for i := 0; i < 20; i++ {
		r := h.buy(fmt.Sprintf("u%d", i), "t", 1, "")
		if r.Status != http.StatusAccepted {
			t.Fatalf("buy: %d %s", r.Status, r.Raw)
		}
		accepted = append(accepted, r.str("order_id"))
	}
	time.Sleep(4 * time.Second) // several retention passes, nothing committed
	if !strings.Contains(p.log(), "failpoint "+failpoint.ConsumerBeforeCommit+" fired") {
		t.Fatalf("failpoint did not fire; log:\n%s", p.log())
	}
	p.kill()
	delete(env, "FLASHSALE_FAILPOINTS")
	startProc(t, env)
	rep := newChecker(t, env).settle("t", accepted, 30*time.Second)
	if rep.LiveOrders != 20 || rep.DBStock != 10 {
		t.Fatalf("after restart: %+v", rep)
	}
}

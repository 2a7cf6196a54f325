package testenv_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/testenv"
)

func countKeys(t *testing.T, c rueidis.Client, match string) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(match).Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatal(err)
		}
		n += len(e.Elements)
		if cursor = e.Cursor; cursor == 0 {
			return n
		}
	}
}

func exists(t *testing.T, c rueidis.Client, key string) bool {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Exists().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func set(t *testing.T, c rueidis.Client, key, value string) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().Set().Key(key).Value(value).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// TestRedisCleanupDeletesOnlyItsPrefix nests two tests, each with its own
// prefix, and checks that the inner cleanup leaves the outer test's key,
// then that the outer cleanup removes its own.
func TestRedisCleanupDeletesOnlyItsPrefix(t *testing.T) {
	t.Parallel()
	var url, outer string
	t.Run("outer", func(t *testing.T) {
		url, outer = testenv.Redis(t)
		c := testenv.RedisClient(t, url)
		set(t, c, outer+":survivor", "1")

		var inner string
		t.Run("inner", func(t *testing.T) {
			var innerURL string
			innerURL, inner = testenv.Redis(t)
			if inner == outer {
				t.Fatalf("two tests got the same prefix %q", inner)
			}
			ic := testenv.RedisClient(t, innerURL)
			// More keys than one SCAN batch, of several types, some hash-tagged.
			const n = 2500
			cmds := make(rueidis.Commands, 0, n+3)
			for i := range n {
				cmds = append(cmds, ic.B().Set().Key(fmt.Sprintf("%s:k%d", inner, i)).Value("v").Build())
			}
			cmds = append(cmds,
				ic.B().Hset().Key(inner+":hash:{sku1}").FieldValue().FieldValue("f", "v").Build(),
				ic.B().Sadd().Key(inner+":buyers:{sku1}").Member("u1").Build(),
				ic.B().Set().Key(inner).Value("bare prefix").Build(),
			)
			for _, r := range ic.DoMulti(context.Background(), cmds...) {
				if err := r.Error(); err != nil {
					t.Fatal(err)
				}
			}
			if got := countKeys(t, ic, inner+":*"); got != n+2 {
				t.Fatalf("before cleanup: %d keys under %s:*, want %d", got, inner, n+2)
			}
		})
		if inner == "" {
			t.Skip("inner test did not get a prefix")
		}

		// Cleanup of "inner" has run: it must have removed its keys only.
		if got := countKeys(t, c, inner+":*"); got != 0 {
			t.Errorf("after cleanup: %d keys left under %s:*, want 0", got, inner)
		}
		if exists(t, c, inner) {
			t.Errorf("after cleanup: key %s left", inner)
		}
		if !exists(t, c, outer+":survivor") {
			t.Errorf("inner cleanup deleted %s:survivor from another prefix", outer)
		}
	})
	if outer == "" {
		t.Skip("redis unavailable")
	}
	c := testenv.RedisClient(t, url)
	if got := countKeys(t, c, outer+":*"); got != 0 {
		t.Errorf("after outer cleanup: %d keys left under %s:*, want 0", got, outer)
	}
}

// TestRedisSiblingSurvivesCleanup checks the prefix boundary directly: a key
// that starts with the prefix but not with prefix+":" is not deleted.
func TestRedisSiblingSurvivesCleanup(t *testing.T) {
	t.Parallel()
	var url, prefix string
	t.Run("owner", func(t *testing.T) {
		url, prefix = testenv.Redis(t)
		c := testenv.RedisClient(t, url)
		set(t, c, prefix+":mine", "1")
		set(t, c, prefix+"x:not-mine", "1")
	})
	if prefix == "" {
		t.Skip("redis unavailable")
	}
	c := testenv.RedisClient(t, url)
	defer c.Do(context.Background(), c.B().Del().Key(prefix+"x:not-mine").Build())
	if exists(t, c, prefix+":mine") {
		t.Errorf("%s:mine survived its test's cleanup", prefix)
	}
	if !exists(t, c, prefix+"x:not-mine") {
		t.Errorf("%sx:not-mine was deleted by the cleanup of prefix %s", prefix, prefix)
	}
}

func TestRedisUnreachableSkipsLocally(t *testing.T) {
	// A port nothing listens on: bind one, then close it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	t.Setenv("FLASHSALE_TEST_REDIS_URL", "redis://"+addr+"/0")
	t.Setenv("FLASHSALE_TEST_REQUIRE_SERVICES", "")

	var skipped bool
	t.Run("unreachable", func(t *testing.T) {
		t.Cleanup(func() { skipped = t.Skipped() })
		testenv.Redis(t)
		t.Error("Redis returned for an unreachable server")
	})
	if !skipped {
		t.Error("test with an unreachable Redis was not skipped")
	}
}

func TestStartRedisKillRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// appendfsync always: every acknowledged write is on disk before the kill.
	s := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	c := testenv.RedisClient(t, s.URL)
	set(t, c, "k", "before kill")

	s.Kill()
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err == nil {
		t.Fatal("PING succeeded on a killed server")
	}
	s.Kill() // killing twice is harmless

	addr := s.Addr
	s.Restart()
	if s.Addr != addr {
		t.Fatalf("Addr after Restart = %s, want %s", s.Addr, addr)
	}
	// A fresh client: rueidis does not retry writes, so the old one may
	// fail a SET on a connection the kill broke.
	c = testenv.RedisClient(t, s.URL)
	got, err := c.Do(ctx, c.B().Get().Key("k").Build()).ToString()
	if err != nil || got != "before kill" {
		t.Fatalf("GET k after restart = %q, %v; want %q (AOF in the same dir)", got, err, "before kill")
	}

	set(t, c, "k", "before stop")
	s.Stop()
	s.Restart()
	c = testenv.RedisClient(t, s.URL)
	got, err = c.Do(ctx, c.B().Get().Key("k").Build()).ToString()
	if err != nil || got != "before stop" {
		t.Fatalf("GET k after stop and restart = %q, %v; want %q", got, err, "before stop")
	}
}

func TestStartRedisDefaultsKeepNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := testenv.StartRedis(t)
	b := testenv.StartRedis(t)
	if a.Addr == b.Addr {
		t.Fatalf("two servers on one address %s", a.Addr)
	}
	c := testenv.RedisClient(t, a.URL)
	set(t, c, "k", "v")
	a.Restart()
	c = testenv.RedisClient(t, a.URL)
	err := c.Do(ctx, c.B().Get().Key("k").Build()).Error()
	if !rueidis.IsRedisNil(err) {
		t.Fatalf("GET k after restart without persistence: err = %v, want nil reply", err)
	}
}

func TestNATSJetStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "ORDERS",
		Subjects: []string{"orders.>"},
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "orders.sku1", []byte("r1"), jetstream.WithMsgID("r1"))
	if err != nil {
		t.Fatal(err)
	}
	dup, err := js.Publish(ctx, "orders.sku1", []byte("r1"), jetstream.WithMsgID("r1"))
	if err != nil {
		t.Fatal(err)
	}
	if !dup.Duplicate || dup.Sequence != ack.Sequence {
		t.Errorf("second publish with the same Msg-Id: %+v, want a duplicate of seq %d", dup, ack.Sequence)
	}
	msg, err := stream.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "r1" || msg.Subject != "orders.sku1" {
		t.Errorf("GetMsg(%d) = %s %q, want orders.sku1 \"r1\"", ack.Sequence, msg.Subject, msg.Data)
	}
}

func TestNATSRestartKeepsStreams(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	s := testenv.StartNATS(t, "")
	url := s.URL
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "orders.sku1", []byte("kept"))
	if err != nil {
		t.Fatal(err)
	}

	s.Shutdown()
	// The client learns of the closed connection asynchronously.
	for nc.IsConnected() {
		if ctx.Err() != nil {
			t.Fatal("client still connected after Shutdown")
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Restart()
	if s.URL != url {
		t.Fatalf("URL after Restart = %s, want %s", s.URL, url)
	}

	// The client reconnects on its own; retry until it has.
	var msg *jetstream.RawStreamMsg
	for {
		if msg, err = stream.GetMsg(ctx, ack.Sequence); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("GetMsg after restart: %v", err)
	}
	if string(msg.Data) != "kept" {
		t.Errorf("message after restart = %q, want %q", msg.Data, "kept")
	}
}

// TestRestartFindsItsPort: a server stopped for an outage comes back on its
// port even though, meanwhile, the kernel handed out thousands of ports to
// other listeners and connections (other tests in parallel): its port is
// below the ephemeral range the kernel hands out.
func TestRestartFindsItsPort(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t, "")
	u, err := url.Parse(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	ns.Shutdown()
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 2000 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		if l.Addr().(*net.TCPAddr).Port == port {
			t.Fatalf("the kernel gave the stopped server's port %d to another listener", port)
		}
	}
	ns.Restart()
}

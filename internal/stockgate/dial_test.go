package stockgate_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestDialBadSettings: a Redis URL that cannot work fails at once with a
// message naming what is wrong.
func TestDialBadSettings(t *testing.T) {
	a, b := testenv.StartRedis(t), testenv.StartRedis(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	for _, tc := range []struct{ name, url, want string }{
		{"not a url", "http://x", "redis url"},
		{"nothing answers", "redis://" + dead, dead},
		{"no cluster answers", "redis://" + dead + "?addr=" + dead, dead},
		{"plain servers as a cluster", "redis://" + a.Addr + "?addr=" + b.Addr, "not a Redis Cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := stockgate.Dial(tc.url)
			if err == nil {
				c.Close()
				t.Fatalf("Dial(%q): no error", tc.url)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Dial(%q): %v; want it to mention %q", tc.url, err, tc.want)
			}
		})
	}
	c, err := stockgate.Dial(a.URL)
	if err != nil {
		t.Fatalf("a plain server: %v", err)
	}
	c.Close()
}

// TestCallBesideARedial: with Redis hung, a call with a short deadline that
// picks a connection being set up again waits for that set-up, under the
// deadline of the caller that began it (rueidis shares one dial per
// connection; CI saw /readyz's 400 ms ping outlive 700 ms this way).
// DialWithin bounds every set-up, so the wait is at most its timeout, not
// rueidis's default of 5 s.
func TestCallBesideARedial(t *testing.T) {
	rs := testenv.StartRedis(t)
	const bound = 300 * time.Millisecond
	c, err := stockgate.DialWithin(rs.URL, bound)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rs.Pause()
	defer rs.Resume()
	ping := func(d time.Duration) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		if err := c.Do(ctx, c.B().Ping().Build()).Error(); err == nil {
			t.Error("PING answered by a stopped Redis")
		}
		return time.Since(start)
	}
	for i := range 5 {
		ping(20 * time.Millisecond) // alone: it times out and closes its connection
		done := make(chan struct{})
		go func() { defer close(done); ping(30 * time.Second) }() // sets it up again
		time.Sleep(20 * time.Millisecond)
		// Twice the bound plus slack for a loaded machine; without the
		// bound this waits the 5 s default.
		if took := ping(100 * time.Millisecond); took > 2*bound+time.Second {
			t.Fatalf("round %d: a 100ms PING beside a redial took %v; want at most the dial bound %v (plus slack)", i, took, bound)
		}
		<-done
	}
}

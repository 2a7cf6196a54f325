package stockgate_test

import (
	"net"
	"strings"
	"testing"

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

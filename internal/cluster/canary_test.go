package cluster

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/httpapi"
)

// TestCanaryShare runs the shipped HAProxy configuration in front of a
// stable and a canary server (each answers its name) and checks the canary
// split: share 0 sends every buyer to the stable one; a share set through
// the runtime API (no reload) sends about that share of buyers to the
// canary, the same buyers for every request and every new token of theirs;
// raising the share only adds buyers; requests without a buyer's token stay
// stable; with the canary down, every buyer is served by the stable one.
func TestCanaryShare(t *testing.T) {
	t.Parallel()
	named := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/readyz" {
				w.WriteHeader(http.StatusOK)
				return
			}
			io.WriteString(w, name)
		}))
	}
	stable, canary := named("stable"), named("canary")
	defer stable.Close()
	defer canary.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	// The three stable servers of the shipped file share the one stable server.
	lb := StartHAProxyCanary(t, []string{host(stable), host(stable), host(stable)}, []string{host(canary)})
	waitBackend(t, lb, "flashsale-canary", "flashsale-canary-1", "UP")

	client := &http.Client{Timeout: 5 * time.Second}
	served := func(token string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, lb.URL+"/api/v1/skus/x", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	const buyers = 400
	// canaryBuyers asks for every buyer twice, with two tokens of different
	// lifetimes, and returns those the canary served; both answers agree.
	canaryBuyers := func() map[int]bool {
		t.Helper()
		got := map[int]bool{}
		for i := range buyers {
			var answers [2]string
			for j, ttl := range []time.Duration{time.Hour, 2 * time.Hour} {
				tok, err := httpapi.Sign("canary-test-secret", fmt.Sprintf("buyer-%d", i), ttl)
				if err != nil {
					t.Fatal(err)
				}
				answers[j] = served(tok)
			}
			if answers[0] != answers[1] {
				t.Fatalf("buyer-%d met %s, then %s with a new token", i, answers[0], answers[1])
			}
			if answers[0] == "canary" {
				got[i] = true
			}
		}
		return got
	}

	if c := canaryBuyers(); len(c) != 0 {
		t.Fatalf("share 0 (the shipped map): %d buyers met the canary", len(c))
	}
	if err := lb.SetCanaryShare(20); err != nil {
		t.Fatal(err)
	}
	c20 := canaryBuyers()
	if n := len(c20); n < buyers*10/100 || n > buyers*30/100 {
		t.Errorf("share 20: %d of %d buyers met the canary", n, buyers)
	}
	if err := lb.SetCanaryShare(50); err != nil {
		t.Fatal(err)
	}
	c50 := canaryBuyers()
	if n := len(c50); n < buyers*40/100 || n > buyers*60/100 {
		t.Errorf("share 50: %d of %d buyers met the canary", n, buyers)
	}
	for i := range c20 {
		if !c50[i] {
			t.Errorf("buyer-%d met the canary at share 20, not at 50", i)
		}
	}
	if err := lb.SetCanaryShare(100); err != nil {
		t.Fatal(err)
	}
	if got := served(""); got != "stable" {
		t.Errorf("a request without a token at share 100: served by %s", got)
	}
	if err := lb.SetCanaryShare(101); err != nil {
		t.Fatal(err)
	}
	canary.Close()
	waitBackend(t, lb, "flashsale-canary", "flashsale-canary-1", "DOWN")
	if c := canaryBuyers(); len(c) != 0 {
		t.Errorf("canary down: %d buyers met it", len(c))
	}
}

// waitBackend waits until server of backend is in state want.
func waitBackend(t *testing.T, lb *HAProxy, backend, server, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := lb.BackendStates(backend)
		if err == nil && s[server] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy: %s/%s is %q, want %s (%v)", backend, server, s[server], want, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package stockgate_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestCheckEviction: a Redis that may evict keys (maxmemory-policy other
// than noeviction) is refused, naming the setting and the fix, also where
// CONFIG is disabled (read from INFO memory instead) and on a cluster where
// one primary of three evicts.
func TestCheckEviction(t *testing.T) {
	ctx := context.Background()
	client := func(t *testing.T, addrs ...string) *stockgate.Gate {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return stockgate.New(c, "fs")
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // "" : accepted
	}{
		{"noeviction", nil, ""},
		{"allkeys-lru", []string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"}, "maxmemory-policy allkeys-lru"},
		{"volatile-ttl", []string{"--maxmemory-policy", "volatile-ttl"}, "maxmemory-policy volatile-ttl"},
		{"config disabled, evicting", []string{"--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""}, "maxmemory-policy allkeys-lru"},
		{"config disabled, noeviction", []string{"--rename-command", "CONFIG", ""}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testenv.StartRedis(t, tc.args...)
			err := client(t, s.Addr).CheckEviction(ctx)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckEviction: %v", err)
				}
				return
			}
			if !errors.Is(err, stockgate.ErrEvicting) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "noeviction") {
				t.Fatalf("CheckEviction: %v; want ErrEvicting naming %q and the fix", err, tc.want)
			}
		})
	}
	t.Run("cluster, one primary evicting", func(t *testing.T) {
		nodes := startCluster(t)
		g := client(t, nodes[0].Addr, nodes[1].Addr, nodes[2].Addr)
		if err := g.CheckEviction(ctx); err != nil {
			t.Fatalf("CheckEviction before: %v", err)
		}
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{nodes[1].Addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "allkeys-lfu").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		err = g.CheckEviction(ctx)
		if !errors.Is(err, stockgate.ErrEvicting) || !strings.Contains(err.Error(), nodes[1].Addr) {
			t.Fatalf("CheckEviction: %v; want ErrEvicting naming primary %s", err, nodes[1].Addr)
		}
	})
}

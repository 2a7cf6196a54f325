package stockgate

import (
	"strings"
	"testing"

	"github.com/redis/rueidis"
)

// TestParsePrimariesNeedsEverySlot: the primaries are read only from a
// CLUSTER NODES view in which they serve every slot. A view taken during a
// failover, with the promoted replica listed as a primary before the slots
// it took over, is an error (the cluster is changing), not a list without
// it: that list would count as one more change of the cluster, and one
// more rebuild of every sale, once the view settles (TestServeRedisCluster
// saw three rebuilds for one forced failover).
func TestParsePrimariesNeedsEverySlot(t *testing.T) {
	nodes := map[string]rueidis.Client{}
	for _, a := range []string{"127.0.0.1:30001", "127.0.0.1:30002", "127.0.0.1:30003", "127.0.0.1:30004"} {
		nodes[a] = nil
	}
	const (
		n1 = "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected "
		n2 = "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected "
		n3 = "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected "
		r4 = "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected"
	)
	for _, tc := range []struct {
		name, view string
		want       []string // primaries, or nil for an error
	}{
		{"settled", n1 + "0-5460\n" + n2 + "5461-10922\n" + n3 + "10923-16383\n" + r4 + "\n",
			[]string{"127.0.0.1:30001", "127.0.0.1:30002", "127.0.0.1:30003"}},
		{"single slots and a migrating one", n1 + "0-92 93 94-5460 [93->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]\n" + n2 + "5461-10922\n" + n3 + "10923-16383 [93-<-e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca]\n",
			[]string{"127.0.0.1:30001", "127.0.0.1:30002", "127.0.0.1:30003"}},
		{"failing over: the promoted replica without its slots yet",
			strings.Replace(n1, "myself,master -", "myself,slave 07c37dfeb235213a872192d90877d0cd55635b91", 1) + "\n" + n2 + "5461-10922\n" + n3 + "10923-16383\n" +
				"07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 master - 0 1426238317239 5 connected\n",
			nil},
		{"a slot nobody serves", n1 + "0-5459\n" + n2 + "5461-10922\n" + n3 + "10923-16383\n", nil},
		{"a bad range", n1 + "0-x\n" + n2 + "5461-10922\n" + n3 + "10923-16383\n", nil},
	} {
		prim, err := parsePrimaries(tc.view, nodes)
		if tc.want == nil {
			if err == nil {
				t.Errorf("%s: %d primaries, want an error", tc.name, len(prim))
			}
			continue
		}
		var got []string
		for _, p := range prim {
			got = append(got, p.addr)
		}
		if err != nil || strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

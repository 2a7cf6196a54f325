package capacity

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCostsFromBench: the handler's cost is the pipeline's throughput on the
// report's cores, Redis' the gate baseline; a report with neither, or not a
// report, is refused.
func TestCostsFromBench(t *testing.T) {
	cases := []struct {
		report  string
		want    Costs
		wantErr string
	}{
		{`{"setup":{"machine":{"cpus":2}},"baselines":{"redis_gate_rps":50000},"results":[{"strategy":"db-conditional","throughput_rps":500},{"strategy":"pipeline","throughput_rps":10000}]}`,
			Costs{HandlerUS: 200, RedisUS: 20}, ""},
		{`{"baselines":{"redis_gate_rps":40000},"results":[{"strategy":"pipeline","throughput_rps":10000}]}`, Costs{RedisUS: 25}, ""},
		{`{"setup":{"machine":{"cpus":4}},"results":[{"strategy":"pipeline","throughput_rps":8000}]}`, Costs{HandlerUS: 500}, ""},
		{`{"results":[]}`, Costs{}, "neither baselines.redis_gate_rps"},
		{`not json`, Costs{}, "not a bench report"},
	}
	for _, tc := range cases {
		got, err := CostsFromBench([]byte(tc.report))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err %v, want one saying %q", tc.report, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.report, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: costs (-want +got):\n%s", tc.report, diff)
		}
	}
}

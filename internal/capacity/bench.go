package capacity

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Measured are the costs measured on the 2-core development machine
// (docs/scaling.md says how): the defaults of `flashsale plan`.
var Measured = Costs{
	HandlerUS: 120, // a flashsale instance's CPU per purchase request
	RedisUS:   21,  // the Redis primary's CPU per reserve.lua call (INFO cpu / calls)
	NATSUS:    26,  // JetStream per message, BenchmarkPublish
	DBUS:      250, // PostgreSQL per order in a batch of 500, BenchmarkApplyBatch on a loaded machine (MariaDB: 111; both 40-65 quiet, docs/scaling.md)
}

// benchReport is the part of a `flashsale bench -json` report that
// CostsFromBench reads.
type benchReport struct {
	Setup struct {
		Machine struct {
			CPUs int `json:"cpus"`
		} `json:"machine"`
	} `json:"setup"`
	Baselines struct {
		RedisGateRPS float64 `json:"redis_gate_rps"`
	} `json:"baselines"`
	Results []struct {
		Strategy      string  `json:"strategy"`
		ThroughputRPS float64 `json:"throughput_rps"`
	} `json:"results"`
}

// CostsFromBench derives costs from report, the JSON of `flashsale bench
// -json`: the handler's from the pipeline's throughput on the machine's
// cores (everything on the same cores: an upper bound), Redis' from the gate
// baseline (client and server on the same cores: an upper bound too). Costs
// the report lacks are left 0; it fails if it has neither.
func CostsFromBench(report []byte) (Costs, error) {
	var r benchReport
	if err := json.Unmarshal(report, &r); err != nil {
		return Costs{}, fmt.Errorf("not a bench report: %w", err)
	}
	var c Costs
	if r.Baselines.RedisGateRPS > 0 {
		c.RedisUS = 1e6 / r.Baselines.RedisGateRPS
	}
	for _, res := range r.Results {
		if res.Strategy == "pipeline" && res.ThroughputRPS > 0 && r.Setup.Machine.CPUs > 0 {
			c.HandlerUS = float64(r.Setup.Machine.CPUs) * 1e6 / res.ThroughputRPS
		}
	}
	if c.RedisUS == 0 && c.HandlerUS == 0 {
		return c, errors.New("the report has neither baselines.redis_gate_rps nor a pipeline result with setup.machine.cpus")
	}
	return c, nil
}

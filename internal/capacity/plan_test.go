package capacity

import (
	"math"
	"strings"
	"testing"
)

func TestMake(t *testing.T) {
	l := Load{Rate: 1_010_000, HotShare: 0.99, SKUs: 10_000, HotStock: 100_000}
	c := Costs{HandlerUS: 120, RedisUS: 20, NATSUS: 25, DBUS: 250}
	s := Sizing{InstanceCores: 2, Headroom: 0.5, NATSReplicas: 3, Batch: 1000}
	p, err := Make(l, c, s)
	if err != nil {
		t.Fatal(err)
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("HotRate", p.HotRate, 999_900)
	near("NormalRate", p.NormalRate, 10_100)
	near("HotSellSeconds", p.HotSellSeconds, 100_000/999_900.0)
	// 999,900 reserves/s x 20 µs = 19.998 threads; at 50%: 40 buckets.
	near("RedisLoadHot", p.RedisLoadHot, 19.998)
	if p.Buckets != 40 {
		t.Errorf("Buckets = %d, want 40", p.Buckets)
	}
	near("ReservesPerBucket", p.ReservesPerBucket, 999_900/40.0)
	// 10,100 x 20 µs = 0.202 -> 1 primary more.
	if p.RedisPrimaries != 41 {
		t.Errorf("RedisPrimaries = %d, want 41", p.RedisPrimaries)
	}
	// 1,010,000 x 120 µs = 121.2 cores; 2-core instances at 50%: 122.
	near("InstanceCoresBusy", p.InstanceCoresBusy, 121.2)
	if p.Instances != 122 {
		t.Errorf("Instances = %d, want 122", p.Instances)
	}
	near("StreamCapacity", p.StreamCapacity, 20_000)
	near("StreamPeak", p.StreamPeak, 1_010_000)
	near("StreamBurstDrain", p.StreamBurstDrain, 100_000/9_900.0)
	if p.NATSNodes != 3 {
		t.Errorf("NATSNodes = %d, want 3", p.NATSNodes)
	}
	// 10,100 orders/s x 250 µs = 2.525 cores; at 50%: 6 appliers + 1 for the hot row.
	near("DBBusyCores", p.DBBusyCores, 2.525)
	if p.Appliers != 7 {
		t.Errorf("Appliers = %d, want 7", p.Appliers)
	}
	near("HotDrainSeconds", p.HotDrainSeconds, 25)
	near("TransactionsRate", p.TransactionsRate, 10.1)
	if p.AppliersPerInst != 1 {
		t.Errorf("AppliersPerInst = %d, want 1", p.AppliersPerInst)
	}
	out := strings.Join(p.Lines(l, c, s), "\n")
	for _, want := range []string{"40 stock buckets", "41 primaries", "122 instances", "3 nodes", "7 appliers"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan text lacks %q:\n%s", want, out)
		}
	}
}

// TestMakeEdges: no hot SKU, an even replica count, a stream the normal
// orders already fill.
func TestMakeEdges(t *testing.T) {
	c := Costs{HandlerUS: 100, RedisUS: 10, NATSUS: 100, DBUS: 100}
	p, err := Make(Load{Rate: 10_000, HotShare: 0, SKUs: 100}, c, Sizing{InstanceCores: 4, Headroom: 1, NATSReplicas: 2, Batch: 100})
	if err != nil {
		t.Fatal(err)
	}
	if p.Buckets != 0 || p.RedisPrimaries != 1 || p.NATSNodes != 3 || p.Instances != 1 {
		t.Errorf("no hot SKU: %+v", p)
	}
	if !math.IsInf(p.StreamBurstDrain, 1) {
		t.Errorf("StreamBurstDrain = %v: 10,000 orders/s fill a 10,000/s stream", p.StreamBurstDrain)
	}
}

func TestMakeRefusesNonsense(t *testing.T) {
	good := func() (Load, Costs, Sizing) {
		return Load{Rate: 1000, HotShare: 0.5, SKUs: 10, HotStock: 10}, Costs{1, 1, 1, 1}, Sizing{2, 0.5, 3, 100}
	}
	for _, tc := range []struct {
		name   string
		change func(*Load, *Costs, *Sizing)
		want   string
	}{
		{"zero rate", func(l *Load, _ *Costs, _ *Sizing) { l.Rate = 0 }, "rate"},
		{"NaN rate", func(l *Load, _ *Costs, _ *Sizing) { l.Rate = math.NaN() }, "rate"},
		{"share above 1", func(l *Load, _ *Costs, _ *Sizing) { l.HotShare = 1.5 }, "hot-share"},
		{"no other SKUs", func(l *Load, _ *Costs, _ *Sizing) { l.SKUs = 0 }, "skus"},
		{"negative stock", func(l *Load, _ *Costs, _ *Sizing) { l.HotStock = -1 }, "stock"},
		{"zero cost", func(_ *Load, c *Costs, _ *Sizing) { c.DBUS = 0 }, "cost"},
		{"zero cores", func(_ *Load, _ *Costs, s *Sizing) { s.InstanceCores = 0 }, "instance-cores"},
		{"headroom 0", func(_ *Load, _ *Costs, s *Sizing) { s.Headroom = 0 }, "headroom"},
		{"replicas 7", func(_ *Load, _ *Costs, s *Sizing) { s.NATSReplicas = 7 }, "nats-replicas"},
		{"batch 0", func(_ *Load, _ *Costs, s *Sizing) { s.Batch = 0 }, "batch"},
	} {
		l, c, s := good()
		tc.change(&l, &c, &s)
		if _, err := Make(l, c, s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// TestLinesWording: counts of one are singular, and the appliers line says
// how many FLASHSALE_APPLY_WORKERS runs over every instance, not only the
// appliers the database work needs.
func TestLinesWording(t *testing.T) {
	cases := []struct {
		l    Load
		s    Sizing
		want []string
	}{
		{Load{Rate: 1_010_000, HotShare: 0.99, SKUs: 10_000, HotStock: 100_000}, Sizing{InstanceCores: 2, Headroom: 0.5, NATSReplicas: 3, Batch: 1000},
			[]string{"-> 42 stock buckets (", "43 primaries in all", "122 instances of 2 cores", "3 nodes (", "its 100000 orders stored",
				"consumers: 7 appliers needed: FLASHSALE_APPLY_WORKERS=1 on each of the 122 instances runs 122; FLASHSALE_APPLY_BATCH=1000"}},
		{Load{Rate: 1000, HotShare: 0.5, SKUs: 1, HotStock: 1}, Sizing{InstanceCores: 1, Headroom: 0.5, NATSReplicas: 1, Batch: 1000},
			[]string{"over 1 other SKU\n", "-> 1 stock bucket (", "2 primaries in all", "-> 1 instance of 1 core\n", "nats: 1 node (",
				"its 1 order stored", "the hot SKU's 1 order applied", "consumers: 2 appliers needed: FLASHSALE_APPLY_WORKERS=2 on the one instance;"}},
		{Load{Rate: 1000, HotShare: 1, SKUs: 0, HotStock: 10}, Sizing{InstanceCores: 2, Headroom: 1, NATSReplicas: 1, Batch: 1000},
			[]string{"-> 1 primary in all", "1 applier needed:"}},
	}
	c := Costs{HandlerUS: 120, RedisUS: 21, NATSUS: 26, DBUS: 250}
	for _, tc := range cases {
		p, err := Make(tc.l, c, tc.s)
		if err != nil {
			t.Fatal(err)
		}
		out := strings.Join(p.Lines(tc.l, c, tc.s), "\n") + "\n"
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("plan of %+v lacks %q:\n%s", tc.l, w, out)
			}
		}
	}
}

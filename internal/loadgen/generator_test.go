package loadgen

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestLoadgenSchedule(t *testing.T) {
	cases := []struct {
		rate float64
		i    int64
		want time.Duration
	}{
		{1000, 0, 0},
		{1000, 1, time.Millisecond},
		{1000, 2500, 2500 * time.Millisecond},
		{3, 3, time.Second},                        // 1/3 s steps do not drift
		{3, 3_000_000, 1_000_000 * time.Second},    // even after a million of them
		{7, 1, 142_857_143 * time.Nanosecond},      // rounded to the nanosecond
		{0.5, 2, 4 * time.Second},                  // slower than one a second
		{20000, 19999, 999_950 * time.Microsecond}, // last one of the first second
	}
	for _, c := range cases {
		if got := Schedule(c.rate, c.i); got != c.want {
			t.Errorf("Schedule(%v, %d) = %v, want %v", c.rate, c.i, got, c.want)
		}
	}
}

// within reports whether got is want to the histogram's precision (0.1%).
func within(got, want time.Duration) bool {
	return math.Abs(float64(got-want)) <= float64(want)/1000+float64(time.Microsecond)
}

// TestLoadgenOpenLoopMeasuresFromDueTime: requests due every 10 ms against a
// server that takes 100 ms and serves one at a time. Request k is due at
// 10k ms but only sent at 100k ms, answered at 100(k+1) ms: its latency is
// 100 + 90k ms, though the server took 100 ms for each. A generator that
// measured from the send (coordinated omission) would report 100 ms for all.
func TestLoadgenOpenLoopMeasuresFromDueTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res, err := Run(t.Context(), Config{Mode: Open, Rate: 100, Concurrency: 1, Duration: time.Second, Requests: 20},
			func(ctx context.Context, seq int64) Outcome {
				time.Sleep(100 * time.Millisecond)
				return Outcome{Code: "accepted"}
			})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 20 || res.Codes["accepted"] != 20 || res.Errors != 0 {
			t.Fatalf("requests %d, codes %v, errors %d", res.Requests, res.Codes, res.Errors)
		}
		if got, want := res.Percentile(100), 1810*time.Millisecond; !within(got, want) { // k = 19
			t.Errorf("max latency %v, want %v (from the due time)", got, want)
		}
		if got, want := res.Percentile(50), 910*time.Millisecond; !within(got, want) { // k = 9
			t.Errorf("median latency %v, want %v", got, want)
		}
		if got := time.Duration(res.Service.ValueAtPercentile(100)) * time.Microsecond; !within(got, 100*time.Millisecond) {
			t.Errorf("max service time %v, want 100ms", got)
		}
		if res.Late != 19 {
			t.Errorf("late %d, want 19 (all but the first were sent behind schedule)", res.Late)
		}
		if res.Elapsed != 2*time.Second {
			t.Errorf("elapsed %v, want 2s", res.Elapsed)
		}
	})
}

// TestLoadgenOpenLoopKeepsPace: a fast server sees exactly the rate, spaced evenly.
func TestLoadgenOpenLoopKeepsPace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent [10]time.Time
		start := time.Now()
		res, err := Run(t.Context(), Config{Mode: Open, Rate: 4, Duration: 2500 * time.Millisecond},
			func(ctx context.Context, seq int64) Outcome {
				sent[seq] = time.Now()
				time.Sleep(time.Millisecond)
				return Outcome{Code: "ok"}
			})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 10 { // due at 0, 250 ms, ..., 2250 ms; 2500 ms is the bound
			t.Fatalf("%d requests, want 10", res.Requests)
		}
		for i, at := range sent {
			if want := time.Duration(i) * 250 * time.Millisecond; at.Sub(start) != want {
				t.Errorf("request %d sent at %v, want %v", i, at.Sub(start), want)
			}
		}
		if got := res.Percentile(99.9); !within(got, time.Millisecond) {
			t.Errorf("p99.9 %v, want 1ms", got)
		}
		if got := res.Throughput(); math.Abs(got-4) > 1e-9 {
			t.Errorf("throughput %v/s, want 4/s over the 2.5 s bound", got)
		}
	})
}

// TestLoadgenClosedLoop: 4 buyers, 10 ms per request, 40 requests: 100 ms.
func TestLoadgenClosedLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var inFlight, most atomic.Int64
		res, err := Run(t.Context(), Config{Mode: Closed, Concurrency: 4, Duration: time.Hour, Requests: 40},
			func(ctx context.Context, seq int64) Outcome {
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(10 * time.Millisecond)
				inFlight.Add(-1)
				if seq%10 == 0 {
					return Outcome{Code: "transport", Err: true}
				}
				return Outcome{Code: "accepted"}
			})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 40 || res.Errors != 4 || res.Codes["accepted"] != 36 || res.Codes["transport"] != 4 {
			t.Errorf("requests %d, errors %d, codes %v", res.Requests, res.Errors, res.Codes)
		}
		if most.Load() != 4 {
			t.Errorf("%d requests in flight at most, want 4", most.Load())
		}
		if res.Elapsed != 100*time.Millisecond || res.Window != 100*time.Millisecond {
			t.Errorf("elapsed %v, window %v; want 100ms (count bound)", res.Elapsed, res.Window)
		}
		if got := res.Throughput(); math.Abs(got-360) > 1e-6 {
			t.Errorf("throughput %v/s, want 360/s (errors do not count)", got)
		}
		if got := res.Percentile(50); !within(got, 10*time.Millisecond) {
			t.Errorf("median %v, want 10ms", got)
		}
		var completed, errs int64
		for _, p := range res.Timeline {
			completed += p.Completed
			errs += p.Errors
		}
		if completed != 40 || errs != 4 {
			t.Errorf("timeline holds %d answers, %d errors; want 40, 4", completed, errs)
		}
	})
}

// TestLoadgenTimeBound: a closed loop stops starting requests at the
// duration; requests in flight then are answered but not counted in the
// throughput window.
func TestLoadgenTimeBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var progress []Progress
		res, err := Run(t.Context(), Config{Mode: Closed, Concurrency: 2, Duration: 1 * time.Second,
			Progress: func(p Progress) { progress = append(progress, p) }, ProgressEvery: 250 * time.Millisecond},
			func(ctx context.Context, seq int64) Outcome {
				time.Sleep(300 * time.Millisecond)
				return Outcome{Code: "accepted"}
			})
		if err != nil {
			t.Fatal(err)
		}
		// Each buyer starts at 0, 300, 600, 900 ms: 8 requests, the last two
		// answered at 1.2 s, after the bound.
		if res.Requests != 8 || res.InWindow != 6 || res.Elapsed != 1200*time.Millisecond {
			t.Errorf("requests %d, in window %d, elapsed %v; want 8, 6, 1.2s", res.Requests, res.InWindow, res.Elapsed)
		}
		if got := res.Throughput(); math.Abs(got-6) > 1e-9 {
			t.Errorf("throughput %v, want 6/s", got)
		}
		if len(progress) < 4 || !progress[len(progress)-1].Final || progress[len(progress)-1].Done != 8 {
			t.Errorf("progress reports: %+v", progress)
		}
	})
}

func TestLoadgenStopsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(145*time.Millisecond, cancel)
		res, err := Run(ctx, Config{Mode: Open, Rate: 100, Duration: time.Hour}, func(ctx context.Context, seq int64) Outcome {
			return Outcome{Code: "ok"}
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 15 { // due at 0..140 ms
			t.Errorf("%d requests, want 15", res.Requests)
		}
	})
}

func TestLoadgenConfigValidate(t *testing.T) {
	bad := []Config{
		{Mode: "burst", Duration: time.Second, Concurrency: 1},
		{Mode: Closed, Concurrency: 1},
		{Mode: Closed, Duration: time.Second},
		{Mode: Open, Duration: time.Second},
		{Mode: Open, Duration: time.Second, Rate: math.NaN()},
		{Mode: Closed, Duration: time.Second, Concurrency: 1, Requests: -1},
	}
	for _, c := range bad {
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := (Config{Mode: Open, Duration: time.Second, Rate: 10}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestLoadgenPercentiles: 1..1000 ms once each; the histogram answers each
// percentile to 0.1%.
func TestLoadgenPercentiles(t *testing.T) {
	h := NewHistogram()
	for v := int64(1); v <= 1000; v++ {
		if err := h.RecordValue(v * 1000); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 500 * time.Millisecond}, {99, 990 * time.Millisecond}, {99.9, 999 * time.Millisecond}, {100, time.Second}} {
		got := time.Duration(h.ValueAtPercentile(c.p)) * time.Microsecond
		if !within(got, c.want) {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	pts := PercentileCurve(h)
	if len(pts) == 0 || pts[0].Percentile != 0 || pts[len(pts)-1].Percentile != 100 {
		t.Fatalf("curve %v", pts)
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].Percentile <= pts[i-1].Percentile || pts[i].Value < pts[i-1].Value {
			t.Errorf("curve not increasing at %d: %v then %v", i, pts[i-1], pts[i])
		}
	}
}

// TestLoadgenWarmup: requests answered during the warm-up are not measured.
func TestLoadgenWarmup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		res, err := Run(t.Context(), Config{Mode: Closed, Concurrency: 1, Warmup: 250 * time.Millisecond, Duration: 500 * time.Millisecond},
			func(ctx context.Context, seq int64) Outcome {
				calls.Add(1)
				time.Sleep(100 * time.Millisecond)
				return Outcome{Code: "accepted"}
			})
		if err != nil {
			t.Fatal(err)
		}
		// Sent at 0, 100 ... 700 ms, answered 100 ms later. Measured: the
		// answers from 250 ms on (300 ... 800 ms); in the window up to
		// 750 ms: 300 ... 700 ms.
		if calls.Load() != 8 || res.Requests != 6 || res.InWindow != 5 || res.Elapsed != 550*time.Millisecond {
			t.Errorf("calls %d, measured %d, in window %d, elapsed %v; want 8, 6, 5, 550ms",
				calls.Load(), res.Requests, res.InWindow, res.Elapsed)
		}
		if got := res.Throughput(); math.Abs(got-10) > 1e-9 {
			t.Errorf("throughput %v, want 10/s (5 in 0.5 s)", got)
		}
	})
}

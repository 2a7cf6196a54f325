package room

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestRateCurve(t *testing.T) {
	ttl := 2 * time.Minute
	cases := []struct {
		name     string
		capacity float64
		avail    int64
		known    bool
		conv     float64
		want     float64
	}{
		{"plenty: capacity", 50, 1_000_000, true, 1, 50},
		{"at the knee", 50, 6000, true, 1, 50},
		{"below the knee: avail per horizon", 50, 240, true, 1, 2},
		{"half buy: twice as many", 50, 240, true, 0.5, 4},
		{"conv floored at 0.05", 50, 60, true, 0.001, 10},
		{"conv above 1 clamped", 50, 240, true, 3, 2},
		{"one unit left: the floor", 50, 1, true, 1, MinRate},
		{"the floor, not past the capacity", 0.5, 1, true, 1, 0.5},
		{"sold out", 50, 0, true, 1, 0},
		{"oversold", 50, -3, true, 1, 0},
		{"unknown: hold", 50, 100, false, 1, 0},
		{"no capacity", 0, 100, true, 1, 0},
	}
	for _, c := range cases {
		if got := Rate(c.capacity, c.avail, c.known, c.conv, ttl); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: Rate = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestControllerRate: ticks driven by the test's clock advance served by
// rate times the time elapsed: the SKU's rate, else the default.
func TestControllerRate(t *testing.T) {
	e := newEnv(t)
	r := e.room(t, "a")
	for _, c := range []struct {
		s    Settings
		want int64 // served after 2 s
	}{
		{Settings{SKU: "default"}, 20},          // DefaultRate 10/s
		{Settings{SKU: "fast", Rate: 25}, 50},   // the SKU's capacity
		{Settings{SKU: "slow", Rate: 0.75}, 1},  // fractions carry over ticks
		{Settings{SKU: "few", Rate: 1000}, 100}, // never past the last joiner
	} {
		for _, u := range users(100) {
			join(t, r, c.s, u)
		}
		now := e.clock.Now()
		tick(t, r, c.s, now)
		var tk Tick
		for range 20 {
			now = now.Add(100 * time.Millisecond)
			tk = tick(t, r, c.s, now)
		}
		if tk.Served != c.want {
			t.Errorf("%s: served %d after 2 s, want %d (tick %+v)", c.s.SKU, tk.Served, c.want, tk)
		}
	}
	if e.obs.admit != 20+50+1+100 {
		t.Errorf("Observer.Admitted total %d, want %d", e.obs.admit, 171)
	}
}

// TestControllerBeforeOpening: nothing is served before the opening; a gap
// between ticks (a takeover) advances by at most two ticks' worth.
func TestControllerBeforeOpening(t *testing.T) {
	e := newEnv(t)
	r := e.room(t, "a")
	s := Settings{SKU: "sku1", OpensAt: t0.Add(time.Second)}
	for _, u := range users(50) {
		join(t, r, s, u)
	}
	tick(t, r, s, t0)
	if tk := tick(t, r, s, t0.Add(900*time.Millisecond)); tk.Served != 0 {
		t.Fatalf("served %d before the opening", tk.Served)
	}
	tick(t, r, s, t0.Add(time.Second))
	if tk := tick(t, r, s, t0.Add(11*time.Second)); tk.Served != 2 {
		t.Errorf("after a 10 s gap served %d, want 2 (two 100 ms ticks at 10/s)", tk.Served)
	}
	if st := poll(t, r, s, "user000"); st.Position == 0 {
		t.Errorf("the controller's tick after the opening did not draw: %+v", st)
	}
}

// TestControllerConv: when admitted buyers do not buy, conv falls and the
// room admits more buyers per unit left.
func TestControllerConv(t *testing.T) {
	e := newEnv(t)
	e.cfg.AdmissionTTL = 10 * time.Second
	r := e.room(t, "a")
	s := Settings{SKU: "sku1", Rate: 100}
	for _, u := range users(400) {
		join(t, r, s, u)
	}
	e.stock.set(100, true)
	now := e.clock.Now()
	first := tick(t, r, s, now)
	if first.Rate != 10 || first.Conv != 1 {
		t.Fatalf("first tick %+v, want conv 1, rate 100 units/10 s = 10/s", first)
	}
	// One unit sold per four positions served.
	var tk Tick
	for range 30 {
		now = now.Add(100 * time.Millisecond)
		tk = tick(t, r, s, now)
		e.stock.set(100-tk.Served/4, true)
	}
	if tk.Conv < 0.2 || tk.Conv > 0.3 {
		t.Errorf("conv %v after a quarter of admitted buyers bought, want about 0.25 (tick %+v)", tk.Conv, tk)
	}
	want := Rate(100, tk.Avail, true, tk.Conv, e.cfg.AdmissionTTL)
	if tk.Rate != want || tk.Rate <= 10 {
		t.Errorf("rate %v, want %v (> the 10/s of conv 1)", tk.Rate, want)
	}
	// A new leader starts from the conv in Redis, not from 1.
	r2 := e.room(t, "b")
	r.release(context.Background(), s.SKU)
	if tk2 := tick(t, r2, s, now.Add(100*time.Millisecond)); !tk2.Leader || tk2.Conv != tk.Conv {
		t.Errorf("new leader's tick %+v, want conv %v carried over", tk2, tk.Conv)
	}
}

// TestLeaderElection: two instances ticking the same room advance it once
// per tick; when the leader stops, the other takes over once the lease
// expires.
func TestLeaderElection(t *testing.T) {
	e := newEnv(t)
	e.cfg.LeaseTTL = 300 * time.Millisecond
	a, b := e.room(t, "a"), e.room(t, "b")
	s := Settings{SKU: "sku1"}
	for _, u := range users(100) {
		join(t, a, s, u)
	}
	now := e.clock.Now()
	if ta, tb := tick(t, a, s, now), tick(t, b, s, now); !ta.Leader || tb.Leader {
		t.Fatalf("first ticks: a %+v, b %+v; want a alone leading", ta, tb)
	}
	var served int64
	for range 10 {
		now = now.Add(100 * time.Millisecond)
		ta, tb := tick(t, a, s, now), tick(t, b, s, now)
		if !ta.Leader || tb.Leader {
			t.Fatalf("a %+v, b %+v; want a alone leading", ta, tb)
		}
		served = ta.Served
	}
	if served != 10 {
		t.Fatalf("served %d after 10 ticks of 100 ms at 10/s on two instances, want 10", served)
	}

	// a dies (stops ticking, keeps its lease): b waits for the lease to
	// expire in Redis's own time.
	deadline := time.Now().Add(10 * time.Second)
	var tb Tick
	for !tb.Leader {
		if time.Now().After(deadline) {
			t.Fatal("b never took the lease over")
		}
		time.Sleep(20 * time.Millisecond)
		now = now.Add(100 * time.Millisecond)
		tb = tick(t, b, s, now)
	}
	// The takeover's own step covers at most two ticks, not the whole gap.
	if tb.Served < served || tb.Served > served+2 {
		t.Errorf("b's takeover step served %d, want %d to %d", tb.Served, served, served+2)
	}
	served = tb.Served
	now = now.Add(100 * time.Millisecond)
	if tb = tick(t, b, s, now); tb.Served != served+1 {
		t.Errorf("b after takeover served %d, want %d", tb.Served, served+1)
	}
	// a comes back: it is fenced off until b's lease lapses.
	if ta := tick(t, a, s, now); ta.Leader {
		t.Errorf("a took the lease back while b holds it: %+v", ta)
	}
}

// TestRun: the loop on a real ticker advances served and gives its lease
// up when stopped, so another instance takes over at once.
func TestRun(t *testing.T) {
	e := newEnv(t)
	e.cfg.Tick = 10 * time.Millisecond
	e.cfg.Now = time.Now
	e.cfg.DefaultRate = 1000
	r := e.room(t, "a")
	s := Settings{SKU: "sku1"}
	for _, u := range users(5) {
		join(t, r, s, u)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r.Run(ctx, func() []Settings { return []Settings{s} })
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := r.Stats(context.Background(), s.SKU)
		if err != nil {
			t.Fatal(err)
		}
		if st.Served == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run did not serve everyone: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if tk := tick(t, e.room(t, "b"), s, time.Now()); !tk.Leader {
		t.Errorf("after Run stopped another instance could not lead: %+v", tk)
	}
}

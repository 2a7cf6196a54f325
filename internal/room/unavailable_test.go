package room

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestFailClosed: with the room's Redis hung (SIGSTOP) then dead (SIGKILL),
// Join, Poll and the controller return ErrUnavailable within about the
// configured timeout, and an admission given earlier still verifies.
func TestFailClosed(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := testenv.RedisClient(t, srv.URL)
	clk := &clock{t: t0}
	st := &stock{units: 1_000_000, known: true}
	const timeout = 300 * time.Millisecond
	r, err := New(c, Config{Prefix: "room", Key: []byte("test key, 16 bytes or more"), Timeout: timeout, Now: clk.Now}, nil, st.remaining)
	if err != nil {
		t.Fatal(err)
	}
	s := Settings{SKU: "sku1"}
	ctx := context.Background()
	join(t, r, s, "admitted")
	join(t, r, s, "waiting")
	tick(t, r, s, clk.Now())
	tick(t, r, s, clk.Add(100*time.Millisecond)) // 50/s by default: both served
	a := poll(t, r, s, "admitted")
	if a.State != StateAdmitted {
		t.Fatalf("first buyer %+v, want admitted", a)
	}

	check := func(what string) {
		t.Helper()
		calls := map[string]func() error{
			"Join":  func() error { _, err := r.Join(ctx, s, "newcomer"); return err },
			"Poll":  func() error { _, err := r.Poll(ctx, s, "waiting"); return err },
			"Tick":  func() error { _, err := r.Tick(ctx, s, clk.Now()); return err },
			"Stats": func() error { _, err := r.Stats(ctx, s.SKU); return err },
		}
		for name, call := range calls {
			start := time.Now()
			err := call()
			// Generous: the bound is the timeout, not a measure of speed.
			if took := time.Since(start); !errors.Is(err, ErrUnavailable) || took > timeout+5*time.Second {
				t.Errorf("%s with Redis %s: %v after %v, want ErrUnavailable within about %v", name, what, err, took, timeout)
			}
		}
		if err := r.VerifyAdmission(a.Admission, s.SKU, "admitted", s.OpensAt, clk.Now()); err != nil {
			t.Errorf("VerifyAdmission with Redis %s: %v", what, err)
		}
	}
	srv.Pause()
	check("paused")
	srv.Kill()
	check("killed")
}

// TestRedisRestart: with persistence on, the room survives its Redis
// restarting: places and admissions are as before.
func TestRedisRestart(t *testing.T) {
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	c := testenv.RedisClient(t, srv.URL)
	clk := &clock{t: t0}
	st := &stock{units: 100, known: true}
	r, err := New(c, Config{Prefix: "room", Key: []byte("test key, 16 bytes or more"), Now: clk.Now, Timeout: 5 * time.Second}, nil, st.remaining)
	if err != nil {
		t.Fatal(err)
	}
	s := Settings{SKU: "sku1", OpensAt: t0.Add(time.Second)}
	us := users(10)
	for _, u := range us {
		join(t, r, s, u)
	}
	clk.Add(time.Second)
	before := map[string]Status{}
	for _, u := range us {
		before[u] = poll(t, r, s, u)
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for _, u := range us {
		for {
			got, err := r.Poll(context.Background(), s, u)
			if errors.Is(err, ErrUnavailable) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond) // the client reconnects
				continue
			}
			if err != nil || got.Position != before[u].Position {
				t.Fatalf("%s after the restart: %+v, %v; before %+v", u, got, err, before[u])
			}
			break
		}
	}
}

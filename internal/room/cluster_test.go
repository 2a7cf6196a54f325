package room

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestCluster: every script's keys share the room's hash tag, so the room
// runs on Redis Cluster (no CROSSSLOT), for several SKUs on several slots.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six redis-servers")
	}
	rc := testenv.StartRedisCluster(t)
	clk := &clock{t: t0}
	st := &stock{units: 1_000_000, known: true}
	r, err := New(rc.Client(), Config{Prefix: "room", Key: []byte("test key, 16 bytes or more"), Now: clk.Now, Timeout: 5 * time.Second}, nil, st.remaining)
	if err != nil {
		t.Fatal(err)
	}
	for _, sku := range []string{"a", "b", "c", "d"} {
		s := Settings{SKU: sku, OpensAt: t0.Add(time.Second)}
		join(t, r, s, "early")
		clk.Set(s.OpensAt)
		join(t, r, s, "late")
		tick(t, r, s, clk.Now())
		tick(t, r, s, clk.Add(100*time.Millisecond))
		if got := poll(t, r, s, "early"); got.State != StateAdmitted {
			t.Errorf("%s: early buyer %+v, want admitted", sku, got)
		}
		if _, err := r.Stats(context.Background(), sku); err != nil {
			t.Error(err)
		}
		if err := r.Close(context.Background(), sku); err != nil {
			t.Error(err)
		}
		clk.Set(t0)
	}
}

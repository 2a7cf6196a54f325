package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/fleet"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestRegistry: on a real Redis, instances that beat are listed (stable
// first), one silent for over 30 s is not, one silent for over 10 minutes
// is deleted, one that leaves is gone; the canary state is absent until a
// trial writes it, then read back as written.
func TestRegistry(t *testing.T) {
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	r := fleet.New(c, prefix)
	ctx := context.Background()
	now := time.Now()
	if cs, err := r.Canary(ctx); err != nil || cs != nil {
		t.Fatalf("no trial yet: %v %v", cs, err)
	}
	for _, b := range []struct {
		id, group string
		ago       time.Duration
	}{{"c1", "canary", 0}, {"s2", "stable", time.Second}, {"s1", "stable", 0}, {"quiet", "stable", time.Minute}, {"gone", "stable", time.Hour}} {
		if err := r.Beat(ctx, fleet.Instance{ID: b.id, Group: b.group, Version: "v1"}, now.Add(-b.ago)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := r.Instances(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range got {
		ids = append(ids, in.ID)
	}
	if len(ids) != 3 || ids[0] != "s1" || ids[1] != "s2" || ids[2] != "c1" {
		t.Fatalf("listed %v, want [s1 s2 c1]", ids)
	}
	n, err := c.Do(ctx, c.B().Hlen().Key(prefix+":instances").Build()).AsInt64()
	if err != nil || n != 4 {
		t.Fatalf("entries after listing: %d %v, want 4 (the hour-old one deleted)", n, err)
	}
	if err := r.Leave(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Instances(ctx, now); len(got) != 2 {
		t.Fatalf("after c1 left: %+v", got)
	}
	want := fleet.Canary{Share: 25, State: "running", Steps: []int{5, 25, 100}, Step: 1, StartedAt: now.UTC().Truncate(time.Millisecond), UpdatedAt: now.UTC().Truncate(time.Millisecond)}
	if err := r.SetCanary(ctx, want); err != nil {
		t.Fatal(err)
	}
	cs, err := r.Canary(ctx)
	if err != nil || cs == nil || cs.Share != 25 || cs.State != "running" || cs.Step != 1 || len(cs.Steps) != 3 || !cs.StartedAt.Equal(want.StartedAt) {
		t.Fatalf("canary state: %+v %v", cs, err)
	}
}

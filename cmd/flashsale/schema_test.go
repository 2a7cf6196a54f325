package main

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flashsale/flashsale/internal/fleet"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestPublishSchemaFollowsTheFleet: with order-schema 2 an instance
// publishes schema version 2 only while every instance in the fleet
// registry reports reading it; an instance that does not (an older
// release) turns it back to 1 within a check and holds it there for
// schemaHold checks after it was last listed, and an empty registry (this
// instance's own beat not in yet) is no answer.
func TestPublishSchemaFollowsTheFleet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	q, err := orderqueue.Open(ctx, nc, orderqueue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	url, prefix := testenv.Redis(t)
	reg := fleet.New(testenv.RedisClient(t, url), prefix)
	// The other instances beat from their own processes: their own client
	// (one connection shared with publishSchema's reads made a slow read's
	// dropped connection fail a beat here, on a loaded CI machine).
	others := fleet.New(testenv.RedisClient(t, url), prefix)
	var observed atomic.Int64
	observed.Store(1)
	go publishSchema(ctx, q, reg, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)), func(v int) { observed.Store(int64(v)) })

	stays := func(want int, why string) {
		t.Helper()
		for range 10 {
			time.Sleep(20 * time.Millisecond)
			if v := q.PublishSchema(); v != want {
				t.Fatalf("%s: publishes schema %d, want %d", why, v, want)
			}
		}
	}
	becomes := func(want int, why string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for q.PublishSchema() != want || observed.Load() != int64(want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: publishes schema %d, want %d", why, q.PublishSchema(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	beat := func(id string, features ...string) {
		t.Helper()
		if err := others.Beat(ctx, fleet.Instance{ID: id, Group: "stable", Features: features}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}

	stays(1, "no instance listed")
	beat("self", fleet.FeatureCrowd, fleet.FeatureSchema2)
	becomes(2, "every instance reads schema 2")
	beat("older", fleet.FeatureCrowd)
	becomes(1, "an instance that reads only schema 1 joined")
	stays(1, "it is still listed")
	if err := others.Leave(ctx, "older"); err != nil {
		t.Fatal(err)
	}
	// It may be restarting (it left on its way down, and starts its
	// consumer before its first beat): version 1 for schemaHold periods.
	left := time.Now()
	stays(1, "it left a moment ago")
	becomes(2, "it left")
	// The hold counts from the last check that listed it, up to a period
	// (longer on a loaded machine) before Leave: half the hold is the bound
	// (without one, schema 2 comes back within a check or two).
	if held, hold := time.Since(left), schemaHold*20*time.Millisecond; held < hold/2 {
		t.Errorf("schema 2 again %v after the older instance left, want about %v", held, hold)
	}
}

// TestSeedLeaseFollowsTheFleet: every instance, whatever its own setting,
// starts each load of a sale with a sold-out lease as long as the longest
// one an instance answers from (its own, or one listed in the fleet
// registry), and keeps it for schemaHold checks after that instance was
// last listed (a Redis that lost the sale lost the registry too).
func TestSeedLeaseFollowsTheFleet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, prefix := testenv.Redis(t)
	reg := fleet.New(testenv.RedisClient(t, url), prefix)
	others := fleet.New(testenv.RedisClient(t, url), prefix)
	g := stockgate.New(testenv.RedisClient(t, url), prefix)
	var own atomic.Int64
	const every = 50 * time.Millisecond // a hold of 1.5 s
	go seedLeases(ctx, g, reg, func() time.Duration { return time.Duration(own.Load()) }, every, slog.New(slog.NewTextHandler(io.Discard, nil)))
	becomes := func(want time.Duration, why string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); g.SeedLease() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: seed lease %v, want %v", why, g.SeedLease(), want)
			}
		}
	}
	beat := func(id string, lease time.Duration) {
		t.Helper()
		if err := others.Beat(ctx, fleet.Instance{ID: id, Group: "stable", SoldOutLeaseMs: lease.Milliseconds()}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}

	becomes(0, "no lease in use")
	own.Store(int64(time.Second))
	becomes(time.Second, "its own lease")
	beat("other", 3*time.Second)
	becomes(3*time.Second, "a longer one listed")
	// The registry lost (Redis lost its data): still the longest seen.
	if err := others.Leave(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	time.Sleep(5 * every)
	if got := g.SeedLease(); got != 3*time.Second {
		t.Fatalf("seed lease %v just after the listed instance left, want 3s", got)
	}
	becomes(time.Second, "the hold passed")
	if held, hold := time.Since(gone), schemaHold*every; held < hold/2 {
		t.Errorf("the 3s lease dropped %v after its instance left, want about %v", held, hold)
	}
	own.Store(0)
	becomes(0, "no lease in use any more")
}

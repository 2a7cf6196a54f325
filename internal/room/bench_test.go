package room

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// BenchmarkPoll measures a poll on a private redis-server with a room of
// 2000 waiting buyers served at 10/s: the client's time per poll (ns/op,
// round trip included), Redis's CPU per poll (redis-µs/poll, from INFO
// commandstats), how often a waiting buyer polls when following
// PollAfter (polls/buyer/s, averaged over the queue) and their product,
// Redis's CPU per waiting buyer per second (redis-µs/buyer/s).
// docs/waiting-room.md records the figures.
//
// lottery: every buyer joined before the opening, so each poll computes
// its place with the Feistel permutation; fcfs: they joined after it.
func BenchmarkPoll(b *testing.B) {
	b.Run("fcfs", func(b *testing.B) { benchmarkPoll(b, false) })
	b.Run("lottery", func(b *testing.B) { benchmarkPoll(b, true) })
}

func benchmarkPoll(b *testing.B, lottery bool) {
	srv := testenv.StartRedis(b)
	c := testenv.RedisClient(b, srv.URL)
	st := &stock{units: 1_000_000, known: true}
	clk := &clock{t: time.Now()}
	r, err := New(c, Config{Prefix: "room", Key: []byte("bench key, 16 bytes or more"), DefaultRate: 10, Timeout: 5 * time.Second, Now: clk.Now}, nil, st.remaining)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	s := Settings{SKU: "sku1"}
	if lottery {
		s.OpensAt = clk.Now().Add(time.Second)
	}
	const n = 2000
	var wg sync.WaitGroup
	var pollRate atomic.Int64 // sum of 1/PollAfter, in micro-polls per second
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < n; i += 16 {
				if _, err := r.Join(ctx, s, fmt.Sprintf("buyer%05d", i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	clk.Add(time.Second)
	if _, err := r.Tick(ctx, s, clk.Now()); err != nil {
		b.Fatal(err)
	}
	for i := range n {
		a, err := r.Poll(ctx, s, fmt.Sprintf("buyer%05d", i))
		if err != nil {
			b.Fatal(err)
		}
		pollRate.Add(int64(1e6 / a.PollAfter.Seconds()))
	}
	if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(7919) % n
			if _, err := r.Poll(ctx, s, fmt.Sprintf("buyer%05d", i)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	usec := commandUsecPerCall(info, "evalsha")
	perBuyer := float64(pollRate.Load()) / 1e6 / n
	b.ReportMetric(usec, "redis-µs/poll")
	b.ReportMetric(perBuyer, "polls/buyer/s")
	b.ReportMetric(usec*perBuyer, "redis-µs/buyer/s")
}

// commandUsecPerCall reads usec_per_call of cmd from INFO commandstats.
func commandUsecPerCall(info, cmd string) float64 {
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
	}
	return 0
}

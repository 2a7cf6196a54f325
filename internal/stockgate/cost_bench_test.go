package stockgate_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// BenchmarkRedisCost measures what each step of an accepted purchase costs
// Redis itself, on a private redis-server that nothing else uses: the
// reserve script (the default rate limits, an Idempotency-Key, the payload the
// purchase path stores), the relay's unqueue once the stream acknowledged
// (100 ids a call), the consumer's finalize of applied orders (500 a call),
// and the idempotency look-up of a sold-out SKU. Per operation it reports
// redis-cpu-µs (the server's user+system CPU, INFO cpu: the syscalls of
// the round trips included) and cmd-µs (the commands' own time, INFO
// commandstats; a script's, its commands included). These are the figures behind the purchase path's Redis
// share in docs/performance.md.
func BenchmarkRedisCost(b *testing.B) {
	srv := testenv.StartRedis(b)
	c := testenv.RedisClient(b, srv.URL)
	g := stockgate.New(c, "cost")
	ctx := context.Background()
	var n atomic.Int64
	// The service's default limits: the per-user one alone (2/s, burst 5).
	lim := stockgate.Limits{User: stockgate.Rate{PerSecond: 2, Burst: 5}, IPKey: "127.0.0.1"}
	next := func(sku string) sale.Reservation {
		i := n.Add(1)
		return sale.Reservation{OrderID: stockgate.NewOrderID(sku), SKU: sku, User: fmt.Sprintf("buyer-%09d", i), Quantity: 1,
			AcceptedAt: time.Now().UnixMilli(), IdempotencyKey: fmt.Sprintf("key-%012d", i), ClientIP: "127.0.0.1"}
	}
	const sku = "cost"
	if _, err := g.Seed(ctx, sku, stockgate.Config{PerUserLimit: 1}, sale.MaxStock, nil, nil, nil, nil, "b"); err != nil {
		b.Fatal(err)
	}
	var ids []string
	reserve := func(b *testing.B, count int) {
		ids = ids[:0]
		ch := make(chan string, count)
		var i atomic.Int64
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r := next(sku)
				if _, err := g.ReserveLimited(ctx, r, lim); err != nil {
					b.Error(err)
					return
				}
				if i.Add(1) <= int64(count) {
					ch <- r.OrderID
				}
			}
		})
		close(ch)
		for id := range ch {
			ids = append(ids, id)
		}
	}
	inBatches := func(b *testing.B, size int, f func([]string) error) {
		for i := 0; i < len(ids); i += size {
			if err := f(ids[i:min(i+size, len(ids))]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("reserve", func(b *testing.B) {
		measure(b, c, func() { reserve(b, 0) })
	})
	b.Run("unqueue-100", func(b *testing.B) {
		b.StopTimer()
		reserve(b, b.N)
		b.StartTimer()
		measure(b, c, func() {
			inBatches(b, 100, func(ids []string) error { return g.Unqueue(ctx, sku, ids...) })
		})
	})
	b.Run("finalize-500", func(b *testing.B) {
		b.StopTimer()
		reserve(b, b.N)
		inBatches(b, 100, func(ids []string) error { return g.Unqueue(ctx, sku, ids...) })
		b.StartTimer()
		measure(b, c, func() {
			inBatches(b, 500, func(ids []string) error {
				os := make([]stockgate.Outcome, len(ids))
				for i, id := range ids {
					os[i] = stockgate.Outcome{OrderID: id}
				}
				_, err := g.Finalize(ctx, sku, os)
				return err
			})
		})
	})
	b.Run("duplicate-sold-out", func(b *testing.B) {
		b.SetParallelism(32)
		measure(b, c, func() {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, _, err := g.Duplicate(ctx, sku, "nobody", strconv.FormatInt(n.Add(1), 10)); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	})
}

// measure runs f (b.N operations) and reports the Redis server's CPU and
// commands' time per operation.
func measure(b *testing.B, c rueidis.Client, f func()) {
	cpu0, sc0, cmd0 := redisTimes(b, c)
	f()
	cpu1, sc1, cmd1 := redisTimes(b, c)
	b.ReportMetric((cpu1-cpu0)/float64(b.N), "redis-cpu-µs/op")
	if sc1 > sc0 {
		// A script's commands count in their own stats too: only the script's.
		cmd0, cmd1 = sc0, sc1
	}
	b.ReportMetric((cmd1-cmd0)/float64(b.N), "cmd-µs/op")
}

// redisTimes returns the server's user+system CPU, the scripts' total time
// (EVALSHA, their commands included) and the commands' total time (every
// command but INFO, scripts' commands counted twice), in µs.
func redisTimes(b testing.TB, c rueidis.Client) (cpu, scripts, cmds float64) {
	s, err := c.Do(context.Background(), c.B().Info().Section("cpu").Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(s, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		switch {
		case !ok:
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f * 1e6
		case strings.HasPrefix(k, "cmdstat_") && k != "cmdstat_info":
			for _, kv := range strings.Split(v, ",") {
				if name, val, _ := strings.Cut(kv, "="); name == "usec" {
					f, _ := strconv.ParseFloat(val, 64)
					cmds += f
					if k == "cmdstat_evalsha" {
						scripts += f
					}
				}
			}
		}
	}
	return cpu, scripts, cmds
}

package stockgate_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// BenchmarkReserve compares the gate script through rueidis with many
// concurrent callers (auto-pipelined: what the HTTP path does) against a
// plain loop that sends one EVALSHA and waits for its reply before the next.
// Compare the reserves/s of the two in one run; absolute figures depend on
// the machine. Each reservation is a distinct user on a SKU that never sells out.
func BenchmarkReserve(b *testing.B) {
	g, _ := newGate(b)
	ctx := context.Background()
	var n atomic.Int64
	next := func(sku string) sale.Reservation {
		i := n.Add(1)
		return sale.Reservation{OrderID: fmt.Sprintf("%08x-0000-7000-8000-%012x", i>>48, i), SKU: sku,
			User: fmt.Sprintf("u%d", i), Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
	}
	for _, mode := range []string{"loop", "parallel-64", "parallel-256"} {
		b.Run(mode, func(b *testing.B) {
			sku := "bench-" + mode
			if _, err := g.Seed(ctx, sku, stockgate.Config{PerUserLimit: 1}, sale.MaxStock, nil, nil, nil, nil, "b"); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			switch mode {
			case "loop":
				for i := 0; i < b.N; i++ {
					if _, err := g.Reserve(ctx, next(sku)); err != nil {
						b.Fatal(err)
					}
				}
			default:
				par := 64
				if mode == "parallel-256" {
					par = 256
				}
				b.SetParallelism(max(1, par/runtime.GOMAXPROCS(0))) // goroutines = p x GOMAXPROCS
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := g.Reserve(ctx, next(sku)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reserves/s")
		})
	}
}

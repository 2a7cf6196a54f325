package stockgate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// BenchmarkReserveBatched asks whether Redis would spend less per purchase
// if several reserves went to it in one script call (as several
// reservations go to the stream in one message): "single" is the gate's
// reserve script, "batch-N" the same script run N times inside one call
// (its body wrapped in a function, N buyers' keys and arguments in one
// EVALSHA). Each runs 32 callers per core at once against a private redis-server
// with the service's default limits and reports the server's CPU per
// reserve (INFO cpu). Run each alone (-bench 'ReserveBatched/single$'), so
// that every case starts from an empty Redis. It is not a path of the
// service: docs/performance.md has the figures, which answer no.
func BenchmarkReserveBatched(b *testing.B) {
	srv := testenv.StartRedis(b)
	c := testenv.RedisClient(b, srv.URL)
	g := stockgate.New(c, "cost")
	ctx := context.Background()
	const sku = "cost"
	if _, err := g.Seed(ctx, sku, stockgate.Config{PerUserLimit: 1}, sale.MaxStock, nil, nil, nil, nil, "b"); err != nil {
		b.Fatal(err)
	}
	lim := stockgate.Limits{User: stockgate.Rate{PerSecond: 2, Burst: 5}, IPKey: "127.0.0.1"}
	var n atomic.Int64
	one := func() ([]string, []string) {
		i := n.Add(1)
		r := sale.Reservation{OrderID: stockgate.NewOrderID(sku), SKU: sku, User: fmt.Sprintf("buyer-%09d", i), Quantity: 1,
			AcceptedAt: time.Now().UnixMilli(), IdempotencyKey: fmt.Sprintf("key-%012d", i), ClientIP: "127.0.0.1"}
		payload, _ := json.Marshal(r)
		keys := g.KeysOf(sku)
		ks := []string{keys.Meta, keys.Buyers, keys.Res, keys.Outbox, keys.Idem, keys.Journal}
		args := []string{r.OrderID, r.User, "1", strconv.FormatInt(r.AcceptedAt, 10), r.User + "\x00" + r.IdempotencyKey, string(payload)}
		lk := g.LimitKeys(sku, r.User, lim.IPKey)
		ui, ub := lim.User.Args()
		ks = append(ks, lk[0], lk[1], lk[2])
		args = append(args, "0", "0", ui, ub, "0", "0", "1")
		return ks, args
	}
	batched := rueidis.NewLuaScript("local SCRIPT_ID = 'x'\nlocal function one(KEYS, ARGV)\n" + stockgate.ReserveLua + "\nend\n" + `
local out = {}
local n = #KEYS / 9
for i = 0, n - 1 do
  local k, a = {}, {}
  for j = 1, 9 do k[j] = KEYS[i*9+j] end
  for j = 1, 13 do a[j] = ARGV[i*13+j] end
  out[#out+1] = one(k, a)
end
return out
`)
	b.Run("single", func(b *testing.B) {
		cpu0 := redisCPUOnly(b, c)
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k, a := one()
				if v, err := g.ReserveScript().Exec(ctx, c, k, a).ToArray(); err != nil || len(v) < 2 {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric((redisCPUOnly(b, c)-cpu0)/float64(b.N), "redis-cpu-µs/reserve")
	})
	for _, size := range []int{1, 4, 16} {
		b.Run(fmt.Sprint("batch-", size), func(b *testing.B) {
			cpu0 := redisCPUOnly(b, c)
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					var K, A []string
					for range size {
						k, a := one()
						K = append(K, k...)
						A = append(A, a...)
					}
					vals, err := batched.Exec(ctx, c, K, A).ToArray()
					if err != nil || len(vals) != size {
						b.Error(err, len(vals))
						return
					}
					for _, v := range vals {
						if code, _ := v.ToArray(); len(code) == 0 {
							b.Error("no reply")
							return
						} else if x, _ := code[0].AsInt64(); x != 1 {
							b.Error("not accepted", x)
							return
						}
					}
				}
			})
			b.ReportMetric((redisCPUOnly(b, c)-cpu0)/float64(b.N*size), "redis-cpu-µs/reserve")
		})
	}
}

// redisCPUOnly is the server's user+system CPU so far, in µs.
func redisCPUOnly(b testing.TB, c rueidis.Client) float64 {
	cpu, _, _ := redisTimes(b, c)
	return cpu
}

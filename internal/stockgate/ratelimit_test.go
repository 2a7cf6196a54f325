package stockgate_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// dump reads every key of sku (limit keys included) as text, to show that a
// refused request wrote nothing.
func dump(t *testing.T, c rueidis.Client, g *stockgate.Gate, sku string) map[string]string {
	t.Helper()
	ctx := context.Background()
	k := g.KeysOf(sku)
	out := map[string]string{}
	for _, key := range []string{k.Meta, k.Buyers, k.Res, k.Idem} {
		m, err := c.Do(ctx, c.B().Hgetall().Key(key).Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		out[key] = fmt.Sprint(m)
	}
	ids, err := c.Do(ctx, c.B().Zrange().Key(k.Outbox).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	out[k.Outbox] = fmt.Sprint(ids)
	prefix := k.Meta[:len(k.Meta)-len("meta")]
	keys, err := c.Do(ctx, c.B().Keys().Pattern(prefix+"rl:*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	for _, key := range keys {
		v, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			t.Fatal(err)
		}
		out[key] = v
	}
	return out
}

func limitedFor(t *testing.T, err error) *stockgate.LimitedError {
	t.Helper()
	var le *stockgate.LimitedError
	if !errors.As(err, &le) || !errors.Is(err, sale.ErrRateLimited) {
		t.Fatalf("got %v, want a rate limit", err)
	}
	var re *sale.RateLimitError
	if !errors.As(err, &re) || re.RetryAfter <= 0 {
		t.Fatalf("%v: no *sale.RateLimitError with a positive RetryAfter", err)
	}
	return le
}

func TestReserveLimitedPerUser(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 100, 100)
	l := stockgate.Limits{User: stockgate.Rate{PerSecond: 5, Burst: 3}}
	for i := 0; i < 3; i++ {
		if _, err := g.ReserveLimited(ctx, res("s", "u", 1), l); err != nil {
			t.Fatalf("request %d within the burst: %v", i, err)
		}
	}
	before := dump(t, c, g, "s")
	_, err := g.ReserveLimited(ctx, res("s", "u", 1), l)
	le := limitedFor(t, err)
	if le.User <= 0 || le.User > 200*time.Millisecond || le.SKU != 0 || le.IP != 0 {
		t.Fatalf("waits %+v, want only the user's, at most one interval (200ms)", le)
	}
	if after := dump(t, c, g, "s"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a limited request wrote:\nbefore %v\nafter  %v", before, after)
	}
	// Another user is not limited; the limited one is again after the wait.
	if _, err := g.ReserveLimited(ctx, res("s", "v", 1), l); err != nil {
		t.Fatal(err)
	}
	time.Sleep(le.User + 10*time.Millisecond)
	if _, err := g.ReserveLimited(ctx, res("s", "u", 1), l); err != nil {
		t.Fatalf("after waiting %v: %v", le.User, err)
	}
	if got := avail(t, g, "s"); got != 95 {
		t.Fatalf("available %d, want 95", got)
	}
}

func TestReserveLimitedPerIPAndSKU(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 100, 1)

	ipl := stockgate.Limits{IP: stockgate.Rate{PerSecond: 1, Burst: 2}, IPKey: "203.0.113.7"}
	for _, u := range []string{"a", "b"} {
		if _, err := g.ReserveLimited(ctx, res("s", u, 1), ipl); err != nil {
			t.Fatal(err)
		}
	}
	if le := limitedFor(t, func() error { _, err := g.ReserveLimited(ctx, res("s", "c", 1), ipl); return err }()); le.IP <= 0 {
		t.Fatalf("waits %+v, want the IP's", le)
	}
	other := ipl
	other.IPKey = "2001:db8::/64"
	if _, err := g.ReserveLimited(ctx, res("s", "c", 1), other); err != nil {
		t.Fatalf("another IP: %v", err)
	}
	noIP := ipl
	noIP.IPKey = ""
	if _, err := g.ReserveLimited(ctx, res("s", "d", 1), noIP); err != nil {
		t.Fatalf("no IP key skips the IP limit: %v", err)
	}

	skul := stockgate.Limits{SKU: stockgate.Rate{PerSecond: 1, Burst: 1}}
	if _, err := g.ReserveLimited(ctx, res("s", "e", 1), skul); err != nil {
		t.Fatal(err)
	}
	le := limitedFor(t, func() error { _, err := g.ReserveLimited(ctx, res("s", "f", 1), skul); return err }())
	if le.SKU <= 500*time.Millisecond || le.SKU > time.Second {
		t.Fatalf("waits %+v, want the SKU's, about 1s", le)
	}
	var re *sale.RateLimitError
	if !errors.As(error(le), &re) || re.Scope != "sku" {
		t.Fatalf("scope %q, want sku", re.Scope)
	}
}

// Refused purchases count against the limits (a buyer who keeps clicking at
// limit_reached is limited); a repeat of an order id does not.
func TestReserveLimitedCounting(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 10, 1)
	l := stockgate.Limits{User: stockgate.Rate{PerSecond: 1, Burst: 3}}
	first := res("s", "u", 1)
	if _, err := g.ReserveLimited(ctx, first, l); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ { // the caller's retries of one call: free
		if r, err := g.ReserveLimited(ctx, first, l); err != nil || !r.Duplicate {
			t.Fatalf("repeat %d: %+v %v", i, r, err)
		}
	}
	for i := 0; i < 2; i++ {
		if _, err := g.ReserveLimited(ctx, res("s", "u", 1), l); !errors.Is(err, sale.ErrLimitReached) {
			t.Fatalf("click %d: %v, want limit reached", i, err)
		}
	}
	limitedFor(t, func() error { _, err := g.ReserveLimited(ctx, res("s", "u", 1), l); return err }())

	// The limit key expires once its bucket is full again.
	key := g.KeysOf("s").Meta[:len(g.KeysOf("s").Meta)-len("meta")] + "rl:u:u"
	pttl, err := c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil || pttl <= 0 || pttl > 3001 {
		t.Fatalf("PTTL %s = %d %v, want 1..3001 ms", key, pttl, err)
	}
}

func TestReserveSoldOutAvailable(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "s", 1, 5)
	_, err := g.Reserve(ctx, res("s", "u", 2))
	var so *stockgate.SoldOutError
	if !errors.Is(err, sale.ErrSoldOut) || !errors.As(err, &so) || so.Available != 1 {
		t.Fatalf("got %v, want sold out with 1 available", err)
	}
}

// BenchmarkReserveLimited measures what the rate limits add to the gate:
// the same auto-pipelined load (64 concurrent callers, distinct users and
// IPs, limits that never refuse) with no limit, the user limit, and all three.
func BenchmarkReserveLimited(b *testing.B) {
	g, _ := newGate(b)
	ctx := context.Background()
	var n atomic.Int64
	loose := stockgate.Rate{PerSecond: 1e6, Burst: 1 << 30}
	for i, mode := range []struct {
		name string
		l    stockgate.Limits
	}{
		{"none", stockgate.Limits{}},
		{"user", stockgate.Limits{User: stockgate.Rate{PerSecond: 3, Burst: 5}}},
		{"sku+user+ip", stockgate.Limits{SKU: loose, User: stockgate.Rate{PerSecond: 3, Burst: 5}, IP: stockgate.Rate{PerSecond: 50, Burst: 100}}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			sku := fmt.Sprintf("benchl-%d", i)
			if _, err := g.Seed(ctx, sku, stockgate.Config{PerUserLimit: 1}, sale.MaxStock, nil, nil, nil, nil, "b"); err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					l := mode.l
					l.IPKey = fmt.Sprintf("10.%d.%d.%d", byte(i>>16), byte(i>>8), byte(i))
					r := sale.Reservation{OrderID: fmt.Sprintf("%08x-0000-7000-8000-%012x", i>>48, i), SKU: sku,
						User: fmt.Sprintf("u%d", i), Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
					if _, err := g.ReserveLimited(ctx, r, l); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reserves/s")
		})
	}
}

package httpapi

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// The handler benchmarks run one purchase through Server.ServeHTTP and the
// real purchase service (catalog, sale window, limits, sold-out flag,
// circuit breaker, metrics), with only the Redis gate and the relay
// replaced by fakes that answer at once: what is measured is the CPU this
// process spends on a purchase, not Redis's. docs/performance.md
// ("Handler benchmark") has the command and the figures.

// benchGate is a gate that admits every purchase of benchSKU with plenty
// left and finds benchSoldOut sold out.
type benchGate struct{}

const (
	benchSKU     = "phone-2026-flash"
	benchSoldOut = "phone-2026-gone"
)

var benchPayload = []byte(`{"order_id":"x"}`)

func (benchGate) ReserveLimited(ctx context.Context, r sale.Reservation, _ stockgate.Limits) (stockgate.ReserveResult, error) {
	// A Redis client waits for its reply or the context (rueidis selects
	// on ctx.Done()); the reply is here at once.
	select {
	case <-ctx.Done():
		return stockgate.ReserveResult{}, ctx.Err()
	default:
	}
	if r.SKU == benchSoldOut {
		return stockgate.ReserveResult{}, &stockgate.SoldOutError{Available: 0}
	}
	return stockgate.ReserveResult{OrderID: r.OrderID, Available: 1000, Payload: benchPayload}, nil
}

func (benchGate) Duplicate(ctx context.Context, _, _, _ string) (string, bool, error) {
	// The gate's look-up waits for its batch's reply or the context.
	select {
	case <-ctx.Done():
		return "", false, ctx.Err()
	default:
	}
	return "", false, nil
}

func (benchGate) Unsent(context.Context, string, string, string) ([]byte, string, error) {
	return nil, "", nil
}
func (benchGate) Lookup(context.Context, string, ...string) (sale.Reservation, bool, error) {
	return sale.Reservation{}, false, nil
}

func (benchGate) Available(context.Context, string) (int64, bool, error) { return 1000, true, nil }

// benchRelay drops what it is handed.
type benchRelay struct{}

func (benchRelay) Notify(context.Context, string, string, []byte) {}
func (benchRelay) Publish(ctx context.Context, _, _ string, _ []byte) error {
	// The relay waits for the stream's ack or the context; the ack is here.
	select {
	case <-ctx.Done():
		return ctx.Err()
	default:
		return nil
	}
}

// benchDirect is the database fallback; set so the circuit breaker runs
// as in production, never called (the fake gate does not fail).
type benchDirect struct{}

func (benchDirect) BuyDirect(context.Context, sale.Reservation, time.Time) (sale.Order, bool, error) {
	return sale.Order{}, false, sale.ErrUnavailable
}

type benchSKUs struct{}

func (benchSKUs) SKUs(context.Context) ([]sale.SKU, error) {
	return []sale.SKU{
		{ID: benchSKU, Stock: 1000, TotalStock: 1000, PerUserLimit: 5},
		{ID: benchSoldOut, Stock: 0, TotalStock: 1000, PerUserLimit: 5},
	}, nil
}

// benchServer is the API as serve builds it with the default settings
// (the instance limiter, the per-user rate limit, the sold-out flag, a
// purchase waiting for the stream's ack, metrics), tracing off.
func benchServer(b *testing.B) *Server {
	cat := purchase.NewCatalog(benchSKUs{})
	if err := cat.Refresh(context.Background()); err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	m := metrics.New()
	buy := purchase.New(purchase.Deps{
		Catalog: cat, Gate: benchGate{}, Relay: benchRelay{}, Direct: benchDirect{}, Log: log, Observer: m, Breaker: m,
		Limits:    purchase.Limits{User: stockgate.Rate{PerSecond: 2, Burst: 2}, SoldOutTTL: time.Hour},
		StreamAck: 250 * time.Millisecond,
	}, purchase.BreakerConfig{FallbackConcurrency: 8})
	return New(buy, nil, log, Config{
		Users:   NewUserAuth("bench-secret-of-reasonable-length"),
		Limiter: rate.NewLimiter(rate.Inf, 0),
		Observe: m.HTTP,
	})
}

// benchBody is a request body read again from the start on every request.
type benchBody struct{ bytes.Reader }

func (*benchBody) Close() error { return nil }

// benchWriter is a ResponseWriter that keeps the status and drops the body.
type benchWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) WriteHeader(code int)        { w.status = code }
func (w *benchWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// benchPurchase runs b.N purchases of sku by one user (a request as the
// net/http server hands it over: headers parsed, body unread), with an
// Idempotency-Key if key is set, and checks every answer is want.
func benchPurchase(b *testing.B, sku string, want int, key ...string) {
	s := benchServer(b)
	tok, err := Sign("bench-secret-of-reasonable-length", "user-12345", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"sku_id":"` + sku + `","quantity":1}`)
	body := &benchBody{}
	r, err := http.NewRequest(http.MethodPost, "/api/v1/orders", body)
	if err != nil {
		b.Fatal(err)
	}
	r.RemoteAddr = "192.0.2.10:51234"
	r.RequestURI = "/api/v1/orders"
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+tok)
	r.ContentLength = int64(len(payload))
	for _, k := range key {
		r.Header.Set("Idempotency-Key", k)
	}
	// The connection's context, cancelled when the client goes away, as
	// net/http gives each request.
	conn, cancel := context.WithCancel(context.Background())
	defer cancel()
	r = r.WithContext(conn)
	w := &benchWriter{h: http.Header{}}
	do := func() {
		body.Reset(payload)
		clear(w.h)
		w.status, w.n = 0, 0
		s.ServeHTTP(w, r)
		if w.status != want {
			b.Fatalf("status %d, want %d", w.status, want)
		}
	}
	// The first purchase of a sold-out SKU asks the gate and sets the flag;
	// the benchmark is of the answers from memory after it.
	do()
	b.ReportAllocs()
	for b.Loop() {
		do()
	}
}

// BenchmarkPurchase is one accepted purchase (202) through ServeHTTP:
// routing, token, body, the purchase service, the answer.
func BenchmarkPurchase(b *testing.B) { benchPurchase(b, benchSKU, http.StatusAccepted) }

// BenchmarkPurchaseSoldOut is one purchase of a SKU flagged sold out (409
// sold_out), answered from memory without a gate call.
func BenchmarkPurchaseSoldOut(b *testing.B) { benchPurchase(b, benchSoldOut, http.StatusConflict) }

// BenchmarkPurchaseSoldOutKeyed is the same with an Idempotency-Key: the
// flag answers after the gate's look-up of the key (a retry gets its order),
// which the fake gate answers at once (not found).
func BenchmarkPurchaseSoldOutKeyed(b *testing.B) {
	benchPurchase(b, benchSoldOut, http.StatusConflict, "bench-key-1")
}

// BenchmarkEmptyHandler is the floor the two above compare with: a handler
// that answers every request with a fixed 409 body, through the same
// request and writer.
func BenchmarkEmptyHandler(b *testing.B) {
	body := []byte(`{"error":{"code":"sold_out","message":"Fewer units are left than asked for."}}` + "\n")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write(body)
	})
	r, err := http.NewRequest(http.MethodPost, "/api/v1/orders", &benchBody{})
	if err != nil {
		b.Fatal(err)
	}
	w := &benchWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
	}
}

// BenchmarkPurchaseParallel is BenchmarkPurchase with every CPU busy.
func BenchmarkPurchaseParallel(b *testing.B) {
	s := benchServer(b)
	tok, err := Sign("bench-secret-of-reasonable-length", "user-12345", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"sku_id":"` + benchSKU + `","quantity":1}`)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		body := &benchBody{}
		r, _ := http.NewRequest(http.MethodPost, "/api/v1/orders", body)
		r.RemoteAddr = "192.0.2.10:51234"
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer "+tok)
		r.ContentLength = int64(len(payload))
		conn, cancel := context.WithCancel(context.Background())
		defer cancel()
		r = r.WithContext(conn)
		w := &benchWriter{h: http.Header{}}
		for pb.Next() {
			body.Reset(payload)
			clear(w.h)
			s.ServeHTTP(w, r)
			if w.status != http.StatusAccepted {
				b.Errorf("status %d", w.status)
				return
			}
		}
	})
}

var _ io.ReadCloser = (*benchBody)(nil)

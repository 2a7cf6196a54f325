package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// emptyReply is what the empty handler answers to everything: the shape
// of an accepted purchase, so the generator does the same work for it.
const emptyReply = `{"order_id":"00000000-0000-7000-8000-000000000000","status":"queued"}`

// StartEmptyServer serves, on a free loopback port, a handler that reads
// the body and answers 202 with a constant accepted purchase: the front-end
// limit of this machine under the same generator (HTTP, the server's
// connection handling, the client) with none of flashsale's work. It
// returns the base URL and a stop function.
func StartEmptyServer() (base string, stop func(), err error) {
	return StartEmptyServerAt("127.0.0.1:0")
}

// StartEmptyServerAt is StartEmptyServer on addr (host:port).
func StartEmptyServerAt(addr string) (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	body := []byte(emptyReply)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 8<<10))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write(body)
		}),
		// The service's server settings (cmd/flashsale serve).
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// GateBaseline measures the Redis gate alone: conc goroutines calling
// stockgate.Gate.Reserve (the reserve script, auto-pipelined by rueidis)
// for d (and, if limit > 0, at most limit reservations), each reservation
// a new user of a SKU that never sells out. It returns reservations per
// second. Keys go under prefix; the caller deletes them (DeleteKeys).
func GateBaseline(ctx context.Context, c rueidis.Client, prefix string, conc int, d time.Duration, limit int64) (float64, error) {
	g := stockgate.New(c, prefix)
	const sku = "gate-baseline"
	if _, err := g.Seed(ctx, sku, stockgate.Config{PerUserLimit: 1}, sale.MaxStock, nil, nil, nil, nil, "bench"); err != nil {
		return 0, err
	}
	var (
		n     atomic.Int64
		errMu sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := 0; w < conc; w++ {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := n.Add(1)
				if limit > 0 && i > limit {
					return
				}
				r := sale.Reservation{OrderID: fmt.Sprintf("%08x-0000-7000-8000-%012x", i>>48, i&0xffffffffffff), SKU: sku,
					User: "g" + strconv.FormatInt(i, 10), Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
				if _, err := g.Reserve(ctx, r); err != nil {
					errMu.Lock()
					first = errors.Join(first, err)
					errMu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return 0, fmt.Errorf("gate baseline: %w", first)
	}
	// Count only what was sent: a goroutine stopped by the deadline took no
	// number, one stopped by the limit took one past it.
	sent := n.Load()
	if limit > 0 {
		sent = min(sent, limit)
	}
	return float64(sent) / time.Since(start).Seconds(), ctx.Err()
}

// DeleteKeys deletes every Redis key under prefix + ":" (SCAN + UNLINK).
// On a Redis Cluster it scans every node the client knows (a keyless SCAN
// reaches one arbitrary node) and unlinks key by key through the cluster
// client, which sends each to its slot's primary.
func DeleteKeys(ctx context.Context, c rueidis.Client, prefix string) error {
	if c.Mode() != rueidis.ClientModeCluster {
		return deleteKeys(ctx, c, c, prefix)
	}
	for _, node := range c.Nodes() {
		if err := deleteKeys(ctx, node, c, prefix); err != nil {
			return err
		}
	}
	return nil
}

// deleteKeys scans node and unlinks what it finds through c.
func deleteKeys(ctx context.Context, node, c rueidis.Client, prefix string) error {
	match := globEscape(prefix) + ":*"
	var cursor uint64
	for {
		e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(match).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return err
		}
		if len(e.Elements) > 0 {
			if c.Mode() == rueidis.ClientModeCluster {
				// One slot per command: keys of several slots in one UNLINK
				// are refused (CROSSSLOT).
				cmds := make(rueidis.Commands, len(e.Elements))
				for i, k := range e.Elements {
					cmds[i] = c.B().Unlink().Key(k).Build()
				}
				for _, r := range c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						return err
					}
				}
			} else if err := c.Do(ctx, c.B().Unlink().Key(e.Elements...).Build()).Error(); err != nil {
				return err
			}
		}
		if e.Cursor == 0 {
			return nil
		}
		cursor = e.Cursor
	}
}

func globEscape(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\', '^':
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(out)
}

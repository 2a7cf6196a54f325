package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/flashsale/flashsale/internal/loadgen"
)

// WorkerBanner starts the line ServeWorker prints once it listens, followed
// by its URL.
const WorkerBanner = "flashsale bench worker listening on "

// ServeWorker runs a load worker on addr until ctx ends (flashsale bench
// -worker): it waits for a coordinator (flashsale bench -workers) and runs
// the parts it is sent, one at a time. token is the bearer token every
// request must carry.
func ServeWorker(ctx context.Context, addr, token string, stdout, stderr io.Writer) error {
	if len(token) < 16 {
		return errors.New("bench: -worker needs -worker-token of at least 16 characters: anyone who can reach the worker and has it can send load from it")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("bench: -worker: %w", err)
	}
	wk := &loadgen.Worker{Token: token, Logf: func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s worker: %s\n", time.Now().Format(time.TimeOnly), fmt.Sprintf(format, args...))
	}}
	srv := &http.Server{Handler: wk.Handler(), ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintln(stdout, WorkerBanner+"http://"+ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err = <-errc:
		return fmt.Errorf("bench: -worker: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

package orderqueue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// TestAnsweredAsksAgain: a set-up request the broker leaves unanswered
// (CI saw a clustered broker drop the dead-letter stream's creation, and
// the instance waited out its whole start-up) is sent again once its
// attempt's bound passes, while the caller's context lasts; an answer, or
// an error other than the attempt's deadline, is returned as it is; once
// the caller's context ends, its error is returned, not another attempt.
func TestAnsweredAsksAgain(t *testing.T) {
	defer func(d time.Duration) { apiAttempt = d }(apiAttempt)
	apiAttempt = 50 * time.Millisecond
	ctx := context.Background()

	calls := 0
	v, err := answered(ctx, func(ctx context.Context) (string, error) {
		if calls++; calls < 3 {
			<-ctx.Done() // dropped: no answer until the attempt's bound
			return "", ctx.Err()
		}
		return "created", nil
	})
	if err != nil || v != "created" || calls != 3 {
		t.Fatalf("after two unanswered attempts: %q %v in %d calls, want created in 3", v, err, calls)
	}

	refused := errors.New("stream name already in use with a different configuration")
	calls = 0
	if _, err := answered(ctx, func(context.Context) (string, error) { calls++; return "", refused }); !errors.Is(err, refused) || calls != 1 {
		t.Fatalf("a refusal: %v in %d calls, want it returned at once", err, calls)
	}

	short, cancel := context.WithTimeout(ctx, 120*time.Millisecond)
	defer cancel()
	calls = 0
	_, err = answered(short, func(ctx context.Context) (string, error) { calls++; <-ctx.Done(); return "", ctx.Err() })
	if !errors.Is(err, context.DeadlineExceeded) || short.Err() == nil {
		t.Fatalf("never answered: %v after %d calls, want the caller's deadline", err, calls)
	}
}

// TestUntilPlacedAsksAgain: a stream's creation that the cluster refuses
// for want of servers to place it on (JSClusterNoPeersErrF, "no suitable
// peers for placement, peer offline": CI saw an instance exit at start on
// it, seconds after every node of a new cluster answered /healthz) is asked
// again until it succeeds, for up to its bound; any other error, and the
// caller's context ending, end it at once.
func TestUntilPlacedAsksAgain(t *testing.T) {
	if errNoPeers != jetstream.ErrorCode(server.JSClusterNoPeersErrF) {
		t.Fatalf("errNoPeers %d, the broker's JSClusterNoPeersErrF is %d", errNoPeers, server.JSClusterNoPeersErrF)
	}
	ctx := context.Background()
	noPeers := &jetstream.APIError{Code: 400, ErrorCode: errNoPeers, Description: "no suitable peers for placement, peer offline"}

	calls := 0
	v, err := untilPlaced(ctx, 10*time.Second, func(context.Context) (string, error) {
		if calls++; calls < 3 {
			return "", fmt.Errorf("orderqueue: %w", noPeers)
		}
		return "created", nil
	})
	if err != nil || v != "created" || calls != 3 {
		t.Fatalf("after two refusals for want of peers: %q %v in %d calls, want created in 3", v, err, calls)
	}

	for _, other := range []*jetstream.APIError{
		{Code: 400, ErrorCode: 10058, Description: "stream name already in use with a different configuration"},
		// The same code for a stream the cluster can never place.
		{Code: 400, ErrorCode: errNoPeers, Description: "no suitable peers for placement, insufficient resources"},
	} {
		calls = 0
		if _, err := untilPlaced(ctx, 10*time.Second, func(context.Context) (string, error) { calls++; return "", other }); !errors.Is(err, other) || calls != 1 {
			t.Fatalf("%v: %v in %d calls, want it returned at once", other, err, calls)
		}
	}

	calls = 0
	start := time.Now()
	_, err = untilPlaced(ctx, 600*time.Millisecond, func(context.Context) (string, error) { calls++; return "", noPeers })
	if took := time.Since(start); !errors.Is(err, noPeers) || took < 600*time.Millisecond || took > 5*time.Second || calls < 2 || calls > 600/250+2 {
		t.Fatalf("never placed: %v after %d calls in %v, want the refusal after the 600 ms bound, asked every 250 ms", err, calls, took)
	}

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := untilPlaced(short, time.Minute, func(context.Context) (string, error) { return "", noPeers }); !errors.Is(err, noPeers) || time.Since(start) > 5*time.Second {
		t.Fatalf("the caller's context ended: %v after %v, want the refusal at once", err, time.Since(start))
	}
}

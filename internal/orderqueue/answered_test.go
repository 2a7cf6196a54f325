package orderqueue

import (
	"context"
	"errors"
	"testing"
	"time"
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

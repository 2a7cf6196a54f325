package stockgate

import (
	"context"
	"errors"
	"time"

	"github.com/redis/rueidis"
)

// A Redis Cluster slot being moved (a reshard: stockgate.Move, redis-cli
// --cluster reshard) answers a script whose keys are split between the
// two nodes TRYAGAIN: the script did not run. rueidis follows the move's
// ASK and MOVED redirections itself but does not retry a TRYAGAIN of a
// write (a script is one), so the gate does, for up to a second within
// the caller's deadline: a bucket's few keys move in milliseconds. A move that takes
// longer surfaces as an error wrapping the TRYAGAIN (IsTryAgain), which the
// purchase answers 503 unavailable, "retry shortly".
const (
	tryAgainFirst = 2 * time.Millisecond
	tryAgainMax   = 50 * time.Millisecond
)

// tryAgainFor is how long at most, within the caller's deadline: a second
// (a variable for a test that must not depend on how fast a loaded
// machine completes a move by hand).
var tryAgainFor = time.Second

// tryAgainClient is a rueidis.Client that retries a command answered
// TRYAGAIN (see above). Every other answer, and every other method, is the
// wrapped client's. Only a cluster's client is wrapped: a retried command
// is pinned (not recycled by rueidis), an allocation a single server,
// which never answers TRYAGAIN, does not pay.
type tryAgainClient struct{ rueidis.Client }

// IsTryAgain reports whether err is Redis Cluster's TRYAGAIN. It is asked
// of every gate call's outcome (the breaker's IsExcluded), nil included:
// errors.AsType, not errors.As, whose target escaped to the heap on every
// call.
func IsTryAgain(err error) bool {
	re, ok := errors.AsType[*rueidis.RedisError](err)
	return ok && re.IsTryAgain()
}

func (c tryAgainClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	r := c.Client.Do(ctx, cmd.Pin())
	if !IsTryAgain(r.Error()) {
		return r
	}
	end := time.Now().Add(tryAgainFor)
	for wait := tryAgainFirst; IsTryAgain(r.Error()); {
		if time.Now().Add(wait).After(end) || !waitCtx(ctx, wait) {
			break
		}
		wait = min(2*wait, tryAgainMax)
		r = c.Client.Do(ctx, cmd.Pin())
	}
	return r
}

func (c tryAgainClient) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	for i := range multi {
		multi[i] = multi[i].Pin()
	}
	rs := c.Client.DoMulti(ctx, multi...)
	for i, r := range rs {
		if IsTryAgain(r.Error()) {
			// Not run: run it alone, with the retries of Do.
			rs[i] = c.Do(ctx, multi[i])
		}
	}
	return rs
}

// waitCtx waits d, or less when ctx ends first (then it returns false).
func waitCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

package sale

import (
	"errors"
	"fmt"
	"time"
)

// ErrRateLimited is returned when a request exceeds a rate limit (of the
// instance, or the distributed ones per SKU, user or client IP). Nothing was
// reserved; the caller may retry after the RateLimitError's RetryAfter.
var ErrRateLimited = errors.New("rate limited")

// RateLimitError is ErrRateLimited with the limit that refused and when a
// retry can pass it.
type RateLimitError struct {
	// Scope names the limit: "instance", "sku", "user" or "ip".
	Scope string
	// RetryAfter is how long until the limit admits a request again.
	RetryAfter time.Duration
}

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("too many requests (%s limit): retry in %v", e.Scope, e.RetryAfter.Round(time.Millisecond))
}

// Unwrap makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitError) Unwrap() error { return ErrRateLimited }

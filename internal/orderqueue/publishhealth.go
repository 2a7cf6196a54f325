package orderqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PublishFailuresFailing is how many publish rounds in a row must fail
// (every message of each, none acknowledged since) before the stream's
// publishing reads as failing.
const PublishFailuresFailing = 3

// PublishHealth is what the last publishes to the order stream found.
type PublishHealth struct {
	Failing  bool      // PublishFailuresFailing rounds or more failed in a row
	Failures int       // rounds failed in a row
	Since    time.Time // the first of them (zero: the last round succeeded)
	Err      error     // the last round's first error
	Total    uint64    // rounds failed since the start
}

// pubHealth tracks Publish's outcomes for PublishHealth.
type pubHealth struct {
	mu sync.Mutex
	h  PublishHealth
}

// record notes one publish round: any acknowledged message resets the
// count; a round whose every message failed adds one. A round cut short by
// its caller's cancellation (a shutdown) counts for nothing.
func (p *pubHealth) record(errs []error) {
	var first error
	for _, err := range errs {
		if err == nil {
			p.mu.Lock()
			total := p.h.Total
			p.h = PublishHealth{Total: total}
			p.mu.Unlock()
			return
		}
		if first == nil && !errors.Is(err, context.Canceled) {
			first = err
		}
	}
	if first == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h.Failures == 0 {
		p.h.Since = time.Now()
	}
	p.h.Failures++
	p.h.Total++
	p.h.Err = first
	p.h.Failing = p.h.Failures >= PublishFailuresFailing
}

// PublishHealth reports the order stream's recent publishes: failing once
// PublishFailuresFailing rounds in a row had no message acknowledged (a
// broker that answers pings but cannot store: a full disk, a stream without
// a leader). Accepted purchases wait in the Redis outbox meanwhile.
func (q *Queue) PublishHealth() PublishHealth {
	q.pub.mu.Lock()
	defer q.pub.mu.Unlock()
	return q.pub.h
}

// PublishCheck is PublishHealth as a readiness check: nil unless failing.
func (q *Queue) PublishCheck(context.Context) error {
	h := q.PublishHealth()
	if !h.Failing {
		return nil
	}
	return fmt.Errorf("orderqueue: %d publish rounds in a row failed since %s: %w", h.Failures, h.Since.Format(time.RFC3339), h.Err)
}

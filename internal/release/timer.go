package release

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/sale"
)

// Timer is the delayed trigger of the payment timeout. It reads the order
// stream with its own durable consumer and holds each reservation back
// (a nak with the delay left) until its deadline, then asks the database to
// expire the order. This works on any JetStream server version (message
// schedules need 2.12+); the sweeper is the safety net either way.
type Timer struct {
	svc     *Service
	store   Store
	timeout time.Duration
	now     func() time.Time
}

// NewTimer returns a timer expiring orders timeout after acceptance.
func NewTimer(svc *Service, timeout time.Duration) *Timer {
	return &Timer{svc: svc, store: svc.store, timeout: timeout, now: time.Now}
}

// Handle decides one message: too early -> nak with the delay left; due ->
// expire (a no-op for paid, cancelled or failed orders) -> ack; the order
// not in the database yet -> look again shortly.
func (t *Timer) Handle(ctx context.Context, m jetstream.Msg) {
	var r sale.Reservation
	if err := json.Unmarshal(m.Data(), &r); err != nil || r.Validate() != nil {
		_ = m.Term()
		return
	}
	now := t.now()
	due := time.UnixMilli(r.AcceptedAt).Add(t.timeout)
	if wait := due.Sub(now); wait > 0 {
		_ = m.NakWithDelay(wait + 50*time.Millisecond)
		return
	}
	_, released, err := t.store.Expire(ctx, r.OrderID, now)
	switch {
	case errors.Is(err, sale.ErrOrderNotFound):
		if now.Sub(due) < time.Hour {
			_ = m.NakWithDelay(2 * time.Second)
			return
		}
		// Never applied (dead-lettered, then discarded): nothing to expire.
	case err != nil:
		_ = m.NakWithDelay(2 * time.Second)
		return
	case released:
		t.svc.Kick()
	}
	_ = m.Ack()
}

// Run consumes until ctx ends.
func (t *Timer) Run(ctx context.Context, cons jetstream.Consumer) {
	for ctx.Err() == nil {
		it, err := cons.Messages(jetstream.PullMaxMessages(500), jetstream.PullExpiry(5*time.Second)) // see apply's pullExpiry
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		stop := context.AfterFunc(ctx, it.Stop)
		for {
			m, err := it.Next()
			if err != nil {
				break
			}
			t.Handle(ctx, m)
		}
		stop()
		it.Stop()
		select { // the iterator ended (broker gone?): do not spin
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

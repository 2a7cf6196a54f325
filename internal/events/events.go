// Package events publishes order events (order.created, order.paid,
// order.cancelled, order.failed) to JetStream after the database commit,
// exactly once per transition: each transition is written to
// order_transitions (the outbox) in the transaction that makes it, and is
// marked published only once the stream acknowledged it, under the same
// Msg-Id on every attempt.
//
// A batch's rows stay locked (FOR UPDATE SKIP LOCKED, so that two instances
// do not publish the same rows) while the stream takes it, so that step runs
// under a deadline (PublishTimeout): a hung or absent broker holds one
// database transaction for at most that long, then it rolls back and the
// rows are tried again on the next pass.
package events

import (
	"context"
	"log/slog"
	"time"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
)

// Store is the outbox of transitions.
type Store interface {
	PublishTransitions(ctx context.Context, limit int, publish func([]orderstore.Transition) error) (int, error)
}

// Stream takes the events.
type Stream interface {
	PublishEvents(ctx context.Context, evs []orderqueue.Event) error
}

// PublishTimeout bounds one batch: claiming its rows, publishing them and
// marking them published, so the transaction holding the rows lasts at
// most this long whatever the broker does.
const PublishTimeout = 5 * time.Second

// Publisher drains the outbox into the event stream.
type Publisher struct {
	store   Store
	stream  Stream
	log     *slog.Logger
	timeout time.Duration
}

// New returns a Publisher.
func New(store Store, stream Stream, log *slog.Logger) *Publisher {
	return &Publisher{store: store, stream: stream, log: log, timeout: PublishTimeout}
}

// WithTimeout returns p with batches bounded by d instead of PublishTimeout.
func (p *Publisher) WithTimeout(d time.Duration) *Publisher {
	p.timeout = d
	return p
}

// body is an event's JSON.
type body struct {
	Type string `json:"type"`
	orderstore.Transition
}

// RunOnce publishes every pending transition and returns how many. Each
// batch runs under the publisher's timeout; a batch that times out is
// rolled back (not marked) and RunOnce returns its error.
func (p *Publisher) RunOnce(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := p.batch(ctx)
		total += n
		if err != nil || n < 500 {
			return total, err
		}
	}
}

func (p *Publisher) batch(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	return p.store.PublishTransitions(ctx, 500, func(ts []orderstore.Transition) error {
		evs := make([]orderqueue.Event, 0, len(ts))
		for _, t := range ts {
			typ := orderqueue.EventType(t.To)
			if typ == "" {
				continue
			}
			evs = append(evs, orderqueue.Event{ID: t.ID, Type: typ, Body: body{Type: "order." + typ, Transition: t}})
		}
		if err := p.stream.PublishEvents(ctx, evs); err != nil {
			return err
		}
		failpoint.Inject(failpoint.EventsAfterPublishBeforeMark)
		return nil
	})
}

// Run publishes every period until ctx ends.
func (p *Publisher) Run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := p.RunOnce(ctx); err != nil && ctx.Err() == nil {
				p.log.Warn("events: publishing order events", "err", err)
			}
		}
	}
}

// Package events publishes order events (order.created, order.paid,
// order.cancelled, order.failed) to JetStream after the database commit,
// exactly once per transition: each transition is written to
// order_transitions (the outbox) in the transaction that makes it, and is
// marked published only once the stream acknowledged it, under the same
// Msg-Id on every attempt.
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

// Publisher drains the outbox into the event stream.
type Publisher struct {
	store  Store
	stream Stream
	log    *slog.Logger
}

// New returns a Publisher.
func New(store Store, stream Stream, log *slog.Logger) *Publisher {
	return &Publisher{store: store, stream: stream, log: log}
}

// body is an event's JSON.
type body struct {
	Type string `json:"type"`
	orderstore.Transition
}

// RunOnce publishes every pending transition and returns how many.
func (p *Publisher) RunOnce(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := p.store.PublishTransitions(ctx, 500, func(ts []orderstore.Transition) error {
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
		total += n
		if err != nil || n < 500 {
			return total, err
		}
	}
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

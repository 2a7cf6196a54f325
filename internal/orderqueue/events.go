package orderqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Order events for downstream systems. Subjects are a contract:
//
//	flashsale.events.order.created    the order is in the database (pending_payment)
//	flashsale.events.order.paid
//	flashsale.events.order.cancelled  by its user or the payment timeout (cause says which)
//	flashsale.events.order.failed     the database refused the reservation
//
// The message id (Nats-Msg-Id) is "evt-<event_id>": consumers de-duplicate by
// event_id (the broker does within its duplicate window).
const (
	EventStream        = "FLASHSALE_EVENTS"
	EventSubjectPrefix = "flashsale.events.order."
)

// EventType maps an order status to its event name ("" if none).
func EventType(status string) string {
	switch status {
	case "pending_payment":
		return "created"
	case "paid", "cancelled", "failed":
		return status
	}
	return ""
}

// EnsureEventStream creates or updates the event stream.
func (q *Queue) EnsureEventStream(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	q.mu.Lock()
	q.eventCfg = &cfg
	q.mu.Unlock()
	r, err := q.replicas(ctx, EventStream, cfg.Replicas)
	if err != nil {
		return err
	}
	_, err = q.createStream(ctx, jetstream.StreamConfig{
		Name:       EventStream,
		Subjects:   []string{EventSubjectPrefix + "*"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     cfg.MaxAge,
		Duplicates: cfg.DuplicateWindow,
		Replicas:   r,
	})
	if err != nil {
		return fmt.Errorf("orderqueue: event stream: %w", err)
	}
	return nil
}

// Event is one message for the event stream.
type Event struct {
	ID   int64
	Type string // created, paid, cancelled, failed
	Body any    // marshalled as JSON, with "type" added by the caller
}

// PublishEvents publishes events and waits for every acknowledgement; it
// fails if any was not stored.
func (q *Queue) PublishEvents(ctx context.Context, evs []Event) error {
	futs := make([]jetstream.PubAckFuture, 0, len(evs))
	for _, e := range evs {
		data, err := json.Marshal(e.Body)
		if err != nil {
			return err
		}
		msg := &nats.Msg{Subject: EventSubjectPrefix + e.Type, Data: data}
		setSchema(msg, "")
		f, err := q.js.PublishMsgAsync(msg,
			jetstream.WithMsgID("evt-"+strconv.FormatInt(e.ID, 10)), jetstream.WithExpectStream(EventStream))
		if err != nil {
			return err
		}
		futs = append(futs, f)
	}
	var errs []error
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs = append(errs, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

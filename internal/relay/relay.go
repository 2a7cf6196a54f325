// Package relay moves accepted reservations from the gate's Redis outbox to
// the JetStream stream. An outbox entry is removed only after the stream has
// acknowledged it, so a reservation survives a crash of this process and an
// outage of the broker; it may be published more than once (the broker's
// Msg-Id window and the database's idempotency log absorb that).
//
// Two paths feed the stream: a fast path, handed each reservation right after
// the gate accepted it, and a sweeper that publishes whatever the outbox still
// holds after a grace period (crash recovery, broker outages, other instances'
// leftovers).
package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/tracing"
)

// Outbox is the gate's side of the relay.
type Outbox interface {
	SKUs(ctx context.Context) ([]string, error)
	Outbox(ctx context.Context, sku string, before time.Time, limit int) ([]stockgate.Pending, error)
	Unqueue(ctx context.Context, sku string, ids ...string) error
}

// Publisher is the stream's side of the relay.
type Publisher interface {
	Publish(ctx context.Context, msgs []orderqueue.Message) []error
}

// Config tunes the relay. Zero values take the defaults.
type Config struct {
	// Batch is the most messages published at once (default 512).
	Batch int
	// Grace is how old an outbox entry must be before the sweeper takes it,
	// leaving the fast path time to do its job (default 2s).
	Grace time.Duration
	// SweepEvery is the sweeper's period (default 1s).
	SweepEvery time.Duration
	// Timeout bounds one publish round (default 10s).
	Timeout time.Duration
	// Tracer, if set, traces each fast-path publish (span relay.publish, a
	// child of the purchase's) and carries its trace context in the message.
	Tracer *tracing.Tracer
}

func (c Config) withDefaults() Config {
	if c.Batch == 0 {
		c.Batch = 512
	}
	if c.Grace == 0 {
		c.Grace = 2 * time.Second
	}
	if c.SweepEvery == 0 {
		c.SweepEvery = time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	return c
}

// Relay publishes outbox entries. Create it with New, start it with Run.
type Relay struct {
	box  Outbox
	pub  Publisher
	log  *slog.Logger
	cfg  Config
	fast chan item
}

// item is one reservation on the fast path; done, if set, receives the
// stream's verdict; span ends with it.
type item struct {
	msg  orderqueue.Message
	done chan error
	span trace.Span
}

// New returns a relay from box to pub.
func New(box Outbox, pub Publisher, log *slog.Logger, cfg Config) *Relay {
	cfg = cfg.withDefaults()
	return &Relay{box: box, pub: pub, log: log, cfg: cfg, fast: make(chan item, 4*cfg.Batch)}
}

// Notify hands a just-accepted reservation to the fast path. It never blocks:
// when the fast path is full the sweeper publishes the entry later. ctx
// carries only the purchase's trace.
func (r *Relay) Notify(ctx context.Context, sku, orderID string, payload []byte) {
	it := r.item(ctx, sku, orderID, payload, nil)
	select {
	case r.fast <- it:
	default:
		it.span.End() // the sweeper publishes it, untraced
	}
}

// item makes the fast-path item of a reservation, with its publish span.
func (r *Relay) item(ctx context.Context, sku, orderID string, payload []byte, done chan error) item {
	ctx, span := r.cfg.Tracer.Start(ctx, "relay.publish", trace.SpanKindProducer)
	it := item{msg: orderqueue.Message{ID: orderID, SKU: sku, Data: payload}, done: done, span: span}
	if span.IsRecording() {
		span.SetAttributes(attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", orderqueue.SubjectPrefix+sku),
			attribute.String("messaging.message.id", orderID))
		it.msg.Trace = r.cfg.Tracer.Inject(ctx)
	}
	return it
}

// ErrStreamFailing is Publish's answer, at once, while the stream
// acknowledges no publish (orderqueue.Queue.PublishHealth): the
// reservation is handed to the fast path all the same, but nobody waits
// for an ack that will not come.
var ErrStreamFailing = errors.New("relay: the stream acknowledges no publish; the outbox holds the reservation")

// publishHealth is what a Publisher may report of its recent publishes
// (orderqueue.Queue does).
type publishHealth interface {
	PublishHealth() orderqueue.PublishHealth
}

// Publish hands a just-accepted reservation to the fast path and waits until
// the stream has acknowledged it, or ctx ends. An error means only that it
// is not yet known to be in the stream: it stays in the outbox and the
// sweeper publishes it. While the publisher reads as failing it does not
// wait (ErrStreamFailing).
func (r *Relay) Publish(ctx context.Context, sku, orderID string, payload []byte) error {
	if ph, ok := r.pub.(publishHealth); ok && ph.PublishHealth().Failing {
		r.Notify(ctx, sku, orderID, payload)
		return ErrStreamFailing
	}
	done := make(chan error, 1)
	it := r.item(ctx, sku, orderID, payload, done)
	select {
	case r.fast <- it:
	case <-ctx.Done():
		it.span.End()
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run publishes until ctx is done.
func (r *Relay) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.runFast(ctx)
	}()
	t := time.NewTicker(r.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			<-done
			return
		case now := <-t.C:
			if _, err := r.SweepOnce(ctx, now); err != nil && ctx.Err() == nil {
				r.log.Warn("relay sweep", "err", err)
			}
		}
	}
}

func (r *Relay) runFast(ctx context.Context) {
	batch := make([]item, 0, r.cfg.Batch)
	msgs := make([]orderqueue.Message, 0, r.cfg.Batch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case it := <-r.fast:
			batch = append(batch, it)
		}
	fill:
		for len(batch) < r.cfg.Batch {
			select {
			case it := <-r.fast:
				batch = append(batch, it)
			default:
				break fill
			}
		}
		msgs = msgs[:0]
		for _, it := range batch {
			msgs = append(msgs, it.msg)
		}
		errs := r.send(ctx, msgs)
		// The buyers wait for the stream's ack only: they hear it before
		// the outbox entries go (an entry left by a failed unqueue is
		// published again by the sweeper, de-duplicated).
		for i, it := range batch {
			if it.done != nil {
				it.done <- errs[i]
			}
			tracing.Fail(it.span, errs[i])
			it.span.End()
		}
		r.unqueue(ctx, msgs, errs)
	}
}

// SweepOnce publishes every outbox entry accepted before now minus the grace
// period, on every SKU, and returns how many reached the stream.
func (r *Relay) SweepOnce(ctx context.Context, now time.Time) (int, error) {
	skus, err := r.box.SKUs(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, sku := range skus {
		for {
			pend, err := r.box.Outbox(ctx, sku, now.Add(-r.cfg.Grace), r.cfg.Batch)
			if err != nil {
				return total, err
			}
			if len(pend) == 0 {
				break
			}
			msgs := make([]orderqueue.Message, 0, len(pend))
			var closed []string
			for _, p := range pend {
				if p.Payload == nil {
					closed = append(closed, p.OrderID)
					continue
				}
				msgs = append(msgs, orderqueue.Message{ID: p.OrderID, SKU: sku, Data: p.Payload})
			}
			if len(closed) > 0 {
				if err := r.box.Unqueue(ctx, sku, closed...); err != nil {
					return total, err
				}
			}
			n := r.publish(ctx, msgs)
			total += n
			if n < len(msgs) || len(pend) < r.cfg.Batch {
				break
			}
		}
	}
	return total, nil
}

// publish sends msgs and removes the acknowledged ones from the outbox.
// It returns how many were acknowledged.
func (r *Relay) publish(ctx context.Context, msgs []orderqueue.Message) int {
	n := 0
	for _, err := range r.publishErrs(ctx, msgs) {
		if err == nil {
			n++
		}
	}
	return n
}

// publishErrs sends msgs, removes the acknowledged ones from the outbox and
// returns one error per message (nil: in the stream).
func (r *Relay) publishErrs(ctx context.Context, msgs []orderqueue.Message) []error {
	errs := r.send(ctx, msgs)
	r.unqueue(ctx, msgs, errs)
	return errs
}

// send publishes msgs (all at once, then one wait for their acks) and
// returns one error per message (nil: in the stream).
func (r *Relay) send(ctx context.Context, msgs []orderqueue.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	failpoint.Inject(failpoint.AfterGateBeforeRelay)
	pctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	return r.pub.Publish(pctx, msgs)
}

// unqueue removes from the outbox the messages the stream acknowledged
// (errs[i] == nil).
func (r *Relay) unqueue(ctx context.Context, msgs []orderqueue.Message, errs []error) {
	acked := map[string][]string{}
	n := 0
	for i, err := range errs {
		if err != nil {
			r.log.Debug("relay publish", "order_id", msgs[i].ID, "err", err)
			continue
		}
		acked[msgs[i].SKU] = append(acked[msgs[i].SKU], msgs[i].ID)
		n++
	}
	// One script call per SKU of the batch, all at once (the client
	// pipelines concurrent calls on its connection).
	var wg sync.WaitGroup
	for sku, ids := range acked {
		wg.Go(func() {
			if err := r.box.Unqueue(ctx, sku, ids...); err != nil {
				// The entries stay; the sweeper publishes them again (de-duplicated).
				r.log.Warn("relay unqueue", "sku_id", sku, "err", err)
			}
		})
	}
	wg.Wait()
	if n < len(msgs) {
		r.log.Warn("relay: stream did not acknowledge", "failed", len(msgs)-n, "of", len(msgs))
	}
}

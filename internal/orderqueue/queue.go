// Package orderqueue is the durable queue between the gate and the database:
// a NATS JetStream stream of reservations (message id = order id, so a
// re-publish inside the duplicate window is dropped by the broker) and the
// durable pull consumer the appliers share.
package orderqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/sale"
)

// Names used on the broker. They are part of the operations contract.
const (
	StreamName    = "FLASHSALE_ORDERS"
	SubjectPrefix = "flashsale.orders."
	ConsumerName  = "flashsale-apply"
	// ExpiryConsumerName is the retired durable consumer that timed payment
	// deadlines (the database sweeper does it now). Open deletes it: a
	// durable consumer left on the stream would hold retention below its
	// ack floor for ever.
	ExpiryConsumerName = "flashsale-expire"
	// DeadLetterStream keeps reservations the consumer gave up on, until an
	// operator replays or discards them. Nothing expires from it.
	DeadLetterStream = "FLASHSALE_DLQ"
	DeadLetterPrefix = "flashsale.dlq."
)

// Config tunes the stream and the consumer. Zero values take the defaults.
type Config struct {
	// MaxAge is how long acknowledged messages are kept for replay and audit
	// (default 72h). On the order stream it is not the stream's MaxAge: a
	// message no durable consumer acknowledged is never removed by age (see
	// Retain). The event stream uses it as its MaxAge.
	MaxAge time.Duration
	// DuplicateWindow is the broker's Msg-Id de-duplication window (default 2m).
	DuplicateWindow time.Duration
	// AckWait is how long a delivered message may stay unacknowledged
	// (default 3s): how long the messages of a consumer that died wait for
	// another. The consumer keeps a batch it works on alive with
	// in-progress acks (every third of it), so a slow batch is not
	// redelivered.
	AckWait time.Duration
	// MaxAckPending bounds messages delivered and not yet acknowledged (default 20000).
	MaxAckPending int
	// Replicas of the streams and durable consumers on a clustered broker
	// (default 1; 3 on a 3-node JetStream cluster survives the loss of one
	// node). A stream that already has more replicas keeps them: an
	// operator's higher count is never lowered (see Log).
	Replicas int
	// Log receives the notice that a stream kept more replicas than
	// configured (nil: discarded).
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.MaxAge == 0 {
		c.MaxAge = 72 * time.Hour
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.AckWait == 0 {
		c.AckWait = 3 * time.Second
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 20000
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// replicas returns the replica count to create or update stream name with:
// the configured one, or the stream's own if it has more (an operator
// raised it; lowering it would take away the redundancy they chose).
func (q *Queue) replicas(ctx context.Context, name string, want int) (int, error) {
	st, err := answered(ctx, func(ctx context.Context) (jetstream.Stream, error) { return q.js.Stream(ctx, name) })
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return want, nil
	}
	if err != nil {
		return 0, fmt.Errorf("orderqueue: stream %s: %w", name, err)
	}
	have := st.CachedInfo().Config.Replicas
	if have > want {
		q.cfg.Log.Info("stream keeps more replicas than configured (flashsale never lowers them)",
			"stream", name, "replicas", have, "configured", want)
		return have, nil
	}
	return want, nil
}

// Queue is the stream and its consumer. Safe for concurrent use.
type Queue struct {
	js       jetstream.JetStream
	cfg      Config
	stream   jetstream.Stream
	dlq      jetstream.Stream
	consumer jetstream.Consumer

	mu        sync.Mutex
	eventCfg  *Config // set once the event stream is ensured
	missing   error   // what the last Ensure found missing and could not re-create
	recreated int     // times Ensure re-created something

	pub    pubHealth    // Publish's recent outcomes
	schema atomic.Int32 // the order stream's schema version Publish writes
}

// Open creates or updates the stream and the durable consumer on nc.
// Several instances may call it at once. The configuration is updated in
// place, so a stream created by an older version (with a MaxAge) loses it.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Queue, error) {
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		return nil, err
	}
	q := &Queue{js: js, cfg: cfg}
	q.schema.Store(1)
	if err := q.create(ctx); err != nil {
		return nil, err
	}
	return q, nil
}

// create creates or updates the order and dead-letter streams and the
// durable consumer, and deletes the retired payment-timer consumer. The handles stay valid across a re-creation (they
// address the stream and consumers by name).
func (q *Queue) create(ctx context.Context) error {
	cfg := q.cfg
	orderR, err := q.replicas(ctx, StreamName, cfg.Replicas)
	if err != nil {
		return err
	}
	dlqR, err := q.replicas(ctx, DeadLetterStream, cfg.Replicas)
	if err != nil {
		return err
	}
	st, err := q.createStream(ctx, jetstream.StreamConfig{
		Name:      StreamName,
		Subjects:  []string{SubjectPrefix + "*"},
		Storage:   jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy,
		// No MaxAge: age would drop reservations nobody applied yet (a long
		// database outage). Retain removes acknowledged messages instead.
		MaxAge:     0,
		Duplicates: cfg.DuplicateWindow,
		Replicas:   orderR,
	})
	if err != nil {
		return fmt.Errorf("orderqueue: stream: %w", err)
	}
	dlq, err := q.createStream(ctx, jetstream.StreamConfig{
		Name:       DeadLetterStream,
		Subjects:   []string{DeadLetterPrefix + "*"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Duplicates: cfg.DuplicateWindow,
		Replicas:   dlqR,
	})
	if err != nil {
		return fmt.Errorf("orderqueue: dead-letter stream: %w", err)
	}
	cons, err := createConsumer(ctx, st, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxAckPending: cfg.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: SubjectPrefix + "*",
		Replicas:      orderR,
	})
	if err != nil {
		return fmt.Errorf("orderqueue: consumer: %w", err)
	}
	if err := deleteRetired(ctx, st); err != nil {
		return err
	}
	if q.stream == nil {
		q.stream, q.dlq, q.consumer = st, dlq, cons
	}
	return nil
}

// apiAttempt bounds one JetStream API request of the set-up. A clustered
// broker can leave a request unanswered (its meta or stream leader
// changing while several instances create the same streams at start: CI
// saw an instance wait out its whole 60 s start-up for the dead-letter
// stream's creation); the client would wait for the caller's deadline.
// Creating or updating a stream or consumer, or reading one, can be asked
// again: an unanswered attempt is sent again while the caller's context
// lasts.
var apiAttempt = 10 * time.Second

// answered runs f with a context of at most apiAttempt, again each time an
// attempt ends unanswered (its own deadline passed, not the caller's).
func answered[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, apiAttempt)
		v, err := f(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return v, err
		}
	}
}

// errNoPeers is the broker's JSClusterNoPeersErrF: a replicated stream
// found too few servers to place it on ("no suitable peers for placement,
// peer offline"). A cluster just formed, or one whose server restarts,
// answers it until the meta leader hears from that server again (CI saw
// an instance exit at start on it, seconds after every node's /healthz
// said ok).
const errNoPeers jetstream.ErrorCode = 10005

// noPeersFor bounds how long a stream's creation is asked again while the
// cluster has too few servers for it.
var noPeersFor = 30 * time.Second

// createStream creates or updates a stream (see answered), asked again
// every 250 ms for up to noPeersFor while the cluster has too few servers
// up to place it; then the broker's error is the caller's.
func (q *Queue) createStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	return untilPlaced(ctx, noPeersFor, func(ctx context.Context) (jetstream.Stream, error) {
		return answered(ctx, func(ctx context.Context) (jetstream.Stream, error) { return q.js.CreateOrUpdateStream(ctx, cfg) })
	})
}

// askWhile runs f again every period while it fails with an error retry
// accepts, for up to within and while ctx lasts; then f's last answer is
// the caller's.
func askWhile[T any](ctx context.Context, within, every time.Duration, retry func(error) bool, f func(context.Context) (T, error)) (T, error) {
	deadline := time.Now().Add(within)
	for {
		v, err := f(ctx)
		if err == nil || !retry(err) || !time.Now().Before(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(every):
		}
	}
}

// isCode reports whether err is the broker's API error code.
func isCode(err error, code jetstream.ErrorCode) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == code
}

// peerOffline reports whether err is the broker's errNoPeers because a
// server is offline. The same code also says the cluster can never place
// the stream (more replicas than servers, tags no server has, too little
// storage): those are the operator's to fix, and fail at once.
func peerOffline(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errNoPeers && strings.Contains(apiErr.Description, "offline")
}

// untilPlaced runs f again every 250 ms while it fails because a server the
// stream needs is offline (peerOffline), for up to within and while ctx
// lasts.
func untilPlaced[T any](ctx context.Context, within time.Duration, f func(context.Context) (T, error)) (T, error) {
	return askWhile(ctx, within, 250*time.Millisecond, peerOffline, f)
}

// deleteRetired deletes the retired payment-timer consumer if an older
// version left it on the stream (its ack floor would stop retention).
func deleteRetired(ctx context.Context, st jetstream.Stream) error {
	err := st.DeleteConsumer(ctx, ExpiryConsumerName)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("orderqueue: deleting the retired consumer %s: %w", ExpiryConsumerName, err)
	}
	return nil
}

// createConsumer creates or updates a durable consumer. A stream whose
// replicas were just raised takes a moment to apply it across the cluster;
// meanwhile the broker refuses a consumer with as many replicas as the
// stream's new count ("exceeds parent stream"): retried for up to 15 s.
// errConsumerReplicasExceedStream is the broker's JSConsumerReplicasExceedsStream
// (nats.go names no constant for it).
const errConsumerReplicasExceedStream jetstream.ErrorCode = 10126

func createConsumer(ctx context.Context, st jetstream.Stream, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	exceeds := func(err error) bool { return isCode(err, errConsumerReplicasExceedStream) }
	return askWhile(ctx, 15*time.Second, 100*time.Millisecond, exceeds, func(ctx context.Context) (jetstream.Consumer, error) {
		return answered(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return st.CreateOrUpdateConsumer(ctx, cfg) })
	})
}

// Message is one reservation to publish.
type Message struct {
	ID string // order id; the broker's de-duplication id
	// SKU is the reservation's SKU, or the name of its stock bucket (the
	// subject is the SKU's either way: sale.SKUOfBucket).
	SKU  string
	Data []byte
	// Trace, if set, is the W3C trace context of the purchase (traceparent,
	// tracestate), sent as message headers: the consumer links its batch
	// span to it. Messages published from Redis later have none.
	Trace map[string]string
}

// Publish sends msgs and waits for the stream's acknowledgement of each.
// The returned slice has one error per message (nil: stored durably).
//
// While the queue publishes schema version 2 (SetPublishSchema), the
// reservations of one SKU go out together, up to MaxBatch in one message
// (see SchemaBatch); a reservation alone, or one whose payload is not one
// line, goes out as version 1.
func (q *Queue) Publish(ctx context.Context, msgs []Message) []error {
	errs := make([]error, len(msgs))
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	// of[k] lists the indices in msgs that futs[k] carries; nil when not
	// batching: futs[k] is msgs[k]'s.
	var of [][]int
	publish := func(data []byte, id string, trace map[string]string, sku string, header ...string) (jetstream.PubAckFuture, error) {
		msg := &nats.Msg{Subject: SubjectPrefix + sale.SKUOfBucket(sku), Data: data, Header: make(nats.Header, len(trace)+len(header)/2+1)}
		for k, v := range trace {
			msg.Header[k] = []string{v} // exact (lower-case) W3C names
		}
		setSchema(msg, "")
		for i := 0; i+1 < len(header); i += 2 {
			if header[i+1] != "" {
				msg.Header.Set(header[i], header[i+1])
			}
		}
		return q.js.PublishMsgAsync(msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(StreamName))
	}
	if q.schema.Load() == SchemaBatch && len(msgs) > 1 {
		for _, g := range groups(msgs) {
			var f jetstream.PubAckFuture
			var err error
			if len(g) == 1 {
				m := msgs[g[0]]
				f, err = publish(m.Data, m.ID, m.Trace, m.SKU)
			} else {
				part := make([]Message, len(g))
				for j, i := range g {
					part[j] = msgs[i]
				}
				data, traces, id := encodeBatch(part)
				f, err = publish(data, id, nil, part[0].SKU, SchemaHeader, strconv.Itoa(SchemaBatch),
					HeaderCount, strconv.Itoa(len(g)), HeaderTraces, traces)
			}
			for _, i := range g {
				errs[i] = err
			}
			futs, of = append(futs, f), append(of, g)
		}
	} else {
		for i, m := range msgs {
			var f jetstream.PubAckFuture
			f, errs[i] = publish(m.Data, m.ID, m.Trace, m.SKU)
			futs = append(futs, f)
		}
	}
	for k, f := range futs {
		if f == nil {
			continue
		}
		var err error
		select {
		case <-f.Ok():
		case err = <-f.Err():
		case <-ctx.Done():
			err = ctx.Err()
		}
		if of == nil {
			errs[k] = err
			continue
		}
		for _, i := range of[k] {
			errs[i] = err
		}
	}
	q.pub.record(errs)
	return errs
}

// groups splits msgs (by index) into the messages of a version 2 publish:
// by subject, in order, at most MaxBatch reservations and maxBatchBytes of
// payload each; a payload that is empty or holds a newline (it would not be
// one line) is a group of its own.
func groups(msgs []Message) [][]int {
	var out [][]int
	open := map[string]int{} // subject -> index in out of its open group
	size := map[string]int{}
	for i, m := range msgs {
		if len(m.Data) == 0 || bytes.IndexByte(m.Data, '\n') >= 0 {
			out = append(out, []int{i})
			continue
		}
		subj := sale.SKUOfBucket(m.SKU)
		k, ok := open[subj]
		if !ok || len(out[k]) >= MaxBatch || size[subj]+len(m.Data) > maxBatchBytes {
			k = len(out)
			out = append(out, nil)
			open[subj], size[subj] = k, 0
		}
		out[k] = append(out[k], i)
		size[subj] += len(m.Data) + 1
	}
	return out
}

// SetPublishSchema sets the schema version Publish writes on the order
// stream: 1 (one reservation per message, what every release reads) or
// SchemaBatch. Safe for concurrent use.
func (q *Queue) SetPublishSchema(v int) { q.schema.Store(int32(v)) }

// PublishSchema returns the schema version Publish writes.
func (q *Queue) PublishSchema() int { return int(q.schema.Load()) }

// Consumer returns the durable consumer the appliers share.
func (q *Queue) Consumer() jetstream.Consumer { return q.consumer }

// Stats is the queue's backlog.
type Stats struct {
	Messages   uint64 // stored in the stream
	Pending    uint64 // not yet delivered to the consumer
	AckPending int    // delivered, not yet acknowledged
}

// Stats reads the backlog from the broker.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	ci, err := q.consumer.Info(ctx)
	if err != nil {
		return Stats{}, err
	}
	si, err := q.stream.Info(ctx)
	if err != nil {
		return Stats{}, err
	}
	return Stats{Messages: si.State.Msgs, Pending: ci.NumPending, AckPending: ci.NumAckPending}, nil
}

// Ping checks the stream answers.
func (q *Queue) Ping(ctx context.Context) error {
	_, err := q.stream.Info(ctx)
	return err
}

// JetStream exposes the client for tools and tests (replay, inspection).
func (q *Queue) JetStream() jetstream.JetStream { return q.js }

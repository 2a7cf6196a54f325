// Package apply is the consumer: it takes reservations from the stream in
// batches and applies each batch in one database transaction.
//
// Retry contract, per reservation (a message carries one, or several of
// one SKU in schema version 2: it is acked once all of them are decided,
// and nak'ed while any one waits for a retry, see Handle):
//   - committed (applied or refused by the database) -> the gate closes the
//     reservation (refused ones give their units back) -> ack;
//   - malformed (cannot be decoded or validated) -> dead letter at once;
//   - an outage (orderstore.Outage: the database refuses writes, read-only
//     during a switchover, or lacks disk or memory, while it answers pings)
//     -> wait: the batch is held, kept alive with in-progress acks (so it is
//     neither redelivered nor counted by the broker), and applied again with
//     a short backoff (holdBackoff) until the database takes it. Never
//     nak'ed, never dead-lettered; Outage reports the wait meanwhile;
//   - a transient failure (orderstore.IsTransient: a connection error, a
//     timeout, a serialization failure, a deadlock, a lock timeout), or the
//     database not answering a ping -> nak with a growing delay, however many
//     deliveries: a flaky network or an outage never dead-letters anything;
//   - any other failure -> the batch is split and each reservation applied alone;
//     a reservation that fails alone with a non-transient error has failed
//     deterministically once. It is nak'ed with a growing delay, and
//     dead-lettered at its MaxDeliver-th deterministic failure. Its stock
//     stays reserved until an operator replays or discards it.
//
// While a batch is in hand (applied, or held) it is kept alive with an
// in-progress ack every third of the ack wait, so a short ack wait (the time
// a killed instance's messages wait for another consumer) never redelivers a
// batch that is merely slow.
//
// JetStream's delivery count grows with every nak, transient or not, so it
// cannot decide the dead letter. Each consumer process counts deterministic
// failures per order id in memory instead (dropped once the message is acked
// or dead-lettered, or after a day without news). The limits of that choice:
// a restart forgets the counts, and with several instances each counts its
// own, so a message that always fails may be tried up to MaxDeliver times per
// process life before it is dead-lettered; never fewer than MaxDeliver times.
//
// A redelivery finds the idempotency row if the commit had happened, so
// nothing is applied twice.
//
// Schema versions: every message carries orderqueue.SchemaHeader (none:
// version 1, what releases before the header publish). The consumer decodes
// the versions it knows (Config.Schemas). A message of any other version,
// published by a newer release running beside this one, is not this
// instance's to judge: it is never decoded, acked, dead-lettered or counted
// as a failure; it is nak'ed with UnknownDelay, so it waits on the stream for
// an instance that knows its version, however long that takes, and counted
// (Observer.UnknownVersion: flashsale_messages_unknown_version_total, whose
// alert fires while any waits).
package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/tracing"
)

// Store applies reservations in the database of record.
type Store interface {
	ApplyBatch(ctx context.Context, rs []sale.Reservation) ([]orderstore.Outcome, error)
	Ping(ctx context.Context) error
}

// DeadLetters keeps reservations the consumer gives up on.
type DeadLetters interface {
	// DeadLetterPart copies one reservation m carries (data: its payload,
	// of schema version schema ("" is 1; part its index in a version 2
	// message, -1 for the message whole) to the dead letters.
	DeadLetterPart(ctx context.Context, m jetstream.Msg, part int, data []byte, schema, orderID, sku, reason string) error
}

// Closer closes reservations in the gate once the database decided them.
type Closer interface {
	Finalize(ctx context.Context, sku string, outcomes []stockgate.Outcome) (int64, error)
}

// Config tunes the consumer. Zero values take the defaults.
type Config struct {
	// Batch is the most reservations applied in one transaction (default
	// 256; a message is never split, so one of schema 2 may exceed it).
	Batch int
	// MaxWait is how long a partial batch waits for more messages (default 5ms).
	MaxWait time.Duration
	// Workers is the number of concurrent batch appliers in this process (default 2).
	Workers int
	// Timeout bounds one batch: database transaction plus gate update (default 15s).
	Timeout time.Duration
	// Backoff lists the delays of redeliveries after a failure, by attempt
	// (default 200ms, 1s, 5s; the last repeats). A transient failure (a
	// reset connection, a deadlock) is usually over at once; the last
	// delay bounds both the retry rate against a database that does not
	// answer and how long a message waits once it answers again.
	Backoff []time.Duration
	// MaxDeliver is the number of deterministic failures (see the package
	// doc) after which a message is dead-lettered (default 3). Transient
	// failures do not count.
	MaxDeliver int
	// AckWait is the stream consumer's ack wait (default 3s, as
	// orderqueue's): a batch in hand is kept alive with an in-progress ack
	// every third of it.
	AckWait time.Duration
	// Tracer, if set, traces each batch transaction (span apply.batch, a
	// new trace linked to the trace of every purchase the batch carries).
	Tracer *tracing.Tracer
	// Schemas are the message schema versions this consumer applies, each
	// with its decoder (default: every version this release reads, 1 and
	// 2, see DefaultSchemas). Tests add a version.
	Schemas map[int]Decoder
	// UnknownDelay is how long a message of a schema version not in
	// Schemas waits before it is delivered again (default 5s).
	UnknownDelay time.Duration
}

// Decoder turns a message payload of one schema version (and its
// headers) into the reservations it carries (orderqueue.Part: each with its
// own version 1 payload, and its decoding or validation error). An error
// means the payload as a whole cannot be read: the message is
// dead-lettered whole.
type Decoder func(data []byte, h nats.Header) ([]orderqueue.Part, error)

// DecodeV1 decodes schema version 1: one JSON sale.Reservation (or what a
// version 2 payload carries that a release before the schema header
// dead-lettered whole and replayed: orderqueue.DecodeV1OrBatch).
func DecodeV1(data []byte, _ nats.Header) ([]orderqueue.Part, error) {
	return orderqueue.DecodeV1OrBatch(data), nil
}

// DecodeV2 decodes schema version 2: several reservations of one SKU, one
// per line (orderqueue.SchemaBatch).
func DecodeV2(data []byte, h nats.Header) ([]orderqueue.Part, error) {
	return orderqueue.DecodeBatch(data, h.Get(orderqueue.HeaderTraces))
}

// DefaultSchemas returns the versions this release reads: 1 and 2.
func DefaultSchemas() map[int]Decoder {
	return map[int]Decoder{1: DecodeV1, orderqueue.SchemaBatch: DecodeV2}
}

func (c Config) withDefaults() Config {
	if c.Batch == 0 {
		c.Batch = 256
	}
	if c.MaxWait == 0 {
		c.MaxWait = 5 * time.Millisecond
	}
	if c.Workers == 0 {
		c.Workers = 2
	}
	if c.Timeout == 0 {
		c.Timeout = 15 * time.Second
	}
	if len(c.Backoff) == 0 {
		c.Backoff = []time.Duration{200 * time.Millisecond, time.Second, 5 * time.Second}
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 3
	}
	if c.AckWait == 0 {
		c.AckWait = 3 * time.Second
	}
	if len(c.Schemas) == 0 {
		c.Schemas = DefaultSchemas()
	}
	if c.UnknownDelay == 0 {
		c.UnknownDelay = 5 * time.Second
	}
	return c
}

// Observer is told what each batch did (metrics); nil is fine.
type Observer interface {
	Batch(size int, applied, refused, duplicates int, elapsed time.Duration, err error)
	DeadLettered()
	// UnknownVersion counts one delivery of a message whose schema
	// version this consumer does not know (left for another instance).
	UnknownVersion()
}

// Consumer applies the stream to the database.
type Consumer struct {
	store Store
	gate  Closer
	dead  DeadLetters
	log   *slog.Logger
	cfg   Config
	obs   Observer

	mu        sync.Mutex
	fails     map[string]failures // by order id: deterministic failures so far
	deadParts deadParts
	outage    outage // batches held for an outage
}

// deadParts remembers, by stream sequence and index, the reservations of
// version 2 messages this process dead-lettered while their message still
// waits for another's retry, so that a redelivery does not dead-letter them
// again. Dropped when the message is acked or terminated here, or after
// deadPartsFor without news (another instance may settle it).
type deadParts map[uint64]map[int]deadPart

// deadPart is what deadParts keeps of a dead-lettered reservation: when,
// and its payload. A stream the broker lost and re-created numbers its
// messages from 1 again: a reservation counts as dead-lettered only when
// its payload is the same too.
type deadPart struct {
	at   time.Time
	data string
}

// deadPartsFor is how long a dead-lettered reservation is remembered
// without news: far longer than the longest retry delay, so a redelivery
// finds it; short, so that what another instance settled goes.
const deadPartsFor = 10 * time.Minute

// outage is the consumer's view of a database outage: how many batches are
// held waiting for the database, since when, and why (the last refusal).
type outage struct {
	held   int
	since  time.Time
	reason string
}

// failures counts the deterministic failures of one message.
type failures struct {
	n    int
	last time.Time
}

// forgetAfter is how long a message's failure count is kept without news.
const forgetAfter = 24 * time.Hour

// New returns a consumer.
func New(store Store, gate Closer, dead DeadLetters, log *slog.Logger, obs Observer, cfg Config) *Consumer {
	return &Consumer{store: store, gate: gate, dead: dead, log: log, obs: obs, cfg: cfg.withDefaults(), fails: map[string]failures{},
		deadParts: deadParts{}}
}

// Run consumes from cons with the configured number of workers until ctx is done.
func (c *Consumer) Run(ctx context.Context, cons jetstream.Consumer) {
	done := make(chan struct{}, c.cfg.Workers)
	for i := 0; i < c.cfg.Workers; i++ {
		go func() {
			defer func() { done <- struct{}{} }()
			c.worker(ctx, cons)
		}()
	}
	for i := 0; i < c.cfg.Workers; i++ {
		<-done
	}
}

// pullExpiry bounds how long one pull request waits on the broker.
const pullExpiry = 5 * time.Second

func (c *Consumer) worker(ctx context.Context, cons jetstream.Consumer) {
	for ctx.Err() == nil {
		// A short pull expiry: a pull request parked on a broker that lost
		// the consumer (restarted on an empty store) gets no answer, and the
		// iterator only issues a new one when the old expires; with the
		// default 30 s that is how long the consumer would sit idle after
		// the consumer is re-created.
		it, err := cons.Messages(jetstream.PullMaxMessages(2*c.cfg.Batch), jetstream.PullExpiry(pullExpiry))
		if err != nil {
			c.log.Warn("consumer: subscribe", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		c.drain(ctx, it)
		it.Stop()
	}
}

// drain applies the iterator's messages in batches until ctx ends. Then the
// iterator is drained, not stopped: the messages its pull had already
// buffered are handed back (nak) with the batch being filled, so that
// another instance gets them at once. Stopped, it dropped them, and each
// waited out the consumer's ack wait (30 s as the previous release sets
// it) before anyone applied it.
func (c *Consumer) drain(ctx context.Context, it jetstream.MessagesContext) {
	batch := make([]jetstream.Msg, 0, c.cfg.Batch)
	for {
		// Block for the first message (until ctx ends), then fill the
		// batch for at most MaxWait.
		m, err := it.Next(jetstream.NextContext(ctx))
		if err == nil && ctx.Err() != nil {
			c.handBack(it, append(batch[:0], m))
			return
		}
		if err != nil {
			if ctx.Err() != nil {
				c.handBack(it, nil)
				return
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			c.log.Warn("consumer: next", "err", err)
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		// Batch counts reservations: a version 2 message carries several.
		batch = append(batch[:0], m)
		units := carried(m)
		deadline := time.Now().Add(c.cfg.MaxWait)
		for units < c.cfg.Batch {
			wait := time.Until(deadline)
			if wait <= 0 {
				break
			}
			m, err := it.Next(jetstream.NextMaxWait(wait))
			if err != nil {
				break
			}
			batch = append(batch, m)
			units += carried(m)
		}
		if ctx.Err() != nil {
			c.handBack(it, batch)
			return
		}
		c.Handle(ctx, batch)
	}
}

// handBack naks msgs and every message the iterator still buffers, once the
// consumer stops: none was applied, and a nak lets another consumer have it
// now. Bounded: the buffer holds at most two batches, and an empty one ends
// it within a second (at once when the drain completes).
func (c *Consumer) handBack(it jetstream.MessagesContext, msgs []jetstream.Msg) {
	it.Drain()
	for {
		for _, m := range msgs {
			if err := m.Nak(); err != nil {
				c.log.Warn("consumer: nak on stop", "err", err)
			}
		}
		m, err := it.Next(jetstream.NextMaxWait(time.Second))
		if err != nil {
			return
		}
		msgs = append(msgs[:0], m)
	}
}

// carried returns how many reservations m says it carries
// (orderqueue.HeaderCount; 1 without it).
func carried(m jetstream.Msg) int {
	n, err := strconv.Atoi(m.Headers().Get(orderqueue.HeaderCount))
	if err != nil || n < 1 {
		return 1
	}
	return min(n, orderqueue.MaxBatch)
}

// batch is one Handle's work: the messages whose reservations it applies,
// the reservations, and what became of each.
type batch struct {
	msgs []jetstream.Msg
	ms   []msgState // by message
	rs   []sale.Reservation
	of   []int            // rs[i] came from msgs[of[i]]
	data [][]byte         // rs[i]'s own payload, for a dead letter of it alone
	part []int            // rs[i]'s index in its version 2 message; -1: the message whole
	tr   []tracing.Getter // rs[i]'s purchase's trace context
	out  []unitOutcome    // by reservation
}

// msgState is what became of one message's reservations.
type msgState struct {
	schema string // the message's SchemaHeader
	seq    uint64 // its stream sequence (read for version 2 messages only)
	units  int    // reservations it carries
	dead   int    // of them dead-lettered
	open   bool   // one waits for a redelivery: nak
	long   bool   // a dead letter could not be written: nak with the longest delay
	reason string // the last dead letter's reason (a message all dead-lettered is terminated with it)
}

// unitOutcome is what became of one reservation: decided (committed and
// closed in the gate) or failed with err.
type unitOutcome struct {
	done          bool
	err           error
	deterministic bool
}

// Handle applies one batch of messages and acknowledges, naks or
// dead-letters each according to the retry contract. A message carrying
// several reservations (schema version 2) is acked once every one of them
// is decided: applied, refused by the database, or dead-lettered alone; if
// any waits for a retry, the whole message is nak'ed and its redelivery
// finds the others' idempotency rows.
func (c *Consumer) Handle(ctx context.Context, msgs []jetstream.Msg) {
	b := &batch{}
	for _, m := range msgs {
		c.open(ctx, b, m)
	}
	if len(b.rs) > 0 {
		stop := c.keepAlive(b.msgs)
		c.applyAll(ctx, b)
		stop() // before the acks and naks of settle
	}
	c.settle(ctx, b)
}

// open decodes m into b. A message of an unknown version is left for
// another instance; one that cannot be read at all, and each reservation
// in it that cannot, is dead-lettered at once.
func (c *Consumer) open(ctx context.Context, b *batch, m jetstream.Msg) {
	decode, ok := c.decoder(m)
	if !ok {
		c.unknownVersion(m)
		return
	}
	k := len(b.msgs)
	b.msgs = append(b.msgs, m)
	b.ms = append(b.ms, msgState{schema: m.Headers().Get(orderqueue.SchemaHeader)})
	parts, err := decode(m.Data(), m.Headers())
	if err != nil {
		c.log.Error("consumer: malformed message", "subject", m.Subject(), "err", err)
		b.ms[k].units = 1
		c.deadLetter(ctx, b, k, -1, m.Data(), sale.Reservation{}, "malformed: "+err.Error())
		c.settleNow(ctx, b, k)
		return
	}
	b.ms[k].units = len(parts)
	if len(parts) > 0 && parts[0].Batched {
		if md, err := m.Metadata(); err == nil {
			b.ms[k].seq = md.Sequence.Stream
		}
	}
	added := false
	for _, p := range parts {
		part := -1
		if p.Batched {
			part = p.Index
		}
		if part >= 0 && b.ms[k].seq > 0 && c.deadAlready(b.ms[k].seq, part, p.Data) {
			b.ms[k].dead++ // dead-lettered on an earlier delivery
			continue
		}
		if p.Err != nil {
			c.log.Error("consumer: malformed message", "subject", m.Subject(), "err", p.Err)
			c.deadLetter(ctx, b, k, part, p.Data, p.Reservation, "malformed: "+p.Err.Error())
			continue
		}
		added = true
		b.rs = append(b.rs, p.Reservation)
		b.of = append(b.of, k)
		b.data = append(b.data, p.Data)
		b.part = append(b.part, part)
		if p.Trace != nil {
			b.tr = append(b.tr, p.Trace)
		} else {
			b.tr = append(b.tr, m.Headers())
		}
	}
	if !added {
		c.settleNow(ctx, b, k)
	}
}

// settleNow settles message k of b, none of whose reservations is left to
// apply, at once (terminated, or nak'ed when a dead letter could not be
// written), instead of after the batch's apply, and takes it out of the
// batch.
func (c *Consumer) settleNow(ctx context.Context, b *batch, k int) {
	c.settleMsg(ctx, b.msgs[k], b.ms[k])
	b.msgs, b.ms = b.msgs[:k], b.ms[:k]
}

// partSchema is the schema version a dead letter of one reservation is
// written under: 1 for one taken out of a version 2 payload (part >= 0:
// each is a version 1 payload), else its message's own, kept as it came.
func partSchema(msgSchema string, part int) string {
	if part >= 0 {
		return "1"
	}
	return msgSchema
}

// deadAlready reports whether the reservation k names was dead-lettered by
// this process on an earlier delivery of its message.
func (c *Consumer) deadAlready(seq uint64, index int, data []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deadParts[seq][index]
	return ok && d.data == string(data)
}

// applyAll applies b's reservations in one transaction if it can, and
// records each one's outcome.
func (c *Consumer) applyAll(ctx context.Context, b *batch) {
	b.out = make([]unitOutcome, len(b.rs))
	closeErrs, err := c.applyHeld(ctx, b.rs, b.tr, len(b.msgs))
	if err == nil {
		b.closed(0, closeErrs)
		return
	}
	if c.transient(ctx, err) {
		for i := range b.out {
			b.out[i] = unitOutcome{err: err}
		}
		return
	}
	if len(b.rs) == 1 {
		b.out[0] = unitOutcome{err: err, deterministic: true}
		return
	}
	// Not the database's fault: find the reservation(s) that fail by
	// applying each alone.
	for i := range b.rs {
		closeErrs, err := c.applyHeld(ctx, b.rs[i:i+1], b.tr[i:i+1], 1)
		if err != nil {
			b.out[i] = unitOutcome{err: err, deterministic: !c.transient(ctx, err)}
			continue
		}
		b.closed(i, closeErrs)
	}
}

// closed records the reservations from..from+len(errs) as committed: decided
// unless the gate failed to close one (Redis being down is not the
// reservation's fault: retried, never dead-lettered; the redelivery is a
// duplicate in the database and closes it then).
func (b *batch) closed(from int, errs []error) {
	for j, err := range errs {
		b.out[from+j] = unitOutcome{done: err == nil, err: err}
	}
}

// settle decides each message of b: an ack when all its reservations are
// decided, a nak with a delay growing with its deliveries when one waits
// for a retry, and the dead letter of a reservation at its MaxDeliver-th
// deterministic failure.
func (c *Consumer) settle(ctx context.Context, b *batch) {
	var retried int
	var cause error
	var deterministic bool
	for i, o := range b.out {
		k := b.of[i]
		switch {
		case o.done:
			c.settled(b.rs[i].OrderID)
		case o.deterministic && ctx.Err() == nil:
			deterministic, cause = true, o.err
			if f := c.failed(b.rs[i].OrderID); f >= c.cfg.MaxDeliver {
				c.deadLetter(ctx, b, k, b.part[i], b.data[i], b.rs[i], fmt.Sprintf("apply failed %d times: %v", f, o.err))
				continue
			}
			b.ms[k].open = true
		default:
			cause = o.err
			b.ms[k].open = true
		}
	}
	for k, m := range b.msgs {
		if c.settleMsg(ctx, m, b.ms[k]) {
			retried++
		}
	}
	if retried > 0 {
		c.log.Warn("consumer: will retry", "messages", retried, "deterministic", deterministic, "err", cause)
	}
}

// decoder returns the decoder of m's schema version, if this consumer knows it.
func (c *Consumer) decoder(m jetstream.Msg) (Decoder, bool) {
	v, ok := orderqueue.SchemaOf(m.Headers())
	if !ok {
		return nil, false
	}
	d, ok := c.cfg.Schemas[v]
	return d, ok
}

// unknownVersion leaves m, of a schema version this consumer does not know,
// on the stream for an instance that knows it (see the package doc).
func (c *Consumer) unknownVersion(m jetstream.Msg) {
	if c.obs != nil {
		c.obs.UnknownVersion()
	}
	if err := m.NakWithDelay(c.cfg.UnknownDelay); err != nil {
		c.log.Warn("consumer: nak", "err", err)
	}
	seq := uint64(0)
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	c.log.Warn("consumer: message of a schema version this release does not know; left for an instance that does",
		"subject", m.Subject(), "stream_seq", seq, "schema", m.Headers().Get(orderqueue.SchemaHeader), "redelivery_in", c.cfg.UnknownDelay)
}

// holdBackoff is the wait between two tries of a batch held for an outage:
// it doubles from the first to the last, which then repeats. The last bounds
// how long the writes wait for the consumer once the database takes them
// again; a try costs the database one refused statement.
var holdBackoff = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
	800 * time.Millisecond, 1600 * time.Millisecond, 2 * time.Second}

// applyHeld applies rs (see apply). While the database answers with an
// outage (orderstore.Outage), it holds msgs, keeping them alive with
// in-progress acks, and tries again after holdBackoff, until the apply
// succeeds, fails otherwise (returned) or ctx is done (the last error
// returned). Nothing is nak'ed or counted for an outage.
func (c *Consumer) applyHeld(ctx context.Context, rs []sale.Reservation, tr []tracing.Getter, msgs int) ([]error, error) {
	held := false
	defer func() {
		if held {
			c.release()
		}
	}()
	for try := 0; ; try++ {
		closeErrs, err := c.apply(ctx, rs, tr)
		reason, out := orderstore.Outage(err)
		if !out || ctx.Err() != nil {
			if held && err == nil {
				c.log.Info("consumer: the database takes writes again; held batch applied", "messages", msgs, "tries", try+1)
			}
			return closeErrs, err
		}
		if !held {
			held = true
			c.hold(reason)
			c.log.Warn("consumer: database outage; holding the batch until it takes writes", "messages", msgs, "reason", reason, "err", err)
		} else {
			c.setReason(reason)
		}
		// Handle keeps the messages alive meanwhile.
		sleep(ctx, holdBackoff[min(try, len(holdBackoff)-1)])
	}
}

func (c *Consumer) hold(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.outage.held == 0 {
		c.outage.since = time.Now()
	}
	c.outage.held++
	c.outage.reason = reason
}

func (c *Consumer) setReason(reason string) {
	c.mu.Lock()
	c.outage.reason = reason
	c.mu.Unlock()
}

func (c *Consumer) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.outage.held--; c.outage.held == 0 {
		c.outage = outage{}
	}
}

// Outage reports whether this consumer holds batches for a database outage
// (see the package doc): since when (the first held batch of the outage)
// and why (the last refusal, for operators: readiness and the dashboard).
// ok is false when nothing is held. Safe for concurrent use.
func (c *Consumer) Outage() (since time.Time, reason string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outage.since, c.outage.reason, c.outage.held > 0
}

// keepAlive sends msgs an in-progress ack every third of the ack wait until
// the returned stop is called; once stop returns none follows (an
// in-progress ack after a nak would undo its delay).
func (c *Consumer) keepAlive(msgs []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(max(c.cfg.AckWait/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				inProgress(msgs)
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}

// inProgress tells the broker msgs are still being worked on (it restarts
// their ack wait). Fire and forget: a lost one costs a redelivery, which the
// database's idempotency row absorbs.
func inProgress(msgs []jetstream.Msg) {
	for _, m := range msgs {
		_ = m.InProgress()
	}
}

// transient reports whether err says nothing about the messages: the error
// itself is transient, the consumer is stopping, or the database does not
// answer (an outage whose errors the classifier does not know).
func (c *Consumer) transient(ctx context.Context, err error) bool {
	if orderstore.IsTransient(err) || ctx.Err() != nil {
		return true
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.store.Ping(pctx) != nil
}

// apply runs one transaction for rs and closes the reservations in the
// gate. An error means nothing was committed; otherwise closeErrs holds, by
// reservation, the gate's failure to close it (nil: closed).
func (c *Consumer) apply(ctx context.Context, rs []sale.Reservation, tr []tracing.Getter) (closeErrs []error, err error) {
	start := time.Now()
	bctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	bctx, span := c.cfg.Tracer.Start(bctx, "apply.batch", trace.SpanKindConsumer)
	defer func() {
		tracing.Fail(span, err)
		span.End()
	}()
	if span.IsRecording() {
		// A batch serves many purchases: it starts its own trace and links
		// each purchase's (the span limits keep the first 128 links).
		for _, h := range tr {
			if l, ok := tracing.LinkFrom(h); ok {
				span.AddLink(l)
			}
		}
		span.SetAttributes(attribute.Int("messaging.batch.message_count", len(rs)))
	}

	failpoint.Inject(failpoint.ConsumerBeforeCommit)
	outs, err := c.store.ApplyBatch(bctx, rs)
	if err != nil {
		c.observe(len(rs), 0, 0, 0, start, err)
		return nil, err
	}
	failpoint.Inject(failpoint.ConsumerAfterCommitBeforeAck)

	bySKU := map[string][]stockgate.Outcome{}
	applied, refused, dups := 0, 0, 0
	for i, o := range outs {
		ref := o.Status == sale.StatusFailed
		// By stock bucket: a refusal gives its units back where they were taken.
		bySKU[stockgate.BucketOf(rs[i])] = append(bySKU[stockgate.BucketOf(rs[i])], stockgate.Outcome{OrderID: o.OrderID, Refused: ref, KeyOrderID: o.KeyOrderID})
		switch {
		case o.Duplicate:
			dups++
		case ref:
			refused++
		default:
			applied++
		}
	}
	// One script call per SKU of the batch, all at once (the client
	// pipelines concurrent calls on its connection).
	failed := map[string]error{}
	var fmu sync.Mutex
	var wg sync.WaitGroup
	for sku, os := range bySKU {
		wg.Go(func() {
			if _, err := c.gate.Finalize(bctx, sku, os); err != nil {
				fmu.Lock()
				failed[sku] = err
				fmu.Unlock()
			}
		})
	}
	wg.Wait()
	closeErrs = make([]error, len(rs))
	var ferr error
	for i := range rs {
		if err, bad := failed[stockgate.BucketOf(rs[i])]; bad {
			closeErrs[i], ferr = err, err
		}
	}
	c.observe(len(rs), applied, refused, dups, start, ferr)
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("flashsale.applied", applied), attribute.Int("flashsale.refused", refused),
			attribute.Int("flashsale.duplicates", dups))
		tracing.Fail(span, ferr)
	}
	if c.log.Enabled(bctx, slog.LevelDebug) {
		c.log.DebugContext(bctx, "consumer: batch applied", "reservations", len(rs), "applied", applied,
			"refused", refused, "duplicates", dups, "elapsed", time.Since(start))
	}
	return closeErrs, nil
}

// failed counts one more deterministic failure of the order and returns the count.
func (c *Consumer) failed(orderID string) int {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.fails) >= 10_000 {
		for id, f := range c.fails {
			if now.Sub(f.last) > forgetAfter {
				delete(c.fails, id)
			}
		}
	}
	f := c.fails[orderID]
	f.n++
	f.last = now
	c.fails[orderID] = f
	return f.n
}

// rememberDead records that the reservation at index of the version 2
// message at stream sequence seq is dead-lettered, while the message may
// still be delivered again.
func (c *Consumer) rememberDead(seq uint64, index int, data []byte) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.deadParts) >= 1_000 {
		for s, ps := range c.deadParts {
			for i, d := range ps {
				if now.Sub(d.at) > deadPartsFor {
					delete(ps, i)
				}
			}
			if len(ps) == 0 {
				delete(c.deadParts, s)
			}
		}
	}
	if c.deadParts[seq] == nil {
		c.deadParts[seq] = map[int]deadPart{}
	}
	c.deadParts[seq][index] = deadPart{at: now, data: string(data)}
}

// settled forgets the failures of orders acked or dead-lettered.
func (c *Consumer) settled(orderID string) {
	c.mu.Lock()
	delete(c.fails, orderID)
	c.mu.Unlock()
}

// settleMsg acks, naks or terminates m as st says (see settle), and
// reports whether it was nak'ed for a retry.
func (c *Consumer) settleMsg(ctx context.Context, m jetstream.Msg, st msgState) (retried bool) {
	switch {
	case (st.open || st.long) && ctx.Err() != nil:
		// Stopping: the batch is handed back now (see handBack),
		// not after a backoff that is about this instance's trouble.
		if err := m.Nak(); err != nil {
			c.log.Warn("consumer: nak", "err", err)
		}
	case st.long:
		_ = m.NakWithDelay(c.cfg.Backoff[len(c.cfg.Backoff)-1])
	case st.open:
		n := 1
		if md, err := m.Metadata(); err == nil {
			n = int(md.NumDelivered)
		}
		if err := m.NakWithDelay(c.cfg.Backoff[min(n, len(c.cfg.Backoff))-1]); err != nil {
			c.log.Warn("consumer: nak", "err", err)
		}
		return true
	case st.dead == st.units:
		if err := m.TermWithReason(truncate(st.reason, 200)); err != nil {
			c.log.Warn("consumer: term", "err", err)
		}
		c.forgetParts(st.seq)
	default:
		if err := m.Ack(); err != nil {
			c.log.Warn("consumer: ack", "subject", m.Subject(), "err", err)
		}
		c.forgetParts(st.seq)
	}
	return false
}

// forgetParts drops what Consumer.deadParts remembers of the version 2 message
// at stream sequence seq (acked or terminated; 0: not one).
func (c *Consumer) forgetParts(seq uint64) {
	if seq == 0 {
		return
	}
	c.mu.Lock()
	delete(c.deadParts, seq)
	c.mu.Unlock()
}

// deadLetter copies one reservation of b.msgs[k] (data; part its index in
// a version 2 message, -1 for the message whole; r as far as it was
// decoded) to the dead letters. If the copy fails, the message is nak'ed
// and tried again later.
func (c *Consumer) deadLetter(ctx context.Context, b *batch, k, part int, data []byte, r sale.Reservation, reason string) {
	if err := c.dead.DeadLetterPart(ctx, b.msgs[k], part, data, partSchema(b.ms[k].schema, part), r.OrderID, r.SKU, reason); err != nil {
		c.log.Error("consumer: dead-letter failed; will retry", "order_id", r.OrderID, "err", err)
		b.ms[k].long = true
		return
	}
	c.settled(r.OrderID)
	if part >= 0 && b.ms[k].seq > 0 {
		c.rememberDead(b.ms[k].seq, part, data)
	}
	b.ms[k].dead++
	b.ms[k].reason = reason
	c.log.Error("consumer: dead-lettered", "order_id", r.OrderID, "sku_id", r.SKU, "reason", reason)
	if c.obs != nil {
		c.obs.DeadLettered()
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (c *Consumer) observe(size, applied, refused, dups int, start time.Time, err error) {
	if c.obs != nil {
		c.obs.Batch(size, applied, refused, dups, time.Since(start), err)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

package orderqueue

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/sale"
)

// Headers of a dead letter.
const (
	hdrReason     = "Flashsale-Reason"
	hdrDeliveries = "Flashsale-Deliveries"
	hdrStreamSeq  = "Flashsale-Stream-Seq"
	hdrOrderID    = "Flashsale-Order-Id"
	hdrFailedAt   = "Flashsale-Failed-At"
)

// DeadLetter is a reservation the consumer gave up on. Its stock stays
// reserved until an operator replays it (applied then, exactly once) or
// discards it (recorded failed, units given back once).
type DeadLetter struct {
	Seq        uint64    `json:"seq"`
	OrderID    string    `json:"order_id"`
	SKU        string    `json:"sku_id"`
	Reason     string    `json:"reason"`
	Deliveries int       `json:"deliveries"`
	StreamSeq  uint64    `json:"stream_seq"`
	FailedAt   time.Time `json:"failed_at"`
	Data       []byte    `json:"-"`
	// Schema is the original message's SchemaHeader ("" for none: version
	// 1), kept so that a replay publishes the payload under its own version.
	Schema string `json:"-"`
}

// Reservation decodes the dead letter's payload.
func (d DeadLetter) Reservation() (sale.Reservation, error) {
	var r sale.Reservation
	if err := json.Unmarshal(d.Data, &r); err != nil {
		return r, fmt.Errorf("%w: dead letter %d: %v", sale.ErrInvalid, d.Seq, err)
	}
	return r, r.Validate()
}

// Parts decodes what the dead letter holds: one reservation, or the
// reservations of a version 2 message that a release before the schema
// header dead-lettered whole (see DecodeV1OrBatch). It returns the valid
// ones and how many others it holds that cannot be read; an error when
// there is no valid one (ErrUnknownSchema, wrapped, for a version this
// release does not read: a newer release's to handle).
func (d DeadLetter) Parts() (parts []Part, invalid int, err error) {
	v, ok := SchemaOf(nats.Header{SchemaHeader: []string{d.Schema}})
	if !ok {
		return nil, 0, fmt.Errorf("%w: dead letter %d: schema %q", sale.ErrInvalid, d.Seq, d.Schema)
	}
	all, err := Decode(v, d.Data, "")
	if errors.Is(err, ErrUnknownSchema) {
		return nil, 0, fmt.Errorf("dead letter %d is of schema version %d: %w", d.Seq, v, ErrUnknownSchema)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: dead letter %d: %v", sale.ErrInvalid, d.Seq, err)
	}
	var first error
	for _, p := range all {
		if p.Err != nil {
			invalid++
			if first == nil {
				first = p.Err
			}
			continue
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return nil, invalid, fmt.Errorf("%w: dead letter %d: %v", sale.ErrInvalid, d.Seq, first)
	}
	return parts, invalid, nil
}

// ErrNoDeadLetter is returned when no dead letter has the sequence number.
var ErrNoDeadLetter = errors.New("no such dead letter")

// DeadLetter copies m to the dead-letter stream with the reason and delivery
// count. The caller terminates m only after this returned nil, so a message
// is never lost between the two streams (a crash in between leaves a copy in
// both; the database's idempotency log absorbs a later double apply).
func (q *Queue) DeadLetter(ctx context.Context, m jetstream.Msg, orderID, sku, reason string) error {
	return q.DeadLetterPart(ctx, m, -1, m.Data(), m.Headers().Get(SchemaHeader), orderID, sku, reason)
}

// DeadLetterPart is DeadLetter of one reservation that m carries: data is
// its own payload, of schema version schema ("": 1), part its index in a
// version 2 message (-1: the message whole). A version 2 message's
// reservation is dead-lettered alone, as version 1 (see SchemaBatch), so
// that a replay or a discard handles it as every release does; its index
// keeps its dead letter's id apart from its neighbours' (two without an
// order id must not be taken for one copy).
func (q *Queue) DeadLetterPart(ctx context.Context, m jetstream.Msg, part int, data []byte, schema, orderID, sku, reason string) error {
	seq, deliveries := uint64(0), 0
	if md, err := m.Metadata(); err == nil {
		seq, deliveries = md.Sequence.Stream, int(md.NumDelivered)
	}
	if !sale.ValidSKU(sku) {
		sku = malformed
	}
	msg := nats.NewMsg(DeadLetterPrefix + sku)
	msg.Data = data
	msg.Header.Set(hdrReason, truncate(reason, 1000))
	msg.Header.Set(hdrDeliveries, strconv.Itoa(deliveries))
	msg.Header.Set(hdrStreamSeq, strconv.FormatUint(seq, 10))
	msg.Header.Set(hdrOrderID, orderID)
	msg.Header.Set(hdrFailedAt, time.Now().UTC().Format(time.RFC3339Nano))
	setSchema(msg, schema)
	id := fmt.Sprintf("dlq-%d-%s", seq, orderID)
	if part >= 0 {
		id = fmt.Sprintf("dlq-%d-%d-%s", seq, part, orderID)
	}
	_, err := q.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(DeadLetterStream))
	if err != nil {
		return fmt.Errorf("orderqueue: dead-letter: %w", err)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func parseDeadLetter(rm *jetstream.RawStreamMsg) DeadLetter {
	d := DeadLetter{Seq: rm.Sequence, Data: rm.Data, SKU: strings.TrimPrefix(rm.Subject, DeadLetterPrefix)}
	if rm.Header != nil {
		d.Reason = rm.Header.Get(hdrReason)
		d.OrderID = rm.Header.Get(hdrOrderID)
		d.Deliveries, _ = strconv.Atoi(rm.Header.Get(hdrDeliveries))
		d.StreamSeq, _ = strconv.ParseUint(rm.Header.Get(hdrStreamSeq), 10, 64)
		d.FailedAt, _ = time.Parse(time.RFC3339Nano, rm.Header.Get(hdrFailedAt))
		d.Schema = rm.Header.Get(SchemaHeader)
	}
	return d
}

// DeadLetters lists up to limit dead letters, oldest first, starting at
// sequence after+1.
func (q *Queue) DeadLetters(ctx context.Context, after uint64, limit int) ([]DeadLetter, error) {
	info, err := q.dlq.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []DeadLetter
	if after >= info.State.LastSeq {
		return out, nil // also keeps after+1 from wrapping at the top of uint64
	}
	for seq := max(after+1, info.State.FirstSeq); seq <= info.State.LastSeq && len(out) < limit; seq++ {
		rm, err := q.dlq.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return out, err
		}
		out = append(out, parseDeadLetter(rm))
	}
	return out, nil
}

// DeadLetterCount returns how many dead letters are waiting.
func (q *Queue) DeadLetterCount(ctx context.Context) (uint64, error) {
	info, err := q.dlq.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// GetDeadLetter returns dead letter seq, or ErrNoDeadLetter.
func (q *Queue) GetDeadLetter(ctx context.Context, seq uint64) (DeadLetter, error) {
	rm, err := q.dlq.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, ErrNoDeadLetter
	}
	if err != nil {
		return DeadLetter{}, err
	}
	return parseDeadLetter(rm), nil
}

// DeleteDeadLetter removes dead letter seq (after a replay or a discard).
// Deleting one that is not there (deleted already) is nil.
func (q *Queue) DeleteDeadLetter(ctx context.Context, seq uint64) error {
	err := q.dlq.DeleteMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		// The broker's reason comes as text only ("sequence 2 not found",
		// "stream store EOF" past the last one), never ErrMsgNotFound:
		// ask whether the message is there.
		if _, gerr := q.dlq.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return nil
		}
	}
	return err
}

// Replay publishes a dead letter's reservation to the order stream again
// under a new message id (the original id may still be inside the broker's
// duplicate window). The database's idempotency log keeps it applied once.
// It keeps the payload's schema version.
func (q *Queue) Replay(ctx context.Context, d DeadLetter) error {
	return q.republish(ctx, d.SKU, d.Data, d.Schema, fmt.Sprintf("replay-%d-%s", d.Seq, d.OrderID))
}

// republish publishes data (of schema version schema) to sku's subject of
// the order stream under message id id.
func (q *Queue) republish(ctx context.Context, sku string, data []byte, schema, id string) error {
	msg := nats.NewMsg(SubjectPrefix + sku)
	msg.Data = data
	setSchema(msg, schema)
	_, err := q.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(StreamName))
	return err
}

// ReplayParts publishes each of parts (what dead letter d holds, see
// Parts) to the order stream as a version 1 message of its own, under a
// new message id; for a dead letter holding several reservations, which
// every release reads that way.
func (q *Queue) ReplayParts(ctx context.Context, d DeadLetter, parts []Part) error {
	for _, p := range parts {
		if err := q.republish(ctx, p.Reservation.SKU, p.Data, "1", fmt.Sprintf("replay-%d-%d-%s", d.Seq, p.Index, p.Reservation.OrderID)); err != nil {
			return err
		}
	}
	return nil
}

// Unapplied returns the reservations of sku that the stream holds and the
// consumer has not yet acknowledged, plus every dead letter of sku: the
// reservations that may still be in flight. Used to rebuild Redis after it
// lost its in-flight records. The caller filters out those the database
// already processed.
func (q *Queue) Unapplied(ctx context.Context, sku string) ([]sale.Reservation, error) {
	ci, err := q.consumer.Info(ctx)
	if err != nil {
		return nil, err
	}
	out, err := readAll(ctx, q.stream, SubjectPrefix+sku, ci.AckFloor.Stream+1)
	if err != nil {
		return nil, err
	}
	dead, err := readAll(ctx, q.dlq, DeadLetterPrefix+sku, 1)
	if err != nil {
		return nil, err
	}
	out = append(out, dead...)
	// A release before the schema header dead-letters a version 2 message
	// whole under _malformed (and replays it there): its reservations are
	// sku's too.
	for _, at := range []struct {
		st   jetstream.Stream
		subj string
		from uint64
	}{{q.stream, SubjectPrefix + malformed, ci.AckFloor.Stream + 1}, {q.dlq, DeadLetterPrefix + malformed, 1}} {
		if err := readMalformed(ctx, at.st, at.subj, at.from, func(_ string, r sale.Reservation) {
			if r.SKU == sku {
				out = append(out, r)
			}
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// malformed is the subject suffix of what cannot name its SKU.
const malformed = "_malformed"

// readMalformed is readEach of subject, a _malformed one, read only when
// it holds a message (a cheap look-up first: it almost never does).
func readMalformed(ctx context.Context, st jetstream.Stream, subject string, from uint64, f func(subject string, r sale.Reservation)) error {
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return err
	}
	if info.State.Subjects[subject] == 0 {
		return nil
	}
	return readEach(ctx, st, subject, from, f)
}

// UnappliedAll is Unapplied for every SKU at once, bucketed by SKU: the
// stream is read once from the consumer's ack floor, and the dead letters
// once, through one ordered consumer each, however many SKUs there are (a
// rebuild of thousands of SKUs would otherwise create a consumer per SKU
// and run into the broker's consumer limits).
func (q *Queue) UnappliedAll(ctx context.Context) (map[string][]sale.Reservation, error) {
	ci, err := q.consumer.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]sale.Reservation{}
	add := func(subject, prefix string, r sale.Reservation) {
		sku := strings.TrimPrefix(subject, prefix)
		if sku == malformed {
			sku = r.SKU // see Unapplied
		}
		out[sku] = append(out[sku], r)
	}
	if err := readEach(ctx, q.stream, SubjectPrefix+"*", ci.AckFloor.Stream+1, func(subj string, r sale.Reservation) {
		add(subj, SubjectPrefix, r)
	}); err != nil {
		return nil, err
	}
	if err := readEach(ctx, q.dlq, DeadLetterPrefix+"*", 1, func(subj string, r sale.Reservation) {
		add(subj, DeadLetterPrefix, r)
	}); err != nil {
		return nil, err
	}
	return out, nil
}

func readAll(ctx context.Context, st jetstream.Stream, subject string, from uint64) ([]sale.Reservation, error) {
	var out []sale.Reservation
	err := readEach(ctx, st, subject, from, func(_ string, r sale.Reservation) { out = append(out, r) })
	return out, err
}

// readEach calls f with every valid reservation of st on subject (a
// wildcard is fine) from sequence from up to the stream's last message when
// the read began, through one ordered consumer.
func readEach(ctx context.Context, st jetstream.Stream, subject string, from uint64, f func(subject string, r sale.Reservation)) error {
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs == 0 || from > info.State.LastSeq {
		return nil
	}
	// Every Fetch of an ordered consumer makes a new server-side consumer
	// ({prefix}_{n}) and deletes the previous one in a goroutine of its own
	// (nats.go), which on a busy server can still be pending when the read
	// returns. So every consumer of this read carries one prefix, and all of
	// them are deleted before it returns.
	prefix := "fs-read-" + rand.Text()
	oc, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    max(from, 1),
		// A backstop for the delete below (a process that dies mid-read):
		// the default keeps an idle ordered consumer for 5 minutes, and
		// thousands of them run into the broker's consumer limits.
		InactiveThreshold: 10 * time.Second,
		NamePrefix:        prefix,
	})
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		names := st.ConsumerNames(dctx)
		var ours []string
		for n := range names.Name() {
			if strings.HasPrefix(n, prefix+"_") {
				ours = append(ours, n)
			}
		}
		for _, n := range ours {
			_ = st.DeleteConsumer(dctx, n) // already gone: fine
		}
	}()
	// Read up to the last message the stream held when we started; an empty
	// fetch is retried a few times before giving up, so a slow server cannot
	// make the read stop short silently.
	ci, err := oc.Info(ctx)
	if err != nil {
		return err
	}
	if ci.NumPending == 0 {
		return nil
	}
	// Each fetch asks for what is still pending (at most 1,000): a fetch
	// asking for more than the stream holds waits out its whole MaxWait.
	want, lastSeq := ci.NumPending, uint64(0)
	for empty := 0; empty < 5; {
		batch, err := oc.Fetch(int(min(want, 1000)), jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			return err
		}
		n := 0
		var pending uint64
		for m := range batch.Messages() {
			n++
			// Every version this release reads: a rebuild that skipped
			// a version 2 message would count its reservations' units
			// as free.
			if v, ok := SchemaOf(m.Headers()); ok {
				parts, _ := Decode(v, m.Data(), "")
				for _, p := range parts {
					if p.Err == nil {
						f(m.Subject(), p.Reservation)
					}
				}
			}
			if md, err := m.Metadata(); err == nil {
				pending, lastSeq = md.NumPending, md.Sequence.Stream
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		switch {
		case n > 0 && pending == 0:
			return nil
		case n > 0:
			want = pending
		default:
			empty++
		}
	}
	return fmt.Errorf("orderqueue: reading %s: the stream stopped answering at sequence %d of %d", subject, lastSeq, info.State.LastSeq)
}

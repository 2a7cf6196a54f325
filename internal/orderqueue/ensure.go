package orderqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrMissing is returned (wrapped) by Missing and Ready when the broker
// answers but a stream or durable consumer of flashsale is gone: the
// broker was restarted on an empty store, or someone deleted it.
var ErrMissing = errors.New("orderqueue: missing on the broker")

// Missing asks the broker whether every stream and durable consumer exists.
// It returns an error wrapping ErrMissing that names what is gone, another
// error if the broker could not be asked, nil if all exist.
func (q *Queue) Missing(ctx context.Context) error {
	var gone []string
	var other error
	check := func(name string, err error) {
		switch {
		case err == nil:
		case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound),
			errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
			errors.Is(err, nats.ErrNoResponders): // connected, and nothing serves the JetStream API
			gone = append(gone, name)
		case other == nil:
			other = err
		}
	}
	_, err := q.js.Stream(ctx, StreamName)
	check("stream "+StreamName, err)
	if err == nil {
		_, err = q.js.Consumer(ctx, StreamName, ConsumerName)
		check("consumer "+ConsumerName, err)
	}
	_, err = q.js.Stream(ctx, DeadLetterStream)
	check("stream "+DeadLetterStream, err)
	q.mu.Lock()
	events := q.eventCfg != nil
	q.mu.Unlock()
	if events {
		_, err = q.js.Stream(ctx, EventStream)
		check("stream "+EventStream, err)
	}
	if len(gone) > 0 {
		return fmt.Errorf("%w: %s", ErrMissing, strings.Join(gone, ", "))
	}
	return other
}

// Ensure re-creates whatever Missing finds gone (streams with their
// configuration, durable consumers) and reports whether it did. Several
// instances may call it at once.
func (q *Queue) Ensure(ctx context.Context) (bool, error) {
	err := q.Missing(ctx)
	if !errors.Is(err, ErrMissing) {
		q.setMissing(nil)
		return false, err
	}
	q.setMissing(err)
	if cerr := q.create(ctx); cerr != nil {
		return false, fmt.Errorf("%v; re-creating: %w", err, cerr)
	}
	q.mu.Lock()
	ecfg := q.eventCfg
	q.mu.Unlock()
	if ecfg != nil {
		if cerr := q.EnsureEventStream(ctx, *ecfg); cerr != nil {
			return false, fmt.Errorf("%v; re-creating: %w", err, cerr)
		}
	}
	q.mu.Lock()
	q.recreated++
	q.mu.Unlock()
	q.setMissing(nil)
	return true, nil
}

func (q *Queue) setMissing(err error) {
	q.mu.Lock()
	q.missing = err
	q.mu.Unlock()
}

// Ready is the readiness check of the broker's state: an error while a
// stream or consumer is missing and not yet re-created (ErrMissing). A
// broker that cannot be reached is not reported here (purchases wait in the
// Redis outbox; Ping reports it).
func (q *Queue) Ready(ctx context.Context) error {
	q.mu.Lock()
	err := q.missing
	q.mu.Unlock()
	if err != nil {
		return err
	}
	if err := q.Missing(ctx); errors.Is(err, ErrMissing) {
		return err
	}
	return nil
}

// Recreated returns how many times Ensure re-created streams or consumers.
func (q *Queue) Recreated() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.recreated
}

// RunEnsure calls Ensure every period until ctx is done.
func (q *Queue) RunEnsure(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			did, err := q.Ensure(cctx)
			cancel()
			switch {
			case did:
				log.Warn("jetstream streams or consumers were missing: re-created them")
			case errors.Is(err, ErrMissing) && ctx.Err() == nil:
				log.Error("jetstream streams or consumers missing", "err", err)
			}
		}
	}
}

// Retain removes from the order stream the messages that are older than
// the retention (Config.MaxAge) and acknowledged by every durable consumer
// of the stream: it purges below the lowest ack floor, never past a message
// accepted within the retention. A message some consumer has not
// acknowledged (a long database outage, a message in a retry loop, an order
// whose payment timer runs) is never removed. It returns the messages purged.
func (q *Queue) Retain(ctx context.Context, now time.Time) (uint64, error) {
	info, err := q.stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	var floor uint64
	first := true
	names := q.stream.ListConsumers(ctx)
	for ci := range names.Info() {
		if ci.Config.Durable == "" {
			continue // ordered readers (rebuilds) hold no claim
		}
		if ci.Name == ExpiryConsumerName {
			// Retired; re-created by an instance of an older version
			// during a rolling upgrade: it holds no claim, it goes.
			if err := deleteRetired(ctx, q.stream); err != nil {
				return 0, err
			}
			continue
		}
		if first || ci.AckFloor.Stream < floor {
			floor, first = ci.AckFloor.Stream, false
		}
	}
	if err := names.Err(); err != nil {
		return 0, err
	}
	if first || floor < info.State.FirstSeq {
		return 0, nil
	}
	// Every message below upto is acknowledged by every durable consumer;
	// find the first of them accepted within the retention (stored in
	// order, so the times grow with the sequence).
	upto := floor + 1
	cutoff := now.Add(-q.cfg.MaxAge)
	lo, hi := info.State.FirstSeq, upto
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := q.stream.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(SubjectPrefix+"*"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			hi = mid
			continue
		}
		if err != nil {
			return 0, err
		}
		if m.Sequence >= upto || !m.Time.Before(cutoff) {
			hi = mid
		} else {
			lo = m.Sequence + 1
		}
	}
	if lo <= info.State.FirstSeq {
		return 0, nil
	}
	if err := q.stream.Purge(ctx, jetstream.WithPurgeSequence(lo)); err != nil {
		return 0, fmt.Errorf("orderqueue: retention purge: %w", err)
	}
	after, err := q.stream.Info(ctx)
	if err != nil || after.State.Msgs > info.State.Msgs {
		return 0, nil
	}
	return info.State.Msgs - after.State.Msgs, nil
}

// RunRetention calls Retain every period until ctx is done.
func (q *Queue) RunRetention(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			n, err := q.Retain(cctx, now)
			cancel()
			if err != nil && ctx.Err() == nil {
				log.Warn("order stream retention", "err", err)
			} else if n > 0 {
				log.Debug("order stream retention", "purged", n)
			}
		}
	}
}

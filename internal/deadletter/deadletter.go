// Package deadletter is what an operator can do with reservations the
// consumer gave up on: list them, replay them (apply again, exactly once) or
// discard them (record them failed and give their units back, exactly once).
// A dead-lettered reservation keeps its stock reserved until then.
package deadletter

import (
	"context"
	"errors"
	"fmt"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// Queue holds the dead letters.
type Queue interface {
	DeadLetters(ctx context.Context, after uint64, limit int) ([]orderqueue.DeadLetter, error)
	DeadLetterCount(ctx context.Context) (uint64, error)
	GetDeadLetter(ctx context.Context, seq uint64) (orderqueue.DeadLetter, error)
	DeleteDeadLetter(ctx context.Context, seq uint64) error
	Replay(ctx context.Context, d orderqueue.DeadLetter) error
	ReplayParts(ctx context.Context, d orderqueue.DeadLetter, parts []orderqueue.Part) error
}

// Store records a discarded reservation so it can never be applied.
type Store interface {
	Discard(ctx context.Context, r sale.Reservation) (already bool, status sale.Status, err error)
}

// Gate gives a discarded reservation's units back, once.
type Gate interface {
	Finalize(ctx context.Context, sku string, outcomes []stockgate.Outcome) (int64, error)
}

// ErrNotFound is returned when no dead letter has the sequence number.
var ErrNotFound = orderqueue.ErrNoDeadLetter

// Service runs operator actions on dead letters.
type Service struct {
	q     Queue
	store Store
	gate  Gate
}

// New returns a Service.
func New(q Queue, store Store, gate Gate) *Service { return &Service{q: q, store: store, gate: gate} }

// List returns up to limit dead letters after sequence after, and how many there are.
//
// The count is read before the page: the consumer may write a dead letter
// while List runs, and a count read after the page would include one the page
// never saw (a caller waiting for n dead letters would find one missing). Read
// first, the count only names dead letters that were there when the page was
// read: a page that is not full (from the start) holds at least that many,
// unless an operator removed one meanwhile.
func (s *Service) List(ctx context.Context, after uint64, limit int) ([]orderqueue.DeadLetter, uint64, error) {
	n, err := s.q.DeadLetterCount(ctx)
	if err != nil {
		return nil, 0, err
	}
	ds, err := s.q.DeadLetters(ctx, after, limit)
	if err != nil {
		return nil, 0, err
	}
	return ds, n, nil
}

// Action is what was done with a dead letter.
type Action struct {
	Seq           uint64 `json:"seq"`
	OrderID       string `json:"order_id"`
	Action        string `json:"action"` // replayed, discarded, already_applied, dropped_malformed
	UnitsReturned int64  `json:"units_returned"`
	// OrderIDs lists the reservations of a dead letter that held several
	// (a version 2 message a release before the schema header
	// dead-lettered whole); OrderID is then the first.
	OrderIDs []string `json:"order_ids,omitempty"`
	// Malformed counts the reservations of such a dead letter that could
	// not be read: they went with it (no units can be attributed to them).
	Malformed int `json:"malformed,omitempty"`
}

// ErrUnknownSchema: the dead letter is of a schema version this release
// does not read (a newer release wrote it); nothing was done with it.
var ErrUnknownSchema = orderqueue.ErrUnknownSchema

// Replay sends the reservation back to the order stream and removes the
// dead letter. Safe to repeat: the database applies a reservation once.
func (s *Service) Replay(ctx context.Context, seq uint64) (Action, error) {
	d, err := s.q.GetDeadLetter(ctx, seq)
	if err != nil {
		return Action{}, err
	}
	parts, invalid, err := d.Parts()
	if errors.Is(err, ErrUnknownSchema) {
		return Action{}, err
	}
	if err != nil {
		return Action{}, fmt.Errorf("%w: dead letter %d cannot be replayed (malformed); discard it", sale.ErrInvalid, seq)
	}
	a := Action{Seq: seq, OrderID: d.OrderID, Action: "replayed", Malformed: invalid}
	if parts[0].Batched {
		err = s.q.ReplayParts(ctx, d, parts)
		a.OrderID, a.OrderIDs = parts[0].Reservation.OrderID, orderIDs(parts)
	} else {
		err = s.q.Replay(ctx, d)
	}
	if err != nil {
		return Action{}, err
	}
	if err := s.q.DeleteDeadLetter(ctx, seq); err != nil {
		return Action{}, err
	}
	return a, nil
}

func orderIDs(parts []orderqueue.Part) []string {
	ids := make([]string, len(parts))
	for i, p := range parts {
		ids[i] = p.Reservation.OrderID
	}
	return ids
}

// Discard records the reservation as failed (reason "discarded") in the
// database, gives its units and the buyer's slot back in Redis, and removes
// the dead letter. Each step is idempotent, so a discard interrupted half
// way can be repeated. A reservation the database already applied is not
// discarded: only the dead letter goes. A dead letter holding several
// reservations (Action.OrderIDs) has each discarded so.
func (s *Service) Discard(ctx context.Context, seq uint64) (Action, error) {
	d, err := s.q.GetDeadLetter(ctx, seq)
	if err != nil {
		return Action{}, err
	}
	parts, invalid, perr := d.Parts()
	if errors.Is(perr, ErrUnknownSchema) {
		return Action{}, perr
	}
	if perr != nil {
		// Nothing decodable: no units can be attributed to it.
		if err := s.q.DeleteDeadLetter(ctx, seq); err != nil {
			return Action{}, err
		}
		return Action{Seq: seq, OrderID: d.OrderID, Action: "dropped_malformed"}, nil
	}
	a := Action{Seq: seq, OrderID: parts[0].Reservation.OrderID, Action: "discarded", Malformed: invalid}
	if parts[0].Batched {
		a.OrderIDs = orderIDs(parts)
	}
	live := 0
	for _, p := range parts {
		r := p.Reservation
		already, status, err := s.store.Discard(ctx, r)
		if err != nil {
			return Action{}, err
		}
		refused := !already || status == sale.StatusFailed || status == sale.StatusCancelled
		units, err := s.gate.Finalize(ctx, stockgate.BucketOf(r), []stockgate.Outcome{{OrderID: r.OrderID, Refused: refused && status != sale.StatusCancelled}})
		if err != nil {
			return Action{}, err
		}
		a.UnitsReturned += units
		if already && status.Live() {
			live++
		}
	}
	if err := s.q.DeleteDeadLetter(ctx, seq); err != nil {
		return Action{}, err
	}
	if live == len(parts) {
		a.Action = "already_applied"
	}
	return a, nil
}

// IsNotFound reports whether err means no such dead letter.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/crowd"
	"github.com/flashsale/flashsale/internal/room"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/ticket"
)

// Crowd is what the crowd routes need (docs/crowd.md): tickets, the
// waiting room and the risk lists.
type Crowd struct {
	Gate crowd.Gate
	// Room, if set, serves the waiting room's join and poll routes.
	Room Room
	// QueueLimit, if set, bounds one buyer's joins and polls of waiting
	// rooms on this instance (429 beyond): poll_after_ms is advice, and
	// a buyer who ignores it must not take the instance's budget.
	QueueLimit *BuyerLimit
	// Observe, if set, counts challenges issued and solved and refusals
	// by code (metrics.Metrics.Challenge).
	Observe func(result, reason string)
}

func (c Crowd) observe(result, reason string) {
	if c.Observe != nil {
		c.Observe(result, reason)
	}
}

// A purchase carries its proofs in the Flashsale-Ticket and
// Flashsale-Admission headers (orders.go). Headers, not body fields, so
// that the previous release, which refuses unknown body fields, takes the
// same purchases while both run.

// crowdSKU is the sale a crowd route names, from the catalog.
func (s *Server) crowdSKU(r *http.Request) (sale.SKU, error) {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return sale.SKU{}, errBadSKUID
	}
	sku, ok := s.buy.Catalog.Get(id)
	if !ok {
		return sale.SKU{}, sale.ErrUnknownSKU
	}
	return sku, nil
}

// getChallenge hands out a proof-of-work challenge in the altcha widget's
// format; its level and work are in headers (the body is the widget's).
func (s *Server) getChallenge(w http.ResponseWriter, r *http.Request) error {
	c := s.cfg.Crowd
	now := requestTime(r)
	sku, err := s.crowdSKU(r)
	if err != nil {
		return err
	}
	user := userOf(r)
	if err := s.Blocked(r, user); err != nil {
		return err
	}
	if c.Gate.Tickets == nil {
		return ticket.ErrNotRequired
	}
	ch, err := c.Gate.Tickets.Challenge(sku, user, now)
	if err != nil {
		return err
	}
	c.observe("issued", "")
	h := w.Header()
	h.Set("Flashsale-Challenge-Level", strconv.Itoa(ch.Level))
	h.Set("Flashsale-Challenge-Work", strconv.FormatUint(uint64(ch.Work), 10))
	h.Set("Flashsale-Challenge-Expires", ch.Expires.UTC().Format(time.RFC3339))
	setJSONHeaders(w)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(ch.Body, '\n'))
	return nil
}

type ticketRequest struct {
	// Payload is the widget's solution: base64 of its JSON.
	Payload *string `json:"payload"`
}

type ticketResponse struct {
	Ticket    string  `json:"ticket"`
	SKU       string  `json:"sku_id"`
	ValidFrom apiTime `json:"valid_from"`
	ExpiresAt apiTime `json:"expires_at"`
}

// postTicket turns a solved challenge into a ticket.
func (s *Server) postTicket(w http.ResponseWriter, r *http.Request) error {
	c := s.cfg.Crowd
	now := requestTime(r)
	sku, err := s.crowdSKU(r)
	if err != nil {
		return err
	}
	var req ticketRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Payload == nil || *req.Payload == "" {
		return invalid("payload is required: the altcha widget's solution (base64)")
	}
	user := userOf(r)
	if err := s.Blocked(r, user); err != nil {
		return err
	}
	if c.Gate.Tickets == nil {
		return ticket.ErrNotRequired
	}
	t, err := c.Gate.Tickets.Redeem(r.Context(), sku, user, *req.Payload, now)
	if err != nil {
		if !isTicketRefusal(err) {
			// The replay set could not say: the solution is not spent.
			return errors.Join(sale.ErrUnavailable, err)
		}
		c.observe("refused", codeOf(err))
		return err
	}
	status := http.StatusCreated
	if t.Repeat {
		status = http.StatusOK // the ticket this buyer's earlier redeem made
	} else {
		c.observe("solved", "")
	}
	from := t.ValidFrom
	if from.IsZero() {
		from = now
	}
	writeJSON(w, status, ticketResponse{Ticket: t.Token, SKU: sku.ID, ValidFrom: apiTime{from}, ExpiresAt: apiTime{t.Expires}})
	return nil
}

func isTicketRefusal(err error) bool {
	for _, e := range []error{sale.ErrRateLimited, ticket.ErrMalformed, ticket.ErrForged, ticket.ErrWrongSolution, ticket.ErrExpired,
		ticket.ErrOtherBuyer, ticket.ErrOtherSale, ticket.ErrReplayed, ticket.ErrNotRequired} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// codeOf is the API error code err answers with.
func codeOf(err error) string {
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return "internal"
}

// Room is the waiting room (room.Room) as the queue routes use it.
type Room interface {
	Join(ctx context.Context, s room.Settings, user string) (room.Status, error)
	Poll(ctx context.Context, s room.Settings, user string) (room.Status, error)
}

// RoomSettings is a sale's waiting room as the room package takes it.
func RoomSettings(sku sale.SKU) room.Settings {
	return room.Settings{SKU: sku.ID, OpensAt: sku.StartsAt, Rate: float64(sku.Crowd.AdmissionRate)}
}

type queueResponse struct {
	State       string   `json:"state"`
	Position    *int64   `json:"position,omitempty"`
	Ahead       *int64   `json:"ahead,omitempty"`
	ETASeconds  *float64 `json:"eta_seconds,omitempty"`
	PollAfterMS *int64   `json:"poll_after_ms,omitempty"`
	Admission   string   `json:"admission,omitempty"`
	ExpiresAt   *apiTime `json:"expires_at,omitempty"`
}

func queueJSON(st room.Status) queueResponse {
	q := queueResponse{State: st.State, Admission: st.Admission}
	switch st.State {
	case room.StateWaiting:
		eta := st.ETASeconds
		if eta >= 0 {
			eta = float64(int64(eta*10+0.5)) / 10
		}
		poll := st.PollAfter.Milliseconds()
		q.Position, q.Ahead, q.ETASeconds, q.PollAfterMS = &st.Position, &st.Ahead, &eta, &poll
	case room.StateAdmitted, room.StateExpired:
		q.ExpiresAt = timePtr(st.ExpiresAt)
	case room.StateSoldOut:
		if st.PollAfter > 0 {
			poll := st.PollAfter.Milliseconds()
			q.PollAfterMS = &poll
		}
	}
	return q
}

// joinQueue joins the sale's waiting room (idempotent per buyer); with
// tickets, a valid ticket first. getQueue polls it.
func (s *Server) joinQueue(w http.ResponseWriter, r *http.Request) error {
	return s.queue(w, r, true)
}

func (s *Server) getQueue(w http.ResponseWriter, r *http.Request) error {
	return s.queue(w, r, false)
}

func (s *Server) queue(w http.ResponseWriter, r *http.Request, join bool) error {
	c := s.cfg.Crowd
	now := requestTime(r)
	sku, err := s.crowdSKU(r)
	if err != nil {
		return err
	}
	user := userOf(r)
	if err := s.Blocked(r, user); err != nil {
		return err
	}
	if wait, ok := c.QueueLimit.Allow(user, now); !ok {
		return &sale.RateLimitError{Scope: "user", RetryAfter: wait}
	}
	if !sku.Crowd.WaitingRoom {
		return errNoWaitingRoom
	}
	if !sku.EndsAt.IsZero() && !now.Before(sku.EndsAt) {
		return sale.ErrSaleEnded
	}
	if c.Room == nil {
		return room.ErrUnavailable
	}
	if join && sku.Crowd.TicketRequired {
		if c.Gate.Tickets == nil {
			return ticket.ErrInvalidTicket
		}
		if err := c.Gate.Tickets.Check(headerValue(r.Header, "Flashsale-Ticket"), sku, user, ticketTime(sku, now)); err != nil {
			return err
		}
	}
	var st room.Status
	if join {
		st, err = c.Room.Join(r.Context(), RoomSettings(sku), user)
	} else {
		st, err = c.Room.Poll(r.Context(), RoomSettings(sku), user)
	}
	if err != nil {
		return err
	}
	status := http.StatusOK
	if join {
		status = http.StatusCreated
	}
	writeJSON(w, status, queueJSON(st))
	return nil
}

// ticketTime is when a ticket is checked for joining the queue: a ticket is
// good from the sale's start, and a buyer joins before it, so a join before
// the start checks the ticket as of the start.
func ticketTime(sku sale.SKU, now time.Time) time.Time {
	if now.Before(sku.StartsAt) {
		return sku.StartsAt
	}
	return now
}

// errNoWaitingRoom is the 409 of a queue route of a sale without a room.
var errNoWaitingRoom = errors.New("the sale has no waiting room")

// BuyerLimit is a per-buyer budget of requests per second on this
// instance: a fixed one-second window per buyer, in two generations of
// maps so that its memory is bounded and a flood of ids drops the buyers
// untouched longest, not every buyer's count at once. A nil BuyerLimit
// allows everything.
type BuyerLimit struct {
	PerSecond int
	mu        sync.Mutex
	cur, prev map[string]buyerWindow
}

type buyerWindow struct {
	sec int64
	n   int
}

// maxBuyerEntries bounds the buyers a BuyerLimit remembers.
const maxBuyerEntries = 200_000

// Allow counts a request of user at now and reports whether it is within
// the budget, else how long until the next second.
func (l *BuyerLimit) Allow(user string, now time.Time) (time.Duration, bool) {
	if l == nil || l.PerSecond <= 0 {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.cur[user]
	if !ok {
		w = l.prev[user]
	}
	if sec := now.Unix(); w.sec != sec {
		w = buyerWindow{sec: sec}
	}
	if w.n >= l.PerSecond {
		return time.Until(time.Unix(w.sec+1, 0)), false
	}
	w.n++
	if l.cur == nil {
		l.cur = map[string]buyerWindow{}
	}
	if _, ok := l.cur[user]; !ok && len(l.cur) >= maxBuyerEntries/2 {
		l.prev, l.cur = l.cur, map[string]buyerWindow{}
	}
	l.cur[user] = w
	return 0, true
}

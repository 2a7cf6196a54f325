package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/deadletter"
	"github.com/flashsale/flashsale/internal/room"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/ticket"
)

// errorCodes maps an error to its HTTP status, stable machine-readable code
// and the fixed sentence shown to clients. This table is the API contract
// for errors (docs/api.md and api/openapi.yaml list it). The text of the error
// itself never reaches a client (it may name packages, drivers, addresses):
// it goes to the log. Only a detail written for clients (a *publicError,
// made by this package's input checks) replaces the sentence.
var errorCodes = []struct {
	err     error
	status  int
	code    string
	message string
}{
	{sale.ErrInvalidBuckets, http.StatusBadRequest, "invalid_buckets", "buckets must be a whole number 1..64."},
	{ticket.ErrMalformed, http.StatusBadRequest, "solution_malformed", "The payload is not a solved challenge (base64 of the altcha widget's JSON)."},
	{ticket.ErrForged, http.StatusForbidden, "challenge_forged", "The challenge was not issued by this service."},
	{ticket.ErrWrongSolution, http.StatusForbidden, "solution_wrong", "The challenge is not solved; it is spent: get a new one."},
	{ticket.ErrExpired, http.StatusGone, "challenge_expired", "The challenge has expired: get a new one."},
	{ticket.ErrOtherBuyer, http.StatusForbidden, "challenge_other_buyer", "The challenge was issued to another buyer."},
	{ticket.ErrOtherSale, http.StatusForbidden, "challenge_other_sale", "The challenge was issued for another sale (or before this one was rescheduled)."},
	{ticket.ErrReplayed, http.StatusConflict, "challenge_used", "The challenge has already been used: get a new one."},
	{ticket.ErrNotOpen, http.StatusConflict, "tickets_not_open", "Tickets for this sale are not handed out yet."},
	{ticket.ErrNotRequired, http.StatusConflict, "ticket_not_required", "This sale needs no ticket."},
	{sale.ErrTicketRequired, http.StatusForbidden, "ticket_required", "This sale needs a valid ticket: solve its challenge first."},
	{sale.ErrNotAdmitted, http.StatusForbidden, "not_admitted", "This sale has a waiting room: buy once it admits you."},
	{deadletter.ErrUnknownSchema, http.StatusConflict, "dead_letter_schema_unknown", "The dead letter is of a schema version this release does not read: replay or discard it with a release that does; nothing was changed."},
	{errFleetNotReady, http.StatusConflict, "fleet_not_ready", "An instance runs a release that does not enforce tickets or waiting rooms; nothing was changed."},
	{errNoWaitingRoom, http.StatusConflict, "no_waiting_room", "This sale has no waiting room: buy directly."},
	{room.ErrNotInQueue, http.StatusNotFound, "not_in_queue", "You have not joined this sale's waiting room: join it first (POST)."},
	{room.ErrUnavailable, http.StatusServiceUnavailable, "room_unavailable", "The waiting room cannot answer now; keep your place and retry shortly."},
	{sale.ErrInvalid, http.StatusBadRequest, "invalid_request", "The request is invalid."},
	{errUnauthenticated, http.StatusUnauthorized, "unauthenticated", "Authentication is missing or not valid."},
	{errAdminDisabled, http.StatusForbidden, "admin_disabled", "The admin API is disabled on this instance."},
	{sale.ErrBlocked, http.StatusForbidden, "blocked", "You may not take part in this sale. If you think this is a mistake, contact support."},
	{sale.ErrUnknownSKU, http.StatusNotFound, "unknown_sku", "There is no sale for this SKU."},
	{sale.ErrOrderNotFound, http.StatusNotFound, "order_not_found", "There is no such order."},
	{sale.ErrUnknownRiskEntry, http.StatusNotFound, "unknown_risk_entry", "There is no such risk list entry (or it was removed)."},
	{errNotFound, http.StatusNotFound, "not_found", "There is no such route."},
	{errMethod, http.StatusMethodNotAllowed, "method_not_allowed", "The route does not allow this method."},
	{sale.ErrSoldOut, http.StatusConflict, "sold_out", "Fewer units are left than asked for."},
	{sale.ErrLimitReached, http.StatusConflict, "limit_reached", "The purchase would exceed the per-user limit."},
	{sale.ErrSaleNotOpen, http.StatusConflict, "sale_not_started", "The sale has not started yet."},
	{sale.ErrSaleEnded, http.StatusConflict, "sale_ended", "The sale has ended."},
	{sale.ErrStockConflict, http.StatusConflict, "stock_conflict", "More units are sold or reserved than the new stock allows; nothing was changed."},
	{sale.ErrBucketsInFlight, http.StatusConflict, "buckets_in_flight", "The sale has reservations in flight, so its number of stock buckets cannot change now; nothing was changed. Retry in a moment."},
	{sale.ErrOrderExpired, http.StatusConflict, "order_expired", "The order was cancelled or its payment deadline has passed."},
	{sale.ErrOrderPaid, http.StatusConflict, "order_paid", "The order is paid."},
	{sale.ErrOrderFailed, http.StatusConflict, "order_failed", "The order failed: it never held stock."},
	{sale.ErrNoHistory, http.StatusConflict, "no_history", "The sale has not started, or nothing of it was counted yet: there is nothing to record."},
	{sale.ErrOrderQueued, http.StatusConflict, "order_queued", "The order is still queued; retry in a moment."},
	{errCallbackDisabled, http.StatusForbidden, "callback_disabled", "Payment callbacks are disabled: no payment secret is configured."},
	{errTooLarge, http.StatusRequestEntityTooLarge, "body_too_large", "The request body is larger than 8 KiB."},
	{errHeaderTooLarge, http.StatusRequestHeaderFieldsTooLarge, "header_too_large", "The request line and headers are larger than 16 KiB."},
	{errMediaType, http.StatusUnsupportedMediaType, "unsupported_media_type", "The Content-Type must be application/json (PATCH also takes application/merge-patch+json)."},
	{sale.ErrRateLimited, http.StatusTooManyRequests, "rate_limited", "Too many requests; retry after the Retry-After seconds."},
	{sale.ErrBusy, http.StatusServiceUnavailable, "busy", ""}, // busyMessage
	{errNoDeadLetter, http.StatusNotFound, "dead_letter_not_found", "There is no dead letter with this sequence number."},
	{sale.ErrUnavailable, http.StatusServiceUnavailable, "unavailable", "The service is temporarily unavailable; retry shortly."},
	{sale.ErrNotWarmed, http.StatusServiceUnavailable, "unavailable", "The service is temporarily unavailable; retry shortly."},
	// Last, so that a more specific error wrapped beside it wins: the work
	// ran out of its time (the request's deadline passed in a database or
	// Redis call), which a retry may finish; never a fault of the service.
	{context.DeadlineExceeded, http.StatusServiceUnavailable, "unavailable", "The service is temporarily unavailable; retry shortly."},
	// A failure Config.Transient calls transient (a lock wait the database
	// gave up, a lost connection): a retry may not meet it.
	{errTransient, http.StatusServiceUnavailable, "unavailable", "The service is temporarily unavailable; retry shortly."},
}

// errTransient marks an error Config.Transient calls transient.
var errTransient = errors.New("transient failure")

// internalMessage is the message of 500 internal.
const internalMessage = "Internal error."

var (
	errNotFound         = errors.New("no such route")
	errMethod           = errors.New("method not allowed")
	errTooLarge         = errors.New("request body too large")
	errMediaType        = errors.New("Content-Type must be application/json")
	errNoDeadLetter     = errors.New("no such dead letter")
	errCallbackDisabled = errors.New("payment callbacks are disabled: no payment secret configured")
)

// publicError is an error whose message was written for clients (it names
// only what the client sent and the rule it broke). It wraps the sentinel
// that picks its code.
type publicError struct {
	base error
	msg  string
}

func (e *publicError) Error() string { return e.msg }
func (e *publicError) Unwrap() error { return e.base }

// invalid returns a 400 invalid_request whose message is shown as written.
func invalid(format string, args ...any) error {
	return &publicError{base: sale.ErrInvalid, msg: fmt.Sprintf(format, args...)}
}

// busyMessage is the message of 503 busy, in the buyer's language.
func busyMessage(r *http.Request) string {
	const zh, en = "活动火爆，请稍后重试", "The sale is very busy, please try again shortly"
	al := strings.ToLower(r.Header.Get("Accept-Language"))
	switch {
	case strings.HasPrefix(al, "zh"):
		return zh
	case strings.HasPrefix(al, "en"):
		return en
	}
	return zh + " / " + en
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// errorBodies are the answers of the errorCodes entries with their fixed
// message, encoded once (writeJSON's encoding of an errorBody); internalBody
// is that of 500 internal.
var errorBodies, internalBody = func() ([][]byte, []byte) {
	enc := func(code, msg string) []byte {
		var b errorBody
		b.Error.Code, b.Error.Message = code, msg
		j, err := json.Marshal(b)
		if err != nil {
			panic(err)
		}
		return append(j, '\n')
	}
	bodies := make([][]byte, len(errorCodes))
	for i, e := range errorCodes {
		bodies[i] = enc(e.code, e.message)
	}
	return bodies, enc("internal", internalMessage)
}()

// writeError answers err with its status, code and the code's fixed
// message (or the client-facing detail of a *publicError). Unknown errors
// are 500 internal. The error's own text goes to the log only: at error
// level for 500, info for other 5xx, debug for 4xx.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	writeErrorFor(w, r, log, err, "", "")
}

// writeErrorFor is writeError for a routed request: its log lines, if any
// are written, carry the request id and route. An answer with a fixed
// message is written from errorBodies.
func writeErrorFor(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error, rid, route string) {
	var b errorBody
	status := http.StatusInternalServerError
	b.Error.Code = "internal"
	b.Error.Message = internalMessage
	fixed := internalBody
	for i, e := range errorCodes {
		if errors.Is(err, e.err) {
			status, b.Error.Code, b.Error.Message, fixed = e.status, e.code, e.message, errorBodies[i]
			break
		}
	}
	detail := err
	if pe, ok := errors.AsType[*publicError](err); ok && status != http.StatusInternalServerError {
		b.Error.Message, detail, fixed = pe.msg, pe.base, nil
	}
	if b.Error.Code == "busy" {
		b.Error.Message, fixed = busyMessage(r), nil
	}
	level := slog.LevelDebug
	switch {
	case status == http.StatusInternalServerError:
		level = slog.LevelError
	case status >= 500:
		level = slog.LevelInfo
	}
	if ctx := r.Context(); log.Enabled(ctx, level) {
		if rid != "" {
			log = log.With("request_id", rid, "route", route)
		}
		if status == http.StatusInternalServerError {
			log.ErrorContext(ctx, "http: internal error", "err", err)
		} else {
			log.Log(ctx, level, "http: "+b.Error.Code, "status", status, "err", detail)
		}
	}
	if status == http.StatusServiceUnavailable {
		w.Header()["Retry-After"] = []string{"1"}
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", wwwAuthenticate(err))
	}
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", retryAfter(err))
	}
	if fixed != nil {
		setJSONHeaders(w)
		w.WriteHeader(status)
		_, _ = w.Write(fixed)
		return
	}
	writeJSON(w, status, b)
}

// retryAfter is the Retry-After of a rate limit refusal: whole seconds,
// rounded up, at least 1.
func retryAfter(err error) string {
	secs := int64(1)
	if rl, ok := errors.AsType[*sale.RateLimitError](err); ok {
		secs = max(1, int64((rl.RetryAfter+time.Second-1)/time.Second))
	}
	return strconv.FormatInt(secs, 10)
}

// The values of the headers of every JSON answer, shared by all (net/http
// only reads them; the capacity is the length, so an append copies).
var (
	jsonContentType = []string{"application/json; charset=utf-8"}[:1:1]
	noStore         = []string{"no-store"}[:1:1]
)

func setJSONHeaders(w http.ResponseWriter) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	setJSONHeaders(w)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// acceptedBufs hold the answers writeAccepted composes.
var acceptedBufs = sync.Pool{New: func() any { b := make([]byte, 0, 128); return &b }}

// writeAccepted answers 202 with an orderAccepted, composed by hand when
// both strings need no escaping (an order id and a status always), else
// through writeJSON; the bytes are the same.
func writeAccepted(w http.ResponseWriter, orderID, status string) {
	if !plainJSON(orderID) || !plainJSON(status) {
		writeJSON(w, http.StatusAccepted, orderAccepted{OrderID: orderID, Status: status})
		return
	}
	bp := acceptedBufs.Get().(*[]byte)
	b := append((*bp)[:0], `{"order_id":"`...)
	b = append(b, orderID...)
	b = append(b, `","status":"`...)
	b = append(b, status...)
	b = append(b, "\"}\n"...)
	setJSONHeaders(w)
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(b)
	*bp = b
	acceptedBufs.Put(bp)
}

// plainJSON reports whether encoding/json writes s as it is between quotes:
// printable ASCII without quote, backslash or the HTML characters it escapes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if !plainByte[s[i]] {
			return false
		}
	}
	return true
}

// plainByte[c] says whether encoding/json writes byte c of a string as it is.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

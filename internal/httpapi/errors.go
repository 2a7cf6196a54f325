package httpapi

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// errorCode maps an error to its HTTP status and stable machine-readable code.
// This table is the API contract for errors (README lists it).
var errorCodes = []struct {
	err    error
	status int
	code   string
}{
	{sale.ErrInvalid, http.StatusBadRequest, "invalid_request"},
	{errUnauthenticated, http.StatusUnauthorized, "unauthenticated"},
	{errAdminDisabled, http.StatusForbidden, "admin_disabled"},
	{sale.ErrUnknownSKU, http.StatusNotFound, "unknown_sku"},
	{sale.ErrOrderNotFound, http.StatusNotFound, "order_not_found"},
	{errNotFound, http.StatusNotFound, "not_found"},
	{errMethod, http.StatusMethodNotAllowed, "method_not_allowed"},
	{sale.ErrSoldOut, http.StatusConflict, "sold_out"},
	{sale.ErrLimitReached, http.StatusConflict, "limit_reached"},
	{sale.ErrSaleNotOpen, http.StatusConflict, "sale_not_started"},
	{sale.ErrSaleEnded, http.StatusConflict, "sale_ended"},
	{sale.ErrStockConflict, http.StatusConflict, "stock_conflict"},
	{sale.ErrOrderExpired, http.StatusConflict, "order_expired"},
	{sale.ErrOrderPaid, http.StatusConflict, "order_paid"},
	{sale.ErrOrderFailed, http.StatusConflict, "order_failed"},
	{sale.ErrOrderQueued, http.StatusConflict, "order_queued"},
	{errCallbackDisabled, http.StatusForbidden, "callback_disabled"},
	{errTooLarge, http.StatusRequestEntityTooLarge, "body_too_large"},
	{errMediaType, http.StatusUnsupportedMediaType, "unsupported_media_type"},
	{sale.ErrRateLimited, http.StatusTooManyRequests, "rate_limited"},
	{sale.ErrBusy, http.StatusServiceUnavailable, "busy"},
	{errNoDeadLetter, http.StatusNotFound, "dead_letter_not_found"},
	{sale.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
	{sale.ErrNotWarmed, http.StatusServiceUnavailable, "unavailable"},
}

var (
	errNotFound         = errors.New("no such route")
	errMethod           = errors.New("method not allowed")
	errTooLarge         = errors.New("request body too large")
	errMediaType        = errors.New("Content-Type must be application/json")
	errNoDeadLetter     = errors.New("no such dead letter")
	errCallbackDisabled = errors.New("payment callbacks are disabled: no payment secret configured")
)

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

// writeError answers err with its status and code. Unknown errors are 500
// with a generic message, and logged.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	var b errorBody
	status := http.StatusInternalServerError
	b.Error.Code = "internal"
	b.Error.Message = "internal error"
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			status, b.Error.Code, b.Error.Message = e.status, e.code, err.Error()
			break
		}
	}
	if b.Error.Code == "busy" {
		b.Error.Message = busyMessage(r)
	}
	if status == http.StatusInternalServerError {
		log.ErrorContext(r.Context(), "http: internal error", "err", err)
	}
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", retryAfter(err))
	}
	writeJSON(w, status, b)
}

// retryAfter is the Retry-After of a rate limit refusal: whole seconds,
// rounded up, at least 1.
func retryAfter(err error) string {
	secs := int64(1)
	var rl *sale.RateLimitError
	if errors.As(err, &rl) {
		secs = max(1, int64((rl.RetryAfter+time.Second-1)/time.Second))
	}
	return strconv.FormatInt(secs, 10)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

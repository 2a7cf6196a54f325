package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/sale"
)

// orderRequest is the body of POST /api/v1/orders.
type orderRequest struct {
	SKU      string `json:"sku_id"`
	Quantity *int64 `json:"quantity"`
}

type orderAccepted struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
}

func (s *Server) createOrder(w http.ResponseWriter, r *http.Request) error {
	body, buf, err := readPooled(w, r)
	if err != nil {
		return err
	}
	req, err := decodeOrder(body, s.buy.Catalog)
	if buf != nil {
		bodyBufs.Put(buf)
	}
	if err != nil {
		return err
	}
	key := headerValue(r.Header, "Idempotency-Key")
	res, err := s.buy.Buy(r.Context(), purchase.Request{
		User: userOf(r), SKU: req.SKU, Quantity: req.Quantity, IdempotencyKey: key, ClientIP: peerIP(r),
		Ticket: headerValue(r.Header, "Flashsale-Ticket"), Admission: headerValue(r.Header, "Flashsale-Admission"),
		Blocked: s.Blocked(r, userOf(r)),
	})
	if errors.Is(err, sale.ErrInvalid) {
		return orderInputError(err, req.SKU, req.Quantity, key)
	}
	if err != nil {
		return err
	}
	if res.Order != nil && res.Order.Status != sale.StatusQueued {
		// A retry of a purchase the database has decided: its order, as
		// GET /api/v1/orders/{id} shows it.
		writeJSON(w, http.StatusOK, orderJSON(*res.Order))
		return nil
	}
	writeAccepted(w, res.OrderID, string(res.Status))
	return nil
}

// orderInputError names the input rule of the purchase path (purchase.Buy)
// that err reports broken, in words written for the client.
func orderInputError(err error, sku string, qty int64, key string) error {
	msg := "the purchase request is invalid"
	switch {
	case !sale.ValidSKU(sku):
		msg = "sku_id must be 1-64 characters of A-Z a-z 0-9 _ -"
	case qty < 1 || qty > sale.MaxQuantity:
		msg = fmt.Sprintf("quantity must be 1..%d", sale.MaxQuantity)
	case key != "" && !sale.ValidIdempotencyKey(key):
		msg = fmt.Sprintf("Idempotency-Key must be 1-%d printable ASCII characters", sale.MaxIdempotencyKey)
	}
	return &publicError{base: err, msg: msg}
}

type orderResponse struct {
	OrderID      string   `json:"order_id"`
	SKU          string   `json:"sku_id"`
	User         string   `json:"user_id"`
	Quantity     int64    `json:"quantity"`
	Status       string   `json:"status"`
	CreatedAt    apiTime  `json:"created_at"`
	FailReason   string   `json:"fail_reason,omitempty"`
	ExpiresAt    *apiTime `json:"expires_at"`
	PaidAt       *apiTime `json:"paid_at"`
	CancelledAt  *apiTime `json:"cancelled_at"`
	CancelReason string   `json:"cancel_reason,omitempty"`
	PaymentRef   string   `json:"payment_ref,omitempty"`
}

func orderJSON(o sale.Order) orderResponse {
	return orderResponse{OrderID: o.ID, SKU: o.SKU, User: o.User, Quantity: o.Quantity,
		Status: string(o.Status), CreatedAt: apiTime{o.CreatedAt}, FailReason: o.FailReason,
		ExpiresAt: apiTimeOf(o.ExpiresAt), PaidAt: apiTimeOf(o.PaidAt), CancelledAt: apiTimeOf(o.CancelledAt), CancelReason: o.CancelReason,
		PaymentRef: o.PaymentRef}
}

func (s *Server) getOrder(w http.ResponseWriter, r *http.Request) error {
	o, err := s.buy.Order(r.Context(), userOf(r), r.PathValue("order_id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, orderJSON(o))
	return nil
}

// payRequest is the optional body of POST /api/v1/orders/{order_id}/pay.
type payRequest struct {
	PaymentRef string `json:"payment_ref"`
}

func (s *Server) payOrder(w http.ResponseWriter, r *http.Request) error {
	var req payRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			return err
		}
	}
	if len(req.PaymentRef) > 128 {
		return invalid("payment_ref longer than 128")
	}
	o, err := s.cfg.Lifecycle.Pay(r.Context(), userOf(r), r.PathValue("order_id"), req.PaymentRef)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, orderJSON(o))
	return nil
}

func (s *Server) cancelOrder(w http.ResponseWriter, r *http.Request) error {
	o, err := s.cfg.Lifecycle.Cancel(r.Context(), userOf(r), r.PathValue("order_id"))
	if err != nil {
		return err
	}
	status := http.StatusOK
	if o.Status == sale.StatusQueued {
		// Cancelled when it lands.
		status = http.StatusAccepted
	}
	writeJSON(w, status, orderJSON(o))
	return nil
}

// callbackRequest is the body of POST /api/v1/payments/callback.
type callbackRequest struct {
	OrderID    string `json:"order_id"`
	PaymentRef string `json:"payment_ref"`
}

// paymentCallback is the payment provider's notification that an order was
// paid. It is authenticated by X-Flashsale-Signature: sha256=<hex HMAC-SHA256
// of the raw body with the payment secret>, compared in constant time.
func (s *Server) paymentCallback(w http.ResponseWriter, r *http.Request) error {
	if s.cfg.PaymentSecret == "" {
		return errCallbackDisabled
	}
	body, err := readBody(w, r, "application/json")
	if err != nil {
		return err
	}
	if !validSignature(s.cfg.PaymentSecret, body, r.Header.Get("X-Flashsale-Signature")) {
		return errUnauthenticated
	}
	var req callbackRequest
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	if len(req.PaymentRef) > 128 {
		return invalid("payment_ref longer than 128")
	}
	o, err := s.cfg.Lifecycle.Pay(r.Context(), "", req.OrderID, req.PaymentRef)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, orderJSON(o))
	return nil
}

func timePtr(t time.Time) *apiTime {
	if t.IsZero() {
		return nil
	}
	return &apiTime{t}
}

// apiTimeOf is *t as the API writes it (nil for nil).
func apiTimeOf(t *time.Time) *apiTime {
	if t == nil {
		return nil
	}
	return &apiTime{*t}
}

// apiTime is a time as every response writes it: UTC, RFC 3339 with
// milliseconds, always three digits (2026-01-02T15:04:05.120Z), whichever
// store it came from (Redis keeps milliseconds, the databases
// microseconds) and whatever its trailing zeros.
type apiTime struct{ time.Time }

// apiTimeLayout is apiTime's format.
const apiTimeLayout = "2006-01-02T15:04:05.000Z07:00"

func (t apiTime) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(apiTimeLayout)+2)
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, apiTimeLayout)
	return append(b, '"'), nil
}

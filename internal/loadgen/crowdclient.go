package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// The crowd routes (docs/crowd.md, docs/waiting-room.md) as a buyer's
// browser calls them: a challenge, its solution for a ticket, the waiting
// room's join and poll, and the purchase with the ticket and admission.

// Challenge fetches a proof-of-work challenge of sku for user; body is the
// widget's JSON (what altcha.Solve takes) when r.Status is 200.
func (c *Client) Challenge(ctx context.Context, user, sku string) (body []byte, r Reply) {
	r, raw := c.doRaw(ctx, http.MethodGet, "/api/v1/skus/"+sku+"/challenge", c.token(user), nil)
	return raw, r
}

// Ticket redeems a solved challenge's payload for a ticket of sku.
func (c *Client) Ticket(ctx context.Context, user, sku, payload string) (ticket string, r Reply) {
	body, _ := json.Marshal(map[string]string{"payload": payload})
	r, raw := c.doRaw(ctx, http.MethodPost, "/api/v1/skus/"+sku+"/ticket", c.token(user), body)
	var t struct {
		Ticket string `json:"ticket"`
	}
	if r.Status == http.StatusCreated {
		_ = json.Unmarshal(raw, &t)
	}
	return t.Ticket, r
}

// QueueStatus is the waiting room's answer to a join or a poll.
type QueueStatus struct {
	State       string   `json:"state"` // waiting, admitted, sold_out or expired
	Position    *int64   `json:"position"`
	ETASeconds  *float64 `json:"eta_seconds"` // -1: unknown
	PollAfterMS *int64   `json:"poll_after_ms"`
	Admission   string   `json:"admission"`
}

// Queue joins sku's waiting room with ticket (join) or polls it.
func (c *Client) Queue(ctx context.Context, user, sku, ticket string, join bool) (QueueStatus, Reply) {
	method, header := http.MethodGet, []string(nil)
	if join {
		method, header = http.MethodPost, []string{"Flashsale-Ticket", ticket}
	}
	r, raw := c.doRaw(ctx, method, "/api/v1/skus/"+sku+"/queue", c.token(user), nil, header...)
	var st QueueStatus
	if r.Status == http.StatusOK || r.Status == http.StatusCreated {
		_ = json.Unmarshal(raw, &st)
	}
	return st, r
}

// BuyAdmitted buys one unit of sku as user with an Idempotency-Key and the
// ticket and admission (either may be empty: sent without it).
func (c *Client) BuyAdmitted(ctx context.Context, user, sku, key, ticket, admission string) Reply {
	body := []byte(`{"sku_id":"` + sku + `","quantity":1}`)
	h := []string{"Idempotency-Key", key}
	if ticket != "" {
		h = append(h, "Flashsale-Ticket", ticket)
	}
	if admission != "" {
		h = append(h, "Flashsale-Admission", admission)
	}
	r := c.do(ctx, http.MethodPost, "/api/v1/orders", c.token(user), body, h...)
	if r.Status == http.StatusOK && r.OrderID != "" {
		r.Status, r.Code = http.StatusAccepted, "accepted" // a retry the database decided
	}
	return r
}

// PutSale creates or replaces a sale through the admin API with body (the
// PUT /admin/v1/skus/{id} JSON, crowd settings included).
func (c *Client) PutSale(ctx context.Context, sku string, body []byte) error {
	return c.admin2xx(ctx, http.MethodPut, sku, body)
}

// PatchSale changes some fields of a sale (a JSON merge patch).
func (c *Client) PatchSale(ctx context.Context, sku string, body []byte) error {
	return c.admin2xx(ctx, http.MethodPatch, sku, body)
}

func (c *Client) admin2xx(ctx context.Context, method, sku string, body []byte) error {
	r := c.do(ctx, method, "/admin/v1/skus/"+sku, c.admin, body)
	if r.Status/100 != 2 {
		if r.Err != nil {
			return fmt.Errorf("%s sku %s: %w", method, sku, r.Err)
		}
		return fmt.Errorf("%s sku %s: HTTP %d %s", method, sku, r.Status, r.Code)
	}
	return nil
}

// retryable reports whether r decided nothing (no answer, 429, 5xx): the
// buyer tries again after a pause.
func retryable(r Reply) bool {
	return r.Status == 0 || r.Status == http.StatusTooManyRequests || r.Status >= 500
}

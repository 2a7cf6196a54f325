package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// putSKURequest is the body of PUT /admin/v1/skus/{sku_id}.
type putSKURequest struct {
	Stock        *int64     `json:"stock"`
	PerUserLimit *int64     `json:"per_user_limit"`
	StartsAt     *time.Time `json:"starts_at"`
	EndsAt       *time.Time `json:"ends_at"`
	// Buckets is the number of stock buckets (default 1).
	Buckets *int `json:"buckets"`
	// The crowd settings (docs/crowd.md); absent: off.
	TicketRequired *bool      `json:"ticket_required"`
	TicketsOpenAt  *time.Time `json:"tickets_open_at"`
	WaitingRoom    *bool      `json:"waiting_room"`
	AdmissionRate  *int64     `json:"admission_rate"`
	// Tag groups similar sales for the capacity forecast; absent: none.
	Tag *string `json:"tag"`
}

// badBuckets is the 400 invalid_buckets of a number of buckets out of range.
var badBuckets = &publicError{base: sale.ErrInvalidBuckets, msg: fmt.Sprintf("buckets must be a whole number 1..%d", sale.MaxBuckets)}

type skuResponse struct {
	SKU          string   `json:"sku_id"`
	Available    int64    `json:"available"`
	PerUserLimit int64    `json:"per_user_limit"`
	StartsAt     *apiTime `json:"starts_at"`
	EndsAt       *apiTime `json:"ends_at"`
	State        string   `json:"state"`
	crowdJSON
}

// crowdJSON is a sale's crowd settings as every SKU route answers them.
type crowdJSON struct {
	TicketRequired bool     `json:"ticket_required"`
	TicketsOpenAt  *apiTime `json:"tickets_open_at"`
	WaitingRoom    bool     `json:"waiting_room"`
	AdmissionRate  int64    `json:"admission_rate"`
}

func crowdOf(c sale.Crowd) crowdJSON {
	return crowdJSON{TicketRequired: c.TicketRequired, TicketsOpenAt: timePtr(c.TicketsOpenAt), WaitingRoom: c.WaitingRoom, AdmissionRate: c.AdmissionRate}
}

// badTag is the 400 of a tag that is not one.
var badTag = invalid("tag must be \"\" (none) or 1-64 of A-Z a-z 0-9 _ -")

// badAdmissionRate is the 400 of an admission rate out of range.
var badAdmissionRate = invalid("admission_rate must be a whole number 0..%d (0: derived from the stock and the gate's capacity)", sale.MaxAdmissionRate)

// adminSKUResponse is the sale as every admin SKU route answers it, with
// its allocation: stock (= total_stock) units offered, sold of them held by
// orders in the database (pending payment or paid), db_stock not.
type adminSKUResponse struct {
	SKU          string   `json:"sku_id"`
	Stock        int64    `json:"stock"`
	TotalStock   int64    `json:"total_stock"`
	Sold         int64    `json:"sold"`
	DBStock      int64    `json:"db_stock"`
	PerUserLimit int64    `json:"per_user_limit"`
	StartsAt     *apiTime `json:"starts_at"`
	EndsAt       *apiTime `json:"ends_at"`
	Buckets      int      `json:"buckets"`
	crowdJSON
	Tag     string `json:"tag"`
	Created bool   `json:"created"`
}

func adminSKUJSON(sku sale.SKU, created bool) adminSKUResponse {
	return adminSKUResponse{SKU: sku.ID, Stock: sku.TotalStock, TotalStock: sku.TotalStock, Sold: sku.TotalStock - sku.Stock,
		DBStock: sku.Stock, PerUserLimit: sku.PerUserLimit, StartsAt: timePtr(sku.StartsAt), EndsAt: timePtr(sku.EndsAt), Buckets: sku.BucketCount(),
		crowdJSON: crowdOf(sku.Crowd), Tag: sku.Tag, Created: created}
}

// getAdminSKU answers the sale as the database has it, with its allocation.
func (s *Server) getAdminSKU(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	sku, err := s.admin.SKU(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, adminSKUJSON(sku, false))
	return nil
}

func (s *Server) putSKU(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	var req putSKURequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	switch {
	case req.Stock == nil || *req.Stock < 0 || *req.Stock > sale.MaxStock:
		return invalid("stock is required, 0..%d", sale.MaxStock)
	case req.PerUserLimit == nil || *req.PerUserLimit < 1 || *req.PerUserLimit > sale.MaxPerUserLimit:
		return invalid("per_user_limit is required, 1..%d", sale.MaxPerUserLimit)
	case req.Buckets != nil && (*req.Buckets < 1 || *req.Buckets > sale.MaxBuckets):
		return badBuckets
	case req.AdmissionRate != nil && (*req.AdmissionRate < 0 || *req.AdmissionRate > sale.MaxAdmissionRate):
		return badAdmissionRate
	case req.Tag != nil && !sale.ValidTag(*req.Tag):
		return badTag
	}
	c := orderstore.SKUChange{ID: id, TotalStock: *req.Stock, PerUserLimit: *req.PerUserLimit, Buckets: 1}
	if req.Buckets != nil {
		c.Buckets = *req.Buckets
	}
	if req.Tag != nil {
		c.Tag = *req.Tag
	}
	if req.TicketRequired != nil {
		c.Crowd.TicketRequired = *req.TicketRequired
	}
	if req.TicketsOpenAt != nil {
		c.Crowd.TicketsOpenAt = req.TicketsOpenAt.UTC()
	}
	if req.WaitingRoom != nil {
		c.Crowd.WaitingRoom = *req.WaitingRoom
	}
	if req.AdmissionRate != nil {
		c.Crowd.AdmissionRate = *req.AdmissionRate
	}
	if req.StartsAt != nil {
		c.StartsAt = req.StartsAt.UTC()
	}
	if req.EndsAt != nil {
		c.EndsAt = req.EndsAt.UTC()
	}
	if err := checkWindow(c); err != nil {
		return err
	}
	if c.Crowd.TicketRequired || c.Crowd.WaitingRoom {
		if err := s.crowdReady(r.Context()); err != nil {
			return err
		}
	}
	sku, created, err := s.admin.Put(r.Context(), c)
	if err != nil {
		return changeError(err)
	}
	_ = s.buy.SKUChanged(r.Context(), sku.ID, "put")
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, adminSKUJSON(sku, created))
	return nil
}

// changeError tells the admin what to do about a refused reduction of a
// sale Redis does not hold (reconcile.Syncer.Put); other errors are as is.
func changeError(err error) error {
	if errors.Is(err, sale.ErrNotWarmed) {
		return &publicError{base: err, msg: "The sale is not loaded in the stock gate, so the units in flight are not known: warm it up (POST /admin/v1/skus/{sku_id}/warmup), then reduce."}
	}
	return err
}

// crowdReady refuses (409 fleet_not_ready) while an instance that does not
// enforce tickets and waiting rooms runs: it would sell such a sale to
// anyone. Instances of releases before the registry do not report at all:
// turn the settings on once the rollout is over (docs/crowd.md).
func (s *Server) crowdReady(ctx context.Context) error {
	if s.cfg.CrowdReady == nil {
		return nil
	}
	ids, err := s.cfg.CrowdReady(ctx)
	if err != nil {
		return errors.Join(sale.ErrUnavailable, err)
	}
	if len(ids) > 0 {
		return &publicError{base: errFleetNotReady, msg: fmt.Sprintf(
			"Instances %s run a release that does not enforce tickets or waiting rooms; finish the rollout, then turn them on. Nothing was changed.",
			strings.Join(ids, ", "))}
	}
	return nil
}

// errFleetNotReady is the 409 of turning tickets or a waiting room on
// while an older release runs.
var errFleetNotReady = errors.New("an instance does not enforce tickets or waiting rooms")

func checkWindow(c orderstore.SKUChange) error {
	if !c.StartsAt.IsZero() && !c.EndsAt.IsZero() && !c.EndsAt.After(c.StartsAt) {
		return invalid("ends_at must be after starts_at")
	}
	if t := c.Crowd.TicketsOpenAt; !t.IsZero() && !c.StartsAt.IsZero() && t.After(c.StartsAt) {
		return invalid("tickets_open_at must not be after starts_at")
	}
	return nil
}

// patchSKURequest is the body of PATCH /admin/v1/skus/{sku_id}, a JSON
// merge patch (RFC 7396) of the sale: a field left out keeps its value,
// null clears a nullable one (starts_at, ends_at). A raw value is nil when
// the field is absent and "null" when it is null.
type patchSKURequest struct {
	Stock        json.RawMessage `json:"stock"`
	PerUserLimit json.RawMessage `json:"per_user_limit"`
	StartsAt     json.RawMessage `json:"starts_at"`
	EndsAt       json.RawMessage `json:"ends_at"`
	Buckets      json.RawMessage `json:"buckets"`
	// The crowd settings: booleans and a rate are not nullable;
	// tickets_open_at null clears it.
	TicketRequired json.RawMessage `json:"ticket_required"`
	TicketsOpenAt  json.RawMessage `json:"tickets_open_at"`
	WaitingRoom    json.RawMessage `json:"waiting_room"`
	AdmissionRate  json.RawMessage `json:"admission_rate"`
	// Tag: a string; null or "" clears it.
	Tag json.RawMessage `json:"tag"`
}

// patchSKU changes only the fields the body names, computed from the sale
// as it is under the SKU's change lock. The SKU must exist (404
// unknown_sku otherwise: PUT creates).
func (s *Server) patchSKU(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	body, err := readBody(w, r, "application/merge-patch+json", "application/json")
	if err != nil {
		return err
	}
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return invalid("the body must be a JSON object")
	}
	var req patchSKURequest
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	var stock, limit *int64
	var startsAt, endsAt *time.Time
	var buckets *int
	if req.Buckets != nil {
		if err := decodeJSON(req.Buckets, &buckets); err != nil || buckets == nil || *buckets < 1 || *buckets > sale.MaxBuckets {
			return badBuckets
		}
	}
	var tag *string
	if req.Tag != nil {
		if err := decodeJSON(req.Tag, &tag); err != nil || (tag != nil && !sale.ValidTag(*tag)) {
			return badTag
		}
	}
	var ticketRequired, waitingRoom *bool
	var ticketsOpenAt *time.Time
	var admissionRate *int64
	if req.AdmissionRate != nil {
		if err := decodeJSON(req.AdmissionRate, &admissionRate); err != nil || admissionRate == nil || *admissionRate < 0 || *admissionRate > sale.MaxAdmissionRate {
			return badAdmissionRate
		}
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  **bool
	}{{"ticket_required", req.TicketRequired, &ticketRequired}, {"waiting_room", req.WaitingRoom, &waitingRoom}} {
		if f.raw != nil {
			if err := decodeJSON(f.raw, f.dst); err != nil || *f.dst == nil {
				return invalid("field %q must be true or false", f.name)
			}
		}
	}
	if req.TicketsOpenAt != nil {
		if err := decodeJSON(req.TicketsOpenAt, &ticketsOpenAt); err != nil {
			return invalid("field %q must be an RFC 3339 time string or null", "tickets_open_at")
		}
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  any
	}{{"stock", req.Stock, &stock}, {"per_user_limit", req.PerUserLimit, &limit}, {"starts_at", req.StartsAt, &startsAt}, {"ends_at", req.EndsAt, &endsAt}} {
		if f.raw == nil {
			continue
		}
		if err := decodeJSON(f.raw, f.dst); err != nil {
			return invalid("field %q must be %s", f.name, map[string]string{
				"stock": "a whole number", "per_user_limit": "a whole number",
				"starts_at": "an RFC 3339 time string or null", "ends_at": "an RFC 3339 time string or null"}[f.name])
		}
	}
	switch {
	case req.Stock != nil && (stock == nil || *stock < 0 || *stock > sale.MaxStock):
		return invalid("stock must be 0..%d", sale.MaxStock)
	case req.PerUserLimit != nil && (limit == nil || *limit < 1 || *limit > sale.MaxPerUserLimit):
		return invalid("per_user_limit must be 1..%d", sale.MaxPerUserLimit)
	}
	sku, err := s.admin.Patch(r.Context(), id, func(cur sale.SKU) (orderstore.SKUChange, error) {
		c := orderstore.SKUChange{ID: id, TotalStock: cur.TotalStock, PerUserLimit: cur.PerUserLimit, StartsAt: cur.StartsAt, EndsAt: cur.EndsAt, Buckets: cur.BucketCount(), Crowd: cur.Crowd, Tag: cur.Tag}
		if buckets != nil {
			c.Buckets = *buckets
		}
		if req.Tag != nil {
			c.Tag = ""
			if tag != nil {
				c.Tag = *tag
			}
		}
		if ticketRequired != nil {
			c.Crowd.TicketRequired = *ticketRequired
		}
		if waitingRoom != nil {
			c.Crowd.WaitingRoom = *waitingRoom
		}
		if admissionRate != nil {
			c.Crowd.AdmissionRate = *admissionRate
		}
		if req.TicketsOpenAt != nil {
			c.Crowd.TicketsOpenAt = time.Time{}
			if ticketsOpenAt != nil {
				c.Crowd.TicketsOpenAt = ticketsOpenAt.UTC()
			}
		}
		if stock != nil {
			c.TotalStock = *stock
		}
		if limit != nil {
			c.PerUserLimit = *limit
		}
		if req.StartsAt != nil {
			c.StartsAt = time.Time{}
			if startsAt != nil {
				c.StartsAt = startsAt.UTC()
			}
		}
		if req.EndsAt != nil {
			c.EndsAt = time.Time{}
			if endsAt != nil {
				c.EndsAt = endsAt.UTC()
			}
		}
		if (c.Crowd.TicketRequired && !cur.Crowd.TicketRequired) || (c.Crowd.WaitingRoom && !cur.Crowd.WaitingRoom) {
			if err := s.crowdReady(r.Context()); err != nil {
				return c, err
			}
		}
		return c, checkWindow(c)
	})
	if err != nil {
		return changeError(err)
	}
	_ = s.buy.SKUChanged(r.Context(), sku.ID, "patch")
	writeJSON(w, http.StatusOK, adminSKUJSON(sku, false))
	return nil
}

// restockRequest is the body of POST /admin/v1/skus/{sku_id}/restock.
type restockRequest struct {
	Delta *int64 `json:"delta"`
}

// restockSKU changes the sale's allocation by a delta (units added, or
// removed when negative), whatever it is now: two restocks of 10 add 20,
// and no value read earlier can be stale.
func (s *Server) restockSKU(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	var req restockRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Delta == nil || *req.Delta == 0 || *req.Delta < -sale.MaxStock || *req.Delta > sale.MaxStock {
		return invalid("delta is required: a non-zero whole number, -%d..%d", sale.MaxStock, sale.MaxStock)
	}
	delta := *req.Delta
	sku, err := s.admin.Patch(r.Context(), id, func(cur sale.SKU) (orderstore.SKUChange, error) {
		total := cur.TotalStock + delta
		if total < 0 || total > sale.MaxStock {
			return orderstore.SKUChange{}, invalid("delta %d would take stock from %d to %d, outside 0..%d", delta, cur.TotalStock, total, sale.MaxStock)
		}
		return orderstore.SKUChange{ID: id, TotalStock: total, PerUserLimit: cur.PerUserLimit, StartsAt: cur.StartsAt, EndsAt: cur.EndsAt, Buckets: cur.BucketCount(), Crowd: cur.Crowd, Tag: cur.Tag}, nil
	})
	if err != nil {
		return changeError(err)
	}
	_ = s.buy.SKUChanged(r.Context(), sku.ID, "restock")
	writeJSON(w, http.StatusOK, adminSKUJSON(sku, false))
	return nil
}

func (s *Server) warmup(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	res, err := s.admin.Warm(r.Context(), id)
	if err != nil {
		return err
	}
	_ = s.buy.SKUChanged(r.Context(), id, "warmup")
	writeJSON(w, http.StatusOK, res)
	return nil
}

// errBadSKUID is the 400 of a sku_id in a path that no sale can have:
// bad input, as the same id in a purchase's body is, while a well-formed
// id with no sale is 404 unknown_sku.
var errBadSKUID = &publicError{base: sale.ErrInvalid, msg: "sku_id must be 1-64 characters of A-Z a-z 0-9 _ -"}

func (s *Server) getSKU(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	v, err := s.buy.SKU(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, skuResponse{SKU: v.SKU.ID, Available: v.Available, PerUserLimit: v.SKU.PerUserLimit,
		StartsAt: timePtr(v.SKU.StartsAt), EndsAt: timePtr(v.SKU.EndsAt), State: string(v.State), crowdJSON: crowdOf(v.SKU.Crowd)})
	return nil
}

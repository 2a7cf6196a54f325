// Package httpapi is the HTTP API of flashsale: routes, JSON, authentication,
// input limits and the one table that maps errors to statuses and codes.
package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sale"
)

// Admin is what the admin routes need.
type Admin interface {
	Put(ctx context.Context, c orderstore.SKUChange) (sale.SKU, bool, error)
	Warm(ctx context.Context, id string) (reconcile.WarmResult, error)
}

// Checker reports whether a dependency is usable (readiness).
type Checker struct {
	Name  string
	Check func(ctx context.Context) error
}

// Config of the API.
type Config struct {
	AdminToken string
	Users      *UserAuth
	Ready      []Checker
	// Timeout bounds the work of one request (default 5s).
	Timeout time.Duration
	// Metrics, if set, is served at /metrics.
	Metrics http.Handler
	// Observe, if set, is called after each request with its route pattern,
	// status and duration.
	Observe func(route string, status int, d time.Duration)
}

// Server is the HTTP API.
type Server struct {
	buy   *purchase.Service
	admin Admin
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
}

// New returns the API handler.
func New(buy *purchase.Service, admin Admin, log *slog.Logger, cfg Config) *Server {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	s := &Server{buy: buy, admin: admin, cfg: cfg, log: log, mux: http.NewServeMux()}
	s.routes()
	return s
}

func (s *Server) routes() {
	s.handle("PUT /admin/v1/skus/{sku_id}", s.admin_(s.putSKU))
	s.handle("POST /admin/v1/skus/{sku_id}/warmup", s.admin_(s.warmup))
	s.handle("GET /api/v1/skus/{sku_id}", s.getSKU)
	s.handle("POST /api/v1/orders", s.user(s.createOrder))
	s.handle("GET /api/v1/orders/{order_id}", s.user(s.getOrder))
	s.handle("GET /healthz", s.healthz)
	s.handle("GET /readyz", s.readyz)
	if s.cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", s.cfg.Metrics)
	}
}

type handlerFunc func(w http.ResponseWriter, r *http.Request) error

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (s *Server) handle(pattern string, h handlerFunc) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
		defer cancel()
		if err := h(sw, r.WithContext(ctx)); err != nil {
			writeError(sw, s.log, err)
		}
		if s.cfg.Observe != nil {
			s.cfg.Observe(pattern, sw.status, time.Since(start))
		}
	})
}

// ServeHTTP serves the API. Unknown paths and wrong methods get the JSON
// error shape too.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.mux.Handler(r); pattern != "" {
		s.mux.ServeHTTP(w, r)
		return
	}
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		writeError(w, s.log, errNotFound)
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, s.log, errMethod)
}

func (s *Server) admin_(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := adminOK(r, s.cfg.AdminToken); err != nil {
			return err
		}
		return h(w, r)
	}
}

type userKey struct{}

func (s *Server) user(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		u, err := s.cfg.Users.User(r)
		if err != nil {
			return err
		}
		return h(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	}
}

func userOf(r *http.Request) string { u, _ := r.Context().Value(userKey{}).(string); return u }

// putSKURequest is the body of PUT /admin/v1/skus/{sku_id}.
type putSKURequest struct {
	Stock        *int64     `json:"stock"`
	PerUserLimit *int64     `json:"per_user_limit"`
	StartsAt     *time.Time `json:"starts_at"`
	EndsAt       *time.Time `json:"ends_at"`
}

type skuResponse struct {
	SKU          string     `json:"sku_id"`
	Available    int64      `json:"available"`
	PerUserLimit int64      `json:"per_user_limit"`
	StartsAt     *time.Time `json:"starts_at"`
	EndsAt       *time.Time `json:"ends_at"`
	State        string     `json:"state"`
}

type adminSKUResponse struct {
	SKU          string     `json:"sku_id"`
	Stock        int64      `json:"stock"`
	DBStock      int64      `json:"db_stock"`
	PerUserLimit int64      `json:"per_user_limit"`
	StartsAt     *time.Time `json:"starts_at"`
	EndsAt       *time.Time `json:"ends_at"`
	Created      bool       `json:"created"`
}

func (s *Server) putSKU(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return fmt.Errorf("%w: sku_id must be 1-64 characters of A-Z a-z 0-9 _ -", sale.ErrInvalid)
	}
	var req putSKURequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	switch {
	case req.Stock == nil || *req.Stock < 0 || *req.Stock > sale.MaxStock:
		return fmt.Errorf("%w: stock is required, 0..%d", sale.ErrInvalid, sale.MaxStock)
	case req.PerUserLimit == nil || *req.PerUserLimit < 1 || *req.PerUserLimit > sale.MaxPerUserLimit:
		return fmt.Errorf("%w: per_user_limit is required, 1..%d", sale.ErrInvalid, sale.MaxPerUserLimit)
	}
	c := orderstore.SKUChange{ID: id, TotalStock: *req.Stock, PerUserLimit: *req.PerUserLimit}
	if req.StartsAt != nil {
		c.StartsAt = req.StartsAt.UTC()
	}
	if req.EndsAt != nil {
		c.EndsAt = req.EndsAt.UTC()
	}
	if !c.StartsAt.IsZero() && !c.EndsAt.IsZero() && !c.EndsAt.After(c.StartsAt) {
		return fmt.Errorf("%w: ends_at must be after starts_at", sale.ErrInvalid)
	}
	sku, created, err := s.admin.Put(r.Context(), c)
	if err != nil {
		return err
	}
	_ = s.buy.Catalog.Refresh(r.Context())
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, adminSKUResponse{SKU: sku.ID, Stock: sku.TotalStock, DBStock: sku.Stock, PerUserLimit: sku.PerUserLimit,
		StartsAt: timePtr(sku.StartsAt), EndsAt: timePtr(sku.EndsAt), Created: created})
	return nil
}

func (s *Server) warmup(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return sale.ErrUnknownSKU
	}
	res, err := s.admin.Warm(r.Context(), id)
	if err != nil {
		return err
	}
	_ = s.buy.Catalog.Refresh(r.Context())
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (s *Server) getSKU(w http.ResponseWriter, r *http.Request) error {
	v, err := s.buy.SKU(r.Context(), r.PathValue("sku_id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, skuResponse{SKU: v.SKU.ID, Available: v.Available, PerUserLimit: v.SKU.PerUserLimit,
		StartsAt: timePtr(v.SKU.StartsAt), EndsAt: timePtr(v.SKU.EndsAt), State: string(v.State)})
	return nil
}

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
	var req orderRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	qty := int64(1)
	if req.Quantity != nil {
		qty = *req.Quantity
	}
	res, err := s.buy.Buy(r.Context(), purchase.Request{
		User: userOf(r), SKU: req.SKU, Quantity: qty, IdempotencyKey: r.Header.Get("Idempotency-Key"),
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, orderAccepted{OrderID: res.OrderID, Status: string(sale.StatusQueued)})
	return nil
}

type orderResponse struct {
	OrderID    string    `json:"order_id"`
	SKU        string    `json:"sku_id"`
	User       string    `json:"user_id"`
	Quantity   int64     `json:"quantity"`
	Status     string    `json:"status"`
	CreatedAt  time.Time `json:"created_at"`
	FailReason string    `json:"fail_reason,omitempty"`
}

func (s *Server) getOrder(w http.ResponseWriter, r *http.Request) error {
	o, err := s.buy.Order(r.Context(), userOf(r), r.PathValue("order_id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, orderResponse{OrderID: o.ID, SKU: o.SKU, User: o.User, Quantity: o.Quantity,
		Status: string(o.Status), CreatedAt: o.CreatedAt.UTC(), FailReason: o.FailReason})
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	checks := map[string]string{}
	ok := true
	for _, c := range s.cfg.Ready {
		if err := c.Check(r.Context()); err != nil {
			checks[c.Name] = err.Error()
			ok = false
		} else {
			checks[c.Name] = "ok"
		}
	}
	status := http.StatusOK
	if !ok {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, map[string]any{"ready": ok, "checks": checks})
	return nil
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

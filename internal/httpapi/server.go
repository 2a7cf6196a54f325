// Package httpapi is the HTTP API of flashsale: routes, JSON, authentication,
// input and rate limits and the one table that maps errors to statuses and
// codes.
package httpapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/api"
	"github.com/flashsale/flashsale/internal/deadletter"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/tracing"
)

// Admin is what the admin routes need.
type Admin interface {
	Put(ctx context.Context, c orderstore.SKUChange) (sale.SKU, bool, error)
	// SKU reads a sale from the database of record.
	SKU(ctx context.Context, id string) (sale.SKU, error)
	// Patch changes an existing sale from its current state, serialised
	// with every other change of the SKU (reconcile.Syncer.Patch).
	Patch(ctx context.Context, id string, change func(cur sale.SKU) (orderstore.SKUChange, error)) (sale.SKU, error)
	Warm(ctx context.Context, id string) (reconcile.WarmResult, error)
}

// AuditReader pages through a SKU's stock audit trail.
type AuditReader interface {
	Audit(ctx context.Context, sku string, after int64, limit int) ([]orderstore.AuditEntry, error)
}

// Lifecycle is what the payment and cancellation routes need.
type Lifecycle interface {
	Pay(ctx context.Context, user, id, ref string) (sale.Order, error)
	Cancel(ctx context.Context, user, id string) (sale.Order, error)
}

// DeadLetters is what the dead-letter admin routes need.
type DeadLetters interface {
	List(ctx context.Context, after uint64, limit int) ([]orderqueue.DeadLetter, uint64, error)
	Replay(ctx context.Context, seq uint64) (deadletter.Action, error)
	Discard(ctx context.Context, seq uint64) (deadletter.Action, error)
}

// Checker is one named readiness check of GET /readyz. Check returns nil
// while its dependency is usable. A failure makes the instance unready
// (503) if Critical, else degraded (200, status "degraded"); a check may set
// the level and a reason of its own for one answer by returning a
// *CheckError (Degraded, Unready). Readiness means "this instance can take
// purchases": only the checks that decide that are Critical (or answer
// Unready); everything else that is out is reported, with its reason, and
// degrades.
type Checker struct {
	Name     string
	Critical bool
	Check    func(ctx context.Context) error
}

// Levels a failed readiness check sets (see CheckError).
type Level int

const (
	// LevelOf the Checker: unready if Critical, else degraded.
	LevelOf Level = iota
	// LevelDegraded: reported; the instance stays ready.
	LevelDegraded
	// LevelUnready: the instance is taken out (503).
	LevelUnready
)

// CheckError is a readiness check's failure with its level and a reason
// shown in /readyz's "degraded" or "unready" maps. The reason must name no
// address, credential or driver text (/readyz answers anyone); Err, which
// may, goes to the log.
type CheckError struct {
	Level  Level
	Reason string
	Err    error
}

func (e *CheckError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *CheckError) Unwrap() error { return e.Err }

// Degraded returns a check failure that degrades the instance, with reason.
func Degraded(reason string, err error) error {
	return &CheckError{Level: LevelDegraded, Reason: reason, Err: err}
}

// Unready returns a check failure that takes the instance out, with reason.
func Unready(reason string, err error) error {
	return &CheckError{Level: LevelUnready, Reason: reason, Err: err}
}

// Config of the API.
type Config struct {
	AdminToken  string
	Users       *UserAuth
	DeadLetters DeadLetters
	Lifecycle   Lifecycle
	Audit       AuditReader
	// Reconcile, if set, runs one reconcile pass for POST /admin/v1/reconcile.
	Reconcile func(ctx context.Context) (any, error)
	// PaymentSecret signs payment-provider callbacks (HMAC-SHA256 of the
	// body); the callback route answers 403 callback_disabled when empty.
	PaymentSecret string
	// Breaker, if set, reports the Redis breaker's state for /readyz.
	Breaker func() string
	// Dashboard, if set, is the operators' page, served under /dashboard/
	// (and / redirects there).
	Dashboard http.Handler
	// Overview, if set, answers GET /admin/v1/overview: the live state of
	// every sale and of the pipeline, as JSON (the dashboard's data).
	Overview func(ctx context.Context) (any, error)
	Ready    []Checker
	// Timeout bounds the work of one request (default 5s).
	Timeout time.Duration
	// Metrics, if set, is served at /metrics.
	Metrics http.Handler
	// Observe, if set, is called after each request with its route pattern,
	// status and duration.
	Observe func(route string, status int, d time.Duration)
	// Limiter, if set, is the instance's rate limit in front of every buyer
	// route (/api/..., not the payment callback), checked before
	// authentication and decoding: beyond it 429 rate_limited.
	Limiter *rate.Limiter
	// Proxies are the trusted proxies: only from them is X-Forwarded-For
	// believed (the client IP of the audit trail and the per-IP limit).
	Proxies *Proxies
	// Tracer, if set, traces every routed request (trace.go).
	Tracer *tracing.Tracer
}

// Server is the HTTP API.
type Server struct {
	buy   *purchase.Service
	admin Admin
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	// patterns are the mux's patterns, in the order registered (Routes).
	patterns []string
	// orders is the mux's handler of ordersPattern (ServeHTTP).
	orders http.HandlerFunc
}

// ordersPattern is the purchase route, the one ServeHTTP takes without
// the mux's look-up when a request names it exactly.
const (
	ordersPattern = "POST " + ordersPath
	ordersPath    = "/api/v1/orders"
)

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
	s.handle("GET /admin/v1/skus/{sku_id}", s.admin_(s.getAdminSKU))
	s.handle("PUT /admin/v1/skus/{sku_id}", s.admin_(s.putSKU))
	s.handle("PATCH /admin/v1/skus/{sku_id}", s.admin_(s.patchSKU))
	s.handle("POST /admin/v1/skus/{sku_id}/restock", s.admin_(s.restockSKU))
	s.handle("POST /admin/v1/skus/{sku_id}/warmup", s.admin_(s.warmup))
	s.handle("GET /admin/v1/dlq", s.admin_(s.listDLQ))
	s.handle("GET /admin/v1/skus/{sku_id}/audit", s.admin_(s.listAudit))
	if s.cfg.Reconcile != nil {
		s.handle("POST /admin/v1/reconcile", s.admin_(func(w http.ResponseWriter, r *http.Request) error {
			rep, err := s.cfg.Reconcile(r.Context())
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, rep)
			return nil
		}))
	}
	s.handle("POST /admin/v1/dlq/{seq}/replay", s.admin_(s.dlqAction(true)))
	s.handle("POST /admin/v1/dlq/{seq}/discard", s.admin_(s.dlqAction(false)))
	s.handle("GET /api/v1/skus/{sku_id}", s.limited(s.getSKU))
	s.handle(ordersPattern, s.limited(s.user(s.createOrder)))
	s.handle("GET /api/v1/orders/{order_id}", s.limited(s.user(s.getOrder)))
	if s.cfg.Lifecycle != nil {
		s.handle("POST /api/v1/orders/{order_id}/pay", s.limited(s.user(s.payOrder)))
		s.handle("POST /api/v1/orders/{order_id}/cancel", s.limited(s.user(s.cancelOrder)))
		s.handle("POST /api/v1/payments/callback", s.paymentCallback)
	}
	s.handle("GET /openapi.yaml", s.openAPI)
	s.handle("GET /healthz", s.healthz)
	s.handle("GET /readyz", s.readyz)
	if s.cfg.Metrics != nil {
		s.handleRaw("GET /metrics", s.cfg.Metrics)
	}
	if s.cfg.Overview != nil {
		s.handle("GET /admin/v1/overview", s.admin_(func(w http.ResponseWriter, r *http.Request) error {
			v, err := s.cfg.Overview(r.Context())
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, v)
			return nil
		}))
	}
	if s.cfg.Dashboard != nil {
		s.handleRaw("GET /dashboard/", s.cfg.Dashboard)
		s.handleRaw("GET /{$}", http.RedirectHandler("/dashboard/", http.StatusFound))
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

// reqState is what the API works out about a request once, found in its
// context under stateKey: the client's address, the user once
// authenticated. It is also the ResponseWriter ServeHTTP hands the mux,
// recording the answer's status (when no route takes the request it holds
// back the mux's own plain-text answer: see decide), and holds the routed
// request's context (ctx), all in one allocation.
type reqState struct {
	http.ResponseWriter
	s        *Server
	r        *http.Request
	status   int
	clientIP string
	user     string
	// routed: a registered route took the request. passed: the mux
	// answered it (a redirect to a cleaned path) as it did before the JSON
	// errors. suppressed: it did not, ServeHTTP answers 404/405 in JSON.
	routed, decided, passed, suppressed bool
	scratch                             http.Header
	ctx                                 reqCtx
	// rid holds the request id made here (requestID) and ridHeader the
	// X-Request-Id header's value, so that neither is an allocation of
	// its own.
	rid       [16]byte
	ridHeader [1]string
	// start is when the route's handler began (the clock read once for
	// the request: its duration, the instance limiter, the token's exp).
	start time.Time
}

type stateKey struct{}

func stateOf(ctx context.Context) *reqState {
	st, _ := ctx.Value(stateKey{}).(*reqState)
	return st
}

func (st *reqState) Header() http.Header {
	if st.routed || st.passed {
		return st.ResponseWriter.Header()
	}
	if st.scratch == nil {
		st.scratch = http.Header{}
	}
	return st.scratch
}

func (st *reqState) WriteHeader(code int) {
	if !st.routed && !st.decide() {
		return
	}
	st.status = code
	st.ResponseWriter.WriteHeader(code)
}

func (st *reqState) Write(p []byte) (int, error) {
	if !st.routed && !st.decide() {
		return len(p), nil
	}
	return st.ResponseWriter.Write(p)
}

// decide is called when the mux answers a request no route took: the
// answer goes out if the mux has a pattern for the request (it redirects
// to the cleaned path), else ServeHTTP answers in JSON instead.
func (st *reqState) decide() bool {
	if !st.decided {
		st.decided = true
		if _, p := st.s.mux.Handler(st.r); p != "" {
			st.passed = true
			h := st.ResponseWriter.Header()
			for k, v := range st.scratch {
				h[k] = v
			}
		} else {
			st.suppressed = true
		}
	}
	return st.passed
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (st *reqState) Unwrap() http.ResponseWriter { return st.ResponseWriter }

// Routes returns the patterns of every route served, in the order
// registered ("METHOD /path/{name}", as net/http.ServeMux takes them).
// api/openapi.yaml documents each (a test checks both ways).
func (s *Server) Routes() []string { return slices.Clone(s.patterns) }

func (s *Server) handleRaw(pattern string, h http.Handler) {
	s.patterns = append(s.patterns, pattern)
	s.register(pattern, h, true)
}

// register adds h to the mux, marking the request routed when it runs. A
// raw handler gets the connection's writer itself (Flusher and all).
func (s *Server) register(pattern string, h http.Handler, raw bool) {
	f := func(w http.ResponseWriter, r *http.Request) {
		if st, ok := w.(*reqState); ok {
			st.routed = true
			if raw {
				w = st.ResponseWriter
			}
		}
		h.ServeHTTP(w, r)
	}
	s.mux.HandleFunc(pattern, f)
	if pattern == ordersPattern {
		s.orders = f
	}
}

func (s *Server) handle(pattern string, h handlerFunc) {
	s.patterns = append(s.patterns, pattern)
	s.register(pattern, s.traced(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		// Served by ServeHTTP, the request's state records the status,
		// holds the request id and is its context (reqctx.go); else (a
		// test calling the mux) a statusWriter and context.WithTimeout do.
		var ctx context.Context
		var rid string
		st := writerState(w)
		var sw *statusWriter
		if st != nil {
			rid = requestID(r, &st.rid)
			st.ridHeader[0] = rid
			w.Header()["X-Request-Id"] = st.ridHeader[:]
			st.start = start
			st.ctx.init(r.Context(), st, start.Add(s.cfg.Timeout))
			defer st.ctx.end()
			ctx = &st.ctx
		} else {
			rid = requestID(r, new([16]byte))
			w.Header()["X-Request-Id"] = []string{rid}
			sw = &statusWriter{ResponseWriter: w, status: http.StatusOK}
			w = sw
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(r.Context(), s.cfg.Timeout)
			defer cancel()
		}
		if err := h(w, r.WithContext(ctx)); err != nil {
			writeErrorFor(w, r, s.log, err, rid, pattern)
		}
		if s.cfg.Observe != nil {
			status := http.StatusOK
			if st != nil {
				status = st.status
			} else {
				status = sw.status
			}
			s.cfg.Observe(pattern, status, time.Since(start))
		}
	}), false)
}

// writerState finds the request's state under the writers wrapping it.
func writerState(w http.ResponseWriter) *reqState {
	for {
		switch x := w.(type) {
		case *reqState:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}

// ServeHTTP serves the API. Unknown paths and wrong methods get the JSON
// error shape too. The mux routes a request once; only a request no route
// takes is routed again, to tell 404 from 405.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if headerBytes(r) > MaxHeaderBytes {
		w.Header().Set("Connection", "close")
		writeError(w, r, s.log, errHeaderTooLarge)
		return
	}
	st := &reqState{ResponseWriter: w, s: s, r: r, status: http.StatusOK, clientIP: s.cfg.Proxies.ClientIP(r)}
	if s.orders != nil && r.Method == http.MethodPost && r.URL.Path == ordersPath && r.URL.RawPath == "" {
		// A purchase, its path as it is: the mux would route it to the
		// purchase route (no host patterns, no wildcard, nothing to
		// clean), and sets the request's Pattern as here.
		r.Pattern = ordersPattern
		s.orders(st, r)
		return
	}
	s.mux.ServeHTTP(st, r)
	if !st.suppressed {
		return
	}
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		writeError(w, r, s.log, errNotFound)
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, r, s.log, errMethod)
}

func (s *Server) admin_(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := adminOK(r, s.cfg.AdminToken); err != nil {
			return err
		}
		ctx := orderstore.WithActor(r.Context(), orderstore.Actor{Name: "admin", SourceIP: peerIP(r)})
		return h(w, r.WithContext(ctx))
	}
}

// limited puts the instance's rate limit in front of h.
func (s *Server) limited(h handlerFunc) handlerFunc {
	if s.cfg.Limiter == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		if !s.cfg.Limiter.AllowN(requestTime(r), 1) {
			return &sale.RateLimitError{Scope: "instance", RetryAfter: time.Second}
		}
		return h(w, r)
	}
}

// requestTime is when the handling of r began (ServeHTTP read the clock),
// or now.
func requestTime(r *http.Request) time.Time {
	if st := stateOf(r.Context()); st != nil && !st.start.IsZero() {
		return st.start
	}
	return time.Now()
}

// peerIP is the address of the client as the audit trail records it and
// the per-IP limit counts it: the socket peer, or the client a trusted
// proxy names (ServeHTTP works it out once).
func peerIP(r *http.Request) string {
	if st := stateOf(r.Context()); st != nil {
		return st.clientIP
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) error {
	if s.cfg.Audit == nil {
		return errNotFound
	}
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	after, err := queryUint(r, "after", 0)
	if err != nil {
		return err
	}
	limit, err := queryUint(r, "limit", 100)
	if err != nil || limit < 1 || limit > 1000 {
		return invalid("limit must be 1..1000")
	}
	es, err := s.cfg.Audit.Audit(r.Context(), id, int64(after), int(limit))
	if err != nil {
		return err
	}
	next := int64(after)
	if len(es) > 0 {
		next = es[len(es)-1].ID
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": es, "next_after": next})
	return nil
}

type userKey struct{}

func (s *Server) user(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		u, err := s.cfg.Users.User(r)
		if err != nil {
			return err
		}
		ctx := r.Context()
		if st := stateOf(ctx); st != nil {
			// The request's context answers the user and, for the
			// audit trail, the actor (reqCtx.Value).
			st.user = u
			return h(w, r)
		}
		ctx = context.WithValue(ctx, userKey{}, u)
		ctx = orderstore.WithActor(ctx, orderstore.Actor{Name: "user:" + u, SourceIP: peerIP(r)})
		return h(w, r.WithContext(ctx))
	}
}

func userOf(r *http.Request) string {
	if st := stateOf(r.Context()); st != nil && st.user != "" {
		return st.user
	}
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}

// putSKURequest is the body of PUT /admin/v1/skus/{sku_id}.
type putSKURequest struct {
	Stock        *int64     `json:"stock"`
	PerUserLimit *int64     `json:"per_user_limit"`
	StartsAt     *time.Time `json:"starts_at"`
	EndsAt       *time.Time `json:"ends_at"`
	// Buckets is the number of stock buckets (default 1).
	Buckets *int `json:"buckets"`
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
}

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
	Created      bool     `json:"created"`
}

func adminSKUJSON(sku sale.SKU, created bool) adminSKUResponse {
	return adminSKUResponse{SKU: sku.ID, Stock: sku.TotalStock, TotalStock: sku.TotalStock, Sold: sku.TotalStock - sku.Stock,
		DBStock: sku.Stock, PerUserLimit: sku.PerUserLimit, StartsAt: timePtr(sku.StartsAt), EndsAt: timePtr(sku.EndsAt), Buckets: sku.BucketCount(), Created: created}
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
	}
	c := orderstore.SKUChange{ID: id, TotalStock: *req.Stock, PerUserLimit: *req.PerUserLimit, Buckets: 1}
	if req.Buckets != nil {
		c.Buckets = *req.Buckets
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

func checkWindow(c orderstore.SKUChange) error {
	if !c.StartsAt.IsZero() && !c.EndsAt.IsZero() && !c.EndsAt.After(c.StartsAt) {
		return invalid("ends_at must be after starts_at")
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
		c := orderstore.SKUChange{ID: id, TotalStock: cur.TotalStock, PerUserLimit: cur.PerUserLimit, StartsAt: cur.StartsAt, EndsAt: cur.EndsAt, Buckets: cur.BucketCount()}
		if buckets != nil {
			c.Buckets = *buckets
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
		return orderstore.SKUChange{ID: id, TotalStock: total, PerUserLimit: cur.PerUserLimit, StartsAt: cur.StartsAt, EndsAt: cur.EndsAt, Buckets: cur.BucketCount()}, nil
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

// openAPI serves the API's OpenAPI document (api/openapi.yaml).
func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(api.OpenAPI)
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// readyTimeout bounds each readiness check.
const readyTimeout = 700 * time.Millisecond

var errCheckTimeout = errors.New("readiness check did not answer in time")

// readyz answers 200 while the instance can take purchases: status "ok",
// or "degraded" when a check that does not decide it failed (the database,
// the broker, ...: purchases go on through Redis and the outbox, or through
// the database fallback). 503 "unavailable" when a check that decides it
// failed. "checks" has every check "ok" or "unavailable"; "degraded" and
// "unready" (present when not empty) name each failed one with its reason.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	checks := map[string]string{}
	degraded, unready := map[string]string{}, map[string]string{}
	status, code := "ok", http.StatusOK
	// The checks run at once, each under readyTimeout: a balancer's health
	// check has a deadline of its own (HAProxy's is its inter, 1 s in the
	// shipped configuration), and a dependency that hangs (a stream between
	// leaders) must read as that check unavailable, not as the whole
	// instance not answering.
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	type result struct {
		i   int
		err error
	}
	done := make(chan result, len(s.cfg.Ready)) // buffered: a late check never blocks
	for i, c := range s.cfg.Ready {
		go func() { done <- result{i, c.Check(ctx)} }()
	}
	errs := make([]error, len(s.cfg.Ready))
	for i := range errs {
		errs[i] = errCheckTimeout // until it answers
	}
wait:
	for range errs {
		select {
		case r := <-done:
			errs[r.i] = r.err
		case <-ctx.Done():
			break wait // the rest stay timed out
		}
	}
	for i, c := range s.cfg.Ready {
		err := errs[i]
		if err == nil {
			checks[c.Name] = "ok"
			continue
		}
		// The error names addresses and drivers: the log gets it.
		s.log.Info("readyz: check failed", "check", c.Name, "err", err)
		checks[c.Name] = "unavailable"
		level, reason := LevelOf, "unavailable"
		if errors.Is(err, errCheckTimeout) {
			reason = "did not answer within " + readyTimeout.String()
		}
		if ce, ok := errors.AsType[*CheckError](err); ok {
			level, reason = ce.Level, ce.Reason
		}
		if level == LevelOf {
			level = LevelDegraded
			if c.Critical {
				level = LevelUnready
			}
		}
		if level == LevelUnready {
			unready[c.Name] = reason
			status, code = "unavailable", http.StatusServiceUnavailable
		} else {
			degraded[c.Name] = reason
			if status == "ok" {
				status = "degraded"
			}
		}
	}
	body := map[string]any{"status": status, "ready": code == http.StatusOK, "checks": checks}
	if len(degraded) > 0 {
		body["degraded"] = degraded
	}
	if len(unready) > 0 {
		body["unready"] = unready
	}
	if s.cfg.Breaker != nil {
		body["breaker"] = s.cfg.Breaker()
		if body["breaker"] != "closed" && status == "ok" {
			body["status"] = "degraded"
		}
	}
	writeJSON(w, code, body)
	return nil
}

func (s *Server) listDLQ(w http.ResponseWriter, r *http.Request) error {
	if s.cfg.DeadLetters == nil {
		return errNotFound
	}
	after, err := queryUint(r, "after", 0)
	if err != nil {
		return err
	}
	limit, err := queryUint(r, "limit", 100)
	if err != nil || limit < 1 || limit > 1000 {
		return invalid("limit must be 1..1000")
	}
	ds, n, err := s.cfg.DeadLetters.List(r.Context(), after, int(limit))
	if err != nil {
		return err
	}
	if ds == nil {
		ds = []orderqueue.DeadLetter{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead_letters": ds, "count": n})
	return nil
}

func (s *Server) dlqAction(replay bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.cfg.DeadLetters == nil {
			return errNotFound
		}
		seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
		if err != nil || seq == 0 {
			return invalid("seq must be a positive whole number")
		}
		var a deadletter.Action
		if replay {
			a, err = s.cfg.DeadLetters.Replay(r.Context(), seq)
		} else {
			a, err = s.cfg.DeadLetters.Discard(r.Context(), seq)
		}
		if deadletter.IsNotFound(err) {
			return errNoDeadLetter
		}
		if replay && errors.Is(err, sale.ErrInvalid) {
			return &publicError{base: err, msg: fmt.Sprintf("dead letter %d is malformed and cannot be replayed; discard it", seq)}
		}
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, a)
		return nil
	}
}

func queryUint(r *http.Request, name string, def uint64) (uint64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, invalid("%s must be a whole number", name)
	}
	return n, nil
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

// headerValue is h.Get(key) of a key written in canonical form, as net/http
// stores every header it reads (http.CanonicalHeaderKey(key) == key): the
// look-up without canonicalizing key again.
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// requestID is the request's X-Request-Id if it is a sane one (set by a
// gateway), else a new random id, written in buf. It is echoed in the
// response and in every log line about the request.
func requestID(r *http.Request, buf *[16]byte) string {
	if id := headerValue(r.Header, "X-Request-Id"); len(id) > 0 && len(id) <= 64 && sale.ValidIdempotencyKey(id) {
		return id
	}
	var u [8]byte
	binary.BigEndian.PutUint64(u[:], rand.Uint64())
	hex.Encode(buf[:], u[:])
	// buf is written here once and never again: the string may be it.
	return unsafe.String(&buf[0], len(buf))
}

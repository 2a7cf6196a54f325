// Package httpapi is the HTTP API of flashsale: routes, JSON, authentication,
// input and rate limits and the one table that maps errors to statuses and
// codes.
//
// Files by concern: server.go (the Server, its routes on one screen, the
// request state and middleware), orders.go (the buyer's routes: purchase,
// order, pay, cancel, the payment callback), skus.go (a sale's routes:
// read, create, change, restock, warm up), risk.go (the risk lists' admin
// routes and the check the buyer routes make), ops.go (operations: health,
// readiness, audit, dead letters, the OpenAPI document), errors.go (the
// error table), auth.go and jwt.go (tokens), decode.go (the order body),
// protect.go and headerlimit.go (limits), drain.go (shutdown).
package httpapi

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/time/rate"

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
	// BuyerPage, if set, is the buyers' page of a sale, served at
	// /sale/{sku_id} with its files under /sale/assets/ (internal/buyerpage).
	BuyerPage http.Handler
	// Overview, if set, answers GET /admin/v1/overview: the live state of
	// every sale and of the pipeline, as JSON (the dashboard's data).
	Overview func(ctx context.Context) (any, error)
	Ready    []Checker
	// Transient, if set, tells a failure a retry may not meet (a lock wait
	// the database gave up, a connection lost: orderstore.IsTransient):
	// such an error without a more specific code answers 503 unavailable
	// with Retry-After, not 500.
	Transient func(error) bool
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
	// Crowd serves tickets, the waiting room and the risk lists (crowd.go).
	Crowd Crowd
	// CrowdReady, if set, returns the running instances that do not
	// enforce tickets and waiting rooms (an older release): while there
	// are any, an admin change turning either on is refused (409
	// fleet_not_ready), since those instances would sell without asking.
	CrowdReady func(ctx context.Context) ([]string, error)
	// Risk, if set, serves the risk list admin routes (risk.go); Blocklist,
	// if set, is what Server.Blocked checks buyers against.
	Risk      RiskAdmin
	Blocklist Blocklist
	// History, if set, serves the sale history admin routes (history.go).
	History HistoryAdmin
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
	if s.cfg.Risk != nil {
		s.handle("GET /admin/v1/risk", s.admin_(s.listRisk))
		s.handle("POST /admin/v1/risk", s.admin_(s.addRisk))
		s.handle("DELETE /admin/v1/risk/{id}", s.admin_(s.removeRisk))
	}
	if s.cfg.History != nil {
		s.handle("GET /admin/v1/history", s.admin_(s.listHistory))
		s.handle("POST /admin/v1/history/{sku_id}", s.admin_(s.recordHistory))
	}
	s.handle("GET /api/v1/skus/{sku_id}", s.limited(s.getSKU))
	s.handle("GET /api/v1/skus/{sku_id}/challenge", s.limited(s.user(s.getChallenge)))
	s.handle("POST /api/v1/skus/{sku_id}/ticket", s.limited(s.user(s.postTicket)))
	s.handle("POST /api/v1/skus/{sku_id}/queue", s.limited(s.user(s.joinQueue)))
	s.handle("GET /api/v1/skus/{sku_id}/queue", s.limited(s.user(s.getQueue)))
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
	if s.cfg.BuyerPage != nil {
		s.handleRaw("GET /sale/{sku_id}", s.cfg.BuyerPage)
		s.handleRaw("GET /sale/assets/", s.cfg.BuyerPage)
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
			if errors.Is(err, sql.ErrTxDone) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The request ran out of its time and database/sql reports
				// the transaction the context rolled back ("already been
				// committed or rolled back"), which wraps no deadline. A
				// retry may finish it: 503, not 500. Only this error: any
				// other keeps its code, a bug on a slow request included.
				err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
			} else if s.cfg.Transient != nil && s.cfg.Transient(err) {
				// The last entry of errorCodes: a more specific error
				// wrapped in err keeps its code.
				err = fmt.Errorf("%w (%w)", err, errTransient)
			}
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
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
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

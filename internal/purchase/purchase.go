// Package purchase is the request path of a purchase: cheap in-memory checks
// first (input, known SKU, sale window, per-user limit, sold-out flag, rate
// limits the gate already refused), then the Redis gate (stock and the
// distributed rate limits in one script call), then the hand-off to the
// relay. It also answers order and SKU look-ups.
package purchase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/tracing"
)

// Gate is the Redis gate as the purchase path uses it.
type Gate interface {
	ReserveLimited(ctx context.Context, r sale.Reservation, l stockgate.Limits) (stockgate.ReserveResult, error)
	Duplicate(ctx context.Context, sku, user, key string) (string, bool, error)
	// Lookup finds the in-flight reservation orderID in any of skus.
	Lookup(ctx context.Context, orderID string, skus ...string) (sale.Reservation, bool, error)
	Available(ctx context.Context, sku string) (int64, bool, error)
	// Unsent returns the payload of user's reservation orderID of sku and
	// its bucket if it is still in the outbox (not yet in the stream); nil
	// if not.
	Unsent(ctx context.Context, sku, user, orderID string) ([]byte, string, error)
}

// Notifier hands an accepted reservation to the relay's fast path, without
// waiting (Notify) or until the stream acknowledged it (Publish).
type Notifier interface {
	Notify(ctx context.Context, sku, orderID string, payload []byte)
	Publish(ctx context.Context, sku, orderID string, payload []byte) error
}

// OrderReader reads orders from the database of record.
type OrderReader interface {
	Order(ctx context.Context, id string) (sale.Order, error)
	// OrderByKey returns the order user's Idempotency-Key key made on sku
	// (sale.ErrOrderNotFound if none).
	OrderByKey(ctx context.Context, sku, user, key string) (sale.Order, error)
}

// Observer is told the outcome of every purchase (metrics); nil is fine.
type Observer interface {
	Purchase(outcome string)
}

// SaleCounter counts each purchase of a known SKU per second for the sale
// history (salehistory.Tally): in memory, no I/O; nil is fine.
type SaleCounter interface {
	Record(sku, outcome string, d time.Duration)
}

// Announcer tells every instance, this one included, that a sale changed
// (units came back or its settings changed); each calls Noticed. It must not
// block: a notice is a hint, the sold-out flag's TTL covers a lost one.
type Announcer interface {
	Announce(sku, reason string)
}

// Loader loads a sale into Redis from the database (warm-up or rebuild).
type Loader interface {
	Warm(ctx context.Context, id string) (reconcile.WarmResult, error)
}

// Deps are the parts a Service is built from. Direct, Loader and
// RebuildAll may be nil in tests of the plain path (no fallback, no
// self-healing).
type Deps struct {
	Catalog *Catalog
	Gate    Gate
	Relay   Notifier
	Orders  OrderReader
	// Direct sells from the database while the breaker is open.
	Direct DirectBuyer
	// Loader re-loads a sale the gate reports as not loaded (Redis lost it).
	Loader Loader
	// RebuildAll rebuilds every active sale in Redis (before the breaker closes).
	RebuildAll func(ctx context.Context) error
	Log        *slog.Logger
	Observer   Observer
	Breaker    BreakerObserver
	// Seller, if set, sells every purchase straight from the database with
	// one of the comparison strategies (db-conditional, db-pessimistic,
	// db-optimistic, redis-lock): no gate, no queue. Used by the benchmark.
	Seller DirectBuyer
	// StreamAck, when positive, makes a purchase wait up to this long for the
	// stream to acknowledge the reservation before answering 202, so that an
	// accepted purchase survives even a Redis that loses its data. Past it
	// (broker slow or down) the purchase is answered anyway: the reservation
	// is in the Redis outbox and the relay delivers it later.
	StreamAck time.Duration
	// Limits are the rate limits and the sold-out flag (zero: all off).
	Limits Limits
	// Announcer, if set, spreads SKUChanged to every instance.
	Announcer Announcer
	// Tracer, if set, traces each gate call (span stockgate.reserve).
	Tracer *tracing.Tracer
	// Crowd, if set, is asked before the gate (tickets, waiting room).
	Crowd Crowd
	// Counter, if set, counts every purchase of a known SKU (sale history).
	Counter SaleCounter
	// Leaser takes the sold-out leases of Limits.SoldOutLease (nil: Gate,
	// if it is a SoldLeaser).
	Leaser SoldLeaser
}

// Service is the purchase path. Safe for concurrent use.
type Service struct {
	Catalog  *Catalog
	gate     Gate
	relay    Notifier
	orders   OrderReader
	loader   Loader
	guard    *guard
	seller   DirectBuyer
	ack      time.Duration
	log      *slog.Logger
	obs      Observer
	now      func() time.Time
	loading  sync.Map // sku -> struct{}: a load triggered by this instance is running
	limits   Limits
	block    blocklist
	soldOut  soldOutFlags
	leases   soldLeases
	announce Announcer
	tracer   *tracing.Tracer
	crowd    Crowd
	counter  SaleCounter
}

// New returns a purchase service.
func New(d Deps, bc BreakerConfig) *Service {
	s := &Service{Catalog: d.Catalog, gate: d.Gate, relay: d.Relay, orders: d.Orders, loader: d.Loader, log: d.Log, obs: d.Observer, now: time.Now, ack: d.StreamAck, seller: d.Seller,
		limits: d.Limits, announce: d.Announcer, tracer: d.Tracer, crowd: d.Crowd, counter: d.Counter}
	s.soldOut.ttl = d.Limits.SoldOutTTL
	lg := d.Leaser
	if lg == nil {
		lg, _ = d.Gate.(SoldLeaser)
	}
	if lg != nil && d.Limits.SoldOutTTL > 0 && d.Limits.SoldOutLease > 0 {
		s.leases.g, s.leases.ttl, s.leases.max = lg, d.Limits.SoldOutLease, d.Limits.SoldOutLeaseKeys
		if s.leases.max <= 0 {
			s.leases.max = DefaultSoldOutLeaseKeys
		}
		s.leases.log = d.Log
		if s.leases.log == nil {
			s.leases.log = slog.New(slog.DiscardHandler)
		}
	}
	rebuild := d.RebuildAll
	if rebuild == nil {
		rebuild = func(context.Context) error { return nil }
	}
	s.guard = newGuard(bc, d.Direct, rebuild, d.Log, d.Breaker)
	if p, ok := d.Gate.(interface{ Ping(context.Context) error }); ok {
		s.guard.ping = p.Ping
	}
	return s
}

// BreakerState returns the state of the circuit breaker around Redis.
func (s *Service) BreakerState() string { return s.guard.State() }

// Request is one purchase as the API received it (user already authenticated).
type Request struct {
	User           string
	SKU            string
	Quantity       int64
	IdempotencyKey string
	// ClientIP is recorded in the audit trail and keys the per-IP rate
	// limit ("" skips that limit).
	ClientIP string
	// Ticket and Admission are the buyer's proofs for a sale with tickets
	// or a waiting room (Deps.Crowd checks them).
	Ticket, Admission string
	// Blocked, if set, is the refusal of a buyer or address on the risk
	// lists (the caller checks them): the purchase is refused with it,
	// unless it is a retry of an Idempotency-Key that made an order, which
	// gets its order.
	Blocked error
}

// Crowd checks, in memory, that a purchase may reach the gate: the buyer
// holds a ticket where the sale needs one and an admission where it has a
// waiting room. The error is a refusal (sale.ErrTicketRequired,
// sale.ErrNotAdmitted, wrapped);
// expired is true when the refused proof is authentic but out of time, so
// a retry of an Idempotency-Key that made an order still gets its order.
type Crowd interface {
	Admit(sku sale.SKU, req Request, now time.Time) (expired bool, err error)
}

// Result is an accepted purchase.
type Result struct {
	OrderID string
	// Duplicate is true when the Idempotency-Key had already made this order.
	Duplicate bool
	// Status is StatusQueued (admitted by Redis) or, when the database
	// fallback sold it, StatusPendingPayment; for a Duplicate, the order's
	// status as the database knows it (queued while it is not there yet).
	Status sale.Status
	// Order is the order a Duplicate made, as the database has it, once it
	// is there (nil while it is queued, or when the database cannot say):
	// a retry learns the order's real state (pending payment, paid,
	// cancelled or failed), not "queued".
	Order *sale.Order
}

// Buy admits or refuses a purchase. Errors: sale.ErrInvalid, ErrUnknownSKU,
// ErrSaleNotOpen, ErrSaleEnded, ErrLimitReached, ErrSoldOut, ErrRateLimited
// (a *sale.RateLimitError: nothing reserved, retry after its RetryAfter), and
// ErrUnavailable (Redis not usable, or the SKU not loaded in it). An accepted
// purchase is queued: it becomes an order in the database shortly after.
// Unknown SKUs, closed windows, SKUs flagged sold out and limits known to
// refuse are answered from memory: they never reach Redis or the database.
func (s *Service) Buy(ctx context.Context, req Request) (Result, error) {
	start := time.Now()
	res, err := s.buy(ctx, req)
	if err == nil && res.Duplicate {
		res = s.settled(ctx, req.User, res)
	}
	outcome := outcomeOf(err)
	if s.obs != nil {
		s.obs.Purchase(outcome)
	}
	// Only SKUs of the catalog are counted: junk ids must not make keys.
	if s.counter != nil && outcome != "unknown_sku" && outcome != "invalid" {
		s.counter.Record(req.SKU, outcome, time.Since(start))
	}
	return res, err
}

// settledTimeout bounds settled's read: the answer it refines ("queued")
// is already true, so a slow or saturated database must not hold a retry.
const settledTimeout = 200 * time.Millisecond

// settled completes the Result of a retry (Duplicate) with the order as
// the database has it: one read by primary key, for retries only, bounded
// by settledTimeout. An order not there yet (in flight) or a database that
// cannot say in time leaves res as it is: the purchase was accepted, its
// order is queued.
func (s *Service) settled(ctx context.Context, user string, res Result) Result {
	if res.Order != nil || s.orders == nil {
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, settledTimeout)
	defer cancel()
	o, err := s.orders.Order(ctx, res.OrderID)
	if err != nil || o.User != user {
		return res
	}
	res.Status, res.Order = o.Status, &o
	return res
}

func (s *Service) buy(ctx context.Context, req Request) (Result, error) {
	switch {
	case !sale.ValidUser(req.User):
		return Result{}, fmt.Errorf("%w: bad user id", sale.ErrInvalid)
	case !sale.ValidSKU(req.SKU):
		return Result{}, fmt.Errorf("%w: sku_id must be 1-64 characters of A-Z a-z 0-9 _ -", sale.ErrInvalid)
	case req.Quantity < 1 || req.Quantity > sale.MaxQuantity:
		return Result{}, fmt.Errorf("%w: quantity must be 1..%d", sale.ErrInvalid, sale.MaxQuantity)
	case req.IdempotencyKey != "" && !sale.ValidIdempotencyKey(req.IdempotencyKey):
		return Result{}, fmt.Errorf("%w: Idempotency-Key must be 1-%d printable ASCII characters", sale.ErrInvalid, sale.MaxIdempotencyKey)
	}
	sku, ok := s.Catalog.Get(req.SKU)
	if !ok {
		return Result{}, sale.ErrUnknownSKU
	}
	now := s.now()
	if !sku.StartsAt.IsZero() && now.Before(sku.StartsAt) {
		return Result{}, sale.ErrSaleNotOpen
	}
	if !sku.EndsAt.IsZero() && !now.Before(sku.EndsAt) {
		return Result{}, sale.ErrSaleEnded
	}
	if req.Quantity > sku.PerUserLimit {
		return Result{}, sale.ErrLimitReached
	}
	if req.Blocked != nil {
		// A retry of a key that made an order before the buyer was listed
		// gets its order (I11): a read, only with a key.
		if res, found, kerr := s.retried(ctx, req); found {
			return res, kerr
		}
		return Result{}, req.Blocked
	}
	if s.crowd != nil {
		if expired, err := s.crowd.Admit(sku, req, now); err != nil {
			// A retry of a key that made an order gets its order, though
			// its ticket or admission has run out since: a read, and only
			// for a proof this buyer really held.
			if expired {
				if res, found, kerr := s.retried(ctx, req); found {
					return res, kerr
				}
			}
			return Result{}, err
		}
	}
	ipKey := ""
	if s.limits.IP.On() {
		ipKey = IPKey(req.ClientIP)
	}
	if s.seller == nil && !s.soldOut.admit(req.SKU, req.Quantity, now) {
		// A retry with an Idempotency-Key gets the order it made, even
		// after the sale sold out: one read, not the gate. If Redis cannot
		// say, the purchase takes the usual path.
		if req.IdempotencyKey == "" {
			return Result{}, sale.ErrSoldOut
		}
		// A lease's snapshot of the key holders, where there is one,
		// says the key made no order in Redis without asking it; the
		// database fallback's window is read as on the path below.
		if s.leases.absent(req.SKU, req.User, req.IdempotencyKey, now) {
			if res, found, ferr := s.fallbackOrder(ctx, req); found || ferr != nil {
				return res, ferr
			}
			return Result{}, sale.ErrSoldOut
		}
		id, found, err := s.soldOutKey(ctx, req)
		switch {
		case err == nil && found:
			return s.inStream(ctx, req, Result{OrderID: id, Duplicate: true, Status: sale.StatusQueued})
		case err == nil:
			if res, found, ferr := s.fallbackOrder(ctx, req); found || ferr != nil {
				return res, ferr
			}
			return Result{}, sale.ErrSoldOut
		}
	}
	if err := s.blocked(req.SKU, req.User, ipKey, now); err != nil {
		// A retry of a key that made an order gets it, not 429: one read.
		if res, found, kerr := s.keyInGate(ctx, req, 0); found {
			return res, kerr
		}
		return Result{}, err
	}
	gen := s.soldOut.gen.Load()
	r := sale.Reservation{
		OrderID:        stockgate.NewOrderID(req.SKU), // tagged: Order finds it in one Redis call
		SKU:            req.SKU,
		User:           req.User,
		Quantity:       req.Quantity,
		AcceptedAt:     now.UnixMilli(),
		IdempotencyKey: req.IdempotencyKey,
		ClientIP:       req.ClientIP,
	}
	lim := s.limits.gate(ipKey)
	if lim.Buckets = sku.BucketCount(); lim.Buckets > 1 {
		r.Bucket = stockgate.HomeName(r.SKU, r.User, lim.Buckets)
	}
	if s.seller != nil {
		o, dup, err := s.seller.BuyDirect(ctx, r, now)
		if err != nil {
			if isBusiness(err) || errors.Is(err, sale.ErrBusy) {
				return Result{}, err
			}
			return Result{}, fmt.Errorf("%w: %v", sale.ErrUnavailable, err)
		}
		res := Result{OrderID: o.ID, Duplicate: dup, Status: o.Status}
		if dup {
			res.Order = &o
		}
		return res, nil
	}
	clk := newWaitClock()
	defer clk.put()
	gr, err := s.guard.reserve(ctx, clk, func(ctx context.Context) (stockgate.ReserveResult, error) {
		return s.reserve(ctx, r, lim)
	})
	// errors.AsType, not errors.As: the targets would be allocated on
	// every purchase, refused or not.
	le, limited := errors.AsType[*stockgate.LimitedError](err)
	so, soldOut := errors.AsType[*stockgate.SoldOutError](err)
	switch {
	case err == nil:
		switch {
		case gr.Duplicate || gr.Available < 0: // units left unknown
		case gr.Available == 0:
			s.soldOut.set(r.SKU, 0, now, gen)
		default:
			s.soldOut.unset(r.SKU)
		}
	case limited:
		s.remember(limitKeys(req.SKU, req.User, ipKey), le, now)
		return Result{}, err
	case soldOut:
		s.soldOut.set(r.SKU, so.Available, now, gen)
		if res, found, ferr := s.fallbackOrder(ctx, req); found || ferr != nil {
			return res, ferr
		}
		return Result{}, err
	case errors.Is(err, sale.ErrLimitReached):
		// The buyer's units in Redis may count a reservation in flight
		// there while the fallback sold this key's order.
		if res, found, ferr := s.fallbackOrder(ctx, req); found || ferr != nil {
			return res, ferr
		}
		return Result{}, err
	case errors.Is(err, errBreakerOpen):
		// The key may have made a reservation still in flight in Redis,
		// which the database does not know yet: ask Redis if it answers.
		if res, found, err := s.keyInGate(ctx, req, fallbackKeyLookup); found {
			return res, err
		}
		// The buyer's reservations still in flight in Redis are not in
		// the database yet, so the fallback's limit check cannot see
		// them: a Redis that answers (slow, not gone) says what the buyer
		// holds, and a purchase past the limit is refused here instead of
		// sold beside a reservation the database would then refuse.
		if held, ok := s.heldInGate(ctx, r.SKU, r.User); ok && held+r.Quantity > sku.PerUserLimit {
			if req.IdempotencyKey != "" {
				// What the buyer holds may be this key's own first
				// attempt, whose look-up above did not answer in time:
				// the key's outcome is unknown, never limit_reached.
				return Result{}, fmt.Errorf("%w: the buyer holds %d of %d in redis, which may be this Idempotency-Key's order: retry with the same key", sale.ErrUnavailable, held, sku.PerUserLimit)
			}
			return Result{}, fmt.Errorf("%w: %d of %d held", sale.ErrLimitReached, held, sku.PerUserLimit)
		}
		res, err := s.guard.buyDirect(ctx, r, now)
		if errors.Is(err, sale.ErrSoldOut) {
			s.soldOut.set(r.SKU, 0, now, gen)
		}
		return res, err
	case errors.Is(err, sale.ErrBusy):
		return Result{}, err
	case errors.Is(err, stockgate.ErrLayoutNewer):
		// Seeded by a newer release: its instances serve it.
		return Result{}, err
	case errors.Is(err, stockgate.ErrBucketsChanged):
		// The sale was split anew since the catalog was read.
		s.Catalog.Kick()
		return Result{}, fmt.Errorf("%w: sale %s was split anew, retry shortly", sale.ErrUnavailable, req.SKU)
	case errors.Is(err, sale.ErrNotWarmed):
		s.triggerLoad(r.SKU)
		// A retry of a purchase that exists gets its order, not 503.
		if res, found, err := s.keyInGate(ctx, req, 0); found {
			return res, err
		}
		if res, found := s.keyInDatabase(ctx, req); found {
			return res, nil
		}
		return Result{}, fmt.Errorf("%w: sale %s is being loaded into redis, retry shortly", sale.ErrUnavailable, req.SKU)
	case isBusiness(err):
		return Result{}, err
	case stockgate.IsTryAgain(err):
		// Not run: the gate retried it for as long as it may.
		return Result{}, fmt.Errorf("%w: sale %s's stock is being moved between Redis Cluster nodes, retry shortly: %v", sale.ErrUnavailable, req.SKU, err)
	default:
		return Result{}, fmt.Errorf("%w: %v", sale.ErrUnavailable, err)
	}
	if gr.Duplicate {
		return s.inStream(ctx, req, Result{OrderID: gr.OrderID, Duplicate: true, Status: sale.StatusQueued})
	}
	if s.ack > 0 {
		// The clock's second wait: detached from the buyer, so that
		// the gate call's timer serves it too (clock.go).
		actx := clk.start(ctx, s.ack)
		if err := s.relay.Publish(actx, stockgate.BucketOf(r), gr.OrderID, gr.Payload); err != nil && s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.DebugContext(ctx, "purchase: accepted before the stream acknowledged (outbox holds it)", "order_id", gr.OrderID, "err", err)
		}
		clk.stop(actx)
	} else {
		s.relay.Notify(ctx, stockgate.BucketOf(r), gr.OrderID, gr.Payload)
	}
	return Result{OrderID: gr.OrderID, Status: sale.StatusQueued}, nil
}

// soldOutKey asks the gate whether req's Idempotency-Key made an order, for
// a purchase of a SKU this instance knows is sold out: on a sold-out hot
// SKU every keyed request asks it, so it is bounded as the gate call is,
// by a pooled clock's wait (waitClock) of the gate's call timeout, or less
// when the request's own deadline comes sooner, instead of a
// context.WithTimeout of the request's context: that made a timer for the
// request's context and one for the look-up, about a tenth of the
// server's CPU per sold-out answer. Like the gate call's, the wait does
// not end when the buyer leaves (it ends at its bound: a look-up costs one
// share of a batched read, and an error here only sends the purchase on
// to the gate).
func (s *Service) soldOutKey(ctx context.Context, req Request) (string, bool, error) {
	d := s.guard.timeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	if d <= 0 {
		return s.gate.Duplicate(ctx, req.SKU, req.User, req.IdempotencyKey)
	}
	clk := newWaitClock()
	defer clk.put()
	p := clk.start(ctx, d)
	defer clk.stop(p)
	return s.gate.Duplicate(p, req.SKU, req.User, req.IdempotencyKey)
}

// fallbackKeyLookup bounds the look-up of a key in Redis before a database
// fallback sale: Redis is failing (the breaker is open), so a hung one must
// not hold the fallback for the whole gate timeout.
const fallbackKeyLookup = 100 * time.Millisecond

// heldInGate returns the units of sku user holds according to the gate,
// asked within fallbackKeyLookup; ok is false when the gate cannot say in
// time (Redis down or hung: the database's own limit check stands alone).
func (s *Service) heldInGate(ctx context.Context, sku, user string) (int64, bool) {
	h, ok := s.gate.(heldReader)
	if !ok {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, fallbackKeyLookup)
	defer cancel()
	n, err := h.Held(ctx, sku, user)
	return n, err == nil
}

// keyInGate returns the order req's Idempotency-Key made, as the gate's
// idempotency hash records it (queued: it may still be in flight), once it
// is as durable as a first 202 (inStream; err is its refusal). found is
// false when req has no key, the hash has none, or Redis cannot say
// (within limit, if positive, for the look-ups).
func (s *Service) keyInGate(ctx context.Context, req Request, limit time.Duration) (res Result, found bool, err error) {
	if req.IdempotencyKey == "" {
		return Result{}, false, nil
	}
	lctx := ctx
	if limit > 0 {
		var cancel context.CancelFunc
		lctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	id, found, err := s.gate.Duplicate(lctx, req.SKU, req.User, req.IdempotencyKey)
	if err != nil || !found {
		return Result{}, false, nil
	}
	res, err = s.inStreamWith(ctx, lctx, req, Result{OrderID: id, Duplicate: true, Status: sale.StatusQueued})
	return res, true, err
}

// retriedGateWait bounds retried's look-up in Redis, so that a refused
// retry does not wait out a Redis that is not answering.
const retriedGateWait = 250 * time.Millisecond

// retried looks for the order a refused purchase's Idempotency-Key made:
// in the gate (not while the breaker is open), then in the database (an
// order the fallback sold, or one Redis no longer holds). found is false
// without a key, or when neither has one.
func (s *Service) retried(ctx context.Context, req Request) (Result, bool, error) {
	if req.IdempotencyKey == "" {
		return Result{}, false, nil
	}
	if s.guard.State() != "open" {
		if res, found, err := s.keyInGate(ctx, req, retriedGateWait); found {
			return res, true, err
		}
	}
	if res, found := s.keyInDatabase(ctx, req); found {
		return res, true, nil
	}
	return Result{}, false, nil
}

// inStream returns res, the order a retried Idempotency-Key made, once the
// stream holds it, so that a 202 to a retry means what the first one meant
// with StreamAck on: the order survives a Redis that loses its data. The
// first attempt's instance may have died between the gate and the stream,
// leaving the order in the Redis outbox alone (until a sweeper's grace
// ran out). Only an order still in the outbox costs more than one read: it
// is published again from its Redis payload with its own id as the
// message id (the stream de-duplicates a copy) and waited for up to
// StreamAck. When that cannot be confirmed the outcome is unknown to this
// instance: sale.ErrUnavailable, and a retry of the key asks again; it
// never makes a second order.
func (s *Service) inStream(ctx context.Context, req Request, res Result) (Result, error) {
	return s.inStreamWith(ctx, ctx, req, res)
}

// inStreamWith is inStream whose outbox read runs under lctx.
func (s *Service) inStreamWith(ctx, lctx context.Context, req Request, res Result) (Result, error) {
	if s.ack <= 0 || res.Status != sale.StatusQueued {
		return res, nil
	}
	payload, bucket, err := s.gate.Unsent(lctx, req.SKU, req.User, res.OrderID)
	if err != nil {
		return Result{}, fmt.Errorf("%w: order %s of this Idempotency-Key may not be in the stream yet (redis: %v), retry with the same key", sale.ErrUnavailable, res.OrderID, err)
	}
	if payload == nil {
		return res, nil
	}
	pctx, cancel := context.WithTimeout(ctx, s.ack)
	defer cancel()
	if err := s.relay.Publish(pctx, bucket, res.OrderID, payload); err != nil {
		s.log.WarnContext(ctx, "purchase: retried key's order not yet acknowledged by the stream: answered unavailable", "order_id", res.OrderID, "err", err)
		return Result{}, fmt.Errorf("%w: order %s of this Idempotency-Key is not yet in the stream, retry with the same key", sale.ErrUnavailable, res.OrderID)
	}
	return res, nil
}

// fallbackOrder returns the order req's Idempotency-Key made in the
// database, for a keyed purchase about to be refused sold out or
// limit_reached because the gate does not know the key, while the database
// fallback may have sold orders the gate has not learnt of yet
// (guard.unsettled: a fallback sale reaches Redis through the restorer's
// debit or a rebuild). A buyer whose answer was lost (a commit that
// succeeded past the request's deadline is answered 503) and who retries
// the key in that window gets the order, not a refusal (I9, I11). The read
// is bounded (settledTimeout) and at most fallbackReads run at once; when
// the database cannot say, err is sale.ErrUnavailable (retry with the key),
// never the refusal. found is false and err nil, without a read, for a
// keyless purchase and outside that window: a sold-out sale's keyed
// requests cost no database read on a settled gate. (A rate limit's 429 is
// no answer to the key, only "later": it does not ask.)
func (s *Service) fallbackOrder(ctx context.Context, req Request) (Result, bool, error) {
	if req.IdempotencyKey == "" || s.orders == nil || !s.guard.unsettled() {
		return Result{}, false, nil
	}
	select {
	case s.guard.reads <- struct{}{}:
		defer func() { <-s.guard.reads }()
	default:
		return Result{}, false, fmt.Errorf("%w: whether this Idempotency-Key has an order the database fallback sold cannot be read now (redis is recovering), retry with the same key", sale.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, settledTimeout)
	defer cancel()
	res, found, err := s.orderByKey(ctx, req)
	if err != nil {
		return Result{}, false, fmt.Errorf("%w: whether this Idempotency-Key has an order the database fallback sold could not be read (%v), retry with the same key", sale.ErrUnavailable, err)
	}
	return res, found, nil
}

// keyInDatabase returns the order req's Idempotency-Key made, as the
// database records it. found is false when req has no key, or the database
// has no order with it or cannot say.
func (s *Service) keyInDatabase(ctx context.Context, req Request) (Result, bool) {
	if req.IdempotencyKey == "" || s.orders == nil {
		return Result{}, false
	}
	res, found, err := s.orderByKey(ctx, req)
	if err != nil {
		s.log.Warn("purchase: idempotency key look-up in the database", "sku_id", req.SKU, "err", err)
	}
	return res, found
}

// orderByKey reads the order req's Idempotency-Key made from the database:
// found is false, err nil, when there is none.
func (s *Service) orderByKey(ctx context.Context, req Request) (Result, bool, error) {
	o, err := s.orders.OrderByKey(ctx, req.SKU, req.User, req.IdempotencyKey)
	switch {
	case err == nil:
		return Result{OrderID: o.ID, Duplicate: true, Status: o.Status, Order: &o}, true, nil
	case errors.Is(err, sale.ErrOrderNotFound):
		return Result{}, false, nil
	}
	return Result{}, false, err
}

// reserve calls the gate. A transport error means the outcome is unknown:
// the script may have run and its reply been lost. It is retried with the
// same order id, which the script recognises, so a purchase is never
// reserved twice; the error is returned only if no attempt got an answer.
func (s *Service) reserve(ctx context.Context, r sale.Reservation, l stockgate.Limits) (stockgate.ReserveResult, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var gr stockgate.ReserveResult
		gr, err = s.reserveOnce(ctx, r, l, attempt)
		if errors.Is(err, stockgate.ErrClosedForgotten) {
			return s.closedForgotten(ctx, r)
		}
		if err == nil {
			if gr.Duplicate && gr.OrderID == r.OrderID {
				// Our earlier attempt did run: this is our reservation
				// (the units left then are unknown).
				payload, _ := json.Marshal(r)
				return stockgate.ReserveResult{OrderID: r.OrderID, Payload: payload, Available: -1}, nil
			}
			return gr, nil
		}
		if isBusiness(err) || errors.Is(err, sale.ErrNotWarmed) || errors.Is(err, stockgate.ErrBucketsChanged) ||
			errors.Is(err, stockgate.ErrLayoutNewer) || ctx.Err() != nil {
			return gr, err
		}
		s.log.WarnContext(ctx, "purchase: gate outcome unknown, asking again with the same order id", "order_id", r.OrderID, "attempt", attempt+1, "err", err)
	}
	return stockgate.ReserveResult{}, err
}

// closedForgotten answers a reserve call the gate refused because r was
// accepted before the closed orders it still remembers: the database knows
// whether r's order was made. Only a retry of an order id older than the
// retention (or a clock far behind the other instances') gets here.
func (s *Service) closedForgotten(ctx context.Context, r sale.Reservation) (stockgate.ReserveResult, error) {
	o, err := s.orders.Order(ctx, r.OrderID)
	switch {
	case err == nil && o.User == r.User:
		return stockgate.ReserveResult{OrderID: o.ID, Duplicate: true}, nil
	case err == nil || errors.Is(err, sale.ErrOrderNotFound):
		s.log.WarnContext(ctx, "purchase: reservation accepted before the gate's closed-order retention and unknown to the database: is this instance's clock behind?",
			"order_id", r.OrderID, "accepted_at", time.UnixMilli(r.AcceptedAt).UTC())
		return stockgate.ReserveResult{}, fmt.Errorf("%w: reservation %s is older than the closed-order retention", sale.ErrUnavailable, r.OrderID)
	}
	return stockgate.ReserveResult{}, err
}

// reserveOnce is one gate call (the reserve script), traced.
func (s *Service) reserveOnce(ctx context.Context, r sale.Reservation, l stockgate.Limits, attempt int) (stockgate.ReserveResult, error) {
	ctx, span := s.tracer.Start(ctx, "stockgate.reserve", trace.SpanKindClient)
	defer span.End()
	gr, err := s.gate.ReserveLimited(ctx, r, l)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("db.system.name", "redis"), attribute.String("flashsale.sku_id", r.SKU),
			attribute.String("flashsale.order_id", r.OrderID), attribute.Int64("flashsale.quantity", r.Quantity),
			attribute.Int("flashsale.attempt", attempt+1), attribute.String("flashsale.outcome", outcomeOf(err)),
			attribute.Bool("flashsale.duplicate", gr.Duplicate))
		if err != nil && !isBusiness(err) {
			tracing.Fail(span, err)
		}
	}
	return gr, err
}

// triggerLoad starts loading sku into Redis in the background, at most once
// at a time per SKU in this instance.
func (s *Service) triggerLoad(sku string) {
	if s.loader == nil {
		return
	}
	if _, running := s.loading.LoadOrStore(sku, struct{}{}); running {
		return
	}
	go func() {
		defer s.loading.Delete(sku)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := s.loader.Warm(ctx, sku); err != nil {
			s.log.Warn("purchase: loading sale into redis", "sku_id", sku, "err", err)
		}
	}()
}

func isBusiness(err error) bool {
	for _, e := range []error{sale.ErrSoldOut, sale.ErrLimitReached, sale.ErrSaleNotOpen, sale.ErrSaleEnded, sale.ErrInvalid, sale.ErrUnknownSKU, sale.ErrRateLimited,
		sale.ErrTicketRequired, sale.ErrNotAdmitted, sale.ErrBlocked} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func outcomeOf(err error) string {
	switch {
	case err == nil:
		return "accepted"
	case errors.Is(err, sale.ErrSoldOut):
		return "sold_out"
	case errors.Is(err, sale.ErrLimitReached):
		return "limit_reached"
	case errors.Is(err, sale.ErrUnknownSKU):
		return "unknown_sku"
	case errors.Is(err, sale.ErrSaleNotOpen), errors.Is(err, sale.ErrSaleEnded):
		return "not_open"
	case errors.Is(err, sale.ErrInvalid):
		return "invalid"
	case errors.Is(err, sale.ErrBusy):
		return "busy"
	case errors.Is(err, sale.ErrRateLimited):
		return "rate_limited"
	case errors.Is(err, sale.ErrTicketRequired):
		return "ticket_required"
	case errors.Is(err, sale.ErrNotAdmitted):
		return "not_admitted"
	case errors.Is(err, sale.ErrBlocked):
		return "blocked"
	}
	return "error"
}

// Order returns order id if user owns it: from the database, or, while it
// is still queued, from the gate. Errors: sale.ErrOrderNotFound (also when
// another user owns it: ids of others' orders are not disclosed).
func (s *Service) Order(ctx context.Context, user, id string) (sale.Order, error) {
	if !sale.ValidOrderID(id) {
		return sale.Order{}, sale.ErrOrderNotFound
	}
	o, err := s.orders.Order(ctx, id)
	if err == nil {
		if o.User != user {
			return sale.Order{}, sale.ErrOrderNotFound
		}
		return o, nil
	}
	if !errors.Is(err, sale.ErrOrderNotFound) {
		return sale.Order{}, err
	}
	// Queued orders live in the gate under their SKU, which the id's tag
	// names (stockgate.NewOrderID): one Redis call (more only on a tag
	// shared by several SKUs, one call for all of them). An id without a
	// tag (made by an older version) is looked for in every SKU, in one
	// pipelined round trip.
	var skus []string
	if tag, ok := stockgate.OrderTag(id); ok {
		skus = s.Catalog.Tagged(tag)
	} else {
		for _, sku := range s.Catalog.All() {
			skus = append(skus, sku.ID)
		}
	}
	if len(skus) > 0 {
		r, found, err := s.gate.Lookup(ctx, id, skus...)
		if err != nil {
			return sale.Order{}, err
		}
		if found {
			if r.User != user {
				return sale.Order{}, sale.ErrOrderNotFound
			}
			return sale.Order{ID: r.OrderID, SKU: r.SKU, User: r.User, Quantity: r.Quantity,
				Status: sale.StatusQueued, CreatedAt: time.UnixMilli(r.AcceptedAt).UTC()}, nil
		}
	}
	// It may have been applied between the two reads.
	o, err = s.orders.Order(ctx, id)
	if err == nil && o.User == user {
		return o, nil
	}
	return sale.Order{}, sale.ErrOrderNotFound
}

// SKUChanged is called once this instance changed sku's sale (an admin
// change, a warm-up): it reloads the catalog, forgets the local sold-out
// flag of sku and announces the change, so that every other instance does
// the same (Noticed) within milliseconds instead of a catalog refresh period.
func (s *Service) SKUChanged(ctx context.Context, sku, reason string) error {
	err := s.Catalog.Refresh(ctx)
	s.soldOut.clear(sku)
	s.leases.drop(sku)
	if s.announce != nil {
		s.announce.Announce(sku, reason)
	}
	return err
}

// Noticed applies a change announced by any instance: it forgets the local
// sold-out flag of sku (of every SKU when sku is empty) and, when the sale's
// settings may have changed (reload), reloads the catalog in the background.
func (s *Service) Noticed(sku string, reload bool) {
	s.soldOut.clear(sku)
	s.leases.drop(sku)
	if reload {
		s.Catalog.Kick()
	}
}

// SKUView is what a buyer sees of a sale.
type SKUView struct {
	SKU       sale.SKU
	Available int64
	State     sale.SaleState
}

// SKU returns the public view of a sale: units available in Redis (the
// database stock when Redis does not hold it) and its state.
func (s *Service) SKU(ctx context.Context, id string) (SKUView, error) {
	if !sale.ValidSKU(id) {
		return SKUView{}, sale.ErrUnknownSKU
	}
	sku, ok := s.Catalog.Get(id)
	if !ok {
		return SKUView{}, sale.ErrUnknownSKU
	}
	avail, loaded, err := s.gate.Available(ctx, id)
	if err != nil || !loaded {
		avail = sku.Stock
	}
	return SKUView{SKU: sku, Available: max(avail, 0), State: sku.State(s.now(), avail)}, nil
}

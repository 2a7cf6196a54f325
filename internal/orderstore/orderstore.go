// Package orderstore is the database of record: inventory, orders and the idempotency log, behind one type so a second SQL dialect fits without touching callers.
//
// Files: this one holds the types, the dialect-neutral rules (input checks,
// de-duplication, stock and per-user limit decisions) and the backend
// interface every dialect implements; postgres*.go hold the PostgreSQL SQL
// (pgx), mysql*.go the MySQL/MariaDB SQL (database/sql with
// go-sql-driver/mysql). Open picks the dialect from the URL's scheme; nothing
// above this package knows which one runs.
//
// Every method takes a context and is safe for concurrent use. The pools have
// no acquire timeout (pgx#2350): callers give every call a deadline.
package orderstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/jackc/pgx/v5"
)

// Dialect names a supported database.
type Dialect string

// The supported dialects.
const (
	Postgres Dialect = "postgres"
	MySQL    Dialect = "mysql" // MySQL 8 and MariaDB 10.6+
)

// DialectOf returns the dialect of a database URL: MySQL for mysql:// and
// mariadb:// URLs, PostgreSQL for anything else (postgres:// URLs and
// keyword/value DSNs).
func DialectOf(url string) Dialect {
	if strings.HasPrefix(url, "mysql://") || strings.HasPrefix(url, "mariadb://") {
		return MySQL
	}
	return Postgres
}

// backend is what a dialect implements: every exported method of Store.
// The doc comments live on the PostgreSQL implementation (postgres*.go); the
// MySQL one keeps the same contract.
type backend interface {
	Close()
	Ping(ctx context.Context) error
	Migrate(ctx context.Context) error
	DB() *sql.DB
	Stats() PoolStats

	ApplyBatch(ctx context.Context, rs []sale.Reservation) ([]Outcome, error)
	Discard(ctx context.Context, r sale.Reservation) (already bool, status sale.Status, err error)
	BuyDirect(ctx context.Context, r sale.Reservation, now time.Time) (order sale.Order, duplicate bool, err error)
	BuyConditional(ctx context.Context, r sale.Reservation, now time.Time) (sale.Order, bool, error)
	BuyFenced(ctx context.Context, r sale.Reservation, now time.Time, token int64) (sale.Order, bool, error)
	Fence(ctx context.Context, sku string) (int64, error)
	BuyOptimistic(ctx context.Context, r sale.Reservation, now time.Time, attempts int) (sale.Order, bool, error)

	PutSKU(ctx context.Context, c SKUChange) (sku sale.SKU, delta int64, created bool, err error)
	SKU(ctx context.Context, id string) (sale.SKU, error)
	SKUs(ctx context.Context) ([]sale.SKU, error)

	Pay(ctx context.Context, id, user, ref string, now time.Time) (o sale.Order, again bool, err error)
	Cancel(ctx context.Context, id, user, cause string, now time.Time) (o sale.Order, again bool, err error)
	Expire(ctx context.Context, id string, now time.Time) (o sale.Order, released bool, err error)
	ExpireDue(ctx context.Context, now time.Time, limit int) ([]Restore, error)
	RequestCancel(ctx context.Context, id, user string, now time.Time) (o sale.Order, landed bool, err error)
	PendingRestores(ctx context.Context, limit int, skip ...string) ([]Restore, error)
	RestoresDone(ctx context.Context, ids []string) error
	ListenRestores(ctx context.Context, wake func()) error

	Order(ctx context.Context, id string) (sale.Order, error)
	OrderByKey(ctx context.Context, sku, user, key string) (sale.Order, error)
	Snapshot(ctx context.Context, sku string, ids []string) (Snapshot, error)
	SeedSnapshot(ctx context.Context, sku string, ids []string) (Snapshot, error)
	LockedSnapshot(ctx context.Context, sku string, read func(ctx context.Context) (ids []string, err error)) (Snapshot, error)
	Processed(ctx context.Context, ids []string) (map[string]sale.Status, error)
	LiveHoldings(ctx context.Context, sku string) (map[string]int64, error)

	AuditRedis(ctx context.Context, sku string, delta int64, reason string) error
	Audit(ctx context.Context, sku string, after int64, limit int) ([]AuditEntry, error)
	PublishTransitions(ctx context.Context, limit int, publish func([]Transition) error) (int, error)

	AddRisk(ctx context.Context, c RiskChange, now time.Time) (RiskEntry, error)
	RemoveRisk(ctx context.Context, id int64, now time.Time) (RiskEntry, error)
	RiskEntries(ctx context.Context, kind string, now time.Time) ([]RiskEntry, error)
	RiskVersion(ctx context.Context) (int64, error)
	RiskAudit(ctx context.Context, after int64, limit int) ([]RiskAuditEntry, error)
}

// scanner is a row to scan: pgx.Row, *sql.Row and *sql.Rows all are.
type scanner interface{ Scan(dest ...any) error }

// noRows reports whether err says a single-row query found none, in either dialect.
func noRows(err error) bool { return errors.Is(err, sql.ErrNoRows) || errors.Is(err, pgx.ErrNoRows) }

// PoolStats describes the connection pool, for metrics.
type PoolStats struct {
	Max, Total, Idle, InUse int64
	// Waits counts acquisitions that had to wait for a connection.
	Waits int64
}

// Store is the database of record. Create it with Open; it is safe for
// concurrent use by many goroutines and many processes sharing one database.
type Store struct {
	backend
	dialect Dialect
	desc    string // see Describe
}

// Open connects to the database named in url and checks the connection:
// PostgreSQL (a postgres:// URL or a keyword/value DSN, see openPostgres) or
// MySQL/MariaDB (a mysql:// URL, see openMySQL). If the database does not
// exist, Open creates it when the user may. Open does not migrate: call
// Migrate. The caller must Close the Store.
func Open(ctx context.Context, url string, o Options) (*Store, error) {
	o.fill()
	d := DialectOf(url)
	var (
		b   backend
		err error
	)
	switch d {
	case MySQL:
		b, err = openMySQL(ctx, url, o)
	default:
		b, err = openPostgres(ctx, url, o)
	}
	if err != nil {
		return nil, err
	}
	return &Store{backend: b, dialect: d, desc: describe(d, url)}, nil
}

// Dialect reports which database the store talks to.
func (s *Store) Dialect() Dialect { return s.dialect }

// Rebind rewrites a statement written with ? placeholders for the store's
// dialect ($1, $2, ... on PostgreSQL), for callers of DB: tests and the
// invariant checker, which read the tables directly. A ? inside a string
// literal is not supported.
func (s *Store) Rebind(q string) string { return Rebind(s.dialect, q) }

// Rebind rewrites ? placeholders for dialect d.
func Rebind(d Dialect, q string) string {
	if d != Postgres || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Options configure Open. The zero value is usable.
type Options struct {
	// MaxConns bounds the connection pool; 0 (or less) means 16.
	MaxConns int32
	// Logger receives database creation and migration messages; nil discards them.
	Logger *slog.Logger
	// PaymentTimeout is how long after acceptance an unpaid order expires
	// (orders.expires_at); 0 means 15 minutes.
	PaymentTimeout time.Duration
}

const defaultPaymentTimeout = 15 * time.Minute

const defaultMaxConns = 16

// Fail reasons recorded in orders.fail_reason and Outcome.Reason for failed orders.
const (
	// ReasonInsufficientStock means the database stock of the SKU was short when the reservation was applied.
	ReasonInsufficientStock = "insufficient_stock"
	// ReasonUnknownSKU means no inventory row exists for the SKU.
	ReasonUnknownSKU = "unknown_sku"
	// ReasonLimitReached means the reservation would have taken its user past
	// the SKU's per-user limit (live units held plus the quantity).
	ReasonLimitReached = "limit_reached"
	// ReasonDiscarded means an operator discarded the reservation (Discard)
	// before it was applied.
	ReasonDiscarded = "discarded"
	// ReasonDuplicateKey means the reservation's Idempotency-Key had already
	// made another order of the same user and SKU (Outcome.KeyOrderID): the
	// first attempt of a retried purchase, sold by another path (the
	// database fallback, a reservation a rebuild forgot the key of). The
	// refused order row does not carry the key.
	ReasonDuplicateKey = "duplicate_key"
)

// fill sets the defaults of o.
func (o *Options) fill() {
	if o.MaxConns <= 0 {
		o.MaxConns = defaultMaxConns
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.PaymentTimeout <= 0 {
		o.PaymentTimeout = defaultPaymentTimeout
	}
}

// common is what every dialect's backend holds.
type common struct {
	log     *slog.Logger
	timeout time.Duration // payment timeout
	// releases bounds the release transactions (cancel, expire) running at
	// once. Each ends on its SKU's inventory row, one at a time: without a
	// bound, a crowd cancelling one sale fills the whole pool with
	// transactions queued on that row lock, and every other query of the
	// instance (the consumer's apply, payments, the catalog) waits for a
	// connection until its deadline. A release waiting here holds no
	// connection and no lock, so one whose deadline passes leaves nothing
	// behind in the database.
	releases chan struct{}
}

func newCommon(log *slog.Logger, o Options) common {
	return common{log: log, timeout: o.PaymentTimeout, releases: make(chan struct{}, max(2, int(o.MaxConns)/4))}
}

// bounded runs fn once a release slot is free, or returns ctx's error.
func (c *common) bounded(ctx context.Context, fn func() error) error {
	select {
	case c.releases <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("orderstore: waiting for a release slot: %w", ctx.Err())
	}
	defer func() { <-c.releases }()
	return fn()
}

// expiry returns when an order accepted at acceptedMs expires unpaid.
func (c *common) expiry(acceptedMs int64) time.Time {
	return time.UnixMilli(acceptedMs).Add(c.timeout)
}

// SKUChange is the admin's description of a SKU for PutSKU.
type SKUChange struct {
	ID string
	// TotalStock is the allocation of the sale (not the units left): 0..sale.MaxStock.
	TotalStock int64
	// PerUserLimit is the most units one user may hold: 1..sale.MaxPerUserLimit.
	PerUserLimit int64
	// StartsAt and EndsAt bound the sale window; zero means none. When both are
	// set EndsAt must be after StartsAt.
	StartsAt, EndsAt time.Time
	// Buckets is the number of stock buckets of the sale in Redis:
	// 1..sale.MaxBuckets; 0 means 1.
	Buckets int
	// Crowd is the sale's tickets and waiting room; a change replaces it
	// whole, so a caller changing something else passes the current one.
	Crowd sale.Crowd
	// Tag groups sales for the capacity forecast ("" for none); like Crowd,
	// a caller changing something else passes the current one.
	Tag string
}

func (c SKUChange) buckets() int { return max(c.Buckets, 1) }

func (c SKUChange) validate() error {
	switch {
	case !sale.ValidSKU(c.ID):
		return fmt.Errorf("%w: bad sku_id %q", sale.ErrInvalid, c.ID)
	case !sale.ValidTag(c.Tag):
		return fmt.Errorf("%w: bad tag %q", sale.ErrInvalid, c.Tag)
	case c.TotalStock < 0 || c.TotalStock > sale.MaxStock:
		return fmt.Errorf("%w: total_stock %d outside 0..%d", sale.ErrInvalid, c.TotalStock, sale.MaxStock)
	case c.PerUserLimit < 1 || c.PerUserLimit > sale.MaxPerUserLimit:
		return fmt.Errorf("%w: per_user_limit %d outside 1..%d", sale.ErrInvalid, c.PerUserLimit, sale.MaxPerUserLimit)
	case !c.StartsAt.IsZero() && !c.EndsAt.IsZero() && !c.EndsAt.After(c.StartsAt):
		return fmt.Errorf("%w: ends_at must be after starts_at", sale.ErrInvalid)
	case c.Buckets < 0 || c.Buckets > sale.MaxBuckets:
		return fmt.Errorf("%w: buckets %d", sale.ErrInvalidBuckets, c.Buckets)
	case c.Crowd.AdmissionRate < 0 || c.Crowd.AdmissionRate > sale.MaxAdmissionRate:
		return fmt.Errorf("%w: admission_rate %d outside 0..%d", sale.ErrInvalid, c.Crowd.AdmissionRate, sale.MaxAdmissionRate)
	case !c.Crowd.TicketsOpenAt.IsZero() && !c.StartsAt.IsZero() && c.Crowd.TicketsOpenAt.After(c.StartsAt):
		return fmt.Errorf("%w: tickets_open_at must not be after starts_at", sale.ErrInvalid)
	}
	return nil
}

// Outcome is what ApplyBatch did with one reservation.
type Outcome struct {
	OrderID string
	// Status is StatusPendingPayment (stock taken) or StatusFailed (refused)
	// for a reservation applied by this call. For a Duplicate it is the order's
	// status now, which may since have become paid or cancelled.
	Status sale.Status
	// Reason is ReasonUnknownSKU, ReasonLimitReached or ReasonInsufficientStock
	// when Status is StatusFailed (a Duplicate may also carry ReasonDiscarded),
	// empty otherwise.
	Reason string
	// Duplicate is true when the reservation was already applied before this
	// call, or appears earlier in the same call: this call changed nothing for it.
	Duplicate bool
	// KeyOrderID, for a reservation refused with ReasonDuplicateKey, is the
	// order its Idempotency-Key made first: the order a retry of the key is
	// answered with.
	KeyOrderID string
}

// validateBatch rejects a batch holding a reservation that could never be
// applied (it would also break the CHECKs of the orders table).
func validateBatch(rs []sale.Reservation) error {
	for i, r := range rs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("%w: reservation %d (order %q): %v", sale.ErrInvalid, i, r.OrderID, err)
		}
	}
	return nil
}

// dedupe returns the reservations of rs with distinct order ids, in input
// order, and for each element of rs the index of its first occurrence in uniq.
func dedupe(rs []sale.Reservation) (uniq []sale.Reservation, idx []int) {
	seen := make(map[string]int, len(rs))
	uniq = make([]sale.Reservation, 0, len(rs))
	idx = make([]int, len(rs))
	for i, r := range rs {
		j, ok := seen[r.OrderID]
		if !ok {
			j = len(uniq)
			seen[r.OrderID] = j
			uniq = append(uniq, r)
		}
		idx[i] = j
	}
	return uniq, idx
}

// idemKey names one user's Idempotency-Key on one SKU: orders carry each
// at most once (unique index orders_idempotency_idx).
type idemKey struct{ SKU, User, Key string }

func keyOfResv(r sale.Reservation) idemKey { return idemKey{r.SKU, r.User, r.IdempotencyKey} }

// keyedOf returns the keys the reservations of rs carry, without repeats.
func keyedOf(rs []sale.Reservation) []idemKey {
	seen := make(map[idemKey]bool)
	var out []idemKey
	for _, r := range rs {
		if k := keyOfResv(r); r.IdempotencyKey != "" && !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// keyOwners decides, for reservations rs (new, in input order), which
// Idempotency-Keys another order already holds: owners maps the keys of
// orders in the database to their order ids (not modified). It returns for
// each element of rs the order its key already made, or "" when r has no key
// or is the first with it (r then owns the key: its row carries it). Within
// rs the first reservation with a key owns it.
func keyOwners(rs []sale.Reservation, owners map[idemKey]string) []string {
	taken := make(map[idemKey]string)
	out := make([]string, len(rs))
	for i, r := range rs {
		if r.IdempotencyKey == "" {
			continue
		}
		k := keyOfResv(r)
		if id, ok := owners[k]; ok && id != r.OrderID {
			out[i] = id
			continue
		}
		if id, ok := taken[k]; ok {
			out[i] = id
			continue
		}
		taken[k] = r.OrderID
	}
	return out
}

// decideKeys is the start of every apply: reservations of fresh whose key
// already made an order are refused with ReasonDuplicateKey (or, when their
// owner cancelled them while queued, land cancelled without the key); the
// others are returned to be decided by allocate. decided has one slot per
// element of fresh, set for the ones taken out (Status empty for the others).
func decideKeys(fresh []sale.Reservation, owners map[idemKey]string, cancelled func(sale.Reservation) bool) (decided []Outcome, rest []sale.Reservation) {
	decided = make([]Outcome, len(fresh))
	for i, owner := range keyOwners(fresh, owners) {
		r := fresh[i]
		switch {
		case cancelled(r):
			decided[i] = Outcome{OrderID: r.OrderID, Status: sale.StatusCancelled, KeyOrderID: owner}
		case owner != "":
			decided[i] = Outcome{OrderID: r.OrderID, Status: sale.StatusFailed, Reason: ReasonDuplicateKey, KeyOrderID: owner}
		default:
			rest = append(rest, r)
		}
	}
	return decided, rest
}

// mergeDecided fills the open slots of decided, in order, with allocated.
func mergeDecided(decided, allocated []Outcome) {
	j := 0
	for i := range decided {
		if decided[i].Status == "" {
			decided[i] = allocated[j]
			j++
		}
	}
}

// ownsKey reports whether the row of a reservation decided as o carries its
// Idempotency-Key.
func ownsKey(r sale.Reservation, o Outcome) bool { return r.IdempotencyKey != "" && o.KeyOrderID == "" }

// withKeyOwners sets KeyOrderID on prior outcomes refused for their key
// (redeliveries), from owners.
func withKeyOwners(prior map[string]Outcome, uniq []sale.Reservation, owners map[idemKey]string) {
	for _, r := range uniq {
		o, ok := prior[r.OrderID]
		if !ok || o.Reason != ReasonDuplicateKey || r.IdempotencyKey == "" {
			continue
		}
		if id := owners[keyOfResv(r)]; id != r.OrderID {
			o.KeyOrderID = id
			prior[r.OrderID] = o
		}
	}
}

// keyConflictAttempts bounds how often an apply or a direct sale is run
// again after the unique index refused a key another transaction committed
// meanwhile (one that did not hold the SKU's row lock: an unknown SKU's
// failed order, a discard). The next attempt sees that order and refuses
// the reservation properly.
const keyConflictAttempts = 4

// lockedSKU is what the rules need of one inventory row read under its row lock.
type lockedSKU struct {
	Stock        int64
	PerUserLimit int64
}

// holder keys live holdings: units of SKU held by User in pending_payment or paid orders.
type holder struct{ SKU, User string }

// allocate walks rs in order against the locked inventory rows of their SKUs
// (absent from skus: the SKU does not exist) and the live holdings of their
// users (absent from held: none), and decides each reservation, checking in
// this order: unknown SKU; per-user limit (held plus quantity, counting what
// this batch already gave the user, above the limit: limit_reached);
// stock (taken while it fits in what is left, insufficient_stock otherwise).
// A refused reservation takes nothing. It returns one outcome per reservation
// and the units to take per SKU (only SKUs with a positive take). The maps
// passed in are not modified.
func allocate(rs []sale.Reservation, skus map[string]lockedSKU, held map[holder]int64) ([]Outcome, map[string]int64) {
	remaining := make(map[string]int64, len(skus))
	for id, k := range skus {
		remaining[id] = k.Stock
	}
	gained := make(map[holder]int64)
	take := make(map[string]int64)
	out := make([]Outcome, len(rs))
	for i, r := range rs {
		o := Outcome{OrderID: r.OrderID}
		h := holder{r.SKU, r.User}
		k, known := skus[r.SKU]
		left := remaining[r.SKU]
		switch {
		case !known:
			o.Status, o.Reason = sale.StatusFailed, ReasonUnknownSKU
		case held[h]+gained[h]+r.Quantity > k.PerUserLimit:
			o.Status, o.Reason = sale.StatusFailed, ReasonLimitReached
		case r.Quantity > 0 && r.Quantity <= left:
			o.Status = sale.StatusPendingPayment
			remaining[r.SKU] = left - r.Quantity
			take[r.SKU] += r.Quantity
			gained[h] += r.Quantity
		default:
			o.Status, o.Reason = sale.StatusFailed, ReasonInsufficientStock
		}
		out[i] = o
	}
	return out, take
}

// checkDirect decides a purchase straight from the database (BuyDirect) of
// qty units of sku at now, by a user already holding held live units of it,
// checking in this order: the sale window, the per-user limit, the stock. It
// returns nil if the purchase may take the units, else an error wrapping
// sale.ErrSaleNotOpen, sale.ErrSaleEnded, sale.ErrLimitReached or sale.ErrSoldOut
// (sale.ErrInvalid for a quantity below 1).
func checkDirect(sku sale.SKU, held, qty int64, now time.Time) error {
	switch {
	case qty < 1:
		return fmt.Errorf("%w: quantity %d", sale.ErrInvalid, qty)
	case !sku.StartsAt.IsZero() && now.Before(sku.StartsAt):
		return fmt.Errorf("%w: starts at %s", sale.ErrSaleNotOpen, sku.StartsAt.Format(time.RFC3339))
	case !sku.EndsAt.IsZero() && !now.Before(sku.EndsAt):
		return fmt.Errorf("%w: ended at %s", sale.ErrSaleEnded, sku.EndsAt.Format(time.RFC3339))
	case held+qty > sku.PerUserLimit:
		return fmt.Errorf("%w: holds %d, asks %d, limit %d", sale.ErrLimitReached, held, qty, sku.PerUserLimit)
	case qty > sku.Stock:
		return fmt.Errorf("%w: %d left, asks %d", sale.ErrSoldOut, sku.Stock, qty)
	}
	return nil
}
